/*
 * The timers (dispatch/timer_host.c, dispatch/timer_gpu.c with its kernel
 * tracer dispatch/timer_cupti.c and the hold dispatch/hold.h).
 * Internal header: never installed.
 */
#ifndef UST_DISPATCH_TIMERS_H
#define UST_DISPATCH_TIMERS_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "dispatch/hold.h"
#include "dispatch/kerneltime.h"
#include "dispatch/roofcall.h"
#include "scorer/scorer.h"

/* ---- timers (dispatch/timer_host.c, dispatch/timer_gpu.c) ---------------------------
 *
 * The host clock for CPU calls (read inline), device events for GPU calls:
 * begin and end only record events on the caller's stream; a harvest (the
 * worker, never a serving thread) moves completed timings into the route's
 * figures. Nothing synchronises the serving path. */

typedef struct ust__timers ust__timers;

typedef enum ust__timer_kind {
  UST__TIMER_AUTO = 0, /* the kernel tracer where it loads, events otherwise */
  UST__TIMER_CUPTI,    /* the same, warning when the tracer is not available */
  UST__TIMER_EVENTS,   /* events around each timed call */
} ust__timer_kind;

typedef struct ust__timer_opts {
  int kind;              /* ust__timer_kind */
  uint64_t window_ns;    /* how long a kernel-tracing window stays open */
  double budget;         /* the share of host time windows may cost (<= 0: always on) */
  double launch_cost_ns; /* what tracing adds to one kernel launch, for the budget */
  const char *cupti_path; /* borrowed; NULL: libcupti.so.13 as the loader finds it */
  int callbacks;         /* 1: correlate launches through CUPTI's launch callbacks when it can subscribe */
  int (*profiler_active)(void); /* 1 while torch's profiler records (may be NULL) */
  uint64_t hold_deadline_ns; /* timed GPU calls are held (dispatch/hold.h), giving up after this; 0: not held */
} ust__timer_opts;

/* Where the timer stands, for the report. */
typedef struct ust__timer_status {
  const char *kind;   /* "cupti" or "events" (static) */
  const char *state;  /* the tracer's: "idle", "window", ..., "yielded", "off"; NULL without one */
  char why[200];      /* why the tracer is off or stood down; "" otherwise */
  uint32_t version;   /* libcupti's API version */
  const char *correlation; /* how the last window joined kernels to calls: "records" or "callbacks" (static) */
  uint64_t yields, windows_cut, buffers_short, buffers_lost;
  double ns_per_tick; /* the records' clock, over the last window (1: ns) */
  ust__kt_totals totals;
} ust__timer_status;

/* Up to max_pending concurrent GPU timings per device; opts copied (its
 * strings borrowed for the timers' life); log borrowed. */
int ust__timers_create(int max_pending, const ust__timer_opts *opts, ust__log_sink *log, ust__timers **out);
/* Whether the kernel tracer times CUDA calls now: off (events time the
 * sampled calls), between its windows (only a key's first calls are timed,
 * by events), in a window (every call, by its kernels). Relaxed: a hint. */
enum { UST__TRACING_OFF = 0, UST__TRACING_BETWEEN = 1, UST__TRACING_WINDOW = 2 };
int ust__timers_tracing(const ust__timers *t);
/* 1 when the timers hold a kernel tracer that can open windows (CUPTI asked
 * for and loaded); fixed once they are made: 0 means ust__timers_tracing
 * answers UST__TRACING_OFF for their whole life. */
int ust__timers_may_trace(const ust__timers *t);
/* Where the timer stands (thread-safe). */
void ust__timers_status(ust__timers *t, ust__timer_status *out);
/* Waits for every pending timing (synchronises). NULL: no-op. */
void ust__timers_destroy(ust__timers *t);
/* 1 once a GPU call was timed. */
int ust__timers_used(const ust__timers *t);
/* Record the start event on stream, held (dispatch/hold.h) unless the
 * operator's standing (hold: its binding's word) or the device says not; a
 * token, or -1 when no timer is free. */
int ust__timers_begin(ust__timers *t, int device_id, void *stream, ust__hold_word *hold);
/* A timed call's floor, or part of it, waits for the lengths of a varlen
 * batch on the device (dispatch/roofcall.h): copied on the call's stream
 * right after its stop event (or its last kernel, a kernel tracer's call),
 * and read once they are in: the floor given at its end then has d's
 * bounded part (d->bound_tsol_ps) replaced by the lengths' own, and the
 * work noted on d->figs is corrected the same way (a tracer's call at its
 * window's conclusion). part: the call's own floor (UST__FLOOR_OWN) or its
 * bound callees' (UST__FLOOR_CALLEES). 0 when taken; -1 (the bound stands)
 * for a call that has one already, no staging area free. */
enum { UST__FLOOR_OWN = 1, UST__FLOOR_CALLEES = 2 };
int ust__timers_defer_floor(ust__timers *t, int token, const ust__floor_defer *d, int part);
/* The floor that stands for the call is part's: a deferral of the other
 * part is let go, neither read nor applied. */
void ust__timers_floor_settled(ust__timers *t, int token, int part);
/* The same for a floor the timers do not time (a shadow's arms): d's
 * lengths staged on d->device, a tag (> 0; 0: none, the bound stands);
 * copied on the call's stream, an event behind them; the floor then, its
 * bounded part replaced by the lengths' own when their copies are done (it
 * never waits: copies not done yet leave the bound, and the area is given
 * back by the worker once they are), the area given back (every tag,
 * exactly once; tsol_ps 0 lets them go). */
int ust__timers_stage(ust__timers *t, int device, const ust__floor_defer *d);
void ust__timers_stage_copy(ust__timers *t, int tag1, void *stream);
uint64_t ust__timers_stage_floor(ust__timers *t, int tag1, uint64_t tsol_ps); /* t NULL: tsol_ps */
/* Record the end event (releasing the hold) and queue the timing for figs,
 * with the call's roofline floor (0: unknown). */
void ust__timers_end(ust__timers *t, int token, void *stream, ust__figs *figs, uint64_t tsol_ps, int kind);
/* How the timers hold calls: the deadline (0: not held), per device the
 * hold's calibration (UST__HOLD_*) and what a held pair adds around its
 * work, and the holds that gave up. Thread-safe. */
typedef struct ust__hold_status {
  uint64_t deadline_ns, held, expired, released_late, excluded;
  int n_devices; /* devices whose state is known */
  struct {
    int device, state;
    double offset_ns, spread_ns;
  } devices[8];
} ust__hold_status;
void ust__timers_hold_status(ust__timers *t, ust__hold_status *out);
/* Graph capture, with the kernel tracer on: before a captured call, the
 * index its first node will take in the graph stream captures into (0 if
 * noted, -1 if not: no tracer, no CUPTI node ids, an error); after it, the
 * nodes it added become its route's, so that replays of them are timed and
 * counted (ust__kt_graph_call). Slow path: capture only. */
int ust__timers_capture_mark(ust__timers *t, void *stream, uint32_t *from);
void ust__timers_captured(ust__timers *t, void *stream, uint32_t from, ust__figs *figs, uint64_t tsol_ps);
/* After understudy made graphs of its own while stream captures (a captured
 * shadow's parts): the executable graph of the capture is numbered past
 * them (ust__kt_graph_made). Slow path: capture only. */
void ust__timers_graph_made(ust__timers *t, void *stream);
/* Inside a tracing window only: a slot for a span of a candidate's run (the
 * run, UST__KT_RUN, or an op it called, UST__KT_OP), or -1; ended on the
 * same thread by ust__timers_span_end, whose kernels are then counted into
 * sink (ust__kt_end_span). */
int ust__timers_span_begin(ust__timers *t);
void ust__timers_span_end(ust__timers *t, int token, ust__kt_sink *sink, int role);
/* Release a timer whose call raised; nothing is recorded. */
void ust__timers_cancel(ust__timers *t, int token);
/* Move completed timings into their figures; returns how many are still
 * pending. Never blocks. */
int ust__timers_harvest(ust__timers *t);
/* Harvest everything pending when called (synchronises with the device; holds
 * no lock that a serving thread takes while it waits). */
void ust__timers_harvest_all_sync(ust__timers *t);
/* The CUPTI tracer (dispatch/timer_cupti.c, CUDA builds; in HIP builds
 * dispatch/timer_notrace.c, a tracer that is always off), used by the GPU
 * timers. create always gives a tracer; it is "off" (saying why) when
 * CUPTI cannot be loaded or was not asked for. */
typedef struct ust__cupti ust__cupti;
int ust__cupti_create(const ust__timer_opts *opts, ust__log_sink *log, ust__cupti **out);
void ust__cupti_destroy(ust__cupti *c);
/* The worker's step: opens, closes and drains windows (used: a GPU call was
 * seen; sync: conclude an open window now, waiting for its records). 1
 * while a window is open or draining. */
int ust__cupti_poll(ust__cupti *c, int used, int sync);
/* UST__TRACING_*; relaxed. */
int ust__cupti_tracing(const ust__cupti *c);
/* 1 when the tracer is on (CUPTI asked for and loaded); never changes after
 * create: a tracer that is off stays off. */
int ust__cupti_present(const ust__cupti *c);
/* Its windows' call slots (NULL: a tracer that is always off). */
ust__kt *ust__cupti_kt(ust__cupti *c);
/* A call slot with its id pushed, or -1; ended by ust__cupti_end (figs NULL:
 * the call is not timed) on the same thread. */
int ust__cupti_begin(ust__cupti *c);
void ust__cupti_end(ust__cupti *c, int slot, ust__figs *figs, uint64_t tsol_ps, int kind);
/* Or ended as a span of a candidate's run (ust__kt_end_span). */
void ust__cupti_end_span(ust__cupti *c, int slot, ust__kt_sink *sink, int role);
void ust__cupti_status(ust__cupti *c, ust__timer_status *out);
/* 1 when captured calls can be mapped to their graph nodes (the tracer is
 * on and CUPTI names nodes). */
int ust__cupti_maps_graphs(const ust__cupti *c);
/* CUPTI's ids of n graph nodes (CUgraphNode); 0 when all were given, -1
 * when the tracer is off or CUPTI cannot say. */
int ust__cupti_node_ids(ust__cupti *c, void *const *nodes, size_t n, uint64_t *ids);
/* The nodes (ids) one captured call added, for its route's figures. */
/* graph: the graph being captured; made: a graph understudy made after its
 * own others (the last id it took). */
void ust__cupti_graph_made(ust__cupti *c, void *graph, void *made);
int ust__cupti_graph_call(ust__cupti *c, const uint64_t *ids, int n, uint32_t kernels, ust__figs *figs,
                          uint64_t tsol_ps);
/* Graph capture (ust__timers_capture_mark, _captured, _graph_made do these):
 * the index a captured call's first node will take in the graph stream
 * captures into (0, or -1 when the tracer does not map graphs); the nodes
 * it added become its route's; the capture's executable graph numbered past
 * the graphs understudy made meanwhile (dispatch/timer_capture.c, CUDA
 * builds). Runtime errors are said to log. */
int ust__cupti_capture_mark(ust__cupti *c, ust__log_sink *log, void *stream, uint32_t *from);
void ust__cupti_captured(ust__cupti *c, ust__log_sink *log, void *stream, uint32_t from, ust__figs *figs,
                         uint64_t tsol_ps);
void ust__cupti_capture_made(ust__cupti *c, ust__log_sink *log, void *stream);

/* 1 if the stream is capturing a graph (or cannot be asked), else 0. */
int ust__gpu_capturing(void *stream);
/* The GPU's name ("NVIDIA H200"); -1 when there is none. */
int ust__gpu_device_name(int device, char *buf, size_t cap);

#endif /* UST_DISPATCH_TIMERS_H */
