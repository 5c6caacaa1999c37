/*
 * guard/: output comparison, shadow slots and verdicts.
 *
 * Owns: the comparison rules (one element rule shared by the host code and
 * the GPU kernel, guard/compare_elem.h), the pool of in-flight shadow slots,
 * and the verdict that rolls a route back at its first verified failure.
 *
 * Stream discipline: everything a shadow call enqueues (events, the compare
 * kernel, the copy of its results to pinned host memory) goes on the
 * caller's stream; results are read by the engine's worker thread once the
 * slot's last event completed. Nothing here synchronises the serving path.
 *
 * Internal header: never installed.
 */
#ifndef UST_GUARD_H
#define UST_GUARD_H

#include <stdint.h>

#include <dlpack/dlpack.h>

#include "dispatch/callview.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ust__cmp_kind {
  UST__CMP_ALLCLOSE = 0, /* |c - p| <= atol + rtol * |p|; integer dtypes compare exactly */
  UST__CMP_EXACT = 1,    /* equal values (-0 equals +0; any NaN equals any NaN) */
  UST__CMP_SET = 2,      /* allclose after sorting both sides along the last dimension */
} ust__cmp_kind;

/* Reductions over one output pair. This is also the layout the compare
 * kernel writes in device memory, so it holds only integers and doubles:
 * maxima of non-negative doubles are kept as their bit patterns (which order
 * like the values) and the first mismatch as ~index (so zeroed memory means
 * "none" and a maximum finds the smallest index). */
typedef struct ust__cmp_stats {
  unsigned long long n;             /* elements compared */
  unsigned long long mismatches;    /* elements outside tolerance, non-finite ones included */
  unsigned long long nonfinite_prod;
  unsigned long long nonfinite_cand;
  unsigned long long nonfinite_bad; /* candidate non-finite where production is finite */
  unsigned long long first_mismatch_inv; /* ~index of the first mismatch; 0 when none */
  unsigned long long max_abs_bits;  /* max |c - p| over finite pairs */
  unsigned long long max_rel_bits;  /* max |c - p| / |p| over finite pairs with p != 0 */
  double sum_sq_diff;               /* sum (c - p)^2 over finite pairs */
  double sum_sq_prod;               /* sum p^2 over finite production values */
} ust__cmp_stats;

double ust__bits_to_double(unsigned long long bits);
/* -1 when there was no mismatch. */
int64_t ust__cmp_first_mismatch(const ust__cmp_stats *s);

/* dtypes the comparison reads (ust__dtype ids): f16, bf16, f32, f64 and the
 * integer and bool types. */
int ust__cmp_dtype_supported(int dtype);
/* Default tolerances of allclose for a dtype. */
void ust__cmp_default_tol(int dtype, double *atol, double *rtol);

/* Compare n elements of two dense host buffers of the same dtype; out is
 * overwritten. */
void ust__compare_host(const void *prod, const void *cand, int dtype, int64_t n, int kind, double atol,
                       double rtol, ust__cmp_stats *out);
/* Enqueue the comparison of two dense device buffers on stream, reducing
 * into dev_out (device memory the caller zeroed on the same stream). Returns
 * 0 or UST_EGPU. Only in a GPU build; the host build returns UST_EGPU. */
int ust__compare_launch(const void *prod, const void *cand, int dtype, int64_t n, int kind, double atol,
                        double rtol, ust__cmp_stats *dev_out, void *stream);

/* ---- shadow calls ----------------------------------------------------------- */

#define UST__SHADOW_MAX_PAIRS 8

typedef enum ust__shadow_point {
  UST__MARK_PROD_BEGIN = 0,
  UST__MARK_PROD_END,
  UST__MARK_CAND_BEGIN,
  UST__MARK_CAND_END,
  UST__MARK_COUNT
} ust__shadow_point;

typedef enum ust__shadow_fail {
  UST__FAIL_NONE = 0,
  UST__FAIL_ERROR,  /* the candidate returned a non-zero status */
  UST__FAIL_RAISED, /* the candidate raised */
  UST__FAIL_SCHEMA, /* the candidate's results do not line up with production's */
} ust__shadow_fail;

/* One output to compare: production's value and the candidate's. The
 * DLTensors carry the metadata that is checked (shape, dtype, strides,
 * device); *_dense are row-major dense copies (or the same data when the
 * tensor already is) that are compared element by element. Borrowed; on a
 * GPU the buffers must stay valid in stream order until the comparison ran,
 * which the caching allocator guarantees for tensors freed after enqueueing
 * on the same stream. */
typedef struct ust__pair {
  const char *name; /* argument name or "result N"; static or owned by the binding */
  int aa;           /* 1: production against production (A/A), 0: candidate */
  int prod_dtype, cand_dtype; /* ust__dtype */
  DLTensor prod, cand;
  const void *prod_dense, *cand_dense;
} ust__pair;

/* What rolled a route back. Written once, by whoever concluded the failing
 * shadow call, then published through the route's evidence pointer. */
typedef struct ust__evidence {
  struct ust__evidence *prev; /* the route's previous rollback, when it was set back by hand since */
  uint64_t shadow_call;      /* 1-based number of the failing shadow call on its route */
  int serving;               /* the failing call was a verification of the candidate serving */
  uint64_t served_before_verdict; /* calls the candidate served from the failing one until the rollback */
  uint64_t unix_ms;
  char reason[32];           /* mismatch, nonfinite, shape, dtype, stride, device, error, raised, schema */
  char output[80];           /* the output that failed: argument name or "result N" */
  char message[256];
  int has_stats;
  ust__cmp_stats stats;
  double atol, rtol;
  int ndim;
  int64_t shape[8];
  int64_t first_index[8];    /* the first mismatching element, per dimension */
} ust__evidence;

/* The pool of shadow slots. init is called at enable (not thread-safe with
 * the rest); shutdown waits for pending comparisons (synchronises). */
int ust__shadow_init(int max_inflight);
void ust__shadow_shutdown(void);
/* Take a slot for a call on route; NULL when max_inflight are in use.
 * Thread-safe. */
void *ust__shadow_acquire(struct ust__route *route);
/* The call's roofline floor (0: unknown), scored against both sides' times. */
void ust__shadow_note_tsol(void *slot, uint64_t tsol_ps);
/* Conclude the comparisons that completed; returns how many are pending.
 * Never blocks; called from the worker thread. */
int ust__shadow_harvest(void);
/* Conclude every pending comparison (synchronises with the device). */
void ust__shadow_harvest_all_sync(void);

/* The slot verifies a call its candidate served (canary, live). */
void ust__shadow_set_serving(void *slot);
/* The candidate failed on a call it served unverified (an error or a raise,
 * ust__shadow_fail): roll the route back; production serves the call. */
void ust__serve_failed(struct ust__route *r, int fail, const char *msg);

/* ---- rollout (guard/rollout.c) ------------------------------------------- */

struct ust__engine;
struct ust__operator;
struct ust__op_config;
struct cJSON;

/* At enable: the config's per-key modes, then the state file (which wins),
 * seed the modes routes take when they are created. A state file that
 * cannot be read is an error naming it and the field. */
int ust__rollout_init(struct ust__engine *e);
/* Write the state file if a transition is not saved yet. Thread-safe. */
int ust__rollout_persist(void);
void ust__rollout_shutdown(void);
/* A route just created takes its key's mode, if one is known; once it is
 * published, a mode set for its key in between is applied. */
void ust__rollout_route_created(struct ust__route *r);
void ust__rollout_route_published(struct ust__route *r);
/* The route's effective mode (ust__mode) and canary share in 1/2^32. Lock-free. */
int ust__route_mode(const struct ust__route *r, uint32_t *canary_q32);
/* Give a route its own mode; by: "manual", "policy", ...; recorded and persisted. */
int ust__route_set_mode(struct ust__route *r, int mode, double canary, const char *by, const char *reason);
/* The same by shape key, for a route that may not exist yet. */
int ust__rollout_set_key(const char *key, int mode, double canary, const char *by, const char *reason);
/* A verdict rolled the route back (its flag is set): recorded and persisted. */
void ust__rollout_rolled_back(struct ust__route *r, const char *reason);
/* After each passing verification of a route's candidate, started when the
 * route had made `stage` transitions (a pass of an earlier stage does not
 * count for the current one): the promotion policy. */
void ust__rollout_passed(struct ust__route *r, uint64_t stage);
double ust__route_speedup(struct ust__route *r);
/* The route's rollout figures for the report. */
struct cJSON *ust__rollout_json(struct ust__route *r);
/* Apply an operator's reloadable settings (mode, canary, strict, promotion). */
void ust__rollout_set_operator(struct ust__operator *op, const struct ust__op_config *oc);

#ifdef __cplusplus
}
#endif

#endif /* UST_GUARD_H */
