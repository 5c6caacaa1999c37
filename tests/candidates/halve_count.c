/* A candidate for tests, for an op with a result no native candidate makes:
 *
 *     ust_tuple::halve_and_count(Tensor x) -> (Tensor, int)
 *
 * It writes x / 2 (row-major float32 CPU matrices) into its one output; the int
 * is not an output understudy can preallocate, so a served call takes it
 * from production (verified calls) or is not served natively. */
#include <stdint.h>
#include <stdio.h>

#include "understudy/candidate.h"

static int run(void *ctx, const ust_candidate_call *call, char *msg, size_t cap) {
  (void)ctx;
  if (call->n_args < 1 || ust_candidate_arg(call, 0)->kind != UST_VALUE_TENSOR || call->n_outputs != 1) {
    snprintf(msg, cap, "halve_count: expected one tensor argument and one output, got %d outputs",
             (int)call->n_outputs);
    return 1;
  }
  const DLTensor *x = &ust_candidate_arg(call, 0)->tensor, *y = &call->outputs[0];
  int ok = x->device.device_type == kDLCPU && x->dtype.code == kDLFloat && x->dtype.bits == 32 &&
           y->dtype.code == kDLFloat && y->dtype.bits == 32 && x->ndim == 2 && y->ndim == 2;
  /* the test's (rows, 16) tensors, row-major (NULL strides: compact) */
  ok = ok && y->shape[0] == x->shape[0] && y->shape[1] == x->shape[1] &&
       (x->strides == NULL || (x->strides[1] == 1 && x->strides[0] == x->shape[1])) &&
       (y->strides == NULL || (y->strides[1] == 1 && y->strides[0] == y->shape[1]));
  if (!ok) {
    snprintf(msg, cap, "halve_count: only row-major float32 CPU matrices of one shape");
    return 1;
  }
  const int64_t n = x->shape[0] * x->shape[1];
  const float *in = (const float *)((const char *)x->data + x->byte_offset);
  float *out = (float *)((char *)y->data + y->byte_offset);
  for (int64_t i = 0; i < n; i++)
    out[i] = in[i] * 0.5f;
  return 0;
}

__attribute__((visibility("default"))) const ust_candidate *ust_candidate_get(void);

const ust_candidate *ust_candidate_get(void) {
  static const ust_candidate desc = {sizeof(ust_candidate), UST_CANDIDATE_ABI_VERSION, "halve and count",
                                     "ust_tuple::halve_and_count", run, NULL};
  return &desc;
}
