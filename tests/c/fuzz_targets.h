/*
 * The parsers' fuzz targets: one input to one parser, judged against the
 * parser's contract. Shared by the corpus replay (test_corpus.c), the
 * seeded mutation tests (test_fuzz.c), the corpus extender (fuzz_tool.c,
 * `ust_fuzz`) and the libFuzzer harnesses (tests/fuzz/libfuzzer.c).
 *
 * The corpus of target KIND is tests/data/fuzz/KIND/, one input per file
 * (tests/data/fuzz/README.md).
 */
#ifndef UST_FUZZ_TARGETS_H
#define UST_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

/* A reload input holds the running config, this line, then the next one. */
#define UST_FUZZ_RELOAD_SEPARATOR "\n%%\n"

typedef struct ust_fuzz_target {
  const char *kind; /* the corpus folder's name */
  /* Feeds data (size bytes, no terminator needed; a NUL ends the text as it
   * would for the parser) to the parser. Returns 0 when the result kept the
   * contract: success, or the parser's own error code with a message that
   * names what it read; else prints what broke to stderr and returns 1.
   * *outcome (when outcome is not NULL) receives "accepted" or the error
   * message, valid until the next call. Not thread-safe. */
  int (*run)(const char *data, size_t size, const char **outcome);
} ust_fuzz_target;

extern const ust_fuzz_target ust_fuzz_targets[];
extern const int ust_fuzz_n_targets;

/* The target named kind, or NULL. */
const ust_fuzz_target *ust_fuzz_target_find(const char *kind);

/* The seeded mutator: returns a new NUL-terminated text (free it) made from
 * seed (len bytes) by 1 to 4 edits: truncation, a flipped byte, an inserted
 * JSON token, a deleted run. *state is the xorshift64 state (non-zero); the
 * same state and seed give the same text. */
char *ust_fuzz_mutate(const char *seed, size_t len, uint64_t *state);

#endif
