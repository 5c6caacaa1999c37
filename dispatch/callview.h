/*
 * The C interface between the C++ seam (dispatch/bridge*.cpp) and the C
 * core: the view of one intercepted call, the per-call entry points, and the
 * seam vtable. Valid C and C++ (no C11 atomics here); routes, bindings and
 * hooks stay opaque.
 *
 * The bridge performs primitive steps only; what runs, in which order, and
 * what the caller receives is the serving decision (guard/decision.h).
 *
 * Internal header: never installed.
 */
#ifndef UST_CALLVIEW_H
#define UST_CALLVIEW_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "base/types.h"
#include "guard/compare.h"
#include "guard/decision.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ust__arg_kind {
  UST__ARG_NONE = 0, /* an optional argument that is None, or an undefined tensor */
  UST__ARG_TENSOR,
  UST__ARG_INT,
  UST__ARG_DOUBLE,
  UST__ARG_BOOL,
  UST__ARG_INTLIST,
  UST__ARG_OTHER,      /* anything understudy does not read (strings, lists of lists, ...) */
  UST__ARG_TENSORLIST, /* a Tensor[]: t and dtype are its first tensor's, i its length */
} ust__arg_kind;

#define UST__MAX_LIST 8 /* int[] values carried by the view */

/* One argument. Tensors are borrowed views: shape, strides and data point
 * into the caller's tensor and are valid only until production runs (it
 * consumes the stack). */
typedef struct ust__arg {
  int kind;   /* ust__arg_kind */
  int dtype;  /* ust__dtype, tensors only */
  DLTensor t;
  int64_t i;  /* ints and bools; the length of int lists */
  double f;
  int64_t list[UST__MAX_LIST]; /* an int list's first values (all of them when i <= UST__MAX_LIST) */
} ust__arg;

typedef struct ust__call {
  uint32_t size; /* sizeof(ust__call): grows only at the tail */
  int nargs;
  const ust__arg *args; /* borrowed */
  int device;           /* ust__device of the first tensor argument (a list's first tensor) */
  int device_id;
  void *stream;         /* native stream (cudaStream_t / hipStream_t); NULL on the host */
  int phase;            /* ust_phase of the calling thread */
} ust__call;

struct ust__binding;
struct ust__hook;
struct ust_candidate;

/* What the bridge needs to run a call's candidate. */
typedef struct ust__cand_view {
  int kind;                           /* UST__CAND_NATIVE or UST__CAND_TORCH_OP (guard/guard.h) */
  const struct ust_candidate *native; /* native: the loaded descriptor (NULL when proc runs it) */
  struct ust__procrun *proc;          /* native: its qualifying process runs this call; NULL: this process */
  int remote;                         /* the call runs the candidate elsewhere, to qualify it: its qualifying
                                         process (proc) or a torch op's overload `qualify` */
  int abi;                            /* native: its ABI version */
  void *torch_op;                     /* torch op: the seam's resolved handle, or NULL */
  const char *torch_op_name;          /* torch op: "ns::name", for messages */
  int compare;                        /* ust__cmp_kind */
  uint32_t writes_mask;               /* arguments the op writes, by index */
  uint32_t overwrites_mask;           /* of those, written without being read */
  int compared_returns;               /* leading returns judged; -1: all */
  uint64_t deadline_ns;               /* a call of the candidate longer than this is overdue */
} ust__cand_view;

/* What ust__call_settle decided for a call it did not settle, carried to the
 * end of the call. */
typedef struct ust__call_state {
  void *route;   /* opaque; NULL: the call is not tracked (served untouched) */
  int plan;      /* ust__plan */
  int flags;     /* UST__DF_* */
  void *slot;    /* the call's shadow slot (shadow; verified serving) */
  int capturing; /* the call is being captured into a CUDA graph */
  int capture_marked;    /* the graph's nodes were noted before the call (the kernel tracer maps them) */
  uint32_t capture_from; /* the index its first node will take in the graph */
  int timing;    /* PASS: 0 none, 1 host clock, 2 device timer */
  /* the estimate's stratum of the call's time (UST__TIMED_*): STEADY after its
   * key's first steady_after calls, else SAMPLED; FIRST once it is timed for
   * being one of the key's first calls (the last thing the plan decides) */
  int timed_kind;
  int gpu_slot;
  uint64_t t0_ns;
  uint64_t tsol_ps; /* the call's roofline floor, when timed and known */
  int verdict;      /* after ust__call_want_verdict: -1 pending, then 1 failed, 0 not */
  ust__cand_view cand;
  int nested_ok;    /* its floor may come from the bound ops it calls (its own roofline is absent or an estimate) */
  double own_flops, own_bytes; /* its own roofline's W and Q, noted once the call's floor is settled */
  int floor_tag1;   /* its shadow slot's floor waits for lengths on the device (ust__timers_stage; 0: none) */
  void *graph;      /* shadow captured into the call's CUDA graph (plan SHADOW, flag UST__DF_CAPTURED) */
  /* its candidate's call as the router's table of calls in flight holds it
   * (guard/flight.h): 1 + its entry, 0 none; and the entry's generation */
  int flight;
  uint64_t flight_gen;
} ust__call_state;

/* Bound ops a call runs while it runs (an attention wrapper calling its
 * flash kernel): their floors, summed while the outer call's production
 * runs. */
typedef struct ust__nested {
  int n;            /* nested bound calls seen */
  int unscored;     /* of them, ones whose floor could not be computed */
  uint64_t tsol_ps; /* their floors, summed */
  double flops, bytes;
  /* their work (the roofline's W and Q), summed whether or not a hardware
   * profile gives a floor; unworked: those without a roofline to read */
  double work_flops, work_bytes;
  int unworked;
  /* the outer call whose floor they make, where its timer can wait for a
   * callee's lengths on the device (ust__call_nested_open): its route, and
   * its timer's token + 1 (0: none) */
  void *outer;
  int token1;
} ust__nested;

/* ---- bindings -------------------------------------------------------------------- */

/* What understudy keeps per thread about the calls it intercepts, in one
 * thread-local block: the bridge finds it once per call (each thread-local
 * variable of a dlopen'ed library is a call into the dynamic loader). A
 * passed or tallied call reads its first cache line alone (aligned to one). */
typedef struct __attribute__((aligned(64))) ust__thread {
  int depth;      /* its calls entered (ust__hook_admit .. ust__hook_release), nested */
  int forked;     /* in a forked child: how many of them the parent counted (ust__hook_after_fork) */
  int call_depth; /* tracked calls in progress: a bound op one calls is part of it, not counted again */
  int own_work;   /* understudy's own torch work in progress (snapshots, the candidate): passed through */
  int phase;      /* ust_set_phase */
  int captures;   /* CUDA graph captures this thread began and has not ended (ust_graph_capture_begun) */
  struct ust__nested *nested; /* while an outer call's production runs: where its bound callees' floors are summed */
  /* the keying sample (ust__binding_admit), under the engine key_gen names:
   * what a tallied call reads in this line, the warm-up's and the draw's
   * fields after it */
  int key_traced;   /* its router holds a kernel tracer: inside a window every call is keyed */
  int pool_allocs;  /* its allocations go to a CUDA graph's pool outside a capture (ust_pool_alloc_begun) */
  uint64_t key_gen; /* the engine's number (as a binding's tally word holds it) the fields below count for */
  int64_t key_gap;  /* calls until the next one keyed at random; 0 until the warm-up ends */
  uint64_t key_after; /* its policy's */
  uint64_t key_warm;  /* this thread's calls under it, counted up to key_after */
  uint64_t key_rng;   /* xorshift64* state; 0 until first drawn */
} ust__thread;

/* The calling thread's block (its address: ust__thread_state). */
extern __thread ust__thread ust__thread_block __attribute__((visibility("hidden")));
ust__thread *ust__thread_state(void);

/* What a call of b the bridge may count needs, before its view is built:
 * UST__ADMIT_PASS, passed on untouched (the operator is off);
 * UST__ADMIT_TALLY, tallied without a key (on its hook's line,
 * ust__line_tally) when the bridge can count it so (its device is the
 * host or a CUDA device), else keyed as one call; or the number of calls the
 * keyed call stands for (1; the policy's key_every when keyed at random past
 * the thread's warm-up), for ust__call_settle. While the thread captures a
 * CUDA graph (ust_graph_capture_begun) every call is keyed, so that the
 * graph's nodes map to routes. Reads b's tally word. */
enum { UST__ADMIT_PASS = -1, UST__ADMIT_TALLY = 0, UST__ADMIT_NESTED = -2 };
int ust__binding_admit(struct ust__binding *b, ust__thread *t);

/* A binding's tally word (ust__tally_word): while its operator observes
 * without a candidate, key_every | the engine's number (1 to 2^48 - 1) <<
 * 16; UST__TALLY_OFF while it is off (key_every 0: passed on); else 0, and
 * the call reads the policy. */
#define UST__TALLY_OFF ((uint64_t)1 << 16)

/* The admission's common case: a call tallied past the thread's warm-up
 * under the engine the tally word names, outside captures and tracing
 * windows, not the one drawn (a thread in its warm-up has no countdown
 * drawn: key_gap 0). The caller takes the call off the countdown. */
static inline __attribute__((always_inline)) int ust__word_tallies(uint64_t word, const ust__thread *t) {
  /* one branch for the caller to take, not four: the fields share a line */
  return ((word & 0xffffu) != 0) & (t->key_gen == word >> 16) & ((t->captures | t->key_traced) == 0) &
         (t->key_gap > 1);
}

/* ---- hooks ------------------------------------------------------------------------ */

/* What a call passed on or tallied reads and writes of its hook (with its
 * thread's block): held in the interceptor object, on the cache line torch
 * hands the call's kernel, once the interceptor is registered; the hook's
 * head points at it. The core and the bridge both reach it (and C11 atomics
 * are not C++'s), so its fields are plain integers that both access with
 * the compiler's __atomic builtins. Written by enable, disable and policy
 * changes (serialised by the engine), read and counted by calls. */
typedef struct ust__hook_line {
  /* the bound binding's tally word; UST__TALLY_OFF while none is bound or
   * its operator is off: a call then passes on reading this alone */
  uint64_t word;
  /* calls counted without a key (ust__line_tally) since the hook was
   * registered: a binding's are those counted while it is bound
   * (ust__binding_tallied_count) */
  uint64_t tallied;
} ust__hook_line;

/* The first cache line of an op's hook: its line, and its gate, which the
 * calls that read the binding enter. A hook begins with its head. */
typedef struct __attribute__((aligned(64))) ust__hook_head {
  /* what a call passed on or tallied reads and counts: in the interceptor
   * object (the bridge sets it as it registers one: the object's own line,
   * which the call reads anyway) */
  ust__hook_line *line;
  struct ust__binding *binding; /* the enabled engine's binding of the op; NULL */
  /* The hook's gate, for the calls that read its binding (all but those
   * tallied in the interceptor and those passed on there): such a call
   * enters its count in epoch & 1 before it reads binding; disable detaches
   * the binding, moves the epoch on and waits for the old count to fall to
   * 0 (calls after the move count in the new one, and read NULL). */
  unsigned epoch;
  long inflight[2];
} ust__hook_head;

static inline ust__hook_head *ust__hook_head_of(struct ust__hook *h) { return (ust__hook_head *)(void *)h; }

/* The tally word of the hook whose line l is, as a call reads it first: its
 * calls pass on untouched while it is UST__TALLY_OFF (no binding, or its
 * operator is off), and need no entry. A hint: a call that reads another
 * word is admitted, which decides as well. */
static inline __attribute__((always_inline)) uint64_t ust__line_word(const ust__hook_line *l) {
  return __atomic_load_n(&l->word, __ATOMIC_ACQUIRE);
}

/* The calling thread's block, found once: left to itself the compiler asks
 * the dynamic loader for it again after each atomic (__tls_get_addr). */
static inline __attribute__((always_inline)) ust__thread *ust__thread_here(void) {
  ust__thread *t = &ust__thread_block;
  __asm__("" : "+r"(t));
  return t;
}

/* Whether thread t tallies a call of a hook whose tally word is word, the
 * admission's common case (ust__binding_admit): outside understudy's own
 * work and tracked calls, and ust__word_tallies. Reads t's first line. */
static inline __attribute__((always_inline)) int ust__thread_tallies(uint64_t word, const ust__thread *t) {
  return ((t->own_work | t->call_depth) == 0) & ust__word_tallies(word, t);
}

/* A call thread t tallies (ust__thread_tallies), taken off its countdown
 * and counted on its hook's line l without an entry. A call tallied while
 * disable detaches its binding may be counted by neither engine (it read
 * the word before the detach, and counts after the binding's count was
 * folded). */
static inline __attribute__((always_inline)) void ust__line_tally(ust__hook_line *l, ust__thread *t) {
  t->key_gap--;
  __atomic_fetch_add(&l->tallied, 1, __ATOMIC_RELAXED);
}

/* An intercepted call between ust__hook_admit and ust__hook_release. */
typedef struct ust__entry {
  ust__thread *thread;          /* the calling thread's block */
  ust__hook_head *hook;         /* the hook it was admitted on */
  struct ust__binding *binding; /* the enabled engine's binding of the op; NULL when understudy is
                                   disabled or does not bind the op now */
  unsigned ticket;              /* the epoch it is counted in flight in on the hook's gate */
} ust__entry;

/* An intercepted call its interceptor neither passed on nor tallied
 * (ust__thread_tallies): counted in flight on its hook's gate and the hook's
 * binding read (e->binding stays valid until the release: disable waits for
 * the calls in flight), then admitted. Returns UST__ADMIT_PASS for a call
 * passed on untouched (no binding, understudy's own work, a bound op inside
 * a tracked call, an operator that is off); UST__ADMIT_NESTED for a bound op
 * that a tracked call's production runs while that call collects its
 * callees' floors (the thread's nested, at call depth 1); else what
 * ust__binding_admit says, except that a call it would tally is keyed,
 * standing for itself alone (1): its interceptor tallied every call it could,
 * so such a call is one whose kernel the tally cannot take, or one whose
 * hook's word changed since the interceptor read it. Every entry is released
 * once with ust__hook_release, whatever it returned, on the thread that made
 * it. Lock-free. */
int ust__hook_admit(struct ust__hook *h, ust__entry *e);

static inline __attribute__((always_inline)) void ust__hook_release(const ust__entry *e) {
  ust__thread *const t = e->thread;
  /* a forked child's thread releases the calls it made before the fork last
   * (they nest): their counts are the parent's, which the child's hooks no
   * longer hold (ust__hook_after_fork) */
  if (__builtin_expect(--t->depth < t->forked, 0)) {
    t->forked = t->depth;
    return;
  }
  __atomic_fetch_sub(&e->hook->inflight[e->ticket], 1, __ATOMIC_RELEASE);
}

/* n calls counted on b without a key: a tallied one; or those a call keyed at
 * random stood for, when it could not be counted on a route after all. */
void ust__binding_tallied(struct ust__binding *b, unsigned n);
/* 1 until the binding's argument names were resolved against a schema. */
int ust__binding_needs_names(const struct ust__binding *b);
/* 1 when the binding's roofline reads the lengths of a varlen batch from
 * tensor values: a keyed call's view then carries its tensors' data
 * pointers, so that a timed call's floor can read (or copy) them. */
int ust__binding_reads_lengths(const struct ust__binding *b);
/* Resolve argument names (borrowed), which arguments the schema marks
 * written (schema_writes, by index; the operator's curated list is added)
 * and which are an out= overload's outputs (schema_outs: overwritten, with
 * the list's 'overwrites'). Thread-safe: the first caller resolves, the
 * others wait for it. */
void ust__binding_resolve(struct ust__binding *b, int nargs, const char *const *names, uint32_t schema_writes,
                          uint32_t schema_outs);
const char *ust__binding_display(const struct ust__binding *b);
/* The op the binding intercepts: "ns::name" and its overload ("" the default). */
const char *ust__binding_qualname(const struct ust__binding *b);
const char *ust__binding_overload(const struct ust__binding *b);
/* The schema's name of argument i, stable while enabled; "?" if unknown. */
const char *ust__binding_arg_name(const struct ust__binding *b, int i);

/* ---- one call ------------------------------------------------------------------ */

/* Before anything runs: 1 when the call is settled, served by production
 * alone and untimed (counted on its route, or untracked), with no
 * ust__call_end to make and only st->route set (NULL: untracked); else 0
 * with the plan (st->plan, st->flags) and what it needs in st. Never fails:
 * when anything is off, the call is settled or its plan is UST__PLAN_PASS,
 * served untouched. weight: the calls it stands for (ust__binding_admit),
 * counted on its route; its timing share is the calls' share. */
int ust__call_settle(struct ust__binding *b, const ust__call *call, unsigned weight, ust__call_state *st);
/* After the decision finished (d: its notes and outcome; raised: production
 * raised): timings, served counts, internal errors. */
void ust__call_end(const ust__call *call, ust__call_state *st, const ust__decision *d);

/* Steps of the decision that the C core performs for the bridge. */
void ust__call_mark(ust__call_state *st, int mark, const ust__call *call); /* ust__shadow_point */
/* 0 once the call's slot could not record its device work. */
int ust__call_slot_alive(const ust__call_state *st);
/* Bytes understudy copied for the call (snapshots, the candidate's private
 * inputs): part of its verification's cost, in the report. */
void ust__call_note_copied(ust__call_state *st, uint64_t bytes);
/* 1 when this shadow call also runs production a second time (A/A). */
int ust__call_aa(const ust__call_state *st);
/* COMPARE: pairs borrowed; fail (ust__shadow_fail) with msg (may be NULL). */
void ust__call_compare(ust__call_state *st, const ust__call *call, const ust__pair *pairs, int n_pairs, int fail,
                       const char *msg);
/* ABANDON. */
void ust__call_abandon(ust__call_state *st, const ust__call *call);
/* Before COMPARE: the call will ask for its own verdict. */
void ust__call_want_verdict(ust__call_state *st);
/* VERDICT: 1 failed, 0 passed (or no verdict); waits on a GPU (strict). */
int ust__call_verdict(ust__call_state *st, const ust__call *call);
/* CAND_FAILED: the candidate failed serving unverified (fail, msg). */
void ust__call_cand_failed(ust__call_state *st, int fail, const char *msg);

/* A failing call kept to be replayed (the bridge's, dispatch/bridge_repro.cpp):
 * its arguments' values and layouts, both sides' outputs, the op and the
 * candidate. The router keeps a route's first one; the report shows it. */
typedef struct ust__repro {
  /* The call as the text of a JSON object, made on the first ask (device
   * memory is read then, on the asking thread) and kept; NULL when it could
   * not be made. Owned by the repro; thread-safe. */
  const char *(*text)(struct ust__repro *self);
  /* Called once the call failed, on the thread that concluded it: a repro
   * of host tensors makes its text now, before the caller's tensors change
   * (device tensors are understudy's own copies, read at the first ask). */
  void (*settle)(struct ust__repro *self);
  void (*destroy)(struct ust__repro *self);
  /* why the call failed, set when it is kept */
  char reason[32];
  char output[80];
  int64_t first_mismatch; /* flat, in the output named; -1 none */
} ust__repro;
/* The bytes of a failing call the call's route would keep: its candidate's
 * guard.repro_bytes while the route has none kept yet; 0 otherwise. */
uint64_t ust__call_repro_bound(const ust__call_state *st);
/* Before COMPARE (with a slot): keep is told the call's verdict when it is
 * concluded, on whichever thread concludes it; a failed call's keep becomes
 * its route's (the first one: later ones are destroyed), others are
 * destroyed. Owned from here on; destroyed now when the call has no slot. */
void ust__call_keep(ust__call_state *st, ust__repro *keep);
/* The calling thread into the relaxed stream-capture mode and back (the
 * mode it had): a device copy made then leaves another thread's capture
 * valid. No-ops in a build without a GPU backend. */
int ust__call_relaxed_begin(void);
void ust__call_relaxed_end(int mode);
/* The op names a route keeps of what its candidate calls, and the bytes
 * of each name kept (NUL included): a longer name is cut at the start of a
 * UTF-8 character (an autograd.Function's is its Python class's). */
#define UST__FALLBACK_OPS 12
#define UST__FALLBACK_NAME_MAX (UST__NAME_MAX + 32)

/* What one run of the candidate called (counted by the bridge around a
 * sampled run in this process): aten ops and other ops it called directly,
 * names[i] called counts[i] times (n names), and the bound ops it called
 * with their work (bound). Noted on the call's route. */
void ust__call_fallback(ust__call_state *st, const ust__call *call, uint64_t aten, uint64_t other, int n,
                        const char *const *names, const uint32_t *counts, const ust__nested *bound);
/* Around a counted run of the candidate on a CUDA call, and around each op
 * it calls directly: inside a kernel-tracing window, a span whose kernels
 * count on the route's fallback; a token, or -1 outside a window. Ended on
 * the same thread, innermost first, with its role. */
enum { UST__SPAN_RUN = 1, UST__SPAN_OP = 2 };
int ust__call_span_begin(ust__call_state *st, const ust__call *call);
void ust__call_span_end(ust__call_state *st, int token, int role);
/* The candidate starts running for the call (the clock of its deadline). */
void ust__call_cand_begin(ust__call_state *st);
/* The candidate returned: 1 when its call was past its deadline (the
 * engine's worker found it so while it ran, and rolled its route back; or
 * it took longer), counted once as overdue, with msg saying how long; then
 * the call fails. A call run in the qualifying process is held to the
 * deadline there (ust__call_run_remote): never overdue here; nor is a call
 * captured into a CUDA graph (it only enqueued its work). */
int ust__call_cand_end(ust__call_state *st, char *msg, size_t cap);
/* 1 when the call's floor should be summed from the bound ops production
 * calls (a timed or verified call whose own roofline is absent or an
 * estimate): the bridge then collects them (ust__binding_nested_floor) and
 * hands the sum over (ust__call_nested_done) before the call ends. */
int ust__call_wants_nested(const ust__call_state *st);
/* Before production runs with acc collecting: the call's timer, where a
 * callee's floor bounded for lengths on the device waits for them. */
void ust__call_nested_open(const ust__call_state *st, ust__nested *acc);
/* A bound call made inside another: its floor into acc (b's argument names
 * resolved). */
void ust__binding_nested_floor(struct ust__binding *b, const ust__call *call, ust__nested *acc);
/* The nested floors production's run collected: the call is scored against
 * their sum when every nested call was scored, else against its own. */
void ust__call_nested_done(ust__call_state *st, const ust__nested *acc);
/* Run the candidate in its qualifying process (st->cand.proc) on call's
 * tensors, which the caller owns (private copies): they come back as the
 * candidate left them. The candidate's status (0 succeeded), or
 * UST__CALL_REMOTE_LOST (the process crashed, hung or broke protocol: the
 * candidate is refused for good) or UST__CALL_REMOTE_UNSENT (the call could
 * not be sent; an internal error); msg says what happened. */
#define UST__CALL_REMOTE_LOST (-1000)
#define UST__CALL_REMOTE_UNSENT (-1001)
/* Or the process was busy with another thread's call: nothing ran there
 * (counted); the call goes without its candidate, production serving. */
#define UST__CALL_REMOTE_BUSY (-1002)
struct ust_candidate_call;
int ust__call_run_remote(ust__call_state *st, const struct ust_candidate_call *call, char *msg, size_t cap);
/* An error of understudy's own on the call path (production served). */
void ust__call_internal_error(const struct ust__binding *b);

/* A shadow captured into the call's CUDA graph (UST__DF_CAPTURED): its
 * work is captured in parts, each enqueued on *side between part_begin and
 * part_end, and run at the replays the route's gate verifies: the copies
 * production overwrites (before production), then the candidate and the
 * comparison (after; COMPARE ends it). 0, or an error: the call's shadow is
 * dropped (production stays in the graph alone) and why (ust__graph_why)
 * is counted on the route. */
int ust__call_graph_part_begin(ust__call_state *st, void **side);
int ust__call_graph_part_end(ust__call_state *st, int keep, int why);
/* Inside the open part after production: the candidate's pairs compared
 * into dev_stats (UST__MAX_PAIRS statistics of device memory the graph
 * keeps) and published; then the part is ended into the graph. servable 0:
 * the pairs leave some of the candidate's results out (returns not
 * compared), so its replays may be verified but never served. 0 when the
 * call's shadow is whole in its graph. Ends the slot's use (as COMPARE). */
int ust__call_graph_compare(ust__call_state *st, const ust__pair *pairs, int n_pairs, void *dev_stats, int servable);
/* Inside the open part: bytes copied from src to dst, or set to byte (device
 * memory). 0, or an error (the shadow is dropped). */
int ust__call_graph_copy(ust__call_state *st, void *dst, const void *src, size_t bytes);
int ust__call_graph_fill(ust__call_state *st, void *dst, int byte, size_t bytes);
/* The shadow is dropped for why (detail: logged, may be NULL). */
void ust__call_graph_drop(ust__call_state *st, int why, const char *detail);
/* A shadow beside the chain (a route in shadow when captured): verify-only,
 * its copies taken in the chain by one kernel and everything else on a
 * branch that nothing in the chain waits for, reading only memory kept for
 * it (the buffers the bridge makes for it are never freed: the caller's
 * allocator would hand freed memory to the nodes captured after it). 1
 * when the call's shadow is beside the chain. */
int ust__call_graph_beside(const ust__call_state *st);
/* Before its first part: the call's shadow goes in the chain instead when
 * what it would keep (an estimate, bytes) is over shadow.graph_beside_max_mb.
 * Then each buffer it keeps: device memory kept for the process (not the
 * caller's allocator: torch's would count it in the capture's pool), or
 * NULL over the bound (the caller drops the shadow, UST__GW_KEPT) or
 * without memory. */
void ust__call_graph_beside_plan(ust__call_state *st, uint64_t bytes);
void *ust__call_graph_alloc(ust__call_state *st, uint64_t bytes);
/* Around production in a captured call (end 0 before it, 1 after): its
 * nodes, and not the shadow's, are the route's for the kernel tracer. */
void ust__call_graph_prod(ust__call_state *st, const struct ust__call *call, int end);
/* 1 while the call's open part still captures (the candidate did nothing
 * that ended or invalidated it). */
int ust__call_graph_active(const ust__call_state *st);
/* The candidate failed (ust__fail) while captured, its part intact: a
 * verified failure of a shadow call, with evidence; the route rolls back. */
void ust__call_graph_failed(ust__call_state *st, int fail, const char *msg);

/* ---- learned output layouts -------------------------------------------------------- */

#define UST__MAX_RETURNS 8
#define UST__MAX_RANK 8

typedef enum ust__ret_kind {
  UST__RET_NONE = 0,    /* None */
  UST__RET_FRESH = 1,   /* a new tensor: scalar type, device, sizes, strides */
  UST__RET_ARG = 2,     /* a written argument (arg) */
  UST__RET_OPAQUE = 3,  /* a value a native candidate cannot produce */
} ust__ret_kind;

typedef struct ust__ret_layout {
  int kind;        /* ust__ret_kind */
  int arg;         /* UST__RET_ARG: its index */
  int scalar_type; /* UST__RET_FRESH: the bridge's own code (c10::ScalarType) */
  int device;      /* -1 the host, else the GPU's index */
  int ndim;
  int64_t sizes[UST__MAX_RANK], strides[UST__MAX_RANK];
} ust__ret_layout;

/* The layout of production's returns for calls with one signature. */
typedef struct ust__layout {
  uint64_t sig;
  int n_returns;
  ust__ret_layout ret[UST__MAX_RETURNS];
} ust__layout;

/* The layout learned for this call's signature, copied into out: 0, or -1
 * when none is (or can be) learned for it. */
int ust__call_layout(const ust__call_state *st, const ust__call *call, ust__layout *out);
/* Learn one (sig is filled in). Thread-safe; a signature that cannot be
 * keyed exactly (an int list longer than the view carries) is not learned. */
void ust__call_learn_layout(const ust__call_state *st, const ust__call *call, const ust__layout *l);

/* ---- the seam -------------------------------------------------------------------- */

/* What the bridge installs when the library loads. */
typedef struct ust__seam_i {
  const char *torch_version; /* static storage */
  /* Register the interceptor for an op and overload, calling through hook
   * (which lives as long as the process). Once per op for the life of the
   * process. Returns 0, or UST_ETORCH with the last error set. */
  int (*register_hook)(struct ust__hook *hook, const char *qualname, const char *overload, const char *display);
  /* 1 when the op has a schema in this process now. */
  int (*op_defined)(const char *qualname, const char *overload);
  /* When b's op is defined now: read its schema into b (argument names,
   * what it writes: ust__binding_resolve) and return 1; else 0. */
  int (*resolve_binding)(struct ust__binding *b);
  /* A torch op's handle (lives as long as the process), or NULL while the op
   * is not defined. */
  void *(*resolve_op)(const char *qualname, const char *overload);
  /* 1 when torch lets float32 matrix products run in TF32 on this device
   * kind (UST__DEV_CUDA: cuBLAS; UST__DEV_CPU: oneDNN) now, as
   * torch.backends.*.matmul.fp32_precision / set_float32_matmul_precision
   * set it. Cheap: a few loads. */
  int (*tf32_matmul)(int device);
  /* 1 while torch's profiler (Kineto) is preparing or recording a trace:
   * the kernel tracer stands down then. Any thread. */
  int (*profiler_active)(void);
} ust__seam_i;

/* The seam of this build: the bridge's (bridge_seam.cpp), or NULL in a
 * build without torch (a weak default in dispatch/router.c). */
const ust__seam_i *ust__seam(void);

#ifdef __cplusplus
}
#endif

#endif /* UST_CALLVIEW_H */
