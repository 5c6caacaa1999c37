/*
 * Argument checking shared by the rms_norm example candidates
 * (rms_norm_cpu.c, rms_norm_cuda.cu).
 *
 * The op is vLLM's
 *
 *     _C::rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float eps) -> ()
 *
 * so understudy passes four arguments in that order: out (writable: its
 * snapshot), input and weight (the caller's tensors, read-only) and eps (a
 * double). rms_norm_parse checks everything the kernels rely on and turns the
 * call view into a flat description: a pointer per tensor, the row count, the
 * row length and the element strides of the leading (row) dimensions.
 *
 * Everything here is static inline: each candidate is its own shared object
 * and exports nothing but ust_candidate_get.
 */
#ifndef UST_EXAMPLES_RMS_NORM_ARGS_H
#define UST_EXAMPLES_RMS_NORM_ARGS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <understudy/candidate.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define RMS_HD static inline __host__ __device__
#else
#define RMS_HD static inline
#endif

/* Status codes of run. Negative, as the ABI asks; the message says more. */
#define RMS_EINVAL (-1) /* the arguments are not ones this candidate computes */
#define RMS_EGPU (-2)   /* the GPU runtime refused the launch */

/* Dimensions a tensor may have; the GPU kernel takes the row layout by value. */
#define RMS_MAX_DIMS 8

typedef enum rms_dtype {
  RMS_F32 = 0,
  RMS_F16 = 1,
  RMS_BF16 = 2,
} rms_dtype;

/* Where each row starts: the leading dimensions (all but the last) and the
 * element strides of input and out along them. */
typedef struct rms_rows {
  int32_t n_lead;
  int64_t shape[RMS_MAX_DIMS - 1];
  int64_t in_stride[RMS_MAX_DIMS - 1];
  int64_t out_stride[RMS_MAX_DIMS - 1];
} rms_rows;

typedef struct rms_norm_args {
  void *out;          /* first element of the snapshot understudy gave us */
  const void *in;     /* first element of the caller's input */
  const void *weight; /* first element of the caller's weight, unit stride */
  rms_dtype dtype;    /* of all three tensors */
  int64_t rows;       /* product of the leading dimensions */
  int64_t n;          /* the last dimension; input and out are unit-stride along it */
  float eps;
  rms_rows layout;
} rms_norm_args;

/* Writes a message into msg (when there is room for one) and returns status. */
static inline int rms_fail(char *msg, size_t msg_cap, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static inline int rms_fail(char *msg, size_t msg_cap, int status, const char *fmt, ...) {
  if (msg != NULL && msg_cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_cap, fmt, ap);
    va_end(ap);
  }
  return status;
}

static inline void rms_clear_msg(char *msg, size_t msg_cap) {
  if (msg != NULL && msg_cap > 0)
    msg[0] = '\0';
}

/* Element offsets of row `row` (row-major order over the leading dimensions)
 * in input and out. */
RMS_HD void rms_row_offsets(const rms_rows *l, int64_t row, int64_t *in_off, int64_t *out_off) {
  int64_t in = 0, out = 0;
  for (int32_t d = l->n_lead - 1; d >= 0; --d) {
    const int64_t i = row % l->shape[d];
    row /= l->shape[d];
    in += i * l->in_stride[d];
    out += i * l->out_stride[d];
  }
  *in_off = in;
  *out_off = out;
}

static inline const char *rms_arg_name(const ust_value *v, const char *fallback) {
  return v->name != NULL ? v->name : fallback;
}

static inline int rms_dtype_of(DLDataType t, rms_dtype *out) {
  if (t.lanes != 1)
    return -1;
  if (t.code == kDLFloat && t.bits == 32)
    *out = RMS_F32;
  else if (t.code == kDLFloat && t.bits == 16)
    *out = RMS_F16;
  else if (t.code == kDLBfloat && t.bits == 16)
    *out = RMS_BF16;
  else
    return -1;
  return 0;
}

/* Element stride of dimension d; DLPack's NULL strides mean compact row-major. */
static inline int64_t rms_stride(const DLTensor *t, int32_t d) {
  if (t->strides != NULL)
    return t->strides[d];
  int64_t s = 1;
  for (int32_t k = d + 1; k < t->ndim; ++k)
    s *= t->shape[k];
  return s;
}

static inline void *rms_data(const DLTensor *t) {
  return t->data == NULL ? NULL : (char *)t->data + t->byte_offset;
}

/*
 * Checks the call and fills *a. `device_type` is where this candidate's
 * kernels run (kDLCPU, kDLCUDA or kDLROCM). Returns 0, or RMS_EINVAL with a
 * message naming the argument and what was wrong with it.
 */
static inline int rms_norm_parse(const ust_candidate_call *call, int32_t device_type, rms_norm_args *a,
                                 char *msg, size_t msg_cap) {
  const size_t need = offsetof(ust_candidate_call, stream) + sizeof(call->stream);
  memset(a, 0, sizeof *a);
  if (call == NULL)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "no call view");
  if (call->size < need)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "call view of %u bytes is older than this candidate (needs %zu)",
                    (unsigned)call->size, need);
  if (call->n_args != 4 || call->args == NULL)
    return rms_fail(msg, msg_cap, RMS_EINVAL,
                    "expected 4 arguments (out, input, weight, eps) as in _C::rms_norm, got %d", (int)call->n_args);

  static const char *const names[4] = {"out", "input", "weight", "eps"};
  for (int i = 0; i < 3; ++i)
    if (ust_candidate_arg(call, i)->kind != UST_VALUE_TENSOR)
      return rms_fail(msg, msg_cap, RMS_EINVAL, "argument %d (%s) must be a tensor, got value kind %d", i,
                      rms_arg_name(ust_candidate_arg(call, i), names[i]), (int)ust_candidate_arg(call, i)->kind);
  if (ust_candidate_arg(call, 3)->kind != UST_VALUE_DOUBLE)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "argument 3 (%s) must be a float, got value kind %d",
                    rms_arg_name(ust_candidate_arg(call, 3), names[3]), (int)ust_candidate_arg(call, 3)->kind);
  if (!ust_candidate_arg(call, 0)->writable)
    return rms_fail(msg, msg_cap, RMS_EINVAL,
                    "argument 0 (%s) is not marked writable: the candidate would write into the caller's tensor",
                    rms_arg_name(ust_candidate_arg(call, 0), names[0]));

  const DLTensor *out = &ust_candidate_arg(call, 0)->tensor;
  const DLTensor *in = &ust_candidate_arg(call, 1)->tensor;
  const DLTensor *w = &ust_candidate_arg(call, 2)->tensor;
  const DLTensor *ts[3] = {out, in, w};

  if ((int32_t)call->device.device_type != device_type)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "call is on device type %d; this candidate runs on device type %d",
                    (int)call->device.device_type, (int)device_type);
  for (int i = 0; i < 3; ++i) {
    if ((int32_t)ts[i]->device.device_type != device_type || ts[i]->device.device_id != call->device.device_id)
      return rms_fail(msg, msg_cap, RMS_EINVAL, "%s is on device %d:%d, the call on %d:%d",
                      rms_arg_name(ust_candidate_arg(call, i), names[i]), (int)ts[i]->device.device_type,
                      (int)ts[i]->device.device_id, (int)call->device.device_type, (int)call->device.device_id);
  }

  if (rms_dtype_of(in->dtype, &a->dtype) != 0)
    return rms_fail(msg, msg_cap, RMS_EINVAL,
                    "input dtype (code %u, bits %u, lanes %u) is not float32, float16 or bfloat16",
                    (unsigned)in->dtype.code, (unsigned)in->dtype.bits, (unsigned)in->dtype.lanes);
  for (int i = 0; i < 3; i += 2) {
    rms_dtype d;
    if (rms_dtype_of(ts[i]->dtype, &d) != 0 || d != a->dtype)
      return rms_fail(msg, msg_cap, RMS_EINVAL, "%s dtype (code %u, bits %u) differs from input's (code %u, bits %u)",
                      rms_arg_name(ust_candidate_arg(call, i), names[i]), (unsigned)ts[i]->dtype.code,
                      (unsigned)ts[i]->dtype.bits, (unsigned)in->dtype.code, (unsigned)in->dtype.bits);
  }

  if (in->ndim < 1 || in->ndim > RMS_MAX_DIMS || in->shape == NULL)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "input must have 1 to %d dimensions, has %d", RMS_MAX_DIMS,
                    (int)in->ndim);
  if (out->ndim != in->ndim || out->shape == NULL)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "out has %d dimensions, input %d", (int)out->ndim, (int)in->ndim);
  for (int32_t d = 0; d < in->ndim; ++d) {
    if (in->shape[d] < 0)
      return rms_fail(msg, msg_cap, RMS_EINVAL, "input dimension %d is negative (%lld)", (int)d,
                      (long long)in->shape[d]);
    if (out->shape[d] != in->shape[d])
      return rms_fail(msg, msg_cap, RMS_EINVAL, "out dimension %d is %lld, input's %lld", (int)d,
                      (long long)out->shape[d], (long long)in->shape[d]);
  }
  a->n = in->shape[in->ndim - 1];
  if (w->ndim != 1 || w->shape == NULL)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "weight must be 1-D, is %d-D", (int)w->ndim);
  if (w->shape[0] != a->n)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "weight has length %lld, input's last dimension is %lld",
                    (long long)w->shape[0], (long long)a->n);

  a->rows = 1;
  a->layout.n_lead = in->ndim - 1;
  for (int32_t d = 0; d < a->layout.n_lead; ++d) {
    const int64_t s = in->shape[d];
    if (s != 0 && a->rows > INT64_MAX / s)
      return rms_fail(msg, msg_cap, RMS_EINVAL, "input has more rows than fit in 64 bits");
    a->rows *= s;
    a->layout.shape[d] = s;
    a->layout.in_stride[d] = rms_stride(in, d);
    a->layout.out_stride[d] = rms_stride(out, d);
  }

  /* Unit stride along the row is what the kernels assume; a length-1 row has
   * no meaningful stride. */
  const int32_t last = in->ndim - 1;
  if (a->n > 1 && rms_stride(in, last) != 1)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "input's last dimension has stride %lld; it must be contiguous (1)",
                    (long long)rms_stride(in, last));
  if (a->n > 1 && rms_stride(out, last) != 1)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "out's last dimension has stride %lld; it must be contiguous (1)",
                    (long long)rms_stride(out, last));
  if (a->n > 1 && rms_stride(w, 0) != 1)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "weight has stride %lld; it must be contiguous (1)",
                    (long long)rms_stride(w, 0));

  const int empty = a->rows == 0 || a->n == 0;
  if (!empty && (out->data == NULL || in->data == NULL || w->data == NULL))
    return rms_fail(msg, msg_cap, RMS_EINVAL, "a tensor with elements has a NULL data pointer");

  a->out = rms_data(out);
  a->in = rms_data(in);
  a->weight = rms_data(w);
  a->eps = (float)ust_candidate_arg(call, 3)->f;
  return 0;
}

#endif /* UST_EXAMPLES_RMS_NORM_ARGS_H */
