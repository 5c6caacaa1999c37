/*
 * guard/: correctness and rollout. The comparison (guard/compare.h), the
 * serving decision (guard/decision.h), and here: modes and the operators'
 * published policies, candidates as the guard runs and judges them, the
 * pool of shadow slots and the verdicts they conclude, and the rollout state
 * machine with its table of per-key modes.
 *
 * A route (dispatch/) is made of parts declared by their owners; the guard
 * declares two, and only guard code writes them: ust__verify (what its
 * verifications found) and ust__route_rollout (its mode and how it
 * changes). The guard knows nothing of routes beyond these parts: a shadow
 * slot carries an opaque cookie, and verdicts are published through one
 * sink (ust__verdict_sink_i) that the router owns.
 *
 * Stream discipline: everything a shadow call enqueues (events, the compare
 * kernel, the copy of its results to pinned host memory) goes on the
 * caller's stream; results are read by the engine's worker thread once the
 * slot's last event completed. Nothing here synchronises the serving path,
 * except ust__shadow_verdict with wait (strict serving) and the *_sync
 * functions, which say so.
 *
 * Includes only base/ and scorer/. Internal header: never installed.
 */
#ifndef UST_GUARD_H
#define UST_GUARD_H

#include <stdint.h>

#include "base/base.h"
#include "guard/compare.h"
#include "guard/decision.h"
#include "guard/gate.h"
#include "scorer/scorer.h"

struct ust_candidate;
struct ust__procrun;

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

/* ---- candidates ------------------------------------------------------------------ */

enum { UST__CAND_NATIVE = 1, UST__CAND_TORCH_OP = 2 };

/* A candidate as the guard runs and judges it. Filled by the engine's
 * loader (plugin/candidates.c), read-only while enabled. */
typedef struct ust__cand {
  int kind;                          /* UST__CAND_NATIVE or UST__CAND_TORCH_OP */
  char name[UST__QUALNAME_MAX];      /* shown in reports */
  char target[UST__DISPLAY_MAX];     /* the binding it stands in for: "ns::op[.overload]" */
  char id[UST__QUALNAME_MAX + 16];   /* identity kept with saved modes: "sha256:HEX" or "torch_op:NAME" */
  const struct ust_candidate *native; /* native: the descriptor, in the loaded object */
  int abi;                           /* native: the candidate ABI version it was built for */
  int no_capture;                    /* native: its descriptor says UST_CANDIDATE_NO_CAPTURE (never captured) */
  char torch_op[UST__QUALNAME_MAX];  /* torch op: "ns::name" */
  char torch_overload[UST__NAME_MAX];
  _Atomic(void *) seam_op;           /* torch op: the seam's handle once the op is defined (lives as long as the
                                        process), else NULL */
  atomic_uint_fast64_t waiting;      /* calls the candidate missed: its torch op was not defined yet */
  int compare;                       /* ust__cmp_kind */
  double atol, rtol;                 /* < 0: the per-dtype defaults */
  double aa_sample;                  /* share of shadow calls that also run production twice */
  uint32_t aa_q32;
  uint64_t deadline_ns;              /* a call of the candidate longer than this is overdue */
  double max_slowdown;               /* the shadow budget: a candidate this many times slower is not shadowed */
  /* qualify "process": the candidate runs in its own process (proc) until
   * a route's qualify_calls verifications there passed, and in this one
   * (loaded, NULL until the engine loaded it after the first such route)
   * from then on; never here once proc is lost (crash, hang, failure). */
  struct ust__procrun *proc;
  uint64_t qualify_calls;
  _Atomic(const struct ust_candidate *) loaded;
} ust__cand;

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

/* ---- verdicts and the shadow pool (guard/shadow.c) --------------------------------- */

typedef enum ust__shadow_point {
  UST__MARK_PROD_BEGIN = 0,
  UST__MARK_PROD_END,
  UST__MARK_CAND_BEGIN,
  UST__MARK_CAND_END,
  UST__MARK_AA_BEGIN, /* production's second run of an A/A check */
  UST__MARK_AA_END,
  UST__MARK_COUNT
} ust__shadow_point;

typedef enum ust__shadow_fail {
  UST__FAIL_NONE = 0,
  UST__FAIL_ERROR,  /* the candidate returned a non-zero status */
  UST__FAIL_RAISED, /* the candidate raised */
  UST__FAIL_SCHEMA, /* the candidate's results do not line up with production's */
  UST__FAIL_OVERDUE, /* the candidate's call took longer than its deadline */
} ust__shadow_fail;
/* The reason a failure gives in evidence: "error", "raised", "schema", "overdue". */
const char *ust__fail_name(int fail);

typedef enum ust__verdict_kind {
  UST__VERDICT_PASSED = 0,
  UST__VERDICT_FAILED,
  UST__VERDICT_SKIPPED,      /* no verdict: the device work could not be done or read */
  UST__VERDICT_UNVERIFIABLE, /* ran, but an output cannot be compared */
} ust__verdict_kind;

/* One concluded shadow call, as the sink receives it. */
typedef struct ust__verdict {
  int kind;                  /* ust__verdict_kind */
  int serving;               /* it verified a call the candidate served */
  int have_times;            /* both sides were timed */
  uint64_t prod_ns, cand_ns; /* their times, when have_times */
  uint64_t tsol_ps;          /* the call's roofline floor; 0 unknown */
  uint64_t stage;            /* the route's transitions when the call began */
  int remote;                /* the candidate ran in its qualifying process: its time is not its kernel's */
  double aa_log_ratio;       /* an A/A check's ln(T_production again / T_production); NAN: none */
  int timed_kind;            /* the estimate's stratum of production's time (UST__TIMED_*) */
} ust__verdict;

/* Where verdicts go: implemented by the router, which owns the routes the
 * cookies name. Called from serving threads and the worker, never under a
 * lock of the guard's. */
typedef struct ust__verdict_sink_i {
  /* A call's failure, as soon as it is known (on the host at once, or when
   * its comparison is read); ev is handed over (free with free). */
  void (*failed)(void *ctx, void *route, ust__evidence *ev);
  /* Every shadow call that took a slot, once concluded. */
  void (*concluded)(void *ctx, void *route, const ust__verdict *v);
  /* The gate (guard/gate.h, packed) the route's captured calls follow now:
   * its mode and shares; 0 (off) when they must not run their shadow. */
  uint64_t (*gate)(void *ctx, void *route);
  /* 1 when the route's replays may no longer run what was captured (a
   * graph library changed one of its captured calls in place): the ring's
   * entries of its replays are dropped, not judged (NULL: never). */
  int (*replays_stale)(void *ctx, void *route);
} ust__verdict_sink_i;

typedef struct ust__shadow_pool ust__shadow_pool;

/* A pool of max_inflight slots; log and sink are borrowed for its life.
 * Not thread-safe with the pool's use (the engine creates it at enable). */
int ust__shadow_pool_create(int max_inflight, ust__log_sink *log, const ust__verdict_sink_i *sink, void *sink_ctx,
                            ust__shadow_pool **out);
/* Concludes every pending comparison first (synchronises). NULL: no-op. */
void ust__shadow_pool_destroy(ust__shadow_pool *p);

/* What a slot needs of its route: borrowed until it is concluded. */
typedef struct ust__slot_route {
  void *cookie;        /* handed back to the sink */
  ust__verify *verify; /* counted into */
  const ust__cand *cand;
  int serving;         /* verifies a call the candidate serves (canary, live) */
  int remote;          /* the candidate runs in its qualifying process (cand->proc) */
  uint64_t served_at;  /* the route's served calls now */
  uint64_t stage;      /* the route's transitions now */
  uint64_t tsol_ps;    /* the call's floor; 0 unknown */
  int timed_kind;      /* the estimate's stratum of the call (UST__TIMED_*: sampled or steady) */
} ust__slot_route;

/* Take a slot for a call; NULL when max_inflight are in use (the skip is
 * counted on r->verify). Thread-safe. */
void *ust__shadow_acquire(ust__shadow_pool *p, const ust__slot_route *r);
/* 1 when this shadow call also runs production a second time (A/A); a
 * share of the route's shadow calls, spread exactly. */
int ust__shadow_aa(const void *slot);
/* Record a point of the call: an event on stream (a GPU call) or the host
 * clock. device: ust__device; device_id: the GPU the call runs on, which the
 * caller has made current. */
void ust__shadow_mark(void *slot, int mark, int device, void *stream);
/* Bytes understudy copied for the call (counted when it concludes). */
void ust__shadow_note_copied(void *slot, uint64_t bytes);
/* The call's floor, known only once production ran (scored by its nested
 * ops): replaces the one the slot was taken with. */
void ust__shadow_set_floor(void *slot, uint64_t tsol_ps);
/* 0 once the slot could not record its device work (abandon it then). */
int ust__shadow_alive(const void *slot);
/* Hand over the outputs (pairs: borrowed for the call) or the candidate's
 * failure (fail, msg: borrowed, may be NULL); compares them (now on the
 * host, enqueued on stream on a GPU) and releases the slot. */
void ust__shadow_finish(void *slot, int device, void *stream, const ust__pair *pairs, int n_pairs, int fail,
                        const char *msg);
/* Release a slot without a verdict (counted skipped). */
void ust__shadow_abandon(void *slot, int device, void *stream);
/* Before ust__shadow_finish: the caller will ask for this call's verdict
 * into *out (-1 until concluded, then 1 failed, 0 not). */
void ust__shadow_want_verdict(void *slot, int *out);
/* After ust__shadow_finish: *out as above. A host comparison is concluded
 * already; wait (strict, on a GPU) waits for stream and concludes it
 * (synchronises). */
int ust__shadow_verdict(ust__shadow_pool *p, int *out, int device, void *stream, int wait);
/* Conclude the comparisons whose device work completed; returns how many
 * are still pending. Never blocks. Thread-safe. */
int ust__shadow_harvest(ust__shadow_pool *p);

/* Calls captured into CUDA graphs. A shadowed call captured into a graph
 * runs at every replay: production, the candidate on snapshots, the
 * comparisons, and a publication of their statistics into a ring
 * (guard/ring.h) under the site id ust__shadow_site_add returns (never 0;
 * an id names one site of one pool: another pool's harvest counts its
 * entries as unknown). The
 * site keeps the call's route and its pairs' metadata (as
 * ust__shadow_finish takes them; their buffers are not read here), so that
 * each replay is judged exactly as an eager call: counted on the route, a
 * failure's evidence to the sink (which rolls the route back), the verdict
 * to the sink (without times: a replay's come from the kernel tracer). */
#define UST__MAX_SITES 65536
int ust__shadow_site_add(ust__shadow_pool *p, const ust__slot_route *r, const ust__pair *pairs, int n_pairs,
                         int device, uint32_t *site);
/* Judge every replay the ring holds; returns how many. Entries naming no
 * site of this pool, or another pair count than their site's, are not
 * judged: counted into *unknown (NULL: not counted). One thread at a time. */
struct ust__ring;
uint64_t ust__shadow_sites_harvest(ust__shadow_pool *p, struct ust__ring *ring, uint64_t *unknown);
/* Conclude every comparison pending when called (synchronises with the
 * device, holding no lock while it waits). */
void ust__shadow_harvest_all_sync(ust__shadow_pool *p);

/* A site (as ust__shadow_site_add, for a CUDA call) whose comparison is
 * captured now: on stream (capturing), dev_stats (n_pairs statistics, device memory that
 * lives as long as the graph) zeroed, each pair compared into it, and the
 * statistics published into ring under the site (when not NULL: in the
 * replays whose run bits there, the site's ust__gate_counters.runs, say
 * verify: ust__ring_publish_launch). */
struct ust__ring_dev;
int ust__shadow_site_capture(ust__shadow_pool *p, const ust__slot_route *r, const ust__pair *pairs, int n_pairs,
                             void *stream, ust__cmp_stats *dev_stats, const struct ust__ring_dev *ring,
                             const unsigned long long *when, uint32_t *site);

/* ---- shadow captured into CUDA graphs (guard/graph.c) ------------------------------ */

/* The captured calls of one enable: their sites, gates and rings. */
typedef struct ust__graphs ust__graphs;
/* pool and sink are borrowed for its life. */
int ust__graphs_create(ust__shadow_pool *pool, const ust__verdict_sink_i *sink, void *sink_ctx, ust__graphs **out);
/* Turns every gate off (graphs replayed later run production alone) and
 * frees the table; the device memory graphs read is kept. NULL: no-op. */
void ust__graphs_destroy(ust__graphs *g);
/* At disable: every gate off, and later ticks judge nothing (the rings,
 * kept for the process, belong to the next enable's sites). NULL: no-op. */
void ust__graphs_close(ust__graphs *g);
/* The worker's turn: judges the replays the rings hold (as eager calls) and
 * writes each site's gate from its route (sink->gate). Returns how many
 * replays it judged. Thread-safe (the worker and a flush). */
uint64_t ust__graphs_tick(ust__graphs *g);
/* Live sites whose gate was open at the last tick (the worker polls the
 * rings often only while some are). */
uint32_t ust__graphs_open(ust__graphs *g);
/* For the report: captured calls given a site, those whose shadow is whole
 * in their graph (live), live with an open gate at the last tick, ring
 * entries naming no site of this enable, and entries the rings lost since
 * this enable (overwritten before they were read: replays verified but not
 * judged). */
typedef struct ust__graphs_figs {
  uint64_t sites, live, open, unknown, lost;
  uint64_t launched; /* live sites beside the chain whose shadow the device launches */
  uint64_t refused;  /* launches of those the device refused (replays left unverified) */
  uint64_t gated;         /* live sites whose replays the host gates (ust__graphs_bind) */
  uint64_t gated_replays; /* replays of executable graphs the host gated */
  uint64_t gate_failed;   /* executable graphs given back to the device's decision (a node would not change) */
  uint64_t hosted;        /* live sites whose shadow the host starts after the replays that verify */
  uint64_t host_starts;   /* those starts (one per site and verifying replay) */
  uint64_t unseen;        /* graphs replayed whose capture understudy did not see (ust__graphs_unseen) */
} ust__graphs_figs;
void ust__graphs_figures(ust__graphs *g, ust__graphs_figs *f);
/* A graph replayed whose capture understudy did not see (made before
 * enable(), or while it was off: the Python package's hook, once a graph):
 * its calls are neither counted, timed (but by the kernel tracer's names)
 * nor verified. */
void ust__graphs_unseen(ust__graphs *g);

/* Replays gated from the host (sites beside the chain, in a graph its
 * owner keeps alive: its nodes are what is enabled): where the host sees a
 * graph's replays (the Python package's hook on torch.cuda.CUDAGraph),
 * each replay enables the kernels of only the sites it verifies
 * (ust__gate_host_verify), and the kernels verify whenever they run. Any
 * thread; a replay waits only while a bind or unbind runs (they may wait
 * for the worker's gate writes).
 *   capture_id: the id of the capture stream is in now, 0 when none;
 *   capture_hosted: that id, and the capture marked as one whose
 *         executable the host will bind and gate: a shadow beside the chain
 *         captured in it gets no IF node; its body is an executable graph
 *         of its own, which the host starts after each replay that
 *         verifies (ust__graphs_replayed), and which never runs while the
 *         executable is not bound;
 *   bind: exec, instantiated from graph, which capture made and which
 *         stays alive while exec is bound, gated from now on; the number
 *         of sites, 0 (none: nothing changes; a site another executable
 *         gates is not gated again), or an error;
 *   replay: before a replay of exec on stream (nothing for one not bound):
 *         the number of bodies to start after it (0: no call of replayed);
 *         stream waits for the bodies the last verifying replay started
 *         when this one writes the copies they read;
 *   replayed: after that replay, on stream: the bodies started on streams
 *         of the binding's, each behind the replay or (captured with
 *         start_kernel) behind its kernel in the chain (an event that
 *         kernel's replays record once the copies are taken), so that it
 *         runs under the rest of the replay;
 *   unbind: exec gone or made again: its sites decide on the device (a
 *         hosted one's gate stays closed). */
unsigned long long ust__graph_capture_id(void *stream);
unsigned long long ust__graphs_capture_hosted(ust__graphs *g, void *stream);
int ust__graphs_bind(ust__graphs *g, void *graph, unsigned long long capture, void *exec);
int ust__graphs_replay(ust__graphs *g, void *exec, void *stream);
void ust__graphs_replayed(ust__graphs *g, void *exec, void *stream);
void ust__graphs_unbind(ust__graphs *g, void *exec);
/* The graph (or executable graph) capture made was handed to code outside
 * understudy (its raw handle), which may change its kernels in place where
 * nothing of understudy's sees it: each live site of that capture runs
 * production alone in its replays from now on (its gate closed for this
 * enable: no shadow, no candidate's arm), counted once on its route
 * (graph_exposed). The number of sites closed now. */
int ust__graphs_exposed(ust__graphs *g, unsigned long long capture);

/* One shadowed call being captured. */
struct graph_site;
typedef struct ust__graph_call {
  ust__graphs *graphs;
  struct graph_site *site;
  struct ust__ring *ring;
  ust__slot_route r;
  void *stream; /* the caller's capturing stream */
  void *side;   /* where this thread captures parts */
  int mode;     /* the thread's capture mode while a part is open */
  int open;     /* a part is being captured */
  int parts;    /* parts added to the caller's graph */
  int beside;   /* verify-only, its body beside the chain (ust__graph_call_begin) */
  int launch;   /* beside: its body launched from the device where CUDA takes it (else an IF node) */
  int start_kernel; /* beside, started by the host: behind its kernel in the chain (an event that kernel's
                       replays record), else behind the whole replay */
  uint64_t kept, kept_max; /* bytes kept for its body beside the chain, and the bound */
  ust__gate_copies chain;  /* beside: the open part's copies, for its kernel in the chain */
  char why[192]; /* what kept the call from being shadowed in its graph */
  int why_code;  /* ust__graph_why, as ust__graph_part_end found it */
} ust__graph_call;

/* A site for a call of route r being captured on stream (device): its gate
 * off until ust__graph_call_end. 0, or an error (the call stays
 * production alone). */
int ust__graph_call_begin(ust__graphs *g, const ust__slot_route *r, int device, void *stream, ust__graph_call *c);
/* The work enqueued on *side until ust__graph_part_end is a part: it runs
 * at the replays the gate verifies. */
int ust__graph_part_begin(ust__graph_call *c, void **side);
/* Ends the part; keep: into the caller's graph behind its condition (else,
 * or when it cannot be, dropped: why says so). */
int ust__graph_part_end(ust__graph_call *c, int keep);
/* 1 while the open part's stream still captures (nothing the candidate did
 * ended or invalidated it). */
int ust__graph_part_active(const ust__graph_call *c);
/* Device memory for a call beside the chain, on its device: kept for the
 * process (a graph holding it may replay at any time). NULL when there is
 * none (why says so). */
void *ust__graph_keep(ust__graph_call *c, size_t bytes);
/* Inside the open part: the comparisons of pairs into dev_stats and their
 * publication (ust__shadow_site_capture) in the replays the gate verifies;
 * then, for the replays the candidate serves (canary, live), its results
 * copied over production's (each pair of a result or written argument).
 * A call whose results cannot be copied so (another dtype or shape), or
 * not all of them (servable 0: results left out of the pairs), is only
 * ever verified: its gate never lets the candidate serve. */
int ust__graph_call_finish(ust__graph_call *c, const ust__pair *pairs, int n_pairs, ust__cmp_stats *dev_stats,
                           int servable);
/* Inside the open part: a device copy, or bytes set to byte. */
int ust__graph_copy(ust__graph_call *c, void *dst, const void *src, size_t bytes);
int ust__graph_fill(ust__graph_call *c, void *dst, int byte, size_t bytes);
/* ok: the call's shadow is whole in the caller's graph; its site goes live. */
void ust__graph_call_end(ust__graph_call *c, int ok);

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
  double *aa;                           /* |ln| of the A/A checks' time ratios (a ring of the newest); under the lock */
  int n_aa, cap_aa;                     /* checks seen, room kept */
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
/* An A/A check's ln(T_production again / T_production) on this route: its
 * spread sets a floor under the promotion's delta (UST__AA_MIN checks on). */
void ust__rollout_aa(ust__route_rollout *p, double log_ratio);
#define UST__AA_MIN 5
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
  double aa_spread;                /* median |T_prod again / T_prod - 1| of the A/A checks; -1 fewer than UST__AA_MIN */
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

/* ---- the synchronous comparison (ust_compare_sync) ------------------------------ */

/* Result buffers and events kept for reuse per device; one per process
 * context. */
typedef struct ust__compare_cache {
  pthread_mutex_t lock;
  struct ust__cmp_res *free_list;
  ust__log_sink *log;
} ust__compare_cache;

int ust__compare_sync(ust__compare_cache *cache, const DLTensor *p, const DLTensor *c, int kind, double atol,
                      double rtol, void *stream, ust_compare_result *out);
void ust__compare_cache_free(ust__compare_cache *cache);

#endif /* UST_GUARD_H */
