/* The log sink: the host's callback, else stderr. Never called per
 * intercepted call. */
#include <stdio.h>

#include "base/base.h"

void ust__log_sink_set(ust__log_sink *s, ust_log_cb cb, void *user, int max_level) {
  pthread_mutex_lock(&s->lock);
  s->cb = cb;
  s->user = user;
  atomic_store(&s->max_level, max_level);
  pthread_mutex_unlock(&s->lock);
}

void ust__log_set_level(ust__log_sink *s, int max_level) { atomic_store(&s->max_level, max_level); }

void ust__log(ust__log_sink *s, int level, const char *fmt, ...) {
  if (s == NULL || level > atomic_load(&s->max_level))
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  static const char *const names[] = {"error", "warning", "info", "debug"};
  pthread_mutex_lock(&s->lock);
  if (s->cb != NULL)
    s->cb(level, msg, s->user);
  else
    fprintf(stderr, "understudy: %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], msg);
  pthread_mutex_unlock(&s->lock);
}
