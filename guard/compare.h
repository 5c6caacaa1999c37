/*
 * guard/compare.h: the comparison of one output pair, on the host and on a
 * GPU. Valid C, C++ and CUDA/HIP: the kernels and the bridge include it.
 *
 * Internal header: never installed.
 */
#ifndef UST_GUARD_COMPARE_H
#define UST_GUARD_COMPARE_H

#include <stdint.h>

#include <dlpack/dlpack.h>

#include "base/types.h"

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
/* "allclose", "exact", "set" -> ust__cmp_kind; -1 otherwise. */
int ust__cmp_kind_parse(const char *s);
const char *ust__cmp_kind_name(int kind);

/* Compare n elements of two dense host buffers of the same dtype; out is
 * overwritten. */
void ust__compare_host(const void *prod, const void *cand, int dtype, int64_t n, int kind, double atol,
                       double rtol, ust__cmp_stats *out);
/* Enqueue the comparison of two dense device buffers on stream, reducing
 * into dev_out (device memory the caller zeroed on the same stream). Returns
 * 0 or UST_EGPU. Only in a GPU build; the host build returns UST_EGPU. */
int ust__compare_launch(const void *prod, const void *cand, int dtype, int64_t n, int kind, double atol,
                        double rtol, ust__cmp_stats *dev_out, void *stream);

/* Pairs one call hands to the guard, at most (A/A pairs included). */
#define UST__MAX_PAIRS 16

/* One output to compare: production's value and the other side's (the
 * candidate's, or production's second run for an A/A check). The DLTensors
 * carry the metadata that is checked (shape, dtype, strides, device);
 * *_dense are row-major dense copies (or the same data when the tensor
 * already is) that are compared element by element. Borrowed; on a GPU the
 * buffers must stay valid in stream order until the comparison ran, which
 * the caching allocator guarantees for tensors freed after enqueueing on the
 * same stream. */
typedef struct ust__pair {
  const char *name; /* argument name or "result N"; static or owned by the binding */
  int aa;           /* 1: production against production (A/A), 0: candidate */
  int written_arg;  /* 1: an argument the op writes, judged on its values (its layout is the caller's) */
  int input_arg;    /* 1: a read-only argument, before (prod) and after (cand) the candidate ran on it: any
                       difference fails as "wrote input" */
  int prod_dtype, cand_dtype; /* ust__dtype */
  DLTensor prod, cand;
  const void *prod_dense, *cand_dense;
} ust__pair;

/* Elements of a tensor (its shape's product). */
static inline int64_t ust__dl_numel(const DLTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    n *= t->shape[i];
  return n;
}

#ifdef __cplusplus
}
#endif

#endif /* UST_GUARD_COMPARE_H */
