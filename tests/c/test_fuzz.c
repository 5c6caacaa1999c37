/* The config and problem parsers against mutated inputs: every result is a
 * success or the parser's own error with a message, never a crash (the
 * suite also runs under ASan + UBSan). Mutations are seeded, so a failure
 * replays exactly. */
#include <dirent.h>

#include "plugin/plugin.h"
#include "tests/c/runner.h"

static uint64_t fz_state;
static uint64_t fz_next(void) {
  fz_state ^= fz_state << 13;
  fz_state ^= fz_state >> 7;
  fz_state ^= fz_state << 17;
  return fz_state;
}

static const char *const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "-1", "1e999", "\"\\u0000\"",
                                     "\"mode\"", "\"operators\"", "\"key\"", "\"bindings\"", "[-9]", "rows(",
                                     "\"pow2\"", "0.5", "true"};

static char *mutate(const char *seed, size_t len) {
  char *m = malloc(len * 2 + 64);
  memcpy(m, seed, len + 1);
  size_t n = len;
  int edits = 1 + (int)(fz_next() % 4);
  for (int e = 0; e < edits && n > 0; e++) {
    size_t at = fz_next() % n;
    switch (fz_next() % 4) {
    case 0: /* truncate */
      n = at;
      break;
    case 1: /* flip a byte */
      m[at] = (char)(fz_next() & 0x7f);
      if (m[at] == 0)
        m[at] = '#';
      break;
    case 2: { /* insert a token */
      const char *t = tokens[fz_next() % (sizeof tokens / sizeof tokens[0])];
      size_t tl = strlen(t);
      if (n + tl >= len * 2 + 60)
        break;
      memmove(m + at + tl, m + at, n - at);
      memcpy(m + at, t, tl);
      n += tl;
      break;
    }
    default: { /* delete a run */
      size_t k = fz_next() % 8;
      if (at + k > n)
        k = n - at;
      memmove(m + at, m + at + k, n - at - k);
      n -= k;
    }
    }
  }
  m[n] = '\0';
  return m;
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
  fz_state = 0x243f6a8885a308d3ull;
  for (int i = 0; i < 10000; i++) {
    const char *seed = configs[i % 2];
    char *m = mutate(seed, strlen(seed));
    ust__config c;
    int rc = ust__config_parse(m, &c);
    if (rc == 0)
      ust__config_free(&c);
    else {
      ASSERT_INT_EQ(rc, UST_ECONFIG);
      ASSERT_TRUE(ust_last_error()[0] != '\0');
    }
    free(m);
  }
  DIR *d = opendir(UST_SOURCE_DIR "/problems");
  ASSERT_TRUE(d != NULL);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0)
      continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/problems/%s", UST_SOURCE_DIR, e->d_name);
    size_t len = 0;
    char *seed = ust__read_file(path, UST__FILE_MAX << 6, &len);
    ASSERT_TRUE(seed != NULL);
    ust__problem p;
    ASSERT_INT_EQ(ust__problem_parse(seed, path, &p), 0);
    ust__problem_free(&p);
    for (int i = 0; i < 1500; i++) {
      char *m = mutate(seed, len);
      int rc = ust__problem_parse(m, "mutated.json", &p);
      if (rc == 0)
        ust__problem_free(&p);
      else {
        ASSERT_INT_EQ(rc, UST_EPROBLEM);
        ASSERT_STR_CONTAINS(ust_last_error(), "mutated.json");
      }
      free(m);
    }
    free(seed);
    files++;
  }
  closedir(d);
  ASSERT_TRUE(files >= 6);
}
