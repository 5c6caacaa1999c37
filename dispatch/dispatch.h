/*
 * dispatch/: the call view, key dimensions, the route table and the per-call
 * plan; timers; the hooks the bridge calls through. The bridge (bridge*.cpp
 * and bridge.h, the only C++ files) fills the view and performs the serving
 * decision's steps; everything else here is C and never sees a torch header.
 *
 * A route is composed of parts declared by their owners: its figures
 * (scorer/), its verifications and its rollout (guard/), and what the
 * router keeps itself (its key, sampling counters, learned layouts). Each
 * part is written only by its owner's functions. Verdicts come back through
 * the router's sink (ust__router_sink).
 *
 * Includes guard/ and scorer/ (and base/), never plugin/. Internal header:
 * never installed.
 */
#ifndef UST_DISPATCH_H
#define UST_DISPATCH_H

#include <stdatomic.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "base/base.h"
#include "dispatch/callview.h"
#include "dispatch/hold.h"
#include "guard/guard.h"
#include "scorer/scorer.h"

/* ---- definitions (parsed by plugin/problems.c) ------------------------------------ */

#define UST__MAX_DIMS 8
#define UST__FIRST_TIMED 3 /* the first calls of every shape key are timed, whatever the sampling */
#define UST__MAX_OVERLOADS 8
#define UST__MAX_WRITES 8
#define UST__MAX_RVARS 16
#define UST__EXPR_MAX 512
#define UST__MAX_ARGS 32 /* arguments of a schema understudy reads */

typedef enum ust__bucket {
  UST__BUCKET_EXACT = 0,
  UST__BUCKET_POW2 = 1,
} ust__bucket;

/* A key dimension as written in a definition: name = expression over the
 * call's arguments (grammar in dispatch/dimexpr.c). */
typedef struct ust__dim_def {
  char name[UST__NAME_MAX];
  char expr[UST__QUALNAME_MAX];
  int bucket; /* ust__bucket */
} ust__dim_def;

/* A binding's roofline: W (FLOPs) and Q (bytes read, written) as expressions
 * (scorer/expr.c) over named dimensions of the call (the key-dimension
 * grammar, evaluated exactly, unbucketed). W is booked on the path of
 * w_dtype's dtype. */
typedef struct ust__roofline_def {
  int present;
  int n_vars;
  ust__dim_def vars[UST__MAX_RVARS];
  char w[UST__EXPR_MAX];
  char w_dtype[UST__NAME_MAX]; /* argument whose dtype selects W's path */
  char q_read[UST__EXPR_MAX];
  char q_write[UST__EXPR_MAX];
  char estimate[UST__EXPR_MAX]; /* "" when W and Q are exact; else how they approximate */
  int w_tf32;                   /* a matrix product: float32 W runs on the tf32 path when torch allows TF32 */
} ust__roofline_def;

typedef struct ust__binding_def {
  char op[UST__QUALNAME_MAX]; /* "aten::mm", "_C::rms_norm" */
  int n_overloads;
  char overloads[UST__MAX_OVERLOADS][UST__NAME_MAX]; /* "" is the default overload */
  int n_writes;
  char writes[UST__MAX_WRITES][UST__NAME_MAX]; /* argument names the op writes */
  int n_overwrites;
  char overwrites[UST__MAX_WRITES][UST__NAME_MAX]; /* of writes: those written without being read (out
                                                      arguments: their values before the call do not matter) */
  int n_dims;
  ust__dim_def dims[UST__MAX_DIMS];
  int compared_returns; /* the leading returns a candidate is judged on; -1: all (the rest are
                           not data: RNG state, debug masks, sizes) */
  ust__roofline_def roofline;
} ust__binding_def;

/* ---- key dimensions (dispatch/dimexpr.c) -------------------------------------------- */

typedef enum ust__dim_kind {
  UST__DIM_SIZE = 0, /* NAME[i] */
  UST__DIM_ROWS,     /* rows(NAME): product of all sizes but the last */
  UST__DIM_NUMEL,    /* numel(NAME) */
  UST__DIM_LEN,      /* len(NAME): length of an int[] argument */
  UST__DIM_SCALAR,   /* NAME: an int or bool argument */
  UST__DIM_ESIZE,    /* esize(NAME): bytes per element of a tensor argument */
  UST__DIM_BYTES,    /* bytes(NAME): numel * esize */
  UST__DIM_OBYTES,   /* obytes(NAME): bytes of an optional tensor, 0 when None */
} ust__dim_kind;

typedef struct ust__dim_prog {
  /* what a call's evaluation reads first, in one line; the name after */
  int kind;
  int dim;                    /* UST__DIM_SIZE: index, negative from the end */
  int arg_index;              /* resolved against the schema; -1 if absent */
  int bucket;
  char arg[UST__NAME_MAX];
} ust__dim_prog;

/* Compile a dimension expression; on error returns UST_EPROBLEM with a
 * message that quotes the expression. */
int ust__dim_compile(const char *expr, ust__dim_prog *out);
/* The index of the argument called name in a schema's names, or -1. */
int ust__arg_lookup(const char *name, int nargs, const char *const *names);
/* Bind p to its argument's index in a schema's names; -1 when it has none. */
int ust__dim_resolve(ust__dim_prog *p, int nargs, const char *const *names);
/* Evaluate against a call; -1 when the argument is missing or None. */
int64_t ust__dim_eval(const ust__dim_prog *p, const ust__call *call);
/* v in its bucket: UST__BUCKET_POW2 rounds up to a power of two (v > 1);
 * inline, as it runs on every call of a bucketed key. */
static inline int64_t ust__dim_bucket(int bucket, int64_t v) {
  if (bucket != UST__BUCKET_POW2 || v <= 1)
    return v;
  const uint64_t u = (uint64_t)v - 1;
  return (int64_t)(1ull << (64 - __builtin_clzll(u)));
}
/* A tensor's size at dim (negative from the end); -1 past its rank. Inline:
 * every key dimension that is a size reads it on every call. */
static inline int64_t ust__dim_size(const ust__arg *a, int dim) {
  const int d = dim < 0 ? a->t.ndim + dim : dim;
  return d >= 0 && d < a->t.ndim ? a->t.shape[d] : -1;
}

/* ---- a binding's roofline, compiled (dispatch/roofcall.c) --------------------------- */

typedef struct ust__roofline_prog {
  int present;
  int n_vars;
  ust__dim_prog vars[UST__MAX_RVARS];
  ust__expr *w, *q_read, *q_write; /* owned */
  char w_dtype[UST__NAME_MAX];
  int w_dtype_index;               /* resolved against the schema; -1 if absent */
  int w_tf32;                      /* ust__roofline_def.w_tf32 */
  char unscorable[200];            /* once resolved: why its calls cannot be scored, "" when they can */
} ust__roofline_prog;

/* Compile def (borrowed); errors are UST_EPROBLEM naming where. */
int ust__roofline_compile(const ust__roofline_def *def, const char *where, ust__roofline_prog *out);
/* Resolve argument names (borrowed) once the schema is known; what the
 * schema lacks is said to log. */
void ust__roofline_resolve(ust__roofline_prog *p, int nargs, const char *const *names, const char *display,
                           ust__log_sink *log);
/* W per path and bytes read and written by one call: 0, or -1 when the
 * binding has no roofline or a dimension is missing from the call. tf32:
 * torch lets float32 matrix products use TF32 for this call (a w_tf32
 * roofline then books float32 W on the tf32 path). */
int ust__roofline_eval(const ust__roofline_prog *p, const ust__call *call, int tf32, double w[UST__N_PATHS],
                       double *q_read, double *q_write);
void ust__roofline_free(ust__roofline_prog *p);

/* ---- the hardware a call runs on ---------------------------------------------------- */

#define UST__HW_MAX_DEVICES 64

/* The engine's hardware profiles and, per GPU, the one its name picked
 * (resolved at the first call on that GPU). */
typedef struct ust__hw_ctx {
  ust__hw_set set;
  const ust__hw_profile *forced;          /* config hardware.profile: every device */
  _Atomic(const ust__hw_profile *) gpu[UST__HW_MAX_DEVICES];
  atomic_int gpu_resolved[UST__HW_MAX_DEVICES];
  _Atomic(const ust__hw_profile *) cpu; /* the host's, by its model name */
  atomic_int cpu_resolved;
  ust__log_sink *log;
} ust__hw_ctx;

/* The profile for a call's device, or NULL (a device no profile matches: a
 * host CPU without a calibrated profile, an unknown GPU). GPUs are picked by
 * their name, the host by its CPU model name (/proc/cpuinfo), unless the
 * config forces one. Thread-safe. */
const ust__hw_profile *ust__hw_for_call(ust__hw_ctx *hw, const ust__call *call);

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

typedef struct ust__kt_call {
  ust__figs *figs;      /* the route's figures; set at the call's end */
  uint64_t tsol_ps;
  int kind;             /* why it was timed (UST__TIMED_*) */
  int parent;           /* the slot of the call it is nested in, or -1 */
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
/* Release a timer whose call raised; nothing is recorded. */
void ust__timers_cancel(ust__timers *t, int token);
/* Move completed timings into their figures; returns how many are still
 * pending. Never blocks. */
int ust__timers_harvest(ust__timers *t);
/* Harvest everything pending when called (synchronises with the device; holds
 * no lock that a serving thread takes while it waits). */
void ust__timers_harvest_all_sync(ust__timers *t);
/* The CUPTI tracer (dispatch/timer_cupti.c, CUDA builds), used by the GPU
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
/* A call slot with its id pushed, or -1; ended by ust__cupti_end (figs NULL:
 * the call is not timed) on the same thread. */
int ust__cupti_begin(ust__cupti *c);
void ust__cupti_end(ust__cupti *c, int slot, ust__figs *figs, uint64_t tsol_ps, int kind);
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

/* 1 if the stream is capturing a graph (or cannot be asked), else 0. */
int ust__gpu_capturing(void *stream);
/* The GPU's name ("NVIDIA H200"); -1 when there is none. */
int ust__gpu_device_name(int device, char *buf, size_t cap);

/* ---- operators, bindings, routes ------------------------------------------------------ */

struct ust__route;

/* An enabled operator as the router sees it. */
typedef struct ust__operator {
  char name[UST__NAME_MAX];
  const char *def_path;                /* its definition's file, for messages; borrowed */
  _Atomic(const ust__policy *) policy; /* published by the engine (set_mode, reload) */
  ust__cand *cand;                     /* borrowed from the engine; NULL without one */
} ust__operator;

/* 1 while the calling thread is inside an intercepted call (a candidate, or
 * a production kernel, calling back into understudy). */
int ust__in_intercepted_call(void);

/* The interceptor of one op and overload, registered once for the life of
 * the process: the bridge's kernel calls through it. Its head (callview.h)
 * holds the enabled engine's binding of the op, or NULL, and counts its
 * calls in flight. Never freed. */
typedef struct ust__hook {
  ust__hook_head head; /* first: the bridge reaches it from the hook's address */
  char display[UST__DISPLAY_MAX];
  UT_hash_handle hh; /* the process context's registry, by display */
} ust__hook;

/* Bind b to h: calls admitted from now on read it; its calls count in
 * h's epoch b->hook_epoch, its tallies from the hook's count now
 * (ust__binding_tallied_count). Serialised by the caller (enable, disable). */
void ust__hook_attach(ust__hook *h, struct ust__binding *b);
/* Detach h's binding (its calls pass on from now on) and move its epoch on;
 * returns the old one, whose calls ust__hook_inflight counts. */
unsigned ust__hook_detach(ust__hook *h);
/* The calls of epoch old still in flight on h. */
long ust__hook_inflight(ust__hook *h, unsigned old);
/* b's operator's policy changed: h's copy of b's tally word, if b is bound to it. */
void ust__hook_republish(ust__hook *h, const struct ust__binding *b);
/* In a child process after fork, with h's binding detached: no call is in
 * flight on h (the parent's threads did not come along, and the forking
 * thread's calls, released last, are not counted again: ust__fork_child). */
void ust__hook_after_fork(ust__hook *h);
/* In a child process after fork, once: the calling (forking) thread's calls
 * in flight are the parent's. */
void ust__fork_child(void);

typedef struct ust__route_table {
  uint32_t cap;   /* power of two, twice max_routes */
  uint32_t max_routes;
  atomic_uint count;
  _Atomic(struct ust__route *) *slots;
} ust__route_table;

/* Everything the per-call path needs of the engine: the routes, timers,
 * the shadow pool, the rollout table, the seam. Owned by the engine. */
typedef struct ust__router {
  ust__route_table routes;
  ust__timers *timers;
  int tracer; /* ust__timers_may_trace: else no call asks the timers whether a window is open */
  ust__shadow_pool *shadow;
  ust__graphs *graphs; /* shadow captured into CUDA graphs */
  ust__rollout *rollout;
  ust__hw_ctx *hw;
  ust__log_sink *log;
  const ust__seam_i *seam;
  uint64_t graph_beside_max; /* bytes a captured shadow beside the chain may keep (0: none beside) */
  int graph_beside_launch;   /* its body launched from the device where CUDA takes it (else an IF node) */
  int graph_start_kernel;    /* a body the host starts waits for its kernel in the chain (else the replay) */
  atomic_uint_fast64_t internal_errors;
} ust__router;

/* A key dimension as every call reads it, four in a word
 * (ust__binding_keys_set copies them from the programs). */
typedef struct ust__dim_key {
  int8_t kind;      /* UST__DIM_SIZE: a tensor's size, read in place; -1: the program's evaluator */
  int8_t dim;       /* UST__DIM_SIZE: index, negative from the end */
  int8_t arg_index; /* UST__DIM_SIZE: the tensor's argument, -1 until resolved */
  int8_t bucket;
} ust__dim_key;

typedef struct ust__binding {
  /* read on every intercepted call: together, in its first cache line (the
   * engine allocates bindings aligned to one), ahead of the names */
  _Alignas(64) int index;
  int n_dims;
  ust__operator *op;
  /* calls counted without a key outside the hook's count: those a keyed
   * call stood for when it could not be counted on a route after all
   * (ust__binding_tallied), and the hook's once it is detached */
  atomic_uint_fast64_t tallied;
  /* its operator's policy as a call that may be tallied reads it: while the
   * operator observes without a candidate, key_every | the engine's number
   * (1 to 2^48 - 1: a process never enables that often) << 16; while it is
   * off, 1 << 16 (key_every 0: passed on); else 0, and the call reads the
   * policy */
  atomic_uint_fast64_t tally;
  ust__dim_key keys[UST__MAX_DIMS]; /* dims[] as the call's key reads them */
  ust__router *router;           /* the engine's */
  atomic_int resolved;           /* 0 new, 1 resolving, 2 done */
  int nested_ok;                 /* its calls may be floored by the bound ops they call (set once resolved) */
  ust__cand *cand;               /* the operator's candidate when it targets this binding */
  ust__dim_prog dims[UST__MAX_DIMS];
  char qualname[UST__QUALNAME_MAX]; /* "aten::mm" */
  char overload[UST__NAME_MAX];     /* "" or "out" */
  char display[UST__DISPLAY_MAX];   /* "aten::mm.out" */
  const ust__binding_def *def;
  atomic_uint_fast64_t untracked; /* calls not tracked: route table full */
  uint32_t writes_mask;          /* arguments the op writes (schema and curated list), by index */
  uint32_t overwrites_mask;      /* of those, written without being read (schema out= and curated list) */
  int n_arg_names;
  char arg_names[UST__MAX_ARGS][UST__NAME_MAX]; /* the schema's, once resolved */
  ust__roofline_prog roofline;   /* compiled from def->roofline; present 0 without one */
  ust__hook *hook;               /* the process's hook of this op, while enabled */
  ust__hold_word hold;           /* its standing with the timers' hold (dispatch/hold.h) */
  /* bound to it (ust__hook_attach): its calls count in the hook's epoch
   * hook_epoch, and its tallied ones on the hook's head from
   * hook_tallied_base (see ust__binding_tallied_count) while hook_counts is 1 */
  unsigned hook_epoch;
  atomic_int hook_counts;
  uint64_t hook_tallied_base;
  UT_hash_handle hh;             /* the engine's registry, by display name */
} ust__binding;

#define UST__MAX_KEY_TENSORS 8
#define UST__MAX_LAYOUTS 8

typedef struct ust__route_key {
  uint16_t binding;
  uint8_t device;
  uint8_t n_dtypes;
  uint8_t dtypes[UST__MAX_KEY_TENSORS];
  uint8_t phase; /* ust_phase of the calling thread */
  int64_t dims[UST__MAX_DIMS];
} ust__route_key;

typedef struct ust__route {
  /* what every call reads (the key's match, its mode, its count) first */
  uint64_t hash;
  ust__binding *binding;
  ust__route_key key;
  ust__route_rollout rollout;   /* guard/ */
  ust__figs figs;               /* scorer/ */
  ust__verify verify;           /* guard/ */
  char key_str[UST__KEY_MAX];   /* as the report spells it */
  /* the router's own: sampling counters and learned layouts */
  atomic_uint_fast64_t shadow_seen; /* calls considered for shadowing */
  atomic_uint_fast64_t canary_seen; /* canary: calls considered for the candidate */
  atomic_uint_fast64_t verify_seen; /* candidate-served calls considered for verification */
  _Atomic(ust__layout *) layouts[UST__MAX_LAYOUTS]; /* added once, freed with the route */
} ust__route;

/* The router's sink for verdicts (guard/guard.h): cookies are routes. */
extern const ust__verdict_sink_i ust__router_sink;
/* The gate word (guard/gate.h) of r's captured calls now: what its replays
 * run, from its mode, shares, qualification and shadow budget; 0: production
 * alone (also once one of its captured calls changed in place). The sink's
 * gate. */
uint64_t ust__route_gate(ust__route *r);

int ust__router_init(ust__router *r, int max_routes);
void ust__router_free(ust__router *r);
/* A binding's tally word (ust__binding.tally) for its operator's policy
 * under engine number engine_gen. */
uint64_t ust__tally_word(const ust__policy *pol, uint64_t engine_gen);
/* The calls of b counted without a key: its own count and, while it is
 * bound, its hook's in its epoch. Thread-safe. */
uint64_t ust__binding_tallied_count(ust__binding *b);
/* Once b's hook is detached: the hook's count of b's calls moved onto b,
 * which no longer reads the hook (calls tallied are not waited for: see
 * ust__line_tally). Serialised by the caller (disable). */
void ust__binding_fold_tallies(ust__binding *b);
/* Find or insert the route for key. Lock-free; NULL when the table is full
 * or memory ran out. Thread-safe. */
ust__route *ust__routes_get(ust__router *router, const ust__route_key *key, ust__binding *b);

const char *ust__phase_name(int phase);
/* The calling thread's ust_phase (ust_set_phase). */
int ust__thread_phase(void);
/* Build the key of a call: its head and b->n_dims dims, the words routes
 * hash and compare; the dims past them are left as they were (never read:
 * a route keeps them zero). */
void ust__route_key_make(const ust__binding *b, const ust__call *call, ust__route_key *key);
/* Copy b's dimension programs into the keys every call reads: once they are
 * compiled, and again once they are resolved against a schema. */
void ust__binding_keys_set(ust__binding *b);
/* "aten::mm|cpu|f32,f32|M=128,K=64,N=64" into buf. */
void ust__route_key_format(const ust__binding *b, const ust__route_key *k, char *buf, size_t cap);
/* A hash of a call's tensor sizes, strides, dtypes and scalar values: calls
 * with the same signature produce outputs of the same layout. 0 when the
 * call cannot be keyed exactly (an int list longer than the view carries). */
uint64_t ust__call_signature(const ust__call *call);

/* A plain copy of one route for the report: the parts' snapshots, taken in
 * the order the counters grow (served before captured before calls). */
typedef struct ust__route_snap {
  char key[UST__KEY_MAX];
  const ust__binding *binding; /* borrowed: lives as long as the engine */
  ust__route_key k;
  int has_cand;
  ust__rollout_snap rollout;
  ust__verify_snap verify;
  ust__figs_snap figs;
} ust__route_snap;

/* Every route made before the call, and those made meanwhile that it finds: a new
 * array of *n (free with ust__routes_snapshot_free). Never blocks a serving
 * thread: routes are read racily, rows of the rollout table briefly. */
int ust__routes_snapshot(ust__router *r, ust__route_snap **out, int *n);
void ust__routes_snapshot_free(ust__route_snap *s, int n);

#endif /* UST_DISPATCH_H */
