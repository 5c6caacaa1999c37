/* A candidate for tests: it computes nothing and says, as its failure
 * message, the exact dtype understudy handed it for its first argument and
 * its first output ("x f8e5m2(12), out f8e5m2(12)"), or that its call
 * carried none (an ABI version 1 layout). */
#include <stdio.h>

#include "understudy/candidate.h"

/* built again with flags this understudy does not know, which it refuses */
#ifndef UST_TEST_FLAGS
#define UST_TEST_FLAGS 0u
#endif

static int run(void *ctx, const ust_candidate_call *call, char *msg, size_t cap) {
  (void)ctx;
  if (call->size < offsetof(ust_candidate_call, output_dtypes) + sizeof call->output_dtypes) {
    snprintf(msg, cap, "no exact dtypes in a call of size %u", (unsigned)call->size);
    return 2;
  }
  const ust_value *x = ust_candidate_arg(call, 0);
  snprintf(msg, cap, "x %d, out %d", (int)x->dtype, call->n_outputs > 0 ? (int)call->output_dtypes[0] : -1);
  return 1;
}

__attribute__((visibility("default"))) const ust_candidate *ust_candidate_get(void);

const ust_candidate *ust_candidate_get(void) {
  static const ust_candidate desc = {sizeof(ust_candidate), UST_CANDIDATE_ABI_VERSION, "dtype probe",
                                     "ust_defect::ident", run, NULL, UST_TEST_FLAGS, 0};
  return &desc;
}
