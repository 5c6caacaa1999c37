/*
 * The process context and the engine.
 *
 * The context lives as long as the process: the log sink, the seam the
 * bridge installed, the hooks registered with the dispatcher (once per op,
 * never removed; each counts its calls in flight), and the one lock for
 * changes. There is exactly one (plugin/context.c).
 *
 * The engine is everything that exists while understudy is enabled: the
 * config, definitions, operators and their published policies, candidates,
 * bindings, the router (routes, timers, shadow pool, rollout table) and the
 * worker. Created by enable, unpublished by disable, freed when its last
 * reference is dropped (a report or metrics scrape may still hold one).
 *
 * Locks: `life` serialises enable and disable (and is never taken by
 * anything else); `lock` is the lock for changes: the published engine, set
 * mode, reload, the rollout table. It is held briefly, never across a
 * candidate call, a device synchronisation or file I/O; messages said under
 * it are logged after it is released.
 */
#ifndef UST_ENGINE_H
#define UST_ENGINE_H

#include "plugin/plugin.h"

typedef struct ust__policy_node {
  struct ust__policy_node *next;
  ust__policy policy;
} ust__policy_node;

/* An operator of the engine: the router's view, its definition, its
 * candidate. */
typedef struct ust__engine_op {
  ust__operator op;
  const ust__problem *problem; /* borrowed from the engine's problem set */
  ust__candidate candidate;    /* kind 0: none */
  UT_hash_handle hh;           /* by name */
} ust__engine_op;

typedef struct ust__engine {
  struct ust__ctx *ctx;
  atomic_int refs;             /* the context's, and each reader's */
  uint64_t gen;                /* this engine's number in the process (ust__policy.engine_gen) */
  ust__config cfg;
  char *config_json;           /* owned: the text enabled with (or last reloaded), for reload's comparison */
  ust__problem_set problems;
  int n_ops;
  ust__engine_op *ops;         /* owned */
  ust__engine_op *ops_by_name; /* uthash head over ops */
  int n_bindings;
  ust__binding *bindings;      /* owned; hooks point at them while enabled */
  ust__binding *bindings_by_name; /* uthash head, by display name */
  ust__hw_ctx hw;
  ust__router router;
  ust__policy_node *policies;  /* every policy published, freed with the engine: readers may hold any */
  uint64_t started_unix_ms;
  uint64_t started_ns; /* the monotonic clock at enable */

  pthread_t worker;
  int worker_started;
  pthread_mutex_t worker_lock;
  pthread_cond_t worker_cond;
  int worker_stop;
  int worker_done;             /* the worker left its loop (said under worker_lock, on worker_cond) */
  int reaping;                 /* disable timed out: the worker finishes it once the calls in flight left */

  /* The report's recent window: the additive figures as they were at the
   * last two window boundaries (the worker rotates them every window_s);
   * a report's window is its figures less the older one. */
  pthread_mutex_t window_lock;
  struct ust__window_base *window_base[2]; /* owned; [0] older, may be NULL */
} ust__engine;

typedef struct ust__ctx {
  pthread_mutex_t life;
  pthread_mutex_t lock;
  pthread_mutex_t reload;      /* reloads take turns (never held with life) */
  ust__engine *engine;         /* the enabled one; guarded by lock */
  ust__log_sink log;
  const ust__seam_i *seam;     /* the bridge's (ust__seam), NULL without torch; set by the first enable */
  ust__hook *hooks;            /* by display; never freed */
  ust__compare_cache compare;
} ust__ctx;

/* The report of e as a new cJSON tree (free with cJSON_Delete), or NULL
 * when memory ran out. Reads routes racily (figures never torn per field)
 * and never blocks a serving thread. */
struct cJSON *ust__report_build(ust__engine *e);
/* Write the report to path atomically: temp file, fsync, rename. */
int ust__report_write_file(ust__engine *e, const char *path);
/* The report's timer section (which timer, the tracer's windows) as a new
 * cJSON object, or NULL when memory ran out. */
struct cJSON *ust__report_timer(ust__engine *e);

/* ---- readings: a route's additive figures as the derivation reads them (readings.c) ---- */

/* One shape key. Built by ust__reading_of_snap or ust__reading_of_json; its
 * in.lat and in.clat point into the reading itself (ust__reading_link again
 * after moving one). */
typedef struct ust__reading {
  const char *key;              /* borrowed from the snapshot or the report */
  const char *mode;             /* borrowed, or a static name */
  ust__derive_in in;
  ust__hist_sparse lat, clat;   /* owned */
  int has_lat, has_clat;
  /* the figures the metrics count beside the derivation's */
  double timing_dropped, roof_unscored, passed, skipped, unverifiable, overdue, bytes_copied, aa_runs, aa_mismatching;
  double served_prod, served_cand_verified, captured_cand, transitions;
} ust__reading;

/* A route of e from its snapshot s; s's histograms move into the reading. */
void ust__reading_of_snap(const ust__engine *e, ust__route_snap *s, ust__reading *r);
/* A report's shape sh of its operator number op. 0, or UST_ENOMEM (free r either way). */
int ust__reading_of_json(const struct cJSON *sh, int op, ust__reading *r);
/* A report's histogram object (its buckets in any order, repeats added) as a sparse histogram. */
int ust__sparse_of_json(const struct cJSON *lat, ust__hist_sparse *out);
void ust__reading_link(ust__reading *r);
void ust__reading_free(ust__reading *r);
/* Frees n readings and the array. */
void ust__readings_free(ust__reading *r, int n);
/* ust__derive over readings (their operators in [0, n_ops)). */
int ust__derive_readings(const ust__reading *r, int n, double replay_scale, ust__derive_shape *shapes,
                         ust__derive_op *ops, int n_ops, ust__derive_totals *tot);
/* The index of op in e->ops, or -1. */
int ust__engine_op_index(const ust__engine *e, const ust__operator *op);

/* ---- the metrics' figures (metrics.c) --------------------------------------------------- */

/* ust_metrics_read from e's routes, or from a report (report_json, borrowed). */
int ust__metrics_read_engine(ust_metrics *m, ust__engine *e, char **out);
int ust__metrics_read_report(ust_metrics *m, const char *report_json, char **out);

/* ---- the report's recent window (window.c) --------------------------------------------- */

/* The additive figures of every route at one moment. */
typedef struct ust__window_base ust__window_base;

/* Starts a new report window: the figures now become the newer boundary,
 * the older one is dropped (the worker, every report.window_s). */
void ust__window_rotate(ust__engine *e);
void ust__window_base_free(ust__window_base *b);
/* The window of the readings now[0..n): each less its figures in e's older
 * boundary (since enable without one), the keys without a call or a replay
 * in between left out. *out: a new array of *n_out readings (free with
 * ust__readings_free); their operators are now's. *since_unix_ms: where the
 * window begins; *replay_scale: what a replay seen in the tracer's windows
 * within it stands for. timer_window_ns, timer_elapsed_ns: the tracer's
 * window time and the time since enable, now. 0, or UST_ENOMEM. */
int ust__window_readings(ust__engine *e, const ust__reading *now, int n, double timer_window_ns,
                         double timer_elapsed_ns, ust__reading **out, int *n_out, double *since_unix_ms,
                         double *replay_scale);

/* plugin/report_sources.c: the candidate as a route names it (its
 * source's label, else its name); its source and "when" added to its
 * report object jc; a route's served_by and fallback objects (new cJSON
 * trees, NULL when memory ran out). */
const char *ust__report_cand_label(const ust__cand *c);
void ust__report_source(struct cJSON *jc, const ust__cand *c);
struct cJSON *ust__report_served_by(const ust__route_snap *s);
/* Who serves the route now (served_by.now): "production", "candidate" or
 * "both" (canary). */
const char *ust__report_served_now(const ust__route_snap *s);
struct cJSON *ust__report_fallback(const ust__route_snap *s);
/* A route's rollout and its candidate's calls in flight (plugin/report_route.c). */
struct cJSON *ust__report_rollout(const ust__route_snap *s);
struct cJSON *ust__report_flight(const ust__flight_snap *f);

#endif /* UST_ENGINE_H */
