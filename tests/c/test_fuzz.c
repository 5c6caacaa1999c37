/* The parsers against mutated inputs: every result is a success or the
 * parser's own error with a message, never a crash (the suite also runs
 * under ASan + UBSan). Mutations are seeded, so a failure replays exactly;
 * an input worth keeping goes into the corpus (tests/data/fuzz/README.md). */
#include <dirent.h>

#include "plugin/plugin.h"
#include "tests/c/fuzz_targets.h"
#include "tests/c/runner.h"

static void survive(const ust_fuzz_target *t, const char *seed, size_t len, int rounds, uint64_t *state) {
  for (int i = 0; i < rounds; i++) {
    char *m = ust_fuzz_mutate(seed, len, state);
    if (t->run(m, strlen(m), NULL) != 0) {
      fprintf(stderr, "the %s parser broke its contract on this mutation of a seed:\n%s\n", t->kind, m);
      exit(1);
    }
    free(m);
  }
}

TEST(parsers_survive_mutations) {
  const char *configs[] = {
      "{\"version\": 1, \"report\": {\"path\": \"/tmp/x.json\", \"interval_s\": 3}, \"log_level\": \"info\","
      " \"max_routes\": 64, \"defaults\": {\"mode\": \"off\", \"sample\": 0.5},"
      " \"operators\": {\"gemm\": \"observe\", \"topk\": {\"mode\": \"off\", \"sample\": 1}}}",
      "{\"shadow\": {\"max_inflight\": 4}, \"operators\": {\"rms_norm\": {\"mode\": \"shadow\", \"sample\": 1,"
      " \"candidate\": {\"native\": \"x.so\", \"sha256\": \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\","
      " \"target\": \"_C::rms_norm\"}, \"guard\": {\"compare\": \"set\", \"atol\": 0.1, \"rtol\": 0, \"aa_sample\": 0.5}},"
      " \"gemm\": {\"candidate\": {\"torch_op\": \"ns::mm.out\", \"target\": \"aten::mm.out\"}}}}"};
  uint64_t state = 0x243f6a8885a308d3ull;
  const ust_fuzz_target *config = ust_fuzz_target_find("config"), *problem = ust_fuzz_target_find("problem");
  for (int i = 0; i < ust_test_rounds(10000); i++)
    survive(config, configs[i % 2], strlen(configs[i % 2]), 1, &state);
  DIR *d = opendir(UST_SOURCE_DIR "/problems");
  ASSERT_INT_EQ(d != NULL, 1);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0)
      continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/problems/%s", UST_SOURCE_DIR, e->d_name);
    size_t len = 0;
    char *seed = ust__read_file(path, UST__FILE_MAX, &len);
    ASSERT_STR_CONTAINS(seed, "\"operator\"");
    ust__problem p;
    ASSERT_INT_EQ(ust__problem_parse(seed, path, &p), 0);
    ust__problem_free(&p);
    survive(problem, seed, len, ust_test_rounds(1500), &state);
    free(seed);
    files++;
  }
  closedir(d);
  ASSERT_INT_GE(files, 6);
}
