/*
 * What verifications found: the guard's part of a route (ust__verify), and
 * the evidence of a failure.
 * Internal header: never installed.
 */
#ifndef UST_GUARD_VERIFY_H
#define UST_GUARD_VERIFY_H

#include <stdatomic.h>
#include <stdint.h>

#include "guard/cand.h"
#include "guard/compare.h"
#include "scorer/scorer.h"

/* ---- what verifications found: the guard's part of a route ----------------------- */

/* Why a sampled call went without a verdict. */
typedef enum ust__skip {
  UST__SKIP_NO_SLOT = 0, /* every shadow slot was in flight */
  UST__SKIP_ERROR,       /* production raised, or understudy's own work failed */
  UST__SKIP_BUDGET,      /* the candidate is over the shadow budget on this route */
  UST__SKIP_CAPTURE,     /* called while a CUDA graph was captured */
  UST__SKIP_COUNT
} ust__skip;

const char *ust__skip_name(int reason);

typedef struct ust__verify {
  atomic_uint_fast64_t calls;        /* shadow calls that took a slot; each ends verified, skipped or unverifiable */
  atomic_uint_fast64_t verified;     /* reached a verdict */
  atomic_uint_fast64_t passed;
  atomic_uint_fast64_t failed;
  atomic_uint_fast64_t skipped_by[UST__SKIP_COUNT]; /* sampled, but no verdict, by reason (ust__skip) */
  atomic_uint_fast64_t unverifiable; /* ran, but an output's dtype cannot be compared */
  atomic_uint_fast64_t aa_runs;      /* A/A checks: production against itself */
  atomic_uint_fast64_t aa_mismatching;
  atomic_uint_fast64_t max_abs_bits, max_rel_bits;       /* over passing verifications */
  atomic_uint_fast64_t aa_max_abs_bits, aa_max_rel_bits; /* production's own spread */
  atomic_uint_fast64_t bytes_copied; /* by understudy for these calls: snapshots, the candidate's private inputs */
  atomic_uint_fast64_t overdue;      /* candidate calls (verified or not) longer than the deadline */
  atomic_uint_fast64_t proc_passed;  /* verifications that passed with the candidate in its own process */
  atomic_int paused;                 /* shadowing stopped: the candidate is over the shadow budget */
  atomic_uint_fast64_t paused_ratio_milli; /* its median over production's when it stopped, x1000 */
  atomic_uint_fast64_t graph_shadowed; /* captured calls whose graph holds their shadow (guard/graph.c) */
  atomic_uint_fast64_t graph_plain;    /* captured calls whose graph holds production alone */
  atomic_uint_fast64_t graph_beside;   /* of the shadowed: verify-only, beside the chain (guard/graph.c) */
  atomic_int graph_why;                /* why the last of those did (ust__graph_why) */
  atomic_uint_fast64_t graph_ungated;  /* of the shadowed, started by the host: left out of an executable graph's
                                          gating (its binding failed, or was given back): production alone there */
  atomic_uint_fast64_t graph_dropped;  /* replays' ring entries dropped, not judged: a captured call of the route
                                          changed in place (ust__verdict_sink_i.replays_stale) */
  atomic_uint_fast64_t graph_exposed;  /* captured calls in a graph whose raw handle was handed to code outside
                                          understudy (ust__graphs_exposed): production alone in its replays */
} ust__verify;

const char *ust__graph_why_text(int why);
/* Count a captured call as holding production alone, for why. */
void ust__verify_graph_plain(ust__verify *v, int why);

typedef struct ust__verify_snap {
  uint64_t calls, verified, passed, failed, skipped, unverifiable, aa_runs, aa_mismatching;
  uint64_t skipped_by[UST__SKIP_COUNT];
  double max_abs, max_rel, aa_max_abs, aa_max_rel;
  uint64_t bytes_copied, overdue, proc_passed;
  int paused;
  double paused_ratio;
  uint64_t graph_shadowed, graph_plain, graph_beside, graph_ungated, graph_dropped, graph_exposed;
  int graph_why;
} ust__verify_snap;

/* The shadow budget: after at least 5 timed verifications, a candidate whose
 * median time is more than max_slowdown times production's is not shadowed
 * on that route any more (serving routes keep verifying their sample).
 * Returns 1 when this call paused it. */
int ust__verify_budget(ust__verify *v, ust__figs *f, double max_slowdown);

/* A candidate call longer than its deadline (verified or not). */
void ust__verify_overdue(ust__verify *v);
/* A captured call whose graph holds its shadow (beside: verify-only, beside
 * the chain). */
void ust__verify_graph_shadowed(ust__verify *v, int beside);
/* A shadow call that failed before any comparison (the candidate raised or
 * returned an error while captured): a call verified and failed. Returns its
 * number among the route's shadow calls, for the evidence. */
uint64_t ust__verify_failed_call(ust__verify *v);
/* A sampled call that went without a verdict, for reason (ust__skip). */
void ust__verify_skipped(ust__verify *v, int reason);
void ust__verify_snapshot(ust__verify *v, ust__verify_snap *out);

/* What rolled a route back. Built by whoever concluded the failing call,
 * then owned by the route's rollout part. */
typedef struct ust__evidence {
  struct ust__evidence *prev; /* the route's previous rollback, when it was set back by hand since */
  uint64_t shadow_call;       /* 1-based number of the failing shadow call on its route; 0 unverified serving */
  int serving;                /* the failing call was a verification of the candidate serving */
  uint64_t served_at;         /* the route's served calls when the failing call began */
  uint64_t served_before_verdict; /* calls the candidate served from the failing one until the rollback */
  uint64_t unix_ms;
  char reason[32];            /* mismatch, nonfinite, wrote input, shape, dtype, stride, device, error, raised, schema,
                                 restored */
  char output[80];            /* the output that failed: argument name or "result N" */
  char message[256];
  int has_stats;
  ust__cmp_stats stats;
  double atol, rtol;
  int ndim;
  int64_t shape[8];
  int64_t first_index[8];     /* the first mismatching element, per dimension */
} ust__evidence;

#endif /* UST_GUARD_VERIFY_H */
