/*
 * ust_fuzz: grows a parser's corpus without a coverage-guided fuzzer, and
 * runs single inputs through a parser.
 *
 *   ust_fuzz extend KIND [ROUNDS [SEED]]
 *       Mutates the files of tests/data/fuzz/KIND (ust_fuzz_mutate, seeded:
 *       the same corpus and SEED give the same files) ROUNDS times (default
 *       20000) and adds, as mut-<hash>, each mutant whose outcome no file of
 *       the corpus has yet: accepted, or an error message not seen before
 *       once the values it quotes and its numbers are blanked out (a cheap
 *       stand-in for "reached another error path"). A mutant that breaks the
 *       parser's contract is written to ./broke-KIND-<hash> and counted; each
 *       mutant is first written to ./ust-fuzz-last-input, which names the
 *       input if the process crashes instead.
 *   ust_fuzz run KIND FILE...
 *       Each file through the parser; prints its outcome.
 *
 * Exit status: 0, or 1 when an input broke the contract. With clang, the
 * libFuzzer harnesses do the same job guided by coverage (./run.sh fuzz).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/plugin.h"
#include "tests/c/fuzz_targets.h"

typedef struct input {
  char *data;
  size_t len;
} input;

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h;
}

static int is_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* The outcome with what varies between inputs blanked: the values it quotes
 * (a quote opens after a character that is no letter or digit and closes
 * before one) and its numbers; a JSON syntax error is one outcome whatever
 * it quotes. */
static char *signature(const char *outcome) {
  size_t n = strlen(outcome);
  char *s = malloc(n + 1), *o = s;
  const char *json = strstr(outcome, "not valid JSON");
  if (json != NULL)
    n = (size_t)(json - outcome) + strlen("not valid JSON");
  int quoted = 0;
  for (size_t i = 0; i < n; i++) {
    char c = outcome[i], prev = i > 0 ? outcome[i - 1] : ' ', next = i + 1 < n ? outcome[i + 1] : ' ';
    if (c == '\'' && !quoted && !is_alnum(prev)) {
      quoted = 1;
      *o++ = c;
    } else if (c == '\'' && quoted && !is_alnum(next) && next != '\'') {
      quoted = 0;
      *o++ = c;
    } else if (quoted) {
      continue;
    } else if (c >= '0' && c <= '9') {
      if (o == s || o[-1] != '#')
        *o++ = '#';
    } else {
      *o++ = c;
    }
  }
  *o = '\0';
  return s;
}

static int write_file(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
    fprintf(stderr, "ust_fuzz: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

static int visible(const struct dirent *e) { return e->d_name[0] != '.' && strcmp(e->d_name, "README.md") != 0; }

static int extend(const ust_fuzz_target *t, long rounds, uint64_t seed) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/data/fuzz/%s", UST_SOURCE_DIR, t->kind);
  struct dirent **names = NULL;
  int n = scandir(dir, &names, visible, alphasort);
  if (n <= 0) {
    fprintf(stderr, "ust_fuzz: %s holds no inputs to mutate\n", dir);
    return 1;
  }
  input *in = calloc((size_t)n, sizeof *in);
  char **seen = calloc((size_t)n + (size_t)rounds, sizeof *seen);
  int n_seen = 0, n_in = 0;
  for (int i = 0; i < n; i++) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    free(names[i]);
    if ((in[n_in].data = ust__read_file(path, UST__FILE_MAX, &in[n_in].len)) == NULL)
      continue;
    const char *outcome = "";
    t->run(in[n_in].data, in[n_in].len, &outcome);
    char *sig = signature(outcome);
    int known = 0;
    for (int k = 0; k < n_seen && !known; k++)
      known = strcmp(seen[k], sig) == 0;
    if (known)
      free(sig);
    else
      seen[n_seen++] = sig;
    n_in++;
  }
  free(names);
  int added = 0, broke = 0;
  uint64_t state = seed ? seed : 0x9e3779b97f4a7c15ull;
  for (long r = 0; r < rounds; r++) {
    const input *from = &in[state % (uint64_t)n_in];
    char *m = ust_fuzz_mutate(from->data, from->len, &state);
    size_t len = strlen(m);
    if (write_file("ust-fuzz-last-input", m, len) != 0)
      return 1;
    const char *outcome = "";
    char name[2048];
    if (t->run(m, len, &outcome) != 0) {
      snprintf(name, sizeof name, "broke-%s-%016llx", t->kind, (unsigned long long)fnv1a(m, len));
      write_file(name, m, len);
      fprintf(stderr, "ust_fuzz: %s broke the %s parser's contract\n", name, t->kind);
      broke++;
    } else {
      char *sig = signature(outcome);
      int known = 0;
      for (int k = 0; k < n_seen && !known; k++)
        known = strcmp(seen[k], sig) == 0;
      if (known) {
        free(sig);
      } else {
        seen[n_seen++] = sig;
        snprintf(name, sizeof name, "%s/mut-%016llx", dir, (unsigned long long)fnv1a(m, len));
        if (write_file(name, m, len) != 0)
          return 1;
        printf("%s: %s\n", name, outcome);
        added++;
      }
    }
    free(m);
  }
  remove("ust-fuzz-last-input");
  printf("%s: %ld mutants of %d inputs, %d added, %d broke the contract\n", t->kind, rounds, n_in, added, broke);
  for (int i = 0; i < n_in; i++)
    free(in[i].data);
  for (int k = 0; k < n_seen; k++)
    free(seen[k]);
  free(in);
  free(seen);
  return broke ? 1 : 0;
}

int main(int argc, char **argv) {
  const ust_fuzz_target *t = argc > 2 ? ust_fuzz_target_find(argv[2]) : NULL;
  if (t == NULL || (strcmp(argv[1], "extend") != 0 && strcmp(argv[1], "run") != 0)) {
    fprintf(stderr, "usage: ust_fuzz extend KIND [ROUNDS [SEED]] | ust_fuzz run KIND FILE...\nKIND:");
    for (int i = 0; i < ust_fuzz_n_targets; i++)
      fprintf(stderr, " %s", ust_fuzz_targets[i].kind);
    fprintf(stderr, "\n");
    return 2;
  }
  if (strcmp(argv[1], "extend") == 0)
    return extend(t, argc > 3 ? atol(argv[3]) : 20000, argc > 4 ? strtoull(argv[4], NULL, 0) : 0);
  int bad = 0;
  for (int i = 3; i < argc; i++) {
    size_t len = 0;
    char *data = ust__read_file(argv[i], UST__FILE_MAX, &len);
    if (data == NULL) {
      fprintf(stderr, "ust_fuzz: cannot read %s: %s\n", argv[i], strerror(errno));
      return 1;
    }
    const char *outcome = "";
    int rc = t->run(data, len, &outcome);
    printf("%s: %s%s\n", argv[i], rc ? "BROKE THE CONTRACT: " : "", outcome);
    bad |= rc;
    free(data);
  }
  return bad;
}
