/*
 * The engine: everything that exists while understudy is enabled. Created by
 * ust_enable, destroyed by ust_disable; one at a time.
 */
#ifndef UST_ENGINE_H
#define UST_ENGINE_H

#include "dispatch/dispatch.h"
#include "plugin/plugin.h"

typedef struct ust__engine {
  ust__config cfg;
  char *config_json;           /* owned: the text enabled with (or last reloaded), for reload's comparison */
  ust__problem_set problems;
  int n_ops;
  ust__operator *ops;          /* owned */
  ust__operator *ops_by_name;  /* uthash head over ops */
  ust__candidate *cands;       /* owned, one per operator (kind 0: none) */
  int n_bindings;
  ust__binding *bindings;      /* owned; the bridge borrows pointers into it */
  ust__binding *bindings_by_name; /* uthash head over bindings, by display name */
  ust__route_table routes;
  ust__hw_ctx hw;              /* hardware profiles; bindings borrow it */
  uint64_t started_unix_ms;

  pthread_t worker;
  int worker_started;
  pthread_mutex_t worker_lock;
  pthread_cond_t worker_cond;
  int worker_stop;
} ust__engine;

uint64_t ust__internal_errors(void);

/* The JSON report of e as a new cJSON tree (free with cJSON_Delete), or NULL
 * when memory ran out. Reads counters racily: figures are a consistent-
 * enough snapshot, never torn per field. */
struct cJSON *ust__report_build(ust__engine *e);
/* Write the report to path atomically: temp file, fsync, rename. */
int ust__report_write_file(ust__engine *e, const char *path);

#endif /* UST_ENGINE_H */
