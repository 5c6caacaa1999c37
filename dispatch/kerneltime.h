/*
 * Kernel-level timing (dispatch/kerneltime.c, fed by dispatch/timer_cupti.c):
 * kernels joined to the calls that launched them, in windows.
 * Internal header: never installed.
 */
#ifndef UST_DISPATCH_KERNELTIME_H
#define UST_DISPATCH_KERNELTIME_H

#include <stdatomic.h>
#include <stdint.h>

#include "scorer/scorer.h"

/* ---- kernel-level timing (dispatch/kerneltime.c; fed by dispatch/timer_cupti.c) --------
 *
 * A window is a stretch of time in which every kernel the process runs is
 * recorded (by CUPTI on CUDA). Each intercepted call in a window takes a
 * call slot whose id is pushed as an external correlation id around the
 * call; the tracer hands over two kinds of records: (correlation id of a
 * launch -> the external id on top of the launching thread's stack) and
 * (kernel: the launch's correlation id, start, end, name). They arrive in
 * any order, in any buffer; the window joins them when it concludes, after
 * every call of the window has returned and the records have drained.
 *
 * A call's figure is the sum of its kernels' durations (and, apart, their
 * span: first start to last end); a call nested in another (a bound op
 * calling a bound op) adds its kernels to its parents'. The kernels of
 * the window no call claimed are the unattributed time, by kernel name. */

#define UST__KT_MAX_CALLS (1 << 16) /* call slots in one window */
#define UST__KT_MAX_KERNELS (1 << 21) /* kernel records kept in one window */
#define UST__KT_TOP 10               /* unattributed kernels named in a report */
#define UST__KT_NAME_MAX 160

/* Where the kernels of a candidate's run are counted (its route's
 * fallback): runs the tracer saw whole, their kernels and kernel time, and
 * of those the kernels launched inside the ops the candidate called.
 * Additive; written at a window's conclusion. */
typedef struct ust__kt_sink {
  atomic_uint_fast64_t runs, kernels, kernel_ns; /* UST__KT_RUN spans */
  atomic_uint_fast64_t op_kernels, op_ns;        /* UST__KT_OP spans inside them */
} ust__kt_sink;

#define UST__KT_RUN 1 /* a span: a candidate's run */
#define UST__KT_OP 2  /* a span: an op the candidate called, inside its run */

typedef struct ust__kt_call {
  ust__figs *figs;      /* the route's figures; set at the call's end */
  ust__kt_sink *sink;   /* or a span's sink (figs NULL), and its role (UST__KT_RUN, UST__KT_OP) */
  int role;
  uint64_t tsol_ps;
  int kind;             /* why it was timed (UST__TIMED_*) */
  int parent;           /* the slot of the call it is nested in, or -1 */
  int floor_tag1, floor_part; /* its floor's staged lengths (ust__kt_defer_floor), whose part; 0: none */
  atomic_int ended;     /* 1 returned (time it), 2 raised or served by a candidate (do not) */
  /* joined at conclusion */
  uint64_t sum_ns, start, end;
  uint32_t kernels, launches, rt_launches, drv_launches;
} ust__kt_call;

typedef struct ust__kt_name {
  char name[UST__KT_NAME_MAX];
  uint64_t ns, kernels;
} ust__kt_name;

/* Totals over every concluded window; additive (reports add them). */
#define UST__N_PHASES 3 /* ust_phase: unknown, prefill, decode */

typedef struct ust__kt_totals {
  uint64_t windows, window_ns;      /* concluded windows and their open time */
  uint64_t kernels, kernel_ns;      /* every kernel recorded */
  uint64_t attributed, attributed_ns; /* of those, launched inside a timed call */
  uint64_t calls_timed, calls_dropped; /* calls concluded with a figure / without (records lost) */
  uint64_t calls_empty;              /* calls that launched no kernel the tracer saw (no figure) */
  uint64_t calls_replayed;           /* captured calls run again by a graph launch (each timed) */
  uint64_t captured_unmapped;        /* captured calls whose nodes could not be kept (no memory, the bound) */
  uint64_t graph_unknown, graph_unknown_ns; /* kernels graph launches ran of graphs no bound op was seen
                                               captured into (captured before enable(), ...) */
  uint64_t graph_own, graph_own_ns; /* kernels run by understudy's own graphs (shadows' bodies started by the
                                       host or the device) */
  uint64_t phase_kernel_ns[UST__N_PHASES];     /* kernel_ns by the phase of the thread that launched them */
  uint64_t phase_attributed_ns[UST__N_PHASES]; /* attributed_ns by it (launches the callbacks saw; else unknown) */
  uint64_t records_lost;             /* kernels or launches the tracer dropped or that never joined */
  int n_names;
  ust__kt_name names[64];            /* the unattributed kernels with the most time (kept sorted) */
} ust__kt_totals;

typedef struct ust__kt ust__kt;

int ust__kt_create(ust__kt **out);
void ust__kt_destroy(ust__kt *k);
/* Start (on) a window's collection, a new sequence without launches or
 * records, before the tracer turns launch notes and kernel records on; or
 * drop it (0) when the tracer could not turn them on. */
void ust__kt_collect(ust__kt *k, int on);
/* Open the window to calls (collecting first if not yet). Only while no
 * call of the previous window is in flight (ust__kt_quiet). */
void ust__kt_open(ust__kt *k);
/* Serving threads. A slot for a call starting now, or -1 (no window, or no
 * slot left); *ext receives the external id to push. The slot must be
 * ended (ust__kt_end or ust__kt_cancel) on the same thread. */
int ust__kt_begin(ust__kt *k, uint64_t *ext);
void ust__kt_end(ust__kt *k, int slot, ust__figs *figs, uint64_t tsol_ps, int kind);
void ust__kt_cancel(ust__kt *k, int slot);
/* End a slot begun for a span of a candidate's run (role UST__KT_RUN or
 * UST__KT_OP) instead of a call: its kernels are counted into sink at the
 * window's conclusion, an op's only inside a run seen whole. */
void ust__kt_end_span(ust__kt *k, int slot, ust__kt_sink *sink, int role);
/* A call's floor, or one part of it (> 0), waits for the lengths of its
 * varlen batch, staged under tag1 (> 0) by the tracer's owner
 * (dispatch/timers.h): at the window's conclusion, resolve(ctx, tag1,
 * tsol_ps) gives the floor with them, once for every tag, whatever became
 * of the call (tsol_ps 0: they are let go). The slot's thread, before its
 * end; one deferral a slot. */
typedef uint64_t (*ust__kt_floor_fn)(void *ctx, int tag1, uint64_t tsol_ps);
void ust__kt_floor_fn_set(ust__kt *k, ust__kt_floor_fn resolve, void *ctx);
void ust__kt_defer_floor(ust__kt *k, int slot, int tag1, int part);
/* The floor that stands for the call is part's: a deferral of another part
 * is let go (its lengths are not copied, nor read). */
void ust__kt_floor_settled(ust__kt *k, int slot, int part);
/* The slot's tag (0: none); with stands, only while its part stands. */
int ust__kt_floor_tag(const ust__kt *k, int slot, int stands);
/* 1 while a window is open (relaxed: a hint for the router). */
int ust__kt_window_open(const ust__kt *k);
/* Close the window to new calls. */
void ust__kt_close(ust__kt *k);
/* 1 once the window is closed and no call that began in it is in flight. */
int ust__kt_quiet(ust__kt *k);
/* Records (any thread; the tracer's buffer callback). Records of another
 * window's external ids are ignored. */
void ust__kt_ext(ust__kt *k, uint32_t corr, uint64_t ext);
/* A kernel: its launch's correlation id, and the graph node it ran as when
 * a graph launch ran it (the executable graph's node id; 0: none). */
void ust__kt_kernel(ust__kt *k, uint32_t corr, uint64_t node, uint64_t start, uint64_t end, const char *name);
/* Graph replays. At capture, the nodes a captured call added (CUPTI's
 * node ids in the graph being captured) and its route's figures: each graph
 * launch that runs them is one replayed call of the route, timed by their
 * kernels. Nodes are kept across windows.
 * Replays report the nodes of the executable graph. CUPTI numbers graphs and
 * executable graphs from one process-wide counter and a node's id is its
 * graph's id above its index in the graph (CUDA 13.0, seen on an H200): the
 * executable graph instantiated right after a capture (torch's CUDAGraph,
 * and torch.compile's graph trees, instantiate at capture end) has the
 * captured graph's id + 1, its nodes the same indices. A graph instantiated
 * later, or cloned, is not followed: its kernels stay unattributed. */
#define UST__KT_MAX_CAPTURED (1u << 20)
/* An executable graph known to be instantiated from graph (CUPTI's resource
 * callback): its replays follow that graph for certain. */
void ust__kt_graph_exec(ust__kt *k, uint32_t graph, uint32_t exec);
/* Graphs understudy made itself while graph was captured (a captured
 * shadow's parts, its IF bodies, its check instantiation) took ids up to
 * last: the executable graph instantiated at capture end is last + 1, not
 * graph + 1 (seen on an H200 with CUDA 13.0). Taken as the rule of id + 1
 * is: only for a graph captured alone. */
void ust__kt_graph_made(ust__kt *k, uint32_t graph, uint32_t last);
/* A graph library changed executable graph exec in place: node, the id of
 * the node it set (a node of the graph exec was made from), or 0 when it
 * updated the whole of exec from another graph. Each captured call whose
 * nodes that changed counts once on its route (figs->graph_changed). */
void ust__kt_exec_changed(ust__kt *k, uint32_t exec, uint64_t node);
int ust__kt_graph_call(ust__kt *k, const uint64_t *nodes, int n, uint32_t kernels, ust__figs *figs,
                       uint64_t tsol_ps);
/* A launch API's record: a runtime or a driver launch (a runtime launch may
 * make a driver launch of its own: a call's launches are the larger count). */
#define UST__KT_LAUNCH_RUNTIME 1u
#define UST__KT_LAUNCH_DRIVER 2u
void ust__kt_launch(ust__kt *k, uint32_t corr, uint32_t flags);
/* The calling thread's innermost call slot (-1: none); and a launch the
 * calling thread makes for that slot (a launch API's callback: no external
 * id needed). */
int ust__kt_current(void);
/* slot -1: a launch outside any call, noted for its phase only; phase: the
 * launching thread's ust_phase (its kernels' time is counted by phase). */
void ust__kt_launch_of(ust__kt *k, uint32_t corr, int slot, uint32_t flags, int phase);
/* Launches of the window's calls whose kernel record has not come yet (the
 * window has drained when none is left). */
uint64_t ust__kt_outstanding(ust__kt *k);
/* The tracer lost n records (counted against the window). */
void ust__kt_lost(ust__kt *k, uint64_t n);
/* Join the closed, quiet window's records, move each ended call's figure
 * into its route (ust__figs_kernel_time) and the window into the totals.
 * ns_per_tick: the records' clock in ns (1 unless another client of the
 * tracer set a clock of its own). */
void ust__kt_conclude(ust__kt *k, uint64_t window_ns, double ns_per_tick);
/* A copy of the totals (thread-safe). */
void ust__kt_totals_get(ust__kt *k, ust__kt_totals *out);
/* Kernels recorded in the window so far (for budgeting the next one). */
uint64_t ust__kt_window_kernels(ust__kt *k);

/* When the next window opens: a window of window_ns that recorded kernels
 * costs kernels * launch_cost_ns of host time; windows are spaced so that
 * this cost stays within budget (a fraction of the time), and never closer
 * than min_gap_ns. budget <= 0: windows back to back. */
uint64_t ust__kt_next_open(uint64_t opened_ns, uint64_t window_ns, uint64_t kernels, double launch_cost_ns, double budget,
                           uint64_t min_gap_ns);

#endif /* UST_DISPATCH_KERNELTIME_H */
