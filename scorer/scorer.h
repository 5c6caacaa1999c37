/*
 * scorer/: the arithmetic of figures. Mergeable latency histograms, roofline
 * expressions, hardware profiles and floors, a route's figures (the part of
 * a route the scorer owns), and the rules that derive quantiles, device-time
 * estimates, weights and S from additive figures. Pure: it includes nothing
 * but base/, knows nothing of calls, routes or the engine.
 *
 * Histograms are log-bucketed with 16 sub-buckets per power of two (the
 * representative value of a bucket is within 1/32 of any value in it), so
 * histograms from many processes merge exactly by adding counts.
 *
 * Internal header: never installed.
 */
#ifndef UST_SCORER_H
#define UST_SCORER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define UST__HIST_SUB_BITS 4
#define UST__HIST_SUB (1u << UST__HIST_SUB_BITS)
#define UST__HIST_BUCKETS (UST__HIST_SUB + (64 - UST__HIST_SUB_BITS) * UST__HIST_SUB)
#define UST__HIST_SCHEME "log2-sub16-ns"

/* Concurrent histogram: record from any thread, read racily for reports. */
typedef struct ust__hist {
  atomic_uint_fast64_t *buckets; /* UST__HIST_BUCKETS counts, owned */
  atomic_uint_fast64_t count;
  atomic_uint_fast64_t sum;      /* ns */
} ust__hist;

/* A plain snapshot used for merging, quantiles and tests. */
typedef struct ust__hist_snap {
  uint64_t buckets[UST__HIST_BUCKETS];
  uint64_t count;
  uint64_t sum;
} ust__hist_snap;

int ust__hist_init(ust__hist *h);
void ust__hist_free(ust__hist *h);
void ust__hist_record(ust__hist *h, uint64_t ns);
void ust__hist_snapshot(const ust__hist *h, ust__hist_snap *out);

uint32_t ust__hist_index(uint64_t v);
uint64_t ust__hist_lower(uint32_t idx);
uint64_t ust__hist_width(uint32_t idx);
/* The q-quantile of a live histogram, read racily (no copy). */
double ust__hist_quantile_live(ust__hist *h, double q);
/* Add src into dst: exact. */
void ust__hist_merge(ust__hist_snap *dst, const ust__hist_snap *src);
/* The q-quantile (0 < q <= 1) as the representative value of the bucket that
 * holds rank ceil(q * count); 0 for an empty histogram. */
double ust__hist_quantile(const ust__hist_snap *s, double q);

/* ---- roofline expressions ---------------------------------------------------
 *
 * W (FLOPs) and Q (bytes) of an operator are expressions over the call's
 * dimensions, compiled once and evaluated per shape key without Python:
 *
 *   expr    := term (('+' | '-') term)*
 *   term    := unary (('*' | '/' | '%') unary)*
 *   unary   := ('-' | '+') unary | power
 *   power   := primary ('^' unary)?
 *   primary := NUMBER | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'
 *
 * NAME is one of the variables given at compile time; the functions are
 * min, max (two or more arguments), ceil, floor, abs (one), cdiv(a, b)
 * (ceil(a / b)). Evaluation is in double: integers are exact up to 2^53.
 * The program is bounded (1024 characters, 256 steps, nesting 64), so any
 * input compiles or fails in bounded time and memory. */

typedef struct ust__expr ust__expr;

/* Compile text against the variable names (borrowed). On success *out is a
 * new program (free with ust__expr_free); on error returns UST_EPROBLEM with
 * a message that quotes the text and the position. */
int ust__expr_compile(const char *text, const char *const *vars, int n_vars, ust__expr **out);
/* Evaluate with values[i] for vars[i]. Returns UST_EINVAL (message names
 * the expression) for a division by zero or a non-finite result. */
int ust__expr_eval(const ust__expr *e, const double *values, double *out);
/* The same without setting the thread's last error: for the per-call path. */
int ust__expr_eval_quiet(const ust__expr *e, const double *values, double *out);
void ust__expr_free(ust__expr *e);

/* ---- hardware profiles (problems/hardware/NAME.json) ------------------------
 *
 * Dense peak rates per execution path and the memory bandwidth, picked by
 * the device's name. The paths are named after the W buckets of an
 * operator's FLOPs: bf16, fp16, fp8_e4m3 (every 8-bit float), tf32, fp32,
 * int8 (integer multiply-adds, counted as operations per second). */

enum {
  UST__PATH_BF16 = 0,
  UST__PATH_FP16,
  UST__PATH_FP8_E4M3,
  UST__PATH_TF32,
  UST__PATH_FP32,
  UST__PATH_INT8,
  UST__N_PATHS
};
const char *ust__path_name(int path);
/* -1 for an unknown name. */
int ust__path_parse(const char *name);
/* The path W on tensors of dtype dt (ust__dtype) is booked on; -1 for fp64
 * and integer types other than int8 (no peak in the profiles, so not
 * scored). */
int ust__path_of_dtype(int dt);

#define UST__HW_MAX_MATCH 8

typedef struct ust__hw_profile {
  char name[64];
  int n_match;
  char match[UST__HW_MAX_MATCH][64]; /* whole words of the device name that select this profile */
  int n_exclude;
  char exclude[UST__HW_MAX_MATCH][64]; /* whole words that rule it out ("NVL", "PCIe": other SKUs) */
  double p_peak[UST__N_PATHS];       /* FLOP/s; 0: the device has no such path */
  double b_peak;                     /* bytes/s */
  char *source;                      /* owned */
  char *path;                        /* owned: the file it came from */
} ust__hw_profile;

typedef struct ust__hw_set {
  int n;
  ust__hw_profile *items; /* owned */
} ust__hw_set;

/* Parse one profile; text and path borrowed. Errors are UST_EPROBLEM naming
 * path and field. */
int ust__hw_parse(const char *text, const char *path, ust__hw_profile *out);
/* Every *.json of dir. */
int ust__hw_load_dir(const char *dir, ust__hw_set *out);
void ust__hw_free(ust__hw_set *set);
/* The profile whose match words appear as whole words in device_name and
 * whose exclude words do not ("NVIDIA H200" picks H200, not H20; "NVIDIA
 * H200 NVL" not the SXM profile); the longest match wins; NULL when none. */
const ust__hw_profile *ust__hw_pick(const ust__hw_set *set, const char *device_name);
/* The host's CPU model name ("model name" of /proc/cpuinfo) into buf; 0, or
 * -1 when there is none. */
int ust__host_cpu_name(char *buf, size_t cap);

/* The roofline floor of one call: T_SOL = max(sum_d W[d] / P[d], Q / B), in
 * seconds (the Atrex-Bench evaluator's hybrid rule). W on a path the profile
 * lacks is an error (UST_EINVAL naming the path). */
int ust__roofline_tsol(const ust__hw_profile *hw, const double w[UST__N_PATHS], double q_bytes, double *seconds);
/* The same without setting the thread's last error: for the per-call path. */
int ust__roofline_tsol_quiet(const ust__hw_profile *hw, const double w[UST__N_PATHS], double q_bytes,
                             double *seconds);

/* ---- a route's figures ---------------------------------------------------------
 *
 * The scorer's part of a route: written from any thread by the calls that
 * update it (the router's, the timers' and the verdict sink's), read racily
 * for reports through ust__figs_snapshot. */

typedef struct ust__roof_sums {
  atomic_uint_fast64_t calls;   /* timed calls whose floor is known */
  atomic_uint_fast64_t tsol_ps; /* sum of their T_SOL */
  atomic_uint_fast64_t time_ns; /* sum of their measured times */
} ust__roof_sums;

#define UST__FIGS_KERNEL_NAMES 4

typedef struct ust__figs {
  atomic_uint_fast64_t calls;          /* every call on the route */
  /* of those, the ones not seen one by one: a call keyed at random stands
   * for key_every calls (ust__binding_admit), all but itself counted here */
  atomic_uint_fast64_t estimated;
  atomic_uint_fast64_t captured;       /* calls made while the stream captured a graph */
  atomic_uint_fast64_t timing_dropped; /* sampled, but no figure: no timer free, or one of the two below */
  atomic_uint_fast64_t kernel_lost;    /* of those, timed by the kernel tracer: a kernel record never came */
  atomic_uint_fast64_t pair_failed;    /* of those, an event pair the device could not time */
  ust__hist hist;                      /* production's latency, ns (the timed calls) */
  /* of those, the key's first calls, timed whatever the sampling: kept apart
   * so that a slow first call (a kernel compiled, a plan tuned) does not
   * stand for the sampled ones in the device-time estimate */
  atomic_uint_fast64_t first_timed, first_time_ns;
  /* of the timed calls, those after the key's first steady_after calls
   * (sampled at the steady share, shadowed, verified): the estimate's late
   * stratum; and of the captured calls, those after the first steady_after */
  atomic_uint_fast64_t steady_timed, steady_time_ns, late_captured;
  /* of the timed calls, those timed by their kernels (a kernel tracer: the
   * sum of their kernels' durations), and the sum of those kernels' spans
   * (first start to last end); the others were timed by events or the host
   * clock around the call */
  atomic_uint_fast64_t kernel_timed, kernel_span_ns;
  atomic_uint_fast64_t kernels; /* the kernels those calls ran */
  /* of the timed calls, those whose figure is a held event pair
   * (dispatch/hold.h): the call's work run back to back, less what the pair
   * adds; and the held calls whose hold gave up (their samples dropped) */
  atomic_uint_fast64_t held_timed, hold_expired;
  /* calls run by a graph replay (captured once, run again without the
   * dispatcher), seen by the kernel tracer; each is also a timed call */
  atomic_uint_fast64_t replayed;
  /* kernels of the names production's calls ran, run by graphs no bound op
   * was seen captured into (captured before enable(), or while it was
   * off): their replays are seen by name only, neither timed as calls,
   * verified nor routed; and their summed durations */
  atomic_uint_fast64_t unseen_kernels, unseen_ns;
  /* the names of the kernels production ran in its eager calls, as the
   * kernel tracer saw them (the tracer's strings, which live as long as the
   * process): the first UST__FIGS_KERNEL_NAMES, each once */
  _Atomic(const char *) kernel_names[UST__FIGS_KERNEL_NAMES];
  /* captured calls of its whose nodes a graph library changed in place in
   * an executable graph (a node's parameters set, or the executable graph
   * updated from another graph), seen by the kernel tracer's callbacks:
   * those replays may not run what was captured */
  atomic_uint_fast64_t graph_changed;
  _Atomic(const struct ust__hw_profile *) hw; /* the profile of the last scored call */
  atomic_uint_fast64_t unscored;       /* timed calls whose floor could not be computed */
  atomic_uint_fast64_t nested_scored;  /* timed calls floored by the bound ops they called (see callview.h) */
  ust__roof_sums prod;
  ust__roof_sums cand;                 /* the candidate's, over its passing verifications */
  ust__hist cand_hist;                 /* the candidate's latency, over verified calls */
  /* W and Q of the calls whose floor was evaluated (doubles as bits: a big
   * GEMM's FLOPs overflow an integer sum within a day of traffic) */
  atomic_uint_fast64_t work_calls;
  _Atomic uint64_t flops_bits, bytes_bits;
} ust__figs;

/* Why a call was timed: the stratum its time belongs to in the estimate. */
enum {
  UST__TIMED_SAMPLED = 0, /* sampled at the key's share (or inside a tracer's window, or shadowed) */
  UST__TIMED_FIRST,       /* one of the key's first calls, timed whatever the sampling */
  UST__TIMED_STEADY,      /* a call after the key's first steady_after (sampled at the steady share, or shadowed) */
};

int ust__figs_init(ust__figs *f);
void ust__figs_free(ust__figs *f);
/* One timed run of production with its floor (0: unknown): the histogram,
 * and the roofline sums when the floor is known; kind: UST__TIMED_*. */
void ust__figs_timed(ust__figs *f, uint64_t ns, uint64_t tsol_ps, int kind);
/* One call timed by its kernels: their summed durations (the call's time)
 * and their span. */
void ust__figs_kernel_time(ust__figs *f, uint64_t sum_ns, uint64_t span_ns, uint32_t kernels, uint64_t tsol_ps,
                           int kind);
void ust__figs_cand_time(ust__figs *f, uint64_t ns, uint64_t tsol_ps, int passed);
/* The profile a scored call ran on; stored only when it changes. */
void ust__figs_note_hw(ust__figs *f, const struct ust__hw_profile *hw);
/* The work of a call whose floor was evaluated: W (FLOPs, every path) and
 * Q (bytes read and written). Thread-safe, lock-free. */
void ust__figs_note_work(ust__figs *f, double flops, double bytes);
/* Correct the work noted (no call counted): a call's floor whose bounded
 * part was replaced once its lengths were read (dispatch/roofcall.h). */
void ust__figs_adjust_work(ust__figs *f, double dflops, double dbytes);

/* Counts of a route's calls, each written here alone (the figures are the
 * scorer's part of a route): inline, as every keyed call's plan runs some.
 * Thread-safe, lock-free. */
/* w more calls on the route; returns its calls after them. Of those, all
 * but one (the call that stands for them) are estimated: counted after the
 * calls, released, so a snapshot that reads estimated first never sees more
 * than its share of calls. */
static inline uint64_t ust__figs_count(ust__figs *f, unsigned w) {
  const uint64_t n = atomic_fetch_add_explicit(&f->calls, w, memory_order_relaxed) + w;
  if (w > 1)
    atomic_fetch_add_explicit(&f->estimated, w - 1, memory_order_release);
  return n;
}
/* A call made while its stream captured a graph (late: past the key's first
 * steady_after calls). */
static inline void ust__figs_captured_call(ust__figs *f, int late) {
  atomic_fetch_add_explicit(&f->captured, 1, memory_order_relaxed);
  if (late)
    atomic_fetch_add_explicit(&f->late_captured, 1, memory_order_relaxed);
}
/* A call sampled for timing that got no figure: no timer was free; its
 * kernel records did not all come (the kernel tracer's); its event pair
 * failed. */
static inline void ust__figs_timing_dropped(ust__figs *f) {
  atomic_fetch_add_explicit(&f->timing_dropped, 1, memory_order_relaxed);
}
static inline void ust__figs_kernel_lost(ust__figs *f) {
  atomic_fetch_add_explicit(&f->kernel_lost, 1, memory_order_relaxed);
  ust__figs_timing_dropped(f);
}
static inline void ust__figs_pair_failed(ust__figs *f) {
  atomic_fetch_add_explicit(&f->pair_failed, 1, memory_order_relaxed);
  ust__figs_timing_dropped(f);
}
/* Of the timed calls, one whose figure is a held event pair (dispatch/hold.h). */
static inline void ust__figs_held(ust__figs *f) { atomic_fetch_add_explicit(&f->held_timed, 1, memory_order_relaxed); }
/* A held call whose hold gave up at its deadline (it synchronised inside,
 * or its host took longer): its sample dropped. */
static inline void ust__figs_hold_expired(ust__figs *f) {
  atomic_fetch_add_explicit(&f->hold_expired, 1, memory_order_relaxed);
}
/* A timed call whose floor could not be computed. */
static inline void ust__figs_unscored(ust__figs *f) { atomic_fetch_add_explicit(&f->unscored, 1, memory_order_relaxed); }
/* A timed call floored by the bound ops it called. */
static inline void ust__figs_nested_scored(ust__figs *f) {
  atomic_fetch_add_explicit(&f->nested_scored, 1, memory_order_relaxed);
}
/* A call run again by a graph replay (timed by its kernels). */
static inline void ust__figs_replayed(ust__figs *f) { atomic_fetch_add_explicit(&f->replayed, 1, memory_order_relaxed); }
/* A kernel ns long of a name the route's calls ran, run by a graph no bound
 * op was seen captured into. */
/* Production ran a kernel called name in a call of the route (kept once,
 * among the first UST__FIGS_KERNEL_NAMES; name must live as long as the
 * process). */
void ust__figs_kernel_name(ust__figs *f, const char *name);
static inline void ust__figs_unseen_kernel(ust__figs *f, uint64_t ns) {
  atomic_fetch_add_explicit(&f->unseen_kernels, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->unseen_ns, ns, memory_order_relaxed);
}
/* A captured call whose nodes a graph library changed in place. */
static inline void ust__figs_graph_changed(ust__figs *f) {
  atomic_fetch_add_explicit(&f->graph_changed, 1, memory_order_relaxed);
}

/* Production's median latency over the candidate's; 0 when either is empty. */
double ust__figs_speedup(ust__figs *f);

/* A histogram's non-zero buckets, for reports (owned arrays). */
typedef struct ust__hist_sparse {
  uint64_t count, sum;
  int n;
  uint32_t *index; /* owned, ascending */
  uint64_t *counts; /* owned */
} ust__hist_sparse;

int ust__hist_sparse_take(const ust__hist *h, ust__hist_sparse *out);
/* The non-zero buckets of dense (UST__HIST_BUCKETS counts), with sum, into
 * *out (emptied first). 0, or UST_ENOMEM (out left empty). */
int ust__hist_sparse_of_dense(const uint64_t *dense, uint64_t sum, ust__hist_sparse *out);
void ust__hist_sparse_free(ust__hist_sparse *s);
/* ust__hist_quantile's rule over the non-zero buckets. */
double ust__hist_sparse_quantile(const ust__hist_sparse *s, double q);

typedef struct ust__roof_snap {
  uint64_t calls, tsol_ps, time_ns;
} ust__roof_snap;

/* A plain copy of a route's figures. Read in the order the counters grow
 * (captured before calls), so derived differences never go negative. */
typedef struct ust__figs_snap {
  uint64_t captured, timing_dropped, kernel_lost, pair_failed, calls, estimated, unscored, nested_scored;
  uint64_t first_timed, first_time_ns;
  uint64_t steady_timed, steady_time_ns, late_captured;
  uint64_t kernel_timed, kernel_span_ns, kernels, replayed, unseen_kernels, unseen_ns, graph_changed;
  uint64_t held_timed, hold_expired;
  const char *kernel_names[UST__FIGS_KERNEL_NAMES]; /* NULL past the last */
  const struct ust__hw_profile *hw;
  ust__hist_sparse hist, cand_hist;
  ust__roof_snap prod, cand;
  uint64_t work_calls;
  double flops, bytes; /* sums over the work_calls */
} ust__figs_snap;

/* 0, or UST_ENOMEM (free what it took with ust__figs_snap_free either way). */
int ust__figs_snapshot(ust__figs *f, ust__figs_snap *out);
void ust__figs_snap_free(ust__figs_snap *s);

/* ---- derived figures: the one place their rules live ----------------------------
 *
 * Reports carry additive figures (counts, sums, histogram buckets) and these
 * derived ones; a report built in-process and a merge of many reports derive
 * them by the same functions (plugin/report.c, ust_report_derive). */

/* A key's timed calls by stratum (sums in ns), and its calls. */
typedef struct ust__est_in {
  double timed, timed_sum_ns;       /* every timed call (the histogram) */
  double first_timed, first_sum_ns; /* of those, the key's first calls */
  double steady_timed, steady_sum_ns; /* of those, calls after the key's first steady_after */
  double calls, captured;           /* every call; those made during graph capture (not timed) */
  double steady_calls;              /* calls after the key's first steady_after, outside graph capture */
} ust__est_in;

/* A key's device time: each stratum's mean times its calls outside graph
 * capture: the calls after the key's first steady_after (steady_calls) at the
 * mean of those timed there, the others (graph replays among them) at the
 * mean of the sampled ones before. A stratum no sample reached takes
 * the other's mean; a key no sample reached at all, its first calls' mean
 * (they are often slower: a kernel compiled, a plan tuned). */
double ust__est_device_time(const ust__est_in *in);
/* S of a route: the mean T_SOL of its scored calls over the median measured
 * time; -1 when unknown (nothing scored, or no median). */
double ust__route_s(double tsol_sum_ns, double scored_calls, double p50_ns);
/* The median of v[0..n) (sorts v); 0 for n == 0. */
double ust__median(double *v, int n);

/* ---- a report's derived figures from its additive ones (derive.c) ---------------------
 *
 * One derivation for every reader: the JSON report (plugin/report.c reads
 * its shapes into these structs and writes the results back), a merge of
 * reports (the same, from the merged JSON), the report's recent window and
 * the Prometheus metrics (read from a route snapshot, no JSON between). */

#define UST__DERIVE_PHASES 3 /* unknown, prefill, decode: dispatch's UST__N_PHASES */

/* How a route stands under CUDA graphs (the report's graph.status). */
enum {
  UST__GRAPH_NONE = 0,     /* no graph ran it (null) */
  UST__GRAPH_OBSERVED,     /* its captured calls are timed by their replays */
  UST__GRAPH_GATED,        /* its captured calls hold their shadow, decided at each replay */
  UST__GRAPH_OBSERVE_ONLY, /* verdicts do not flow in its replays (the report's graph.reason says why) */
};
const char *ust__graph_status_name(int status); /* "observed", "gated", "observe-only"; NULL for NONE */

/* One shape key's additive figures. */
typedef struct ust__derive_in {
  int op;                /* the index of its operator in the ops array */
  int phase;             /* [0, UST__DERIVE_PHASES) */
  int on_host;           /* timed by the host clock (a CPU key) */
  int has_shadow;        /* its operator has a candidate: shadow and rollout figures */
  int has_roofline;      /* its binding has a roofline: the roof_* figures */
  int rolled_back;       /* its mode is rolled_back */
  const ust__hist_sparse *lat, *clat; /* borrowed; NULL: none (clat: without shadow) */
  double calls, captured, replayed, kernel_timed, held_timed;
  double first_timed, first_time_ns, steady_timed, steady_time_ns, steady_calls;
  double served_cand;    /* calls its candidate served */
  double roof_calls, roof_tsol_ns, roof_time_ns, cand_roof_calls, cand_roof_tsol_ns, cand_roof_time_ns;
  double work_calls, flops, bytes;
  double shadow_calls, verified, failed;
  double unseen_kernels, graph_changed;                           /* its graph figures */
  double graph_plain, graph_ungated, graph_exposed, graph_shadowed; /* its shadow's graph figures */
} ust__derive_in;

/* -1 stands for null (unknown) in the fields that say so. */
typedef struct ust__derive_shape {
  double timed, p50, p90, p99;     /* production's histogram */
  double cand_timed, cand_p50, cand_p90, cand_p99;
  double replayed_est;             /* replays seen in the tracer's windows, scaled to the whole time */
  double est_device_time_ns, weight;
  double speedup;                  /* -1 */
  double S, S_candidate;           /* -1 */
  double tsol_ns_mean, intensity, flops_mean, achieved_flops_s, cand_achieved_flops_s; /* -1 except the mean */
  int above_roof;                  /* S or S_candidate > 1: measured faster than its floor */
  int graph;                       /* UST__GRAPH_* */
} ust__derive_shape;

/* The candidates' headline (candidate_routes): the keys where both arms have
 * an S, the candidates' S and production's over them, each the keys' S
 * weighted by their device time, and the share of the device time they
 * hold. S_agg_candidate counts 0 for every operator without a verified
 * candidate; these compare the two arms where both ran. */
typedef struct ust__derive_cand {
  double routes, device_share;
  double S_candidate, S_production; /* -1 */
  double time_ns, s_cand, s_prod;   /* the sums they are taken from (S times the keys' device time) */
} ust__derive_cand;

typedef struct ust__derive_phase {
  int routes;                      /* 0: the operator had no key in the phase */
  double est_device_time_ns, weight;
  double S, S_candidate;           /* -1 */
} ust__derive_phase;

typedef struct ust__derive_op {
  int has_candidate;               /* in: its S_candidate and coverage are derived */
  double calls, timed, captured, device_time_ns, est_device_time_ns, weight;
  int scored_shapes;
  double S, S_weighted, S_candidate, coverage; /* -1 */
  int above_roof;                  /* its keys above their roof */
  ust__derive_cand candidate_routes; /* with a candidate */
  ust__derive_phase phases[UST__DERIVE_PHASES];
} ust__derive_op;

typedef struct ust__derive_totals {
  int routes;
  double calls, timed, captured, est_device_time_ns, shadow_calls, verified, failed, rollbacks;
  double scored_share, S_agg, S_agg_candidate; /* -1 */
  double above_roof;               /* keys above their roof */
  int any_candidate;               /* an operator has a candidate: candidate_routes stands */
  ust__derive_cand candidate_routes;
  struct {
    double est_device_time_ns, scored_share, S_agg, S_agg_candidate; /* est 0: no call in the phase */
  } phases[UST__DERIVE_PHASES];
} ust__derive_totals;

/* Derive in[0..n) of ops[0..n_ops) (each ops[i].has_candidate set by the
 * caller): shapes[0..n) and ops are written, tot too. replay_scale: what a
 * replay seen in the tracer's windows stands for (elapsed / window time, 1
 * without windows). 0, or UST_ENOMEM. */
int ust__derive(const ust__derive_in *in, int n, double replay_scale, ust__derive_shape *shapes, ust__derive_op *ops,
                int n_ops, ust__derive_totals *tot);

/* ---- the sequential comparison of a candidate with production (seqtest.c) ---------- */

/* ln of the sign-test mixture martingale after n paired samples of which k
 * fell below the threshold (the method is described in seqtest.c). */
double ust__signmix_log(int k, int n);
/* The least k whose martingale reaches 1/alpha after n samples; n + 1 when
 * none can yet. */
int ust__signmix_kstar(int n, double alpha);

enum { UST__SEQ_OPEN = 0, UST__SEQ_FASTER = 1, UST__SEQ_SLOWER = 2 };

/* Where n paired log-ratios r = ln(T_candidate / T_production) put the
 * median: its confidence sequence [lower, upper] at level 1 - alpha (valid
 * however often it is looked at), the sample median, and the decision:
 * FASTER when upper < c_fast, SLOWER when lower > c_slow, else OPEN. r is
 * borrowed; an end not yet reached is -/+INFINITY. */
typedef struct ust__seq_verdict {
  int n;
  double median, lower, upper;
  int decision;
} ust__seq_verdict;
void ust__seq_judge(const double *r, int n, double alpha, double c_fast, double c_slow, ust__seq_verdict *out);
/* ust__seq_judge's decision alone, from the counts beyond the thresholds
 * (no sort): cheap enough to take at every sample. */
int ust__seq_check(const double *r, int n, double alpha, double c_fast, double c_slow);

/* k* of ust__signmix_kstar for n samples, from the one for n - 1 that c
 * holds (k*(n) is k*(n-1) or one more: one evaluation); any other n or
 * alpha computes it afresh. c starts zeroed; owned by the caller. */
typedef struct ust__seq_kcache {
  int n, k;
  double alpha;
} ust__seq_kcache;
int ust__seq_kstar(ust__seq_kcache *c, int n, double alpha);

/* A promotion's rule as the test reads it (the policy's numbers). */
typedef struct ust__seq_rule {
  double alpha;       /* error rate: each one-sided sequence at alpha / 2 */
  double delta;       /* the smallest difference that counts, before production's own spread widens it */
  double min_speedup; /* > 0: the speed-up to prove as well */
  int max_samples;    /* undecided there: inconclusive */
  int aa_min;         /* A/A pairs needed before any decision; 0: none asked (A/A off) */
} ust__seq_rule;

enum { UST__SEQ_INCONCLUSIVE = 3 };
/* Why a test ended inconclusive. */
enum {
  UST__SEQ_WHY_NONE = 0,
  UST__SEQ_WHY_WITHIN,    /* the sequence lies within the zone: neither faster nor slower by delta */
  UST__SEQ_WHY_NOISE,     /* ... where production's own spread widened delta: the noise is larger than delta */
  UST__SEQ_WHY_UNDECIDED, /* max_samples, neither */
  UST__SEQ_WHY_NO_AA,     /* max_samples without the A/A pairs a decision needs */
};

/* Where the test stands after n paired samples r (borrowed). */
typedef struct ust__seq_state {
  int decision;      /* UST__SEQ_OPEN, _FASTER, _SLOWER, _INCONCLUSIVE */
  int why;           /* UST__SEQ_WHY_*, when inconclusive */
  double spread;     /* production's own spread (as ust__seq_aa_spread); -1: none yet */
  double delta_used; /* delta, widened to the spread when that is larger (never dropped) */
  double c_fast, c_slow; /* ln thresholds: promote below c_fast (-INFINITY: cannot), reject above c_slow */
} ust__seq_state;

/* Production's own spread from n A/A pairs' ln(T_second / T_first):
 * expm1 of the median of |ln|, the typical relative difference between two
 * runs of the same code side by side; -1 for none (or out of memory). aa
 * is borrowed. */
double ust__seq_aa_spread(const double *aa, int n);
/* The test after n samples, with spread (ust__seq_aa_spread of n_aa
 * pairs) and kstar = ust__signmix_kstar(n, rule->alpha / 2) (the caller
 * may keep it in a ust__seq_kcache):
 * - no decision before rule->aa_min A/A pairs;
 * - delta_used = max(delta, spread): an effect smaller than two runs of
 *   production differ by is none;
 * - FASTER when at least kstar samples lie below c_fast = min(ln(1 -
 *   delta_used), -ln(min_speedup)), SLOWER when kstar lie above c_slow =
 *   ln(1 + delta_used): the sequence for the median past a threshold;
 * - INCONCLUSIVE when at least kstar lie above c_fast and kstar below
 *   c_slow (the sequence within the zone), or at max_samples undecided.
 * Returns out->decision. */
int ust__seq_step(const double *r, int n, int kstar, double spread, int n_aa, const ust__seq_rule *rule,
                  ust__seq_state *out);
/* "A/A spread 0.12 > delta 0.05", "within delta 0.05 of production",
 * "undecided after 1000 samples", "3 A/A pairs of the 8 needed": why st is
 * inconclusive, into out (cap bytes). */
void ust__seq_why_text(const ust__seq_state *st, const ust__seq_rule *rule, int n, int n_aa, char *out, size_t cap);

#endif /* UST_SCORER_H */
