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
  /* per-sequence lengths, read from the values of integer tensors (roofline
   * vars only: dispatch/dimexpr.c) */
  UST__DIM_SEQSUM,   /* seqsum(L): the sum of the lengths */
  UST__DIM_SEQDOT,   /* seqdot(L, L2): the sum of the products of two lengths a sequence */
  UST__DIM_SEQTRI,   /* seqtri(L): the sum of L * (L - 1) / 2 */
  UST__DIM_SEQCDIV,  /* seqcdiv(L, D): the sum of ceil(L / D), D a size or an int argument */
} ust__dim_kind;

/* A dimension that reads lengths the host cannot read now (device memory,
 * or a view without data pointers): ust__dim_eval's answer. */
#define UST__DIM_UNREAD (-2)

#define UST__SEQ_ALTS 2

/* Where a sequence form's lengths live: the first of its sources that is
 * not None; each a 1-D integer tensor of the lengths, or of B + 1 offsets
 * (diff(NAME)) whose differences are the lengths. */
typedef struct ust__seq_operand {
  int n;                                /* sources, 1 to UST__SEQ_ALTS */
  int offsets[UST__SEQ_ALTS];           /* diff(NAME) */
  int arg_index[UST__SEQ_ALTS];         /* resolved; -1 if absent */
  char arg[UST__SEQ_ALTS][UST__NAME_MAX];
} ust__seq_operand;

typedef struct ust__dim_prog {
  /* what a call's evaluation reads first, in one line; the name after */
  int kind;
  int dim;                    /* UST__DIM_SIZE: index, negative from the end */
  int arg_index;              /* resolved against the schema; -1 if absent */
  int bucket;
  char arg[UST__NAME_MAX];
  /* the sequence forms' lengths (seq[1]: seqdot's second) and seqcdiv's
   * divisor (a UST__DIM_SIZE or UST__DIM_SCALAR of its own) */
  ust__seq_operand seq[2];
  int div_kind, div_dim, div_index;
  char div_arg[UST__NAME_MAX];
} ust__dim_prog;

/* 1 for a dimension that reads tensor values (the sequence forms): a
 * roofline's, never a key's. */
static inline int ust__dim_reads_values(const ust__dim_prog *p) { return p->kind >= UST__DIM_SEQSUM; }

/* Compile a dimension expression; on error returns UST_EPROBLEM with a
 * message that quotes the expression. */
int ust__dim_compile(const char *expr, ust__dim_prog *out);
/* The index of the argument called name in a schema's names, or -1. */
int ust__arg_lookup(const char *name, int nargs, const char *const *names);
/* Bind p to its arguments' indices in a schema's names; -1 when it lacks
 * one (ust__dim_missing names it). */
int ust__dim_resolve(ust__dim_prog *p, int nargs, const char *const *names);
/* The first argument p names that the schema it was resolved against
 * lacks; NULL when it has them all. */
const char *ust__dim_missing(const ust__dim_prog *p);
/* Evaluate against a call; -1 when the argument is missing or None (or its
 * values make no lengths); UST__DIM_UNREAD for lengths the host cannot
 * read now. Reads values only from host memory the view points at. */
int64_t ust__dim_eval(const ust__dim_prog *p, const ust__call *call);
/* Where a sequence form's lengths are in a call, whether or not the host
 * can read them: operand k's (0, or seqdot's second) first source that is
 * not None (stride in bytes; data NULL in a view without data pointers;
 * host: in host memory the view points at). The divisor of a seqcdiv (1
 * for the other forms; -1 when missing); and a form's value over lengths
 * the host can read (a NULL: every source None, the value 0). Used to
 * evaluate a call's lengths later, once copied from the device. */
typedef struct ust__seq_view {
  const unsigned char *data;
  int64_t stride, n;
  int wide, offsets, host, arg;
} ust__seq_view;
int ust__dim_seq_source(const ust__dim_prog *p, int k, const ust__call *call, ust__seq_view *out);
int64_t ust__dim_seq_divisor(const ust__dim_prog *p, const ust__call *call);
int64_t ust__dim_seq_value(const ust__dim_prog *p, const ust__seq_view *a, const ust__seq_view *b, int64_t div);
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
