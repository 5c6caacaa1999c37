/*
 * Verdicts and the pool of shadow slots (guard/shadow.c): a shadowed call's
 * comparison concluded off the serving path, published through the sink.
 * Internal header: never installed.
 */
#ifndef UST_GUARD_SHADOW_H
#define UST_GUARD_SHADOW_H

#include <stddef.h>
#include <stdint.h>

#include "guard/compare.h"
#include "guard/decision.h"
#include "guard/gate.h"
#include "guard/verify.h"

/* ---- verdicts and the shadow pool (guard/shadow.c) --------------------------------- */

typedef enum ust__shadow_point {
  UST__MARK_PROD_BEGIN = 0,
  UST__MARK_PROD_END,
  UST__MARK_CAND_BEGIN,
  UST__MARK_CAND_END,
  UST__MARK_AA_BEGIN, /* production's A/A run, beside its timed arm (guard/decision.h) */
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
  /* the A/A pair's ln(T_production, second run / first run): production's
   * two runs side by side, as the compared pair; NAN: none */
  double aa_log_ratio;
  int timed_kind;            /* the estimate's stratum of production's time (UST__TIMED_*) */
  int paired;                /* the times are the call's arms (same scope, the order drawn): a sample of the
                                promotion's test; 0: production was timed serving, the candidate after it */
  int replay;                /* a replay of a call captured into a graph: no times by nature */
  int floor_tag1;            /* the slot's floor_tag1, handed back */
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
  /* how its times may be taken (guard/decision.h): UST__DF_ARMS, a shadow
   * timed on copies; UST__DF_AA, A/A runs on the candidate's share
   * (cand->aa_sample) of the route's slots. The order of each slot's arms
   * is drawn at random, for an armed shadow and for verified serving. */
  int arms;
  /* the router's: a deferral of tsol_ps waiting for lengths on the device
   * (+ 1; 0: none), handed back in the verdict, cleared when the floor is
   * replaced (ust__shadow_set_floor) */
  int floor_tag1;
} ust__slot_route;

/* Take a slot for a call; NULL when max_inflight are in use (the skip is
 * counted on r->verify). Thread-safe. */
void *ust__shadow_acquire(ust__shadow_pool *p, const ust__slot_route *r);
/* The slot's arms as decision flags (UST__DF_ARMS, UST__DF_CAND_FIRST,
 * UST__DF_AA): the candidate first on a fair coin drawn per call, A/A on
 * the candidate's share of the route's slots, spread exactly. */
int ust__shadow_arms(const void *slot);
/* 1 when the call runs production once more for A/A (UST__DF_AA). */
int ust__shadow_aa(const void *slot);
/* Record a point of the call: an event on stream (a GPU call) or the host
 * clock. device: ust__device; device_id: the GPU the call runs on, which the
 * caller has made current. */
void ust__shadow_mark(void *slot, int mark, int device, void *stream);
/* Bytes understudy copied for the call (counted when it concludes). */
void ust__shadow_note_copied(void *slot, uint64_t bytes);
/* The call's floor, known only once production ran (scored by its nested
 * ops): replaces the one the slot was taken with (and its floor_tag1). */
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
/* What a call's keeper learns when the call is concluded (ust__shadow_keep):
 * whether it failed and, if so, why. */
typedef struct ust__keep_verdict {
  int failed;
  const char *reason;     /* as the evidence says it ("mismatch", "wrote input", "raised", ...) */
  const char *output;     /* the output (or input) that failed, or NULL */
  int64_t first_mismatch; /* its first mismatching element (flat), or -1 */
} ust__keep_verdict;
/* Before ust__shadow_finish: done(ctx, route cookie, verdict) is called
 * once, when the call is concluded (skipped, abandoned or retired: not
 * failed), on whichever thread concludes it, under no lock of the guard's;
 * done owns ctx from then on. Not called when slot is NULL. */
void ust__shadow_keep(void *slot, void *ctx, void (*done)(void *ctx, void *cookie, const ust__keep_verdict *v));
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

#endif /* UST_GUARD_SHADOW_H */
