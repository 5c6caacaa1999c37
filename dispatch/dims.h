/*
 * Key dimensions compiled (dispatch/dimexpr.c): what a call's key reads.
 * Internal header: never installed.
 */
#ifndef UST_DISPATCH_DIMS_H
#define UST_DISPATCH_DIMS_H

#include <stdint.h>

#include "dispatch/callview.h"
#include "dispatch/defs.h"


typedef enum ust__dim_kind {
  UST__DIM_SIZE = 0, /* NAME[i] */
  UST__DIM_ROWS,     /* rows(NAME): product of all sizes but the last */
  UST__DIM_NUMEL,    /* numel(NAME) */
  UST__DIM_LEN,      /* len(NAME): length of an int[] argument */
  UST__DIM_SCALAR,   /* NAME: an int or bool argument */
  UST__DIM_ESIZE,    /* esize(NAME): bytes per element of a tensor argument */
  UST__DIM_BYTES,    /* bytes(NAME): esize * the sizes of the dimensions whose stride is not 0 (storage) */
  UST__DIM_OBYTES,   /* obytes(NAME): bytes of an optional tensor, 0 when None */
  UST__DIM_NBYTES,   /* nbytes(NAME): numel * esize, the logical size (what writing it moves) */
  UST__DIM_ONBYTES,  /* onbytes(NAME): nbytes of an optional tensor, 0 when None */
  UST__DIM_DTSIZE,   /* dtsize(NAME): bytes per element of a ScalarType argument, 0 when None */
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

#endif /* UST_DISPATCH_DIMS_H */
