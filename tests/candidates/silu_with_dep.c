/* A native candidate for aten::silu (dense float32 CPU tensors) that takes
 * its arithmetic from a library of its own (libust_dep.so, found through
 * its RUNPATH $ORIGIN): the case of a candidate whose dependencies must be
 * pinned too. */
#include <stdio.h>

#include "understudy/candidate.h"

float ust_dep_silu(float x);

static int run(void *ctx, const ust_candidate_call *call, char *msg, size_t cap) {
  (void)ctx;
  const DLTensor *x = &ust_candidate_arg(call, 0)->tensor, *y = &call->outputs[0];
  if (x->dtype.code != kDLFloat || x->dtype.bits != 32 || x->device.device_type != kDLCPU) {
    snprintf(msg, cap, "float32 CPU tensors only");
    return 1;
  }
  int64_t n = 1;
  for (int d = 0; d < x->ndim; d++)
    n *= x->shape[d];
  const float *in = (const float *)x->data;
  float *out = (float *)y->data;
  for (int64_t i = 0; i < n; i++)
    out[i] = ust_dep_silu(in[i]);
  return 0;
}

__attribute__((visibility("default"))) const ust_candidate *ust_candidate_get(void);

const ust_candidate *ust_candidate_get(void) {
  static const ust_candidate desc = {sizeof(ust_candidate), UST_CANDIDATE_ABI_VERSION, "silu with a dependency",
                                     "aten::silu", run, NULL};
  return &desc;
}
