/*
 * base/: the ground every folder stands on. Errors (the thread's last error),
 * the log sink type, clocks, shares of calls, strings and files. Nothing here
 * holds state of its own: the log sink and everything else that lives for
 * the process belong to the one context (plugin/context.c), which hands
 * pointers to the parts that need them.
 *
 * Internal header: never installed.
 */
#ifndef UST_BASE_H
#define UST_BASE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/types.h"
#include "understudy/understudy.h"

/* uthash reports running out of memory here instead of exiting
 * (HASH_NONFATAL_OOM is set for the whole core); the item is then not added. */
extern _Thread_local int ust__hash_oom;
#define uthash_nonfatal_oom(obj) (ust__hash_oom = 1)
#include <uthash.h>

/* What every intercepted call runs is grouped (GCC's .text.hot, across the
 * units) so that a call whose lines were evicted misses on few of them; what
 * only some calls run is kept out of those functions' bodies. */
#define UST__HOT __attribute__((hot))
#define UST__NOINLINE __attribute__((noinline))
#define UST__INLINE inline __attribute__((always_inline)) /* in the hot path's one body, whatever -Os weighs */

/* ---- errors ---------------------------------------------------------------- */

/* Set the calling thread's last error and return err (so callers write
 * `return ust__error(UST_ECONFIG, "...")`). The arguments may quote
 * ust_last_error() itself. */
int ust__error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ust__clear_error(void);

/* ---- the log sink ------------------------------------------------------------ */

/* Where messages go: the host's callback (ust_set_log), else stderr. One
 * lives in the process context; parts that log hold a borrowed pointer.
 * Never used per intercepted call. */
typedef struct ust__log_sink {
  pthread_mutex_t lock; /* serialises the callback */
  ust_log_cb cb;        /* guarded by lock; NULL: stderr */
  void *user;
  atomic_int max_level; /* messages above it are dropped */
} ust__log_sink;

#define UST__LOG_SINK_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, UST_LOG_WARN}

/* The host's sink and level. Thread-safe. */
void ust__log_sink_set(ust__log_sink *s, ust_log_cb cb, void *user, int max_level);
/* The level only (the config's); the host's callback stays. */
void ust__log_set_level(ust__log_sink *s, int max_level);
/* Format and hand to s; s NULL drops the message. The sink's callback must
 * not call back into understudy's control functions (understudy.h). */
void ust__log(ust__log_sink *s, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- clocks and shares ---------------------------------------------------------- */

uint64_t ust__now_ns(void);  /* CLOCK_MONOTONIC */
uint64_t ust__unix_ms(void); /* wall clock */

/* A share in [0, 1] as a fraction of 2^32, saturating: shares within 2^-33
 * of 1 are UINT32_MAX (all), not a wrapped 0. */
uint32_t ust__share_q32(double p);
/* 1 when the n-th event (1-based) is sampled at share q32: exactly
 * floor(n * q32 / 2^32) of the first n are, spread evenly; UINT32_MAX
 * samples all. */
int ust__sampled(uint64_t n, uint32_t q32);

/* ---- strings and files ------------------------------------------------------------ */

char *ust__strdup(const char *s);
/* Copy src into dst[cap]; returns -1 if it does not fit. */
int ust__copy_name(char *dst, size_t cap, const char *src);
/* Files understudy reads (config, definitions, hardware profiles, state)
 * are at most this large. */
#define UST__FILE_MAX (16u << 20)

/* The whole of a regular file of at most max bytes, as a new NUL-terminated
 * string (free with free); NULL with errno set (ENOENT: missing) and the
 * thread's last error naming path: not a regular file (a FIFO, a device: it
 * is opened without blocking and never read), larger than max, unreadable. */
char *ust__read_file(const char *path, size_t max, size_t *len_out);
/* The same for a text file (JSON): one holding a NUL byte is refused too
 * (a C string would end there, leaving the rest unread). */
char *ust__read_text_file(const char *path, size_t max);

struct cJSON;
/* Parse text as one JSON value and nothing else: trailing bytes, a string
 * that holds a NUL character (\u0000), a key given twice in one object and
 * nesting deeper than cJSON's limit are errors (UST_ECONFIG or kind, message
 * "WHAT: ..." with the offset).
 * Linear in the text's size. Returns a new tree (cJSON_Delete) or NULL. */
struct cJSON *ust__json_parse(const char *text, const char *what, int kind);
/* Replace path with text atomically: a temp file beside it, fsync, rename.
 * Errors (UST_EIO) start with what ("report", "state file"). */
int ust__write_file_atomic(const char *path, const char *text, const char *what);

/* Read every *.json file of dir (hidden ones left out), sorted by name, and
 * hand each to cb with its path and text (borrowed for the call), its index
 * and the number of files. Stops at cb's first error and returns it;
 * UST_EPROBLEM naming `what` and the directory when it cannot be read or
 * holds no *.json file. */
typedef int (*ust__json_file_cb)(const char *path, const char *text, int index, int count, void *ctx);
int ust__load_json_dir(const char *dir, const char *what, ust__json_file_cb cb, void *ctx);

#endif /* UST_BASE_H */
