/* The sequential comparison (scorer/seqtest.c): its martingale against
 * numerical integration, its decisions on synthetic paired latencies of
 * known ratio (false promotions at a true ratio >= 1 at most alpha, the
 * samples a clear speedup needs near the fixed-sample figure), and the
 * promotion's error rates by simulation of whole routes: calls whose arms
 * run in a drawn order with a position effect, A/A calls, heavy tails, the
 * shipped defaults, ust__seq_step deciding. */
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

/* ---- whole routes, simulated ------------------------------------------------------- */

typedef struct route_model {
  double ratio;      /* the candidate's true time over production's */
  double noise;      /* sd of each run's ln time */
  double position;   /* ln time a run gains from not being the call's first arm (warm caches) */
  double tails;      /* the chance a run is preempted: + |N(0, 0.5)| on its ln time */
  int before;        /* as before the arms were drawn: the candidate always second, delta never widened, no
                        A/A pairs waited for */
} route_model;

/* One run's ln time at pos (0: the call's first arm). */
static double run_time(const route_model *m, double ln_true, int pos) {
  double t = ln_true + m->noise * normal() - (pos > 0 ? m->position : 0);
  if (uniform() < m->tails)
    t += fabs(0.5 * normal());
  return t;
}

/* A route under the shipped defaults (min_verified 100, alpha 0.05, delta
 * 0.05, max_samples 1000, A/A at 1 in 4, 8 pairs before a decision), call
 * by call until ust__seq_step decides. Returns the decision; *n_out the
 * paired samples it took. */
static int simulate_route(const route_model *m, const int *kstar, double *r, double *aa, int *n_out) {
  const ust__seq_rule rule = {0.05, 0.05, 1.0, 1000, m->before ? 0 : 8};
  const int min_verified = 100;
  const uint32_t aa_q32 = ust__share_q32(0.25);
  int n = 0, n_aa = 0;
  double spread = -1;
  ust__seq_state st;
  for (uint64_t call = 1;; call++) {
    const int with_aa = ust__sampled(call, aa_q32);
    const int cand_first = m->before ? 0 : uniform() < 0.5;
    /* the arms as guard/decision.c orders them: production's beside the
     * candidate's, the A/A run on its far side */
    const int pos_c = cand_first ? 0 : 1 + with_aa, pos_p = cand_first ? 1 : with_aa;
    const double t_c = run_time(m, log(m->ratio), pos_c), t_p = run_time(m, 0, pos_p);
    r[n++] = t_c - t_p;
    if (with_aa) {
      const double t_a = run_time(m, 0, cand_first ? 2 : 0);
      aa[n_aa++] = cand_first ? t_a - t_p : t_p - t_a; /* second over first */
      if (n_aa >= 8 && !m->before)
        spread = ust__seq_aa_spread(aa, n_aa);
    }
    if ((int)call < min_verified)
      continue;
    const int d = ust__seq_step(r, n, kstar[n], spread, n_aa, &rule, &st);
    if (d != UST__SEQ_OPEN) {
      *n_out = n;
      return d;
    }
  }
}

TEST(seqtest_promotion_error_rates_by_simulation) {
  const int routes = 200, max_n = 1000; /* 200 routes: a 5 % rate's bound is 10 of them */
  int *kstar = malloc((size_t)(max_n + 1) * sizeof *kstar);
  double *r = malloc((size_t)max_n * sizeof *r), *aa = malloc((size_t)max_n * sizeof *aa);
  int *needed = malloc((size_t)routes * sizeof *needed);
  for (int n = 0; n <= max_n; n++)
    kstar[n] = ust__signmix_kstar(n, 0.025);
  /* the promotion's targets: at a true ratio of 1 (identical code) at most
   * 5 % promoted, whatever the noise, the tails or how much the second arm
   * gains from the first; 10 % faster promoted and 10 % slower rejected in
   * at least 90 % of the routes, within max_samples, on a quiet route */
  const struct {
    route_model m;
    int check; /* 0: false promotions <= 5 %; 1: promoted >= 90 %; 2: rejected >= 90 %; -1: shown only */
  } cases[] = {
      {{1.00, 0.03, 0.05, 0.00, 0}, 0}, /* the warm caches seen on the CPU */
      {{1.00, 0.03, 0.12, 0.00, 0}, 0}, /* the bias an identical candidate was measured with, before */
      {{1.00, 0.03, 0.20, 0.00, 0}, 0}, /* a position effect four times delta */
      {{1.00, 0.10, 0.10, 0.05, 0}, 0},
      {{1.00, 0.30, 0.05, 0.05, 0}, 0}, /* two CPU hogs beside it */
      {{1.00, 0.01, 0.00, 0.00, 0}, 0}, /* quiet, no position effect */
      {{0.90, 0.03, 0.05, 0.00, 0}, 1},
      {{0.90, 0.05, 0.02, 0.02, 0}, 1},
      {{1.10, 0.03, 0.05, 0.00, 0}, 2},
      {{1.10, 0.05, 0.02, 0.02, 0}, 2},
      {{0.90, 0.10, 0.02, 0.02, 0}, -1}, /* noise past the effect: production's own spread widens delta */
      {{1.00, 0.03, 0.05, 0.00, 1}, -1}, /* as before: what the drawn order and the A/A pairs prevent */
      {{1.00, 0.03, 0.12, 0.00, 1}, -1},
  };
  fprintf(stderr, "ratio  noise  position  tails  order   promoted  rejected  inconclusive  median samples\n");
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const route_model *m = &cases[c].m;
    int counts[4] = {0, 0, 0, 0};
    for (int i = 0; i < routes; i++)
      counts[simulate_route(m, kstar, r, aa, &needed[i])]++;
    qsort(needed, (size_t)routes, sizeof needed[0], cmp_int);
    fprintf(stderr, "%5.2f  %5.2f  %8.2f  %5.2f  %-6s  %8d  %8d  %12d  %14d\n", m->ratio, m->noise, m->position,
            m->tails, m->before ? "before" : "drawn", counts[UST__SEQ_FASTER], counts[UST__SEQ_SLOWER],
            counts[UST__SEQ_INCONCLUSIVE], needed[routes / 2]);
    ASSERT_INT_EQ(counts[UST__SEQ_OPEN], 0); /* every route decided within max_samples */
    if (cases[c].check == 0)
      ASSERT_TRUE(counts[UST__SEQ_FASTER] <= routes / 20);
    if (cases[c].check == 1)
      ASSERT_TRUE(counts[UST__SEQ_FASTER] >= routes * 9 / 10);
    if (cases[c].check == 2)
      ASSERT_TRUE(counts[UST__SEQ_SLOWER] >= routes * 9 / 10);
  }
  free(kstar);
  free(r);
  free(aa);
  free(needed);
}
