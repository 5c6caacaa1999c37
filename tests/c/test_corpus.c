/* The fuzz corpora of tests/data/fuzz/, replayed: every file through its
 * parser, each result a success or the parser's own error with a message,
 * never a crash (the suite also runs under ASan + UBSan). By name: seed-*
 * are valid inputs written by hand and must be accepted (mutations made
 * from them then reach past the first check), err-* must be refused, and
 * bug-* reproduce a contract bug not fixed yet: they must still break the
 * contract, so that a fix is noticed and the file kept as a regression
 * input. How the corpora grow: tests/data/fuzz/README.md. */
#include <dirent.h>
#include <errno.h>

#include "plugin/plugin.h"
#include "tests/c/fuzz_targets.h"
#include "tests/c/runner.h"

static int visible(const struct dirent *e) { return e->d_name[0] != '.' && strcmp(e->d_name, "README.md") != 0; }

/* Replays every file of tests/data/fuzz/KIND; returns how many there were. */
static int replay(const char *kind) {
  const ust_fuzz_target *t = ust_fuzz_target_find(kind);
  ASSERT_STR_EQ(t != NULL ? t->kind : NULL, kind);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/data/fuzz/%s", UST_SOURCE_DIR, kind);
  struct dirent **names = NULL;
  int n = scandir(dir, &names, visible, alphasort);
  ASSERT_INT_GE(n, 0);
  int seeds = 0;
  for (int i = 0; i < n; i++) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    size_t len = 0;
    char *data = ust__read_file(path, UST__FILE_MAX, &len);
    if (data == NULL) {
      fprintf(stderr, "%s: cannot be read: %s\n", path, strerror(errno));
      exit(1);
    }
    const char *outcome = "";
    const int broke = t->run(data, len, &outcome);
    if (strncmp(names[i]->d_name, "bug-", 4) == 0) {
      if (!broke) {
        fprintf(stderr, "%s keeps the %s parser's contract now: the bug it reproduces is fixed; rename it "
                "(mut-*) to keep it as a regression input\n", path, kind);
        exit(1);
      }
      printf("%s: reproduces a bug not fixed yet (the message above)\n", path);
    } else if (broke) {
      fprintf(stderr, "%s broke the contract of the %s parser\n", path, kind);
      exit(1);
    }
    if (strncmp(names[i]->d_name, "seed-", 5) == 0) {
      ASSERT_STR_EQ(outcome, "accepted");
      seeds++;
    }
    if (strncmp(names[i]->d_name, "err-", 4) == 0 && strcmp(outcome, "accepted") == 0) {
      fprintf(stderr, "%s was accepted: files named err-* are inputs the %s parser must refuse\n", path, kind);
      exit(1);
    }
    free(data);
    free(names[i]);
  }
  free(names);
  printf("%s: %d files replayed, %d of them seeds\n", kind, n, seeds);
  ASSERT_INT_GE(seeds, 3);
  return n;
}

TEST(fuzz_corpus_config) { ASSERT_INT_GE(replay("config"), 20); }
TEST(fuzz_corpus_problem) { ASSERT_INT_GE(replay("problem"), 20); }
TEST(fuzz_corpus_state) { ASSERT_INT_GE(replay("state"), 20); }
TEST(fuzz_corpus_hardware) { ASSERT_INT_GE(replay("hardware"), 20); }
TEST(fuzz_corpus_reload) { ASSERT_INT_GE(replay("reload"), 20); }
