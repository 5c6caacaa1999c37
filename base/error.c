/* Error codes, their names and messages, and the per-thread last error. */
#include <stdio.h>
#include <string.h>

#include "base/base.h"

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

_Thread_local int ust__hash_oom;

const char *ust__dtype_name(int dt) {
  static const char *names[UST__DT_COUNT] = {
      "other", "f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "bool",
      "f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "c64", "c128"};
  return dt >= 0 && dt < UST__DT_COUNT ? names[dt] : "other";
}
