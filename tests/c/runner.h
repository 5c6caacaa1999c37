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

#define ASSERT_INT_GE(a, b)                                                              \
  do {                                                                                   \
    long long va_ = (long long)(a), vb_ = (long long)(b);                                \
    if (!(va_ >= vb_)) {                                                                 \
      fprintf(stderr, "%s:%d: %s >= %s failed: %lld < %lld\n", __FILE__, __LINE__, #a, #b, \
              va_, vb_);                                                                 \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* |a - b| <= tol; tol 0 asks for the same double (NaN never matches). */
#define ASSERT_DBL_NEAR(a, b, tol)                                                       \
  do {                                                                                   \
    double va_ = (double)(a), vb_ = (double)(b), vt_ = (double)(tol);                    \
    if (!(va_ - vb_ <= vt_ && vb_ - va_ <= vt_)) {                                       \
      fprintf(stderr, "%s:%d: %s == %s (within %g) failed: %.17g != %.17g\n", __FILE__,   \
              __LINE__, #a, #b, vt_, va_, vb_);                                          \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* Equal strings; NULL equals only NULL and prints as (null). */
#define ASSERT_STR_EQ(a, b)                                                              \
  do {                                                                                   \
    const char *sa_ = (a), *sb_ = (b);                                                   \
    if (sa_ == NULL || sb_ == NULL ? sa_ != sb_ : strcmp(sa_, sb_) != 0) {               \
      fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a,  \
              #b, sa_ ? sa_ : "(null)", sb_ ? sb_ : "(null)");                           \
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

/* The rounds of a test that repeats its work for statistics or for
 * fuzzing: n, or a tenth of n under Valgrind (run.sh says so with
 * $UST_TEST_UNDER_VALGRIND). Memcheck sees a bad access on a path's first
 * pass, some 30 times slower than the other builds, which run every round. */
static inline int ust_test_rounds(int n) { return getenv("UST_TEST_UNDER_VALGRIND") != NULL ? (n + 9) / 10 : n; }

#endif
