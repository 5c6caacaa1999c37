/*
 * A native understudy candidate for
 *
 *     aten::silu(Tensor self) -> Tensor
 *
 * on dense CPU tensors of float32: out = self / (1 + exp(-self)). Its output is
 * a return value, so understudy preallocates it like production's (in canary
 * and live mode from the layout it learned from production for the call's
 * input shapes). Build with hidden visibility: the only exported symbol is
 * ust_candidate_get.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <understudy/candidate.h>

__attribute__((visibility("default"))) const ust_candidate *ust_candidate_get(void);

static int fail(char *msg, size_t cap, const char *fmt, ...) {
  if (cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* Elements of t when it is dense row-major, else -1. */
static int64_t dense_numel(const DLTensor *t) {
  int64_t n = 1, expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->strides != NULL && t->shape[d] != 1 && t->strides[d] != expect)
      return -1;
    expect *= t->shape[d];
    n *= t->shape[d];
  }
  return n;
}

static int silu_cpu_run(void *ctx, const ust_candidate_call *call, char *msg, size_t cap) {
  (void)ctx;
  if (call->n_args < 1 || ust_candidate_arg(call, 0)->kind != UST_VALUE_TENSOR || call->n_outputs != 1)
    return fail(msg, cap, "silu_cpu: expected one tensor argument and one output");
  const DLTensor *x = &ust_candidate_arg(call, 0)->tensor, *y = &call->outputs[0];
  if (x->device.device_type != kDLCPU || x->dtype.code != kDLFloat || x->dtype.bits != 32 || x->dtype.lanes != 1 ||
      y->dtype.code != kDLFloat || y->dtype.bits != 32)
    return fail(msg, cap, "silu_cpu: only float32 CPU tensors");
  const int64_t n = dense_numel(x);
  if (n < 0 || dense_numel(y) != n)
    return fail(msg, cap, "silu_cpu: only dense tensors of the same size");
  const float *in = (const float *)((const char *)x->data + x->byte_offset);
  float *out = (float *)((char *)y->data + y->byte_offset);
  for (int64_t i = 0; i < n; i++)
    out[i] = in[i] / (1.0f + expf(-in[i]));
#ifdef UST_EXAMPLE_WRONG_WRITES_INPUT
  /* A classic bug of generated kernels: scratch space taken from an input. */
  if (n > 0)
    ((float *)(uintptr_t)in)[0] = 1234.0f;
#endif
  if (cap > 0)
    msg[0] = '\0';
  return 0;
}

static const ust_candidate silu_cpu_candidate = {
    .size = sizeof(ust_candidate),
    .abi_version = UST_CANDIDATE_ABI_VERSION,
    .name = "silu_cpu",
    .target = "aten::silu",
    .run = silu_cpu_run,
    .ctx = NULL,
};

const ust_candidate *ust_candidate_get(void) { return &silu_cpu_candidate; }
