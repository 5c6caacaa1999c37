/*
 * Key dimensions: a tiny, closed grammar, compiled once per binding.
 *
 *   NAME[i]      size of dimension i of tensor argument NAME (i < 0 counts
 *                from the end)
 *   rows(NAME)   product of all sizes of NAME but the last
 *   numel(NAME)  number of elements of NAME
 *   len(NAME)    length of the int[] or Tensor[] argument NAME
 *   esize(NAME)  bytes per element of tensor argument NAME
 *   bytes(NAME)  the bytes NAME's elements occupy: esize(NAME) times the product of its sizes
 *                over the dimensions whose stride is not 0 (an expanded tensor, such
 *                as an attention mask broadcast over batch and heads, is read from
 *                its storage, not once per logical element)
 *   obytes(NAME) bytes(NAME) of an optional tensor argument: 0 when it is None
 *   nbytes(NAME) esize(NAME) times numel(NAME): the logical size, as torch's
 *                Tensor.nbytes; what writing a tensor moves (an output is
 *                dense, whatever the strides of the inputs it was made from)
 *   onbytes(NAME) nbytes(NAME) of an optional tensor argument: 0 when it is None
 *   dtsize(NAME) bytes per element of the dtype a ScalarType argument names
 *                (an out_dtype): 0 when it is None
 *   NAME         value of the int or bool argument NAME
 *
 * A Tensor[] argument (a collective's) reads as its first tensor in the
 * tensor forms.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"

static int is_ident(const char *s, size_t n) {
  if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
    return 0;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
      return 0;
  return 1;
}

static int set_arg(ust__dim_prog *out, const char *s, size_t n) {
  if (!is_ident(s, n) || n >= sizeof out->arg)
    return -1;
  memcpy(out->arg, s, n);
  out->arg[n] = '\0';
  return 0;
}

int ust__dim_compile(const char *expr, ust__dim_prog *out) {
  memset(out, 0, sizeof *out);
  out->arg_index = -1;
  size_t n = strlen(expr);
  static const struct {
    const char *fn;
    int kind;
  } fns[] = {{"rows(", UST__DIM_ROWS}, {"numel(", UST__DIM_NUMEL}, {"len(", UST__DIM_LEN},
             {"esize(", UST__DIM_ESIZE}, {"bytes(", UST__DIM_BYTES}, {"obytes(", UST__DIM_OBYTES},
             {"nbytes(", UST__DIM_NBYTES}, {"onbytes(", UST__DIM_ONBYTES}, {"dtsize(", UST__DIM_DTSIZE}};
  for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++) {
    size_t fl = strlen(fns[k].fn);
    if (n > fl + 1 && strncmp(expr, fns[k].fn, fl) == 0 && expr[n - 1] == ')') {
      out->kind = fns[k].kind;
      if (set_arg(out, expr + fl, n - fl - 1) == 0)
        return 0;
      goto bad;
    }
  }
  const char *br = strchr(expr, '[');
  if (br != NULL) {
    char *end = NULL;
    long d = strtol(br + 1, &end, 10);
    if (end == br + 1 || end == NULL || end[0] != ']' || end[1] != '\0' || d < -8 || d > 7)
      goto bad;
    out->kind = UST__DIM_SIZE;
    out->dim = (int)d;
    if (set_arg(out, expr, (size_t)(br - expr)) == 0)
      return 0;
    goto bad;
  }
  out->kind = UST__DIM_SCALAR;
  if (set_arg(out, expr, n) == 0)
    return 0;
bad:
  return ust__error(UST_EPROBLEM,
                    "'%s' is not a dimension (expected NAME[i], rows(NAME), numel(NAME), "
                    "len(NAME), esize(NAME), bytes(NAME), obytes(NAME), nbytes(NAME), onbytes(NAME), "
                    "dtsize(NAME) or NAME)",
                    expr);
}

int ust__arg_lookup(const char *name, int nargs, const char *const *names) {
  for (int i = 0; i < nargs; i++)
    if (strcmp(names[i], name) == 0)
      return i;
  return -1;
}

int ust__dim_resolve(ust__dim_prog *p, int nargs, const char *const *names) {
  p->arg_index = ust__arg_lookup(p->arg, nargs, names);
  return p->arg_index >= 0 ? 0 : -1;
}

static int is_tensor(const ust__arg *a) { return a->kind == UST__ARG_TENSOR || a->kind == UST__ARG_TENSORLIST; }

/* Bytes per element of a dtype as the dispatcher passes a ScalarType
 * argument: c10::ScalarType's number, which torch keeps stable (its
 * serialization relies on the order); -1 for one without a fixed size. */
static int64_t scalar_type_size(int64_t st) {
  static const signed char size[] = {
      1, 1, 2, 4, 8, 2, 4, 8, /* Byte Char Short Int Long Half Float Double */
      4, 8, 16, 1,            /* ComplexHalf ComplexFloat ComplexDouble Bool */
      1, 1, 4, 2,             /* QInt8 QUInt8 QInt32 BFloat16 */
      1, 1, 1, 1, 1, 1, 2,    /* QUInt4x2 QUInt2x4 Bits1x8 Bits2x4 Bits4x2 Bits8 Bits16 */
      1, 1, 1, 1,             /* Float8_e5m2 Float8_e4m3fn Float8_e5m2fnuz Float8_e4m3fnuz */
      2, 4, 8,                /* UInt16 UInt32 UInt64 */
  };
  if (st >= 0 && st < (int64_t)(sizeof size / sizeof size[0]))
    return size[st];
  return st == 44 ? 1 : -1; /* Float8_e8m0fnu */
}

int64_t ust__dim_eval(const ust__dim_prog *p, const ust__call *call) {
  if (p->arg_index < 0 || p->arg_index >= call->nargs)
    return -1;
  const ust__arg *a = &call->args[p->arg_index];
  if ((p->kind == UST__DIM_OBYTES || p->kind == UST__DIM_ONBYTES) && a->kind == UST__ARG_NONE)
    return 0;
  switch (p->kind) {
  case UST__DIM_SIZE: {
    return is_tensor(a) ? ust__dim_size(a, p->dim) : -1;
  }
  case UST__DIM_ROWS:
  case UST__DIM_NUMEL:
  case UST__DIM_BYTES:
  case UST__DIM_OBYTES:
  case UST__DIM_NBYTES:
  case UST__DIM_ONBYTES: {
    if (!is_tensor(a))
      return -1;
    const int stored = p->kind == UST__DIM_BYTES || p->kind == UST__DIM_OBYTES;
    const int bytes = stored || p->kind == UST__DIM_NBYTES || p->kind == UST__DIM_ONBYTES;
    int64_t v = 1;
    int last = p->kind == UST__DIM_ROWS ? a->t.ndim - 1 : a->t.ndim;
    for (int d = 0; d < last; d++) {
      if (a->t.shape[d] == 0)
        return 0;
      if (!stored || a->t.strides == NULL || a->t.strides[d] != 0)
        v *= a->t.shape[d];
    }
    return bytes ? v * (a->t.dtype.bits / 8) * a->t.dtype.lanes : v;
  }
  case UST__DIM_ESIZE:
    return is_tensor(a) ? (int64_t)(a->t.dtype.bits / 8) * a->t.dtype.lanes : -1;
  case UST__DIM_LEN:
    return a->kind == UST__ARG_INTLIST || a->kind == UST__ARG_TENSORLIST ? a->i : -1;
  case UST__DIM_SCALAR:
    return a->kind == UST__ARG_INT || a->kind == UST__ARG_BOOL ? a->i : -1;
  case UST__DIM_DTSIZE:
    return a->kind == UST__ARG_NONE ? 0 : a->kind == UST__ARG_INT ? scalar_type_size(a->i) : -1;
  }
  return -1;
}
