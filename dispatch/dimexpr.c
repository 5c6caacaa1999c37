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
 *
 * Roofline vars may also read the lengths of the sequences of a varlen
 * batch from the values of 1-D integer tensors (a key never does: it is
 * built on every call):
 *
 *   seqsum(L)      the sum of the lengths
 *   seqdot(L, L2)  the sum over sequences of L * L2 (query-key pairs)
 *   seqtri(L)      the sum of L * (L - 1) / 2 (the pairs a causal mask drops)
 *   seqcdiv(L, D)  the sum of ceil(L / D), D a size NAME[i] or an int
 *                  argument (the blocks of a paged cache a sequence uses)
 *
 *   L := SOURCE ('|' SOURCE)?   the first source that is not None; 0 when
 *                               every one is
 *   SOURCE := NAME              a tensor of one length a sequence
 *           | diff(NAME)        a tensor of B + 1 offsets (cu_seqlens):
 *                               the lengths are their differences
 *
 * seqdot takes as many sequences as its first operand has. The values are
 * read where the view points at host memory; lengths on a GPU (or in a view
 * without data pointers) are UST__DIM_UNREAD, and the roofline takes its
 * bounds for them.
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

/* s[0..n) without the blanks around it. */
static void trim(const char **s, size_t *n) {
  while (*n > 0 && isspace((unsigned char)**s))
    (*s)++, (*n)--;
  while (*n > 0 && isspace((unsigned char)(*s)[*n - 1]))
    (*n)--;
}

/* SOURCE ('|' SOURCE)? of s[0..n) into o. */
static int seq_operand(const char *s, size_t n, ust__seq_operand *o) {
  memset(o, 0, sizeof *o);
  while (n > 0) {
    const char *bar = memchr(s, '|', n);
    size_t len = bar != NULL ? (size_t)(bar - s) : n;
    const char *src = s;
    size_t sl = len;
    trim(&src, &sl);
    if (o->n == UST__SEQ_ALTS)
      return -1;
    const int offsets = sl > 6 && strncmp(src, "diff(", 5) == 0 && src[sl - 1] == ')';
    if (offsets) {
      src += 5;
      sl -= 6;
      trim(&src, &sl);
    }
    if (!is_ident(src, sl) || sl >= sizeof o->arg[0])
      return -1;
    memcpy(o->arg[o->n], src, sl);
    o->arg[o->n][sl] = '\0';
    o->offsets[o->n] = offsets;
    o->arg_index[o->n++] = -1;
    if (bar == NULL)
      break;
    n -= len + 1;
    s = bar + 1;
    if (n == 0)
      return -1; /* a trailing '|' */
  }
  return o->n > 0 ? 0 : -1;
}

/* seqsum(L), seqdot(L, L2), seqtri(L), seqcdiv(L, D): 1 when expr is one
 * (compiled into out, or -1 in *rc when malformed), else 0. */
static int seq_form(const char *expr, size_t n, ust__dim_prog *out, int *rc) {
  static const struct {
    const char *fn;
    int kind, args;
  } forms[] = {{"seqsum(", UST__DIM_SEQSUM, 1}, {"seqdot(", UST__DIM_SEQDOT, 2}, {"seqtri(", UST__DIM_SEQTRI, 1},
               {"seqcdiv(", UST__DIM_SEQCDIV, 2}};
  for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++) {
    const size_t fl = strlen(forms[k].fn);
    if (n <= fl || strncmp(expr, forms[k].fn, fl) != 0)
      continue;
    *rc = -1;
    if (expr[n - 1] != ')')
      return 1;
    const char *in = expr + fl;
    const size_t in_n = n - fl - 1;
    /* the top-level comma, if any */
    size_t comma = in_n;
    int depth = 0;
    for (size_t i = 0; i < in_n; i++) {
      depth += in[i] == '(' ? 1 : in[i] == ')' ? -1 : 0;
      if (depth < 0)
        return 1;
      if (in[i] == ',' && depth == 0) {
        if (comma != in_n)
          return 1;
        comma = i;
      }
    }
    if (depth != 0 || (comma != in_n) != (forms[k].args == 2))
      return 1;
    out->kind = forms[k].kind;
    if (seq_operand(in, comma, &out->seq[0]) != 0)
      return 1;
    memcpy(out->arg, out->seq[0].arg[0], sizeof out->arg);
    if (forms[k].kind == UST__DIM_SEQDOT && seq_operand(in + comma + 1, in_n - comma - 1, &out->seq[1]) != 0)
      return 1;
    if (forms[k].kind == UST__DIM_SEQCDIV) {
      const char *d = in + comma + 1;
      size_t dl = in_n - comma - 1;
      trim(&d, &dl);
      char text[UST__NAME_MAX + 8];
      ust__dim_prog div;
      if (dl == 0 || dl >= sizeof text)
        return 1;
      memcpy(text, d, dl);
      text[dl] = '\0';
      if (ust__dim_compile(text, &div) != 0 || (div.kind != UST__DIM_SIZE && div.kind != UST__DIM_SCALAR))
        return 1;
      out->div_kind = div.kind;
      out->div_dim = div.dim;
      out->div_index = -1;
      memcpy(out->div_arg, div.arg, sizeof out->div_arg);
    }
    *rc = 0;
    return 1;
  }
  return 0;
}

int ust__dim_compile(const char *expr, ust__dim_prog *out) {
  memset(out, 0, sizeof *out);
  out->arg_index = -1;
  size_t n = strlen(expr);
  int rc = 0;
  if (seq_form(expr, n, out, &rc)) {
    if (rc == 0)
      return 0;
    return ust__error(UST_EPROBLEM,
                      "'%s' is not a sequence-length dimension (expected seqsum(L), seqdot(L, L), seqtri(L) or "
                      "seqcdiv(L, NAME[i] | NAME), L one or two sources NAME or diff(NAME) joined by '|')",
                      expr);
  }
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
                    "dtsize(NAME), a sequence form (seqsum, seqdot, seqtri, seqcdiv) or NAME)",
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
  if (!ust__dim_reads_values(p))
    return p->arg_index >= 0 ? 0 : -1;
  for (int o = 0; o < 2; o++)
    for (int k = 0; k < p->seq[o].n; k++)
      p->seq[o].arg_index[k] = ust__arg_lookup(p->seq[o].arg[k], nargs, names);
  if (p->kind == UST__DIM_SEQCDIV)
    p->div_index = ust__arg_lookup(p->div_arg, nargs, names);
  return ust__dim_missing(p) == NULL ? 0 : -1;
}

const char *ust__dim_missing(const ust__dim_prog *p) {
  if (!ust__dim_reads_values(p))
    return p->arg_index < 0 ? p->arg : NULL;
  for (int o = 0; o < 2; o++)
    for (int k = 0; k < p->seq[o].n; k++)
      if (p->seq[o].arg_index[k] < 0)
        return p->seq[o].arg[k];
  if (p->kind == UST__DIM_SEQCDIV && p->div_index < 0)
    return p->div_arg;
  return NULL;
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

/* Sequences read at most: a batch's (thousands); a tensor longer than this
 * is not read on the call path (its bounds stand in). */
#define SEQ_MAX 65536

int ust__dim_seq_source(const ust__dim_prog *p, int k, const ust__call *call, ust__seq_view *out) {
  const ust__seq_operand *o = &p->seq[k];
  memset(out, 0, sizeof *out);
  for (int j = 0; j < o->n; j++) {
    const int idx = o->arg_index[j];
    if (idx < 0 || idx >= call->nargs)
      return -1;
    const ust__arg *a = &call->args[idx];
    if (a->kind == UST__ARG_NONE)
      continue;
    const DLDataType dt = a->t.dtype;
    if (a->kind != UST__ARG_TENSOR || a->t.ndim != 1 || dt.code != kDLInt || (dt.bits != 32 && dt.bits != 64) ||
        dt.lanes != 1)
      return -1;
    const int64_t numel = a->t.shape[0];
    out->arg = idx;
    out->offsets = o->offsets[j];
    out->n = o->offsets[j] ? numel - 1 : numel;
    if (out->n < 0)
      return -1;
    out->wide = dt.bits == 64;
    out->stride = (a->t.strides != NULL ? a->t.strides[0] : 1) * (dt.bits / 8);
    out->data = a->t.data != NULL ? (const unsigned char *)a->t.data + a->t.byte_offset : NULL;
    out->host = a->t.device.device_type == kDLCPU && a->t.data != NULL;
    return 0;
  }
  return 1;
}

int64_t ust__dim_seq_divisor(const ust__dim_prog *p, const ust__call *call) {
  if (p->kind != UST__DIM_SEQCDIV)
    return 1;
  if (p->div_index < 0 || p->div_index >= call->nargs)
    return -1;
  const ust__arg *d = &call->args[p->div_index];
  const int64_t div = p->div_kind == UST__DIM_SIZE ? (d->kind == UST__ARG_TENSOR ? ust__dim_size(d, p->div_dim) : -1)
                                                   : (d->kind == UST__ARG_INT ? d->i : -1);
  return div > 0 ? div : -1;
}

static int64_t seq_value(const ust__seq_view *l, int64_t i) {
  const unsigned char *at = l->data + i * l->stride;
  if (l->wide) {
    int64_t v;
    memcpy(&v, at, sizeof v);
    return v;
  }
  int32_t v;
  memcpy(&v, at, sizeof v);
  return v;
}

/* The i-th length; -1 for a negative one (offsets that fall). */
static int64_t seq_len(const ust__seq_view *l, int64_t i) {
  const int64_t v = l->offsets ? seq_value(l, i + 1) - seq_value(l, i) : seq_value(l, i);
  return v >= 0 ? v : -1;
}

int64_t ust__dim_seq_value(const ust__dim_prog *p, const ust__seq_view *a, const ust__seq_view *b, int64_t div) {
  if (a == NULL)
    return 0; /* every source None */
  if (p->kind == UST__DIM_SEQDOT && (b == NULL || b->n < a->n))
    return b == NULL ? 0 : -1;
  if (div <= 0)
    return -1;
  int64_t sum = 0;
  for (int64_t i = 0; i < a->n; i++) {
    const int64_t l = seq_len(a, i);
    if (l < 0)
      return -1;
    int64_t term = l;
    switch (p->kind) {
    case UST__DIM_SEQDOT: {
      const int64_t l2 = seq_len(b, i);
      if (l2 < 0 || __builtin_mul_overflow(l, l2, &term))
        return -1;
      break;
    }
    case UST__DIM_SEQTRI:
      if (__builtin_mul_overflow(l, l > 0 ? l - 1 : 0, &term))
        return -1;
      term /= 2;
      break;
    case UST__DIM_SEQCDIV:
      term = l / div + (l % div != 0);
      break;
    }
    if (__builtin_add_overflow(sum, term, &sum))
      return -1;
  }
  return sum;
}

/* The operand k's lengths where the host can read them: 0; 1 when every
 * source is None; -1 malformed; UST__DIM_UNREAD when they are not in host
 * memory the view points at (or too many to read on the call path). */
static int seq_open(const ust__dim_prog *p, int k, const ust__call *call, ust__seq_view *out) {
  const int rc = ust__dim_seq_source(p, k, call, out);
  if (rc != 0)
    return rc;
  return out->host && out->n <= SEQ_MAX ? 0 : UST__DIM_UNREAD;
}

static int64_t seq_eval(const ust__dim_prog *p, const ust__call *call) {
  ust__seq_view a, b;
  int rc = seq_open(p, 0, call, &a);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  if (p->kind == UST__DIM_SEQDOT) {
    rc = seq_open(p, 1, call, &b);
    if (rc != 0)
      return rc == 1 ? 0 : rc;
  }
  return ust__dim_seq_value(p, &a, &b, ust__dim_seq_divisor(p, call));
}

int64_t ust__dim_eval(const ust__dim_prog *p, const ust__call *call) {
  if (ust__dim_reads_values(p))
    return seq_eval(p, call);
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
