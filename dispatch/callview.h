/*
 * The C interface between torch_bridge.cpp and the C core: the view of one
 * intercepted call, the per-call entry points and the seam vtable. Valid C
 * and C++ (no C11 atomics here); everything atomic stays behind the opaque
 * ust__binding.
 *
 * Internal header: never installed.
 */
#ifndef UST_CALLVIEW_H
#define UST_CALLVIEW_H

#include <stdint.h>

#include <dlpack/dlpack.h>

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
  UST__ARG_OTHER, /* anything understudy does not read (strings, tensor lists, ...) */
} ust__arg_kind;

/* dtypes as small ids: DLPack 0.6 has no codes for the fp8 types. */
typedef enum ust__dtype {
  UST__DT_OTHER = 0,
  UST__DT_F16, UST__DT_BF16, UST__DT_F32, UST__DT_F64,
  UST__DT_I8, UST__DT_U8, UST__DT_I16, UST__DT_I32, UST__DT_I64, UST__DT_BOOL,
  UST__DT_F8E4M3FN, UST__DT_F8E5M2, UST__DT_F8E4M3FNUZ, UST__DT_F8E5M2FNUZ,
  UST__DT_C64, UST__DT_C128,
  UST__DT_COUNT
} ust__dtype;
const char *ust__dtype_name(int dt);

/* One argument. Tensors are borrowed views: shape, strides and data point
 * into the caller's tensor and are valid only until production runs (it
 * consumes the stack). */
typedef struct ust__arg {
  int kind;   /* ust__arg_kind */
  int dtype;  /* ust__dtype, tensors only */
  DLTensor t;
  int64_t i;  /* ints and bools; the length of int lists */
  double f;
} ust__arg;

typedef enum ust__device {
  UST__DEV_CPU = 0,
  UST__DEV_CUDA = 1,  /* CUDA or HIP: torch calls both "cuda" */
  UST__DEV_OTHER = 2, /* meta, fake, ...: served, not counted */
} ust__device;

typedef struct ust__call {
  uint32_t size; /* sizeof(ust__call): grows only at the tail */
  int nargs;
  const ust__arg *args; /* borrowed */
  int device;           /* ust__device of the first tensor argument */
  int device_id;
  void *stream;         /* native stream (cudaStream_t / hipStream_t); NULL on the host */
} ust__call;

struct ust__binding;
struct ust__pair;
struct ust_candidate;
struct ust__route;

/* What ust__call_begin decided, carried to the end of the call. */
typedef struct ust__call_state {
  struct ust__route *route;
  int timing; /* 0 none, 1 host clock, 2 device events */
  int gpu_slot;
  uint64_t t0_ns;
  void *shadow; /* a shadow slot (guard/shadow.c) when this call is shadowed or its candidate verified */
  int serve;    /* 1: the candidate serves this call (canary, live) */
  int capturing; /* the call is being captured into a CUDA graph */
  int verdict;   /* with ust__shadow_want_verdict: -1 until concluded, then 1 failed, 0 not */
  uint64_t tsol_ps; /* the call's roofline floor, when timed and known */
} ust__call_state;

/* What the bridge needs to run a shadowed call's candidate. */
typedef struct ust__shadow_info {
  int kind;                           /* UST__CAND_NATIVE or UST__CAND_TORCH_OP */
  const struct ust_candidate *native; /* native: the loaded descriptor */
  const char *torch_op;               /* torch op: "ns::name" */
  const char *torch_overload;         /* torch op: "" or the overload */
  int compare;                        /* ust__cmp_kind */
  int aa;                             /* 1: also run production a second time (A/A) */
  uint32_t writes_mask;               /* arguments the op writes, by index */
  int compared_returns;               /* leading returns judged; -1: all */
} ust__shadow_info;

enum { UST__CAND_NATIVE = 1, UST__CAND_TORCH_OP = 2 };

/* 1 when the binding's operator is in mode off: the bridge then passes the
 * call through without building a view. */
int ust__binding_is_off(const struct ust__binding *b);
/* 1 until the binding's argument names were resolved against a schema. */
int ust__binding_needs_names(const struct ust__binding *b);
/* Resolve argument names (borrowed) and which arguments the schema marks
 * written (schema_writes, by index; the operator's curated list is added).
 * Thread-safe: the first caller resolves, the others wait for it. */
void ust__binding_resolve(struct ust__binding *b, int nargs, const char *const *names, uint32_t schema_writes);
const char *ust__binding_display(const struct ust__binding *b);
/* The schema's name of argument i, stable while enabled; "?" if unknown. */
const char *ust__binding_arg_name(const struct ust__binding *b, int i);

/* Before production runs. Never fails: when anything is off, st->route is
 * NULL and the call is served untouched. */
void ust__call_begin(struct ust__binding *b, const ust__call *call, ust__call_state *st);
/* After production returned. */
void ust__call_end(const ust__call *call, ust__call_state *st);

/* Shadowed calls (st->shadow != NULL after ust__call_begin): the bridge
 * snapshots the written arguments, marks UST__MARK_PROD_BEGIN, runs
 * production, marks UST__MARK_PROD_END, marks UST__MARK_CAND_BEGIN, runs
 * the candidate on the snapshot, marks UST__MARK_CAND_END, and hands the
 * outputs to ust__shadow_finish, which compares them (now on the host,
 * enqueued on the stream on a GPU) and releases st->shadow. If anything in
 * between goes wrong, ust__shadow_abandon releases it instead. The marks
 * record events on the call's stream (GPU) or read the host clock. */
void ust__shadow_info_get(const ust__call_state *st, ust__shadow_info *out);
void ust__shadow_mark(ust__call_state *st, int mark, const ust__call *call);
/* 0 once the shadow could not record its device work (then abandon it). */
int ust__shadow_alive(const ust__call_state *st);
/* pairs: borrowed (struct ust__pair, guard/guard.h); fail: ust__shadow_fail
 * with msg (borrowed, may be NULL) saying why. */
void ust__shadow_finish(const ust__call *call, ust__call_state *st, const struct ust__pair *pairs, int n_pairs,
                        int fail, const char *msg);
/* Production raised, or understudy failed: the sampled call is counted as
 * skipped (its number is not handed out again). */
void ust__shadow_abandon(const ust__call *call, ust__call_state *st);
/* After production raised: releases what begin took; records nothing. */
void ust__call_cancel(const ust__call *call, ust__call_state *st);

/* Serving (st->serve after ust__call_begin: canary or live). The bridge runs
 * the candidate on the call's own arguments and returns its outputs; when
 * st->shadow is set it also runs production on snapshots and hands both to
 * the guard (ust__shadow_finish), roles as in shadow mode. */
/* Count the call as served by the candidate (a call being captured into a
 * CUDA graph: as a capture of the candidate). Production serves every other
 * tracked call: the report derives its count, nothing is counted per call. */
void ust__call_served_by_candidate(ust__call_state *st);
/* 1: the route's operator verifies before serving (strict). */
int ust__call_strict(const ust__call_state *st);
/* Production served a candidate call: no layout learned for its outputs. */
void ust__call_unlearned(ust__call_state *st);
/* The candidate served a call that was verified. */
void ust__call_verified_serving(ust__call_state *st);
/* The candidate failed (ust__shadow_fail) on a call it served unverified:
 * the route rolls back; the bridge serves production. */
void ust__call_serve_failed(ust__call_state *st, int fail, const char *msg);
/* The outputs' layout production showed for calls with this call's
 * signature (the bridge's blob), or NULL when not learned yet. */
const void *ust__call_layout(const ust__call_state *st, const ust__call *call, size_t *len);
void ust__call_learn_layout(const ust__call_state *st, const ust__call *call, const void *blob, size_t len);
/* Before ust__shadow_finish: the caller will ask for this call's verdict. */
void ust__shadow_want_verdict(ust__call_state *st);
/* After ust__shadow_finish: 1 when this call's verification failed, 0 when
 * not (passed, or no verdict), -1 while pending. A host comparison is
 * concluded already; wait (strict, on a GPU) waits for the call's stream and
 * concludes it (synchronises). */
int ust__shadow_verdict(const ust__call *call, ust__call_state *st, int wait);
/* The shadow call number of the call's slot (0 without one). */
uint64_t ust__shadow_call_no(const ust__call_state *st);
/* An error inside understudy on the call path (the call was served by
 * production); counted in the report. */
void ust__count_internal_error(void);

/* The seam the bridge installs when the library loads. */
typedef struct ust__seam_i {
  const char *torch_version; /* static storage */
  /* Register an interceptor for the binding's op and overload; *handle is
   * the seam's. Returns 0, or UST_ETORCH with the last error set. */
  int (*register_binding)(struct ust__binding *b, void **handle);
  /* Remove it; cannot fail. */
  void (*unregister_binding)(void *handle);
  /* 1 when the op has a schema in this process now. */
  int (*op_defined)(const char *qualname, const char *overload);
} ust__seam_i;

void ust__seam_install(const ust__seam_i *seam);
const char *ust__binding_qualname(const struct ust__binding *b);
const char *ust__binding_overload(const struct ust__binding *b);

/* Calls in flight through interceptors; disable waits for it to drain. */
void ust__inflight_enter(void);
void ust__inflight_leave(void);

#ifdef __cplusplus
}
#endif

#endif /* UST_CALLVIEW_H */
