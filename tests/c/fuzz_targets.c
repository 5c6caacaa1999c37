/* The parsers' fuzz targets and the seeded mutator (fuzz_targets.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin/plugin.h"
#include "tests/c/fuzz_targets.h"

/* The input as a C string, as the parsers take it: up to its first NUL. */
static char *text_of(const char *data, size_t size) {
  char *t = malloc(size + 1);
  if (t == NULL) {
    fprintf(stderr, "fuzz: out of memory for a %zu-byte input\n", size);
    exit(1);
  }
  memcpy(t, data, size);
  t[size] = '\0';
  return t;
}

static int broke(const char *kind, const char *what, int rc) {
  fprintf(stderr, "fuzz %s: %s (rc %d %s, last error \"%s\")\n", kind, what, rc, ust_err_name(rc), ust_last_error());
  return 1;
}

/* A failure must be the parser's own code with a message naming what it
 * read (needle: a path the message must quote, or NULL). */
static int judge_error(const char *kind, int rc, int own, const char *needle, const char **outcome) {
  const char *msg = ust_last_error();
  if (outcome != NULL)
    *outcome = msg;
  if (rc != own)
    return broke(kind, "an error other than the parser's own", rc);
  if (msg[0] == '\0')
    return broke(kind, "an error without a message", rc);
  if (needle != NULL && strstr(msg, needle) == NULL)
    return broke(kind, "an error message that does not name the file", rc);
  return 0;
}

static int run_config(const char *data, size_t size, const char **outcome) {
  char *text = text_of(data, size);
  ust__config c;
  int rc = ust__config_parse(text, &c), bad = 0;
  free(text);
  if (rc != 0)
    return judge_error("config", rc, UST_ECONFIG, NULL, outcome);
  if (outcome != NULL)
    *outcome = "accepted";
  /* what an accepted config promises its readers */
  if (!(c.default_sample >= 0 && c.default_sample <= 1) || c.max_routes <= 0 || c.n_ops < 0)
    bad = broke("config", "accepted with defaults out of range", 0);
  for (int i = 0; i < c.n_ops && !bad; i++)
    if (c.ops[i].name[0] == '\0' || strnlen(c.ops[i].name, UST__NAME_MAX) == UST__NAME_MAX ||
        !(c.ops[i].sample >= 0 && c.ops[i].sample <= 1))
      bad = broke("config", "accepted an operator without a name or with a sample outside [0, 1]", 0);
  ust__config_free(&c);
  return bad;
}

static int run_problem(const char *data, size_t size, const char **outcome) {
  char *text = text_of(data, size);
  ust__problem p;
  int rc = ust__problem_parse(text, "fuzz-input.json", &p), bad = 0;
  free(text);
  if (rc != 0)
    return judge_error("problem", rc, UST_EPROBLEM, "fuzz-input.json", outcome);
  if (outcome != NULL)
    *outcome = "accepted";
  if (p.name[0] == '\0' || p.n_bindings < 0 || (p.n_bindings > 0 && p.bindings == NULL))
    bad = broke("problem", "accepted without a name or with bindings missing", 0);
  ust__problem_free(&p);
  return bad;
}

static int run_hardware(const char *data, size_t size, const char **outcome) {
  char *text = text_of(data, size);
  ust__hw_profile p;
  int rc = ust__hw_parse(text, "fuzz-input.json", &p), bad = 0;
  free(text);
  if (rc != 0)
    return judge_error("hardware", rc, UST_EPROBLEM, "fuzz-input.json", outcome);
  if (outcome != NULL)
    *outcome = "accepted";
  if (p.name[0] == '\0' || !(p.b_peak > 0) || p.n_match < 1 || p.source == NULL || p.source[0] == '\0')
    bad = broke("hardware", "accepted without a name, a bandwidth, a match word or a source", 0);
  free(p.source);
  free(p.path);
  return bad;
}

/* The state file is read from a path: the input goes to a file of this
 * process's own, rewritten for each input. */
static char state_path[64];

static int state_row(void *ctx, const ust__rollout_row *row) {
  int *bad = ctx;
  if (row->key == NULL || strlen(row->key) >= UST__KEY_MAX || row->reason == NULL || row->candidate == NULL)
    *bad = broke("state", "a row without a key, reason or candidate, or with a key too long", 0);
  else if (row->mode < UST__MODE_OFF || row->mode > UST__MODE_ROLLED_BACK)
    *bad = broke("state", "a row with a mode out of range", 0);
  else if (row->mode == UST__MODE_CANARY && !(row->canary > 0 && row->canary < 1))
    *bad = broke("state", "a canary row with its share outside (0, 1)", 0);
  return 0;
}

static int run_state(const char *data, size_t size, const char **outcome) {
  if (state_path[0] == '\0')
    snprintf(state_path, sizeof state_path, "/tmp/ust-fuzz-state-%ld.json", (long)getpid());
  int fd = open(state_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || (size > 0 && write(fd, data, size) != (ssize_t)size) || close(fd) != 0) {
    fprintf(stderr, "fuzz state: cannot write %s: %s\n", state_path, strerror(errno));
    exit(1);
  }
  int bad = 0;
  int rc = ust__state_read(state_path, state_row, &bad);
  unlink(state_path);
  if (rc != 0)
    return judge_error("state", rc, UST_ECONFIG, state_path, outcome) | bad;
  if (outcome != NULL)
    *outcome = "accepted";
  return bad;
}

/* As ust_reload reaches it: the running config was accepted by enable and
 * the next one is parsed before the comparison, so only pairs of accepted
 * configs are compared. */
static int run_reload(const char *data, size_t size, const char **outcome) {
  char *text = text_of(data, size);
  char *sep = strstr(text, UST_FUZZ_RELOAD_SEPARATOR);
  const char *running = text, *next = "";
  if (sep != NULL) {
    *sep = '\0';
    next = sep + strlen(UST_FUZZ_RELOAD_SEPARATOR);
  }
  ust__config c;
  int rc = ust__config_parse(running, &c);
  if (rc == 0) {
    ust__config_free(&c);
    rc = ust__config_parse(next, &c);
    if (rc == 0)
      ust__config_free(&c);
  }
  if (rc != 0) {
    free(text);
    return judge_error("reload (a side's parse)", rc, UST_ECONFIG, NULL, outcome);
  }
  rc = ust__config_reload_check(running, next);
  int bad = 0;
  if (rc != 0)
    bad = judge_error("reload", rc, UST_ECONFIG, "reload: '", outcome);
  else if (outcome != NULL)
    *outcome = "accepted";
  /* a text never differs from itself */
  if (!bad && (rc = ust__config_reload_check(next, next)) != 0)
    bad = broke("reload", "the next config differs from itself", rc);
  free(text);
  return bad;
}

const ust_fuzz_target ust_fuzz_targets[] = {
    {"config", run_config}, {"problem", run_problem}, {"state", run_state},
    {"hardware", run_hardware}, {"reload", run_reload},
};
const int ust_fuzz_n_targets = (int)(sizeof ust_fuzz_targets / sizeof ust_fuzz_targets[0]);

const ust_fuzz_target *ust_fuzz_target_find(const char *kind) {
  for (int i = 0; i < ust_fuzz_n_targets; i++)
    if (strcmp(ust_fuzz_targets[i].kind, kind) == 0)
      return &ust_fuzz_targets[i];
  return NULL;
}

/* ---- the seeded mutator ---------------------------------------------------------- */

static uint64_t next_u64(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static const char *const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "-1", "1e999", "\"\\u0000\"",
                                     "\"mode\"", "\"operators\"", "\"key\"", "\"bindings\"", "[-9]", "rows(",
                                     "\"pow2\"", "0.5", "true"};

char *ust_fuzz_mutate(const char *seed, size_t len, uint64_t *state) {
  char *m = malloc(len * 2 + 64);
  if (m == NULL) {
    fprintf(stderr, "fuzz: out of memory\n");
    exit(1);
  }
  memcpy(m, seed, len);
  m[len] = '\0';
  size_t n = len;
  int edits = 1 + (int)(next_u64(state) % 4);
  for (int e = 0; e < edits && n > 0; e++) {
    size_t at = next_u64(state) % n;
    switch (next_u64(state) % 4) {
    case 0: /* truncate */
      n = at;
      break;
    case 1: /* flip a byte */
      m[at] = (char)(next_u64(state) & 0x7f);
      if (m[at] == 0)
        m[at] = '#';
      break;
    case 2: { /* insert a token */
      const char *t = tokens[next_u64(state) % (sizeof tokens / sizeof tokens[0])];
      size_t tl = strlen(t);
      if (n + tl >= len * 2 + 60)
        break;
      memmove(m + at + tl, m + at, n - at);
      memcpy(m + at, t, tl);
      n += tl;
      break;
    }
    default: { /* delete a run */
      size_t k = next_u64(state) % 8;
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
