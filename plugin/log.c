/* The replaceable log sink. Never called per intercepted call. */
#include <stdio.h>

#include "plugin/plugin.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static ust_log_cb log_cb;
static void *log_user;
static atomic_int log_max = UST_LOG_WARN;

void ust_set_log(ust_log_cb cb, void *user, int max_level) {
  pthread_mutex_lock(&log_lock);
  log_cb = cb;
  log_user = user;
  atomic_store(&log_max, max_level);
  pthread_mutex_unlock(&log_lock);
}

void ust__log_set_level(int max_level) { atomic_store(&log_max, max_level); }

void ust__log(int level, const char *fmt, ...) {
  if (level > atomic_load(&log_max))
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  static const char *names[] = {"error", "warning", "info", "debug"};
  pthread_mutex_lock(&log_lock);
  if (log_cb != NULL)
    log_cb(level, msg, log_user);
  else
    fprintf(stderr, "understudy: %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], msg);
  pthread_mutex_unlock(&log_lock);
}
