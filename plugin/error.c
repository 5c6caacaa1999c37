/* Error codes, their names and messages, and the per-thread last error. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin/plugin.h"

static _Thread_local char last_error[1024];

const char *ust_strerror(int err) {
  switch (err) {
  case UST_OK:
    return "success";
#define UST__ERRNO_MSG(name, code, msg) \
  case UST_##name:                      \
    return msg;
    UST_ERRNO_MAP(UST__ERRNO_MSG)
#undef UST__ERRNO_MSG
  }
  return "unknown error";
}

const char *ust_err_name(int err) {
  switch (err) {
  case UST_OK:
    return "UST_OK";
#define UST__ERRNO_NAME(name, code, msg) \
  case UST_##name:                       \
    return "UST_" #name;
    UST_ERRNO_MAP(UST__ERRNO_NAME)
#undef UST__ERRNO_NAME
  }
  return "UST_UNKNOWN";
}

const char *ust_last_error(void) { return last_error; }

void ust__clear_error(void) { last_error[0] = '\0'; }

int ust__error(int err, const char *fmt, ...) {
  /* Formatted aside first: the arguments may quote the last error itself. */
  char msg[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof last_error);
  return err;
}

uint32_t ust__share_q32(double p) {
  if (!(p > 0))
    return 0;
  const double q = p * 4294967296.0 + 0.5;
  return q >= 4294967295.0 ? UINT32_MAX : (uint32_t)q;
}

const char *ust_version(void) { return UST_VERSION_STRING; }

void ust_free(void *p) { free(p); }

char *ust__strdup(const char *s) {
  if (s == NULL)
    return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d != NULL)
    memcpy(d, s, n);
  return d;
}

int ust__copy_name(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap)
    return -1;
  memcpy(dst, src, n + 1);
  return 0;
}

char *ust__read_file(const char *path, size_t *len_out) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf != NULL) {
    size_t got = fread(buf + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0)
      break;
    if (cap - len - 1 == 0) {
      char *bigger = realloc(buf, cap * 2);
      if (bigger == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = bigger;
      cap *= 2;
    }
  }
  int failed = ferror(f);
  fclose(f);
  if (buf == NULL || failed) {
    free(buf);
    return NULL;
  }
  buf[len] = '\0';
  if (len_out != NULL)
    *len_out = len;
  return buf;
}

int ust__write_file_atomic(const char *path, const char *text, const char *what) {
  char tmp[4200];
  static atomic_uint seq;
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&seq, 1));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return ust__error(UST_EIO, "%s: cannot create '%s': %s", what, tmp, strerror(errno));
  size_t len = strlen(text), off = 0;
  int rc = 0;
  while (off < len) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      rc = ust__error(UST_EIO, "%s: writing '%s': %s", what, tmp, strerror(errno));
      break;
    }
    off += (size_t)w;
  }
  if (rc == 0 && fsync(fd) != 0)
    rc = ust__error(UST_EIO, "%s: fsync '%s': %s", what, tmp, strerror(errno));
  close(fd);
  if (rc == 0 && rename(tmp, path) != 0)
    rc = ust__error(UST_EIO, "%s: rename to '%s': %s", what, path, strerror(errno));
  if (rc != 0)
    unlink(tmp);
  return rc;
}
