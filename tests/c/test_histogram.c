/* Histogram buckets, quantiles and exact merging. */
#include <math.h>

#include "scorer/scorer.h"
#include "tests/c/runner.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

TEST(hist_bucket_bounds) {
  for (uint64_t v = 0; v < 100000; v++) {
    uint32_t i = ust__hist_index(v);
    ASSERT_TRUE(i < UST__HIST_BUCKETS);
    ASSERT_TRUE(ust__hist_lower(i) <= v && v < ust__hist_lower(i) + ust__hist_width(i));
  }
  for (int k = 0; k < 100000; k++) {
    uint64_t v = next_u64() >> (next_u64() % 64);
    uint32_t i = ust__hist_index(v);
    ASSERT_TRUE(i < UST__HIST_BUCKETS);
    ASSERT_TRUE(ust__hist_lower(i) <= v && v - ust__hist_lower(i) < ust__hist_width(i));
    /* bucket width is at most 1/16 of its lower bound */
    ASSERT_TRUE(ust__hist_width(i) == 1 || ust__hist_width(i) * 16 <= ust__hist_lower(i));
  }
  ASSERT_INT_EQ(ust__hist_index(UINT64_MAX), UST__HIST_BUCKETS - 1);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

TEST(hist_quantile_accuracy) {
  enum { N = 20001 };
  static uint64_t vals[N];
  ust__hist h;
  ASSERT_INT_EQ(ust__hist_init(&h), 0);
  for (int i = 0; i < N; i++) {
    /* log-normal-ish latencies from 1 us to 10 ms */
    vals[i] = 1000 + next_u64() % 10000 * (1 + next_u64() % 1000);
    ust__hist_record(&h, vals[i]);
  }
  qsort(vals, N, sizeof vals[0], cmp_u64);
  static ust__hist_snap s;
  ust__hist_snapshot(&h, &s);
  ASSERT_U64_EQ(s.count, N);
  const double qs[] = {0.01, 0.5, 0.9, 0.99, 1.0};
  for (size_t k = 0; k < sizeof qs / sizeof qs[0]; k++) {
    uint64_t exact = vals[(size_t)ceil(qs[k] * N) - 1];
    double got = ust__hist_quantile(&s, qs[k]);
    double rel = fabs(got - (double)exact) / (double)exact;
    if (rel > 1.0 / 32) {
      fprintf(stderr, "q=%g exact=%llu got=%g rel=%g\n", qs[k], (unsigned long long)exact, got, rel);
      exit(1);
    }
  }
  static ust__hist_snap empty;
  ASSERT_TRUE(ust__hist_quantile(&empty, 0.5) == 0.0);
  ust__hist_free(&h);
}

TEST(hist_merge_exact) {
  enum { N = 50000 };
  ust__hist all, part[4];
  ASSERT_INT_EQ(ust__hist_init(&all), 0);
  for (int p = 0; p < 4; p++)
    ASSERT_INT_EQ(ust__hist_init(&part[p]), 0);
  for (int i = 0; i < N; i++) {
    uint64_t v = next_u64() >> (20 + next_u64() % 40);
    ust__hist_record(&all, v);
    ust__hist_record(&part[next_u64() % 4], v);
  }
  static ust__hist_snap sa, sp, merged;
  ust__hist_snapshot(&all, &sa);
  memset(&merged, 0, sizeof merged);
  for (int p = 0; p < 4; p++) {
    ust__hist_snapshot(&part[p], &sp);
    ust__hist_merge(&merged, &sp);
  }
  ASSERT_TRUE(memcmp(sa.buckets, merged.buckets, sizeof sa.buckets) == 0);
  ASSERT_U64_EQ(merged.count, sa.count);
  ASSERT_U64_EQ(merged.sum, sa.sum);
  const double qs[] = {0.5, 0.9, 0.99};
  for (int k = 0; k < 3; k++)
    ASSERT_TRUE(ust__hist_quantile(&merged, qs[k]) == ust__hist_quantile(&sa, qs[k]));
  ust__hist_free(&all);
  for (int p = 0; p < 4; p++)
    ust__hist_free(&part[p]);
}
