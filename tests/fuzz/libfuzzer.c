/* A libFuzzer harness for one parser, named at compile time by
 * UST_FUZZ_KIND (config, problem, state, hardware or reload): an input that
 * breaks the parser's contract aborts, so libFuzzer keeps it as a crash.
 * Built by -DUST_LIBFUZZER=ON with clang; ./run.sh fuzz runs it. */
#include <stdint.h>
#include <stdlib.h>

#include "tests/c/fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const ust_fuzz_target *t;
  if (t == NULL && (t = ust_fuzz_target_find(UST_FUZZ_KIND)) == NULL)
    abort();
  if (t->run((const char *)data, size, NULL) != 0)
    abort();
  return 0;
}
