/* The sequential comparison (scorer/seqtest.c): its martingale against
 * numerical integration, and its decisions on synthetic paired latencies of
 * known ratio: false promotions at a true ratio >= 1 at most alpha, and the
 * samples a clear speedup needs near the fixed-sample figure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "scorer/scorer.h"
#include "tests/c/runner.h"

/* 2 * integral_{1/2}^{1} (2p)^k (2(1-p))^(n-k) dp by Simpson's rule. */
static double mixture_by_quadrature(int k, int n) {
  const int m = 200000;
  const double a = 0.5, h = 0.5 / m;
  double s = 0;
  for (int i = 0; i <= m; i++) {
    const double p = a + i * h;
    const double f = pow(2 * p, k) * pow(2 * (1 - p), n - k);
    s += f * (i == 0 || i == m ? 1 : i % 2 ? 4 : 2);
  }
  return 2 * s * h / 3;
}

TEST(seqtest_martingale_matches_quadrature) {
  const int cases[][2] = {{0, 1}, {1, 1}, {3, 5}, {7, 10}, {12, 20}, {20, 20}, {30, 50}, {45, 60}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int k = cases[c][0], n = cases[c][1];
    const double want = mixture_by_quadrature(k, n), got = exp(ust__signmix_log(k, n));
    if (fabs(got - want) > 1e-9 * want) {
      fprintf(stderr, "k=%d n=%d: closed form %.17g, quadrature %.17g\n", k, n, got, want);
      ASSERT_TRUE(0);
    }
  }
  /* k* is the least count reaching 1/alpha */
  for (int n = 1; n < 200; n += 7) {
    const int k = ust__signmix_kstar(n, 0.025);
    if (k <= n)
      ASSERT_TRUE(ust__signmix_log(k, n) >= -log(0.025) && (k == 0 || ust__signmix_log(k - 1, n) < -log(0.025)));
    else
      ASSERT_TRUE(ust__signmix_log(n, n) < -log(0.025));
  }
  ASSERT_INT_EQ(ust__signmix_kstar(5, 0.025), 6); /* five samples can never be enough at 2.5 % */
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double normal(void) { return sqrt(-2 * log(uniform())) * cos(2 * M_PI * uniform()); }

/* One simulated route: paired calls whose times carry independent lognormal
 * noise on each arm, until the test decides or max_n samples. Returns the
 * decision; *n_out the samples it took. The decision is taken from counts
 * at the thresholds against k*(n), and checked against ust__seq_judge. */
static int simulate(double ratio, double noise, double alpha, double delta, int max_n, const int *kstar, int *n_out) {
  const double c_fast = log(1 - delta), c_slow = log(1 + delta);
  double *r = malloc((size_t)max_n * sizeof *r);
  int below = 0, above = 0, decision = UST__SEQ_OPEN, n = 0;
  while (n < max_n && decision == UST__SEQ_OPEN) {
    const double prod = exp(noise * normal()), cand = ratio * exp(noise * normal());
    r[n] = log(cand / prod);
    below += r[n] < c_fast;
    above += r[n] > c_slow;
    n++;
    if (below >= kstar[n])
      decision = UST__SEQ_FASTER;
    else if (above >= kstar[n])
      decision = UST__SEQ_SLOWER;
  }
  ust__seq_verdict v;
  ust__seq_judge(r, n, alpha, c_fast, c_slow, &v);
  if (v.decision != decision || ust__seq_check(r, n, alpha, c_fast, c_slow) != decision) {
    fprintf(stderr, "ratio %.2f noise %.2f n=%d: counts say %d, judge says %d [%g, %g]\n", ratio, noise, n, decision,
            v.decision, v.lower, v.upper);
    exit(1);
  }
  free(r);
  *n_out = n;
  return decision;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

TEST(seqtest_decisions_on_synthetic_pairs) {
  const double alpha = 0.05, delta = 0.05;
  const int max_n = 400, routes = ust_test_rounds(1000);
  int *kstar = malloc((size_t)(max_n + 1) * sizeof *kstar);
  for (int n = 0; n <= max_n; n++)
    kstar[n] = ust__signmix_kstar(n, alpha / 2);
  const double ratios[] = {0.90, 0.98, 1.00, 1.02, 1.10}, noises[] = {0.03, 0.10};
  int needed[1000];
  for (int ri = 0; ri < 5; ri++)
    for (int ni = 0; ni < 2; ni++) {
      int counts[3] = {0, 0, 0};
      for (int i = 0; i < routes; i++) {
        int n = 0;
        counts[simulate(ratios[ri], noises[ni], alpha, delta, max_n, kstar, &n)]++;
        needed[i] = n;
      }
      qsort(needed, routes, sizeof needed[0], cmp_int);
      fprintf(stderr, "true ratio %.2f, noise %2.0f %% an arm: %4d promoted, %4d rejected, %4d open after %d; median "
              "samples %d\n", ratios[ri], noises[ni] * 100, counts[UST__SEQ_FASTER], counts[UST__SEQ_SLOWER],
              counts[UST__SEQ_OPEN], max_n, needed[routes / 2]);
      if (ratios[ri] >= 1.0)
        ASSERT_TRUE(counts[UST__SEQ_FASTER] <= alpha * routes); /* false promotions */
      if (ratios[ri] <= 1.0)
        ASSERT_TRUE(counts[UST__SEQ_SLOWER] <= alpha * routes); /* false rejections */
      if (ratios[ri] == 0.90 && noises[ni] == 0.03) {
        /* the fixed-sample figure n = 13.6 (sigma/gap)^2 for the gap between
         * the true log-ratio and the threshold, sigma the sd of r */
        const double sigma = noises[ni] * sqrt(2.0), gap = log(1 - delta) - log(0.90);
        const double fixed = 13.6 * (sigma / gap) * (sigma / gap);
        fprintf(stderr, "  fixed-sample figure %.1f, sequential median %d\n", fixed, needed[routes / 2]);
        ASSERT_TRUE(counts[UST__SEQ_FASTER] >= 0.99 * routes);
        ASSERT_TRUE(needed[routes / 2] <= 2 * fixed);
      }
      if (ratios[ri] == 1.10 && noises[ni] == 0.03)
        ASSERT_TRUE(counts[UST__SEQ_SLOWER] >= 0.99 * routes);
      if (ratios[ri] == 1.00)
        ASSERT_TRUE(counts[UST__SEQ_OPEN] >= 0.95 * routes); /* equal: inconclusive */
    }
  free(kstar);
}
