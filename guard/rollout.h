/*
 * The rollout state machine (guard/rollout.c): a route's mode, how it
 * changes, and the table of per-key modes kept across restarts.
 * Internal header: never installed.
 */
#ifndef UST_GUARD_ROLLOUT_H
#define UST_GUARD_ROLLOUT_H

#include <stdatomic.h>
#include <stdint.h>

#include "guard/verify.h"

/* ---- rollout (guard/rollout.c) ---------------------------------------------------- */

typedef struct ust__rollout ust__rollout;
struct ust__rollout_entry;

/* The rollout part of a route. Its mode word is read lock-free per call;
 * every change happens under the table's lock. */
typedef struct ust__route_rollout {
  ust__rollout *table;                  /* borrowed */
  const char *key;                      /* the route's shape key; borrowed from the route */
  const ust__cand *cand;                /* the candidate targeting the route's binding, or NULL */
  _Atomic(const ust__policy *) *policy; /* its operator's published policy */
  ust__figs *figs;                      /* the route's figures (speedups), borrowed */
  atomic_uint_fast64_t word;            /* 0: follows the operator; else (mode + 1) | canary_q32 << 32 */
  atomic_uint_fast64_t served_cand;     /* calls whose results the candidate served */
  atomic_uint_fast64_t served_cand_verified;
  atomic_uint_fast64_t served_unlearned; /* candidate calls production served: no layout learned yet */
  atomic_uint_fast64_t captured_cand;   /* graph captures of the candidate (the rest captured production) */
  atomic_uint_fast64_t stage_passes;    /* passing verifications since the last transition */
  atomic_int qualified;                 /* the candidate passed a verification on copies of the arguments since
                                           its last rollback: it may serve */
  atomic_uint_fast64_t transitions;
  _Atomic(ust__evidence *) evidence;    /* the last rollback's, with the earlier ones behind it; owned */
  struct ust__rollout_entry *entry;     /* its row of the table; under the table's lock */
  double *samples;                      /* the stage's paired log-ratios (promotion); under the table's lock */
  int n_samples, cap_samples;
  double *aa;                           /* the A/A pairs' ln(T_second / T_first) (a ring of the newest); under the lock */
  int n_aa, cap_aa;                     /* pairs seen, room kept */
  double aa_spread;                     /* ust__seq_aa_spread of the pairs kept when n_aa was aa_spread_at */
  int aa_spread_at;
  ust__seq_kcache kstar;                /* k* for the stage's samples (scorer/seqtest.c); under the lock */
  uint64_t seen_at_init;                /* its row's transitions when the route was made */
} ust__route_rollout;

/* A route's own mode as the state file keeps it; strings borrowed. */
typedef struct ust__rollout_row {
  const char *key;
  int mode;              /* ust__mode; -1: none of its own (a row kept for its decision) */
  double canary;         /* canary mode's share */
  const char *reason;
  const char *candidate; /* the candidate identity the mode was given for */
  uint64_t unix_ms;
  const char *decision;  /* the promotion's last decision short of a move: "rejected", "inconclusive",
                            "dry_run"; "" none */
  const char *evidence;  /* its evidence (n, median ratio, the sequence's ends, delta, alpha) */
} ust__rollout_row;

/* lock: the engine's lock for changes (borrowed); every function below that
 * changes or reads the table takes it, briefly, and logs only after
 * releasing it. */
int ust__rollout_create(pthread_mutex_t *lock, ust__log_sink *log, ust__rollout **out);
void ust__rollout_destroy(ust__rollout *t);
/* A mode the config gives a key (not state: not written back). */
int ust__rollout_seed(ust__rollout *t, const char *key, int mode, double canary);
/* A row of the state file. A row that runs a candidate (shadow and beyond)
 * without naming its identity is left out (and said in the log): a saved
 * mode only ever returns to the candidate it was given for. */
int ust__rollout_restore(ust__rollout *t, const ust__rollout_row *row);

/* A new route's part: zeroed, then its mode from the table (if its key has
 * one). Before the route is published. */
void ust__rollout_route_init(ust__route_rollout *p, ust__rollout *t, const char *key, const ust__cand *cand,
                             _Atomic(const ust__policy *) *policy, ust__figs *figs);
/* Once the route is published: it joins its row, and a mode set for its key
 * since init is applied. */
void ust__rollout_route_published(ust__route_rollout *p);
/* The effective mode (ust__mode) and canary share. Lock-free. */
int ust__rollout_mode(const ust__route_rollout *p, uint32_t *canary_q32);
/* Give the route its own mode; by: "manual", "policy", "config". */
int ust__rollout_set(ust__route_rollout *p, int mode, double canary, const char *by, const char *reason);
/* The same by key, for a route that may not exist yet (it takes the mode when
 * created); cand: the identity of the candidate its binding would run ("" or
 * NULL: none). A key the table has no row for creates one only while fewer
 * than max_keys rows exist (UST_EFULL past it). */
int ust__rollout_set_key(ust__rollout *t, const char *key, const char *cand, int mode, double canary,
                         const char *by, const char *reason, int max_keys);
/* A verified failure: the first rolls the route back and keeps ev as its
 * evidence; later ones (the route already rolled back) only free ev. */
void ust__rollout_roll_back(ust__route_rollout *p, ust__evidence *ev);
/* A passing verification begun in stage: the promotion policy. on_copies:
 * the candidate ran on copies of the arguments (shadow), which qualifies it
 * to serve. log_ratio: ln(T_candidate / T_production) of the call, NAN when
 * it was not timed on both sides (not a sample then). */
void ust__rollout_passed(ust__route_rollout *p, uint64_t stage, int on_copies, double log_ratio);
/* An A/A pair's ln(T_second / T_first), production run twice side by side
 * on this route: their spread widens the promotion's delta, and with A/A
 * on (guard.aa_sample) the test decides nothing before UST__AA_MIN pairs. */
void ust__rollout_aa(ust__route_rollout *p, double log_ratio);
#define UST__AA_MIN 8
#define UST__AA_KEPT 1024
/* A pass on copies of the arguments that cannot count toward promotion (a
 * replay's: no times): it qualifies the candidate to serve, unless the
 * route was rolled back. */
void ust__rollout_qualify(ust__route_rollout *p);
/* 1 once the candidate may serve the route's calls (it qualified). */
int ust__rollout_qualified(const ust__route_rollout *p);
/* A call's notes from its decision (UST__NOTE_*); capturing: it was captured. */
void ust__rollout_served(ust__route_rollout *p, int notes, int capturing);

/* A plain copy of a route's rollout for the report. */
typedef struct ust__rollout_snap {
  int mode;                /* effective */
  double canary;           /* its share, in canary mode */
  int qualified;           /* the candidate may serve */
  int own;                 /* 1: the route has its own mode; 0: it follows its operator */
  uint64_t served_cand, served_cand_verified, served_unlearned, captured_cand, transitions, stage_passes;
  int has_last;
  char last_from[16], last_to[16], last_by[16], last_reason[160];
  uint64_t last_unix_ms;
  char promotion_state[16]; /* "idle", "collecting", "testing", "rejected", "inconclusive", "dry_run", "live",
                               "rolled_back"; "" none */
  char promotion_note[200];
  int promotion_needed;
  double promotion_min_speedup;
  ust__promotion promotion;  /* the policy judged against */
  ust__seq_verdict promotion_test; /* the stage's samples now (n 0: none) */
  double promotion_delta;          /* the delta judged with: the policy's, or the A/A spread when larger */
  double aa_spread;                /* expm1(median |ln(T_second / T_first)|) of the A/A pairs; -1 fewer than
                                      UST__AA_MIN */
  int aa_samples;
  const ust__evidence *evidence; /* borrowed: evidence is never freed while the route lives */
} ust__rollout_snap;

void ust__rollout_snapshot(ust__route_rollout *p, ust__rollout_snap *out);
/* Evidence chains are freed with the route. */
void ust__rollout_route_free(ust__route_rollout *p);

/* The state to save, if a change is not saved yet: *rows (free with free)
 * holds *n rows whose strings live in the same block. 0 with *rows NULL when
 * nothing changed. A failed write calls ust__rollout_unsaved. */
int ust__rollout_take_changes(ust__rollout *t, ust__rollout_row **rows, int *n);
void ust__rollout_unsaved(ust__rollout *t);

#endif /* UST_GUARD_ROLLOUT_H */
