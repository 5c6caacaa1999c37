/*
 * An operator definition's bindings as plugin/problems.c parses them: the ops
 * a definition binds, their key dimensions and roofline, as written.
 * Internal header: never installed.
 */
#ifndef UST_DISPATCH_DEFS_H
#define UST_DISPATCH_DEFS_H

#include "base/base.h"


#define UST__MAX_DIMS 8
#define UST__FIRST_TIMED 3 /* the first calls of every shape key are timed, whatever the sampling */
#define UST__MAX_OVERLOADS 8
#define UST__MAX_WRITES 8
#define UST__MAX_RVARS 24
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
 * grammar, evaluated exactly, unbucketed, and the sequence forms that read
 * a varlen batch's lengths). W is booked on the path of w_dtype's dtype.
 * Where a call's lengths cannot be read (they live on a GPU), each var that
 * reads them takes its bound instead: an expression over the vars that do
 * not. */
typedef struct ust__roofline_def {
  int present;
  int n_vars;
  ust__dim_def vars[UST__MAX_RVARS];
  char bound[UST__MAX_RVARS][UST__EXPR_MAX]; /* by var; "" for none (its calls are then unscored) */
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

#endif /* UST_DISPATCH_DEFS_H */
