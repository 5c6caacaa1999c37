/*
 * dispatch/: operators, bindings, hooks and routes, the route table and the
 * router; the topics a route is made of have headers of their own, included
 * here: the definitions' bindings (defs.h), key dimensions (dims.h), the
 * roofline and hardware (roofcall.h), the timers (timers.h, with the hold,
 * hold.h, and kernel-level timing, kerneltime.h). The bridge (bridge*.cpp
 * and bridge.h, the only C++ files) fills the view and performs the serving
 * decision's steps; everything else here is C and never sees a torch header.
 *
 * A route is composed of parts declared by their owners: its figures
 * (scorer/), its verifications, its rollout and its candidate's calls in
 * flight (guard/), and what the router keeps itself (its key, sampling counters, learned layouts). Each
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
#include "dispatch/defs.h"
#include "dispatch/dims.h"
#include "dispatch/hold.h"
#include "dispatch/kerneltime.h"
#include "dispatch/roofcall.h"
#include "dispatch/timers.h"
#include "guard/guard.h"
#include "scorer/scorer.h"
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
  ust__flights *flights; /* every candidate call in flight, swept at its deadline (ust__router_sweep) */
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

/* What a route's candidate called inside its own runs (counted on its
 * sampled runs in this process): torch's ops it called directly, by name,
 * and the bound ops among them, whose work (the roofline's W and Q) is work
 * done outside the candidate's own kernels. The router's own part. */
typedef struct ust__fallback {
  atomic_uint_fast64_t runs;        /* candidate runs counted */
  atomic_uint_fast64_t runs_calling; /* of them, runs that called any op */
  atomic_uint_fast64_t aten_calls;  /* aten ops called directly */
  atomic_uint_fast64_t other_calls; /* ops of other namespaces called directly */
  atomic_uint_fast64_t bound_calls; /* bound ops called (at any depth) */
  atomic_uint_fast64_t bound_unscored; /* of them, those without a roofline to read their work from */
  atomic_uint_fast64_t bound_flops, bound_bytes; /* their W and Q, summed */
  atomic_uint_fast64_t own_flops, own_bytes;     /* the runs' own calls' W and Q, summed (where known) */
  atomic_int n_ops;                 /* names taken in op[] */
  char op[UST__FALLBACK_OPS][UST__FALLBACK_NAME_MAX];
  atomic_uint_fast64_t op_calls[UST__FALLBACK_OPS];
  ust__kt_sink kernels; /* the kernels of its runs inside tracing windows, and of the ops it called */
} ust__fallback;

typedef struct ust__fallback_snap {
  uint64_t runs, runs_calling, aten_calls, other_calls, bound_calls, bound_unscored;
  uint64_t bound_flops, bound_bytes, own_flops, own_bytes;
  int n_ops;
  char op[UST__FALLBACK_OPS][UST__FALLBACK_NAME_MAX];
  uint64_t op_calls[UST__FALLBACK_OPS];
  uint64_t kernel_runs, kernels, kernel_ns, op_kernels, op_ns;
} ust__fallback_snap;

typedef struct ust__route {
  /* what every call reads (the key's match, its mode, its count) first */
  uint64_t hash;
  ust__binding *binding;
  ust__route_key key;
  ust__route_rollout rollout;   /* guard/ */
  ust__figs figs;               /* scorer/ */
  ust__verify verify;           /* guard/ */
  ust__flight flight;           /* guard/ */
  char key_str[UST__KEY_MAX];   /* as the report spells it */
  /* the router's own: sampling counters and learned layouts */
  atomic_uint_fast64_t shadow_seen; /* calls considered for shadowing */
  atomic_uint_fast64_t canary_seen; /* canary: calls considered for the candidate */
  atomic_uint_fast64_t verify_seen; /* candidate-served calls considered for verification */
  _Atomic(ust__layout *) layouts[UST__MAX_LAYOUTS]; /* added once, freed with the route */
  ust__fallback fallback;           /* what its candidate called inside its runs */
  _Atomic(ust__repro *) repro;      /* its first failing call kept to be replayed; owned */
} ust__route;

/* The router's sink for verdicts (guard/guard.h): cookies are routes. */
extern const ust__verdict_sink_i ust__router_sink;
/* Every candidate call found past its deadline while still inside, now_ns
 * (ust__flights_sweep): counted overdue on its route, which is rolled back
 * with the evidence "deadline" (the call goes on; its route admits no new
 * candidate call). Returns how many; *next_ns: when the next deadline of a
 * call inside passes (UINT64_MAX: none). The engine's worker. */
int ust__router_sweep(ust__router *r, uint64_t now_ns, uint64_t *next_ns);
/* The gate word (guard/gate.h) of r's captured calls now: what its replays
 * run, from its mode, shares, qualification and shadow budget; 0: production
 * alone (also once one of its captured calls changed in place). The sink's
 * gate. */
uint64_t ust__route_gate(ust__route *r);

/* The route table of max_routes, and room for UST__FLIGHTS candidate calls
 * in flight at once over all routes (more are served by production). */
#define UST__FLIGHTS 1024
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

/* Whether a route of b with key k is one its candidate may run on: the
 * candidate's key-dimension constraints (candidate.when) hold. 1 without a
 * candidate or constraints. */
int ust__route_when_holds(const ust__binding *b, const ust__route_key *k);

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
  ust__flight_snap flight;
  ust__figs_snap figs;
  ust__fallback_snap fallback;
  ust__repro *repro; /* borrowed: lives as long as the route */
} ust__route_snap;

/* Every route made before the call, and those made meanwhile that it finds: a new
 * array of *n (free with ust__routes_snapshot_free). Never blocks a serving
 * thread: routes are read racily, rows of the rollout table briefly. */
int ust__routes_snapshot(ust__router *r, ust__route_snap **out, int *n);
/* A call's work: its roofline's W (every path) and Q; -1 without one. */
int ust__binding_work(const ust__binding *b, const ust__call *call, double *flops, double *bytes);
/* A plain copy of a route's fallback figures (read racily, as the rest). */
void ust__fallback_snapshot(const ust__fallback *f, ust__fallback_snap *o);
void ust__routes_snapshot_free(ust__route_snap *s, int n);

#endif /* UST_DISPATCH_H */
