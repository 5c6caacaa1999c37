/*
 * Modes and the operators' published policies: what a call of an operator
 * reads about how it is served.
 * Internal header: never installed.
 */
#ifndef UST_GUARD_POLICY_H
#define UST_GUARD_POLICY_H

#include <stdint.h>

#include "base/base.h"

/* ---- modes and policies ------------------------------------------------------- */

typedef enum ust__mode {
  UST__MODE_OFF = 0,
  UST__MODE_OBSERVE = 1,
  UST__MODE_SHADOW = 2,      /* observe, and run the candidate beside production on sampled calls */
  UST__MODE_CANARY = 3,      /* the candidate serves a fraction of the calls, a sample of them verified */
  UST__MODE_LIVE = 4,        /* the candidate serves every call, a sample of them verified */
  UST__MODE_ROLLED_BACK = 5, /* a route's verdict: production serves, the candidate no longer runs */
} ust__mode;

/* off, observe, shadow, canary, live (and rolled_back when allow_rolled_back). */
int ust__mode_parse(const char *s, int *mode);
int ust__mode_parse_any(const char *s, int *mode, int allow_rolled_back);
const char *ust__mode_name(int mode);

/* The promotion policy of an operator's routes: shadow -> canary(canary) ->
 * live, each step after min_verified passing verifications in the stage and
 * a sequential test on the paired times of the stage's verified calls
 * (r = ln(T_candidate / T_production) of the same call) whose confidence
 * sequence for the median of r lies below ln(1 - delta) and below
 * -ln(min_speedup); one lying above ln(1 + delta) rejects the candidate
 * ("slower"), max_samples undecided ends "inconclusive". With dry_run the
 * step is recorded, not taken. */
typedef struct ust__promotion {
  int enabled;
  int min_verified;
  double min_speedup; /* the effect-size gate; 0: promote on correctness alone, no comparison of speed */
  double canary;
  int dry_run;
  double alpha;       /* the sequential test's error rate (scorer/seqtest.c) */
  double delta;       /* promote when the candidate is faster by more than delta, reject when slower by more */
  int max_samples;    /* paired samples a stage keeps; reaching them undecided is "inconclusive" */
} ust__promotion;

/* An operator's settings as one immutable snapshot: set_mode and reload
 * publish a new one (an atomic pointer swap); a call reads one pointer and
 * sees all fields of the same version. */
typedef struct ust__policy {
  int mode;            /* ust__mode */
  double sample;       /* measured share of calls (timed; shadowed; verified of the candidate's) */
  uint32_t sample_q32;
  /* the share of a key's calls timed once it has had steady_after calls
   * (UINT64_MAX: the share never changes); shadowing keeps sample */
  double sample_steady;
  uint32_t steady_q32;
  uint64_t steady_after;
  double canary;       /* the candidate's share of calls in canary mode */
  uint32_t canary_q32;
  int strict;          /* canary/live: verify before serving (synchronises) */
  ust__promotion promotion;
  /* an operator that observes without a candidate: past a thread's first
   * key_after calls under the engine, one call in key_every (at random) is
   * keyed and stands for key_every calls; the others are tallied on their
   * binding and passed on. 1: every call keyed (a candidate's operator, any
   * mode but observe) */
  uint32_t key_every;
  uint64_t key_after;
} ust__policy;

#endif /* UST_GUARD_POLICY_H */
