/* The C test runner: a table of tests, each run in its own process. */
#ifndef UST_TEST_RUNNER_H
#define UST_TEST_RUNNER_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ASSERT_TRUE(c)                                                                   \
  do {                                                                                   \
    if (!(c)) {                                                                          \
      fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #c);          \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define ASSERT_INT_EQ(a, b)                                                              \
  do {                                                                                   \
    long long va_ = (long long)(a), vb_ = (long long)(b);                                \
    if (va_ != vb_) {                                                                    \
      fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b, \
              va_, vb_);                                                                 \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define ASSERT_U64_EQ(a, b)                                                              \
  do {                                                                                   \
    uint64_t va_ = (uint64_t)(a), vb_ = (uint64_t)(b);                                   \
    if (va_ != vb_) {                                                                    \
      fprintf(stderr, "%s:%d: %s == %s failed: %" PRIu64 " != %" PRIu64 "\n", __FILE__,    \
              __LINE__, #a, #b, va_, vb_);                                               \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define ASSERT_STR_CONTAINS(hay, needle)                                                 \
  do {                                                                                   \
    const char *h_ = (hay), *n_ = (needle);                                              \
    if (h_ == NULL || strstr(h_, n_) == NULL) {                                          \
      fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__,      \
              h_ ? h_ : "(null)", n_);                                                   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define TEST(name) void test_##name(void)

#endif
