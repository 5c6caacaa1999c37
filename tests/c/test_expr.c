/* The roofline expression evaluator: values, errors, bounded inputs. */
#include <math.h>

#include "plugin/plugin.h"
#include "scorer/scorer.h"
#include "tests/c/runner.h"

static double eval(const char *text, const double *vals) {
  static const char *const vars[] = {"M", "N", "K", "E_topk"};
  ust__expr *e = NULL;
  if (ust__expr_compile(text, vars, 4, &e) != 0) {
    fprintf(stderr, "compile '%s': %s\n", text, ust_last_error());
    exit(1);
  }
  double v = NAN;
  if (ust__expr_eval(e, vals, &v) != 0) {
    fprintf(stderr, "eval '%s': %s\n", text, ust_last_error());
    exit(1);
  }
  ust__expr_free(e);
  return v;
}

TEST(expr_values) {
  const double v[4] = {128, 4096, 11008, 8};
  ASSERT_TRUE(eval("2*M*N*K", v) == 2.0 * 128 * 4096 * 11008);
  ASSERT_TRUE(eval("1 + 2 * 3", v) == 7);
  ASSERT_TRUE(eval("(1 + 2) * 3", v) == 9);
  ASSERT_TRUE(eval("10 - 4 - 3", v) == 3);   /* left associative */
  ASSERT_TRUE(eval("2 ^ 3 ^ 2", v) == 512);  /* right associative */
  ASSERT_TRUE(eval("-2 ^ 2", v) == -4);      /* unary minus binds looser than ^ */
  ASSERT_TRUE(eval("--M + +N", v) == 128 + 4096);
  ASSERT_TRUE(eval("7 % 4 + 9 / 2", v) == 3 + 4.5);
  ASSERT_TRUE(eval("cdiv(N, 128) * ceil(1.5) + floor(2.9) + abs(-3)", v) == 32 * 2 + 2 + 3);
  ASSERT_TRUE(eval("min(M, N, K) + max(E_topk, 3)", v) == 128 + 8);
  ASSERT_TRUE(eval("  1e3 + .5\t", v) == 1000.5);
  /* integers stay exact in double up to 2^53 */
  ASSERT_TRUE(eval("2^52 + 1", v) == 4503599627370497.0);
}

TEST(expr_errors_name_position) {
  static const char *const vars[] = {"M", "N"};
  static const struct {
    const char *text, *needle;
  } bad[] = {
      {"M * Q", "unknown name at position 4"},
      {"(M + N", "expected ')'"},
      {"M N", "unexpected character at position 2"},
      {"", "unexpected end at position 0"},
      {"sqrt(M)", "unknown function"},
      {"min(M)", "wrong number of arguments"},
      {"cdiv(M, N, 1)", "wrong number of arguments"},
      {"M +", "unexpected end"},
      {"1e999", "bad number"},
      {"M $ N", "unexpected character"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ust__expr *e = (ust__expr *)1;
    ASSERT_INT_EQ(ust__expr_compile(bad[i].text, vars, 2, &e), UST_EPROBLEM);
    ASSERT_TRUE(e == NULL);
    ASSERT_STR_CONTAINS(ust_last_error(), bad[i].needle);
  }
  /* nesting and length are bounded: an error, never a deep recursion */
  char deep[400];
  memset(deep, '(', 200);
  deep[200] = 'M';
  memset(deep + 201, ')', 198);
  deep[399] = '\0';
  ust__expr *e = NULL;
  ASSERT_INT_EQ(ust__expr_compile(deep, vars, 2, &e), UST_EPROBLEM);
  ASSERT_STR_CONTAINS(ust_last_error(), "nested too deeply");
  char many[1000];
  size_t n = 0;
  while (n + 4 < sizeof many - 1) {
    memcpy(many + n, "M+1+", 4);
    n += 4;
  }
  memcpy(many + n - 1, "\0", 1);
  ASSERT_INT_EQ(ust__expr_compile(many, vars, 2, &e), UST_EPROBLEM);
  ASSERT_STR_CONTAINS(ust_last_error(), "too long");
  /* short and shallow, yet more values on the stack at once than it holds */
  char wide[512] = "1";
  for (int d = 0; d < 5; d++) {
    char next[sizeof wide + 64];
    snprintf(next, sizeof next, "min(1,1,1,1,1,1,1,1,1,1,1,1,1,1,%s)", wide);
    memcpy(wide, next, sizeof wide - 1);
    wide[sizeof wide - 1] = '\0';
  }
  ASSERT_INT_EQ(ust__expr_compile(wide, vars, 2, &e), UST_EPROBLEM);
  ASSERT_STR_CONTAINS(ust_last_error(), "needs too deep a stack");
  /* division by zero is an evaluation error naming the expression */
  ASSERT_INT_EQ(ust__expr_compile("M / (N - 2)", vars, 2, &e), 0);
  double v = 0, vals[2] = {6, 2};
  ASSERT_INT_EQ(ust__expr_eval(e, vals, &v), UST_EINVAL);
  ASSERT_STR_CONTAINS(ust_last_error(), "'M / (N - 2)': division by zero");
  vals[1] = 5;
  ASSERT_INT_EQ(ust__expr_eval(e, vals, &v), 0);
  ASSERT_TRUE(v == 2);
  ust__expr_free(e);
  ust__expr_free(NULL);
}

/* Mutated expressions compile or fail cleanly (under ASan in the suite). */
TEST(expr_survives_mutations) {
  static const char *const vars[] = {"M", "N", "K"};
  const char *seed = "2*M*N*K + cdiv(N, 128) * min(M, K, 3) - (M ^ 2) / max(N, 1) % 7";
  const char alphabet[] = "MNK0123456789+-*/%^(),. minaxcdivflorabs";
  uint64_t x = 0x9e3779b97f4a7c15ull;
  char buf[256];
  for (int i = 0; i < 20000; i++) {
    snprintf(buf, sizeof buf, "%s", seed);
    size_t len = strlen(buf);
    for (int k = 0; k < 1 + i % 4; k++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      size_t at = x % len;
      buf[at] = alphabet[(x >> 20) % (sizeof alphabet - 1)];
      if ((x >> 40) % 5 == 0)
        buf[at + 1 < len ? at + 1 : at] = '\0';
      len = strlen(buf);
      if (len == 0)
        break;
    }
    ust__expr *e = NULL;
    int rc = ust__expr_compile(buf, vars, 3, &e);
    if (rc == 0) {
      double vals[3] = {3, 5, 7}, v;
      rc = ust__expr_eval(e, vals, &v);
      ASSERT_TRUE(rc == 0 || rc == UST_EINVAL);
      ust__expr_free(e);
    } else {
      ASSERT_INT_EQ(rc, UST_EPROBLEM);
    }
  }
}
