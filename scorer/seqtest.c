/* The sequential comparison of a candidate with production, from paired
 * samples r = ln(T_candidate / T_production) of the same calls.
 *
 * Method: a confidence sequence for the median of r built from sign tests,
 * each a test martingale. For a threshold c, the indicators 1[r_i < c] are
 * Bernoulli(p) with p = P(r < c); "the median is at least c" is p <= 1/2.
 * The mixture of likelihood ratios over p ~ Uniform(1/2, 1],
 *
 *     M_n(c) = 2 * integral_{1/2}^{1} (2p)^k (2(1-p))^(n-k) dp,  k = #{i <= n: r_i < c},
 *
 * is a nonnegative supermartingale under every p <= 1/2 (each factor has
 * expectation 2(p q + (1-p)(1-q)) <= 1 there, for q > 1/2), so by Ville's
 * inequality P(sup_n M_n(c) >= 1/a) <= a: rejecting once M_n(c) >= 1/a is
 * valid at any stopping time, however often it is looked at (Ville 1939;
 * Robbins 1970, "Statistical methods related to the law of the iterated
 * logarithm"; Howard, Ramdas, McAuliffe, Sekhon 2021, "Time-uniform,
 * nonparametric, nonasymptotic confidence sequences", Ann. Statist.). The
 * set of c not rejected, by the same construction mirrored for "at most c",
 * is a confidence sequence for the median: its upper end is the k*-th
 * smallest sample and its lower end the k*-th largest, where k* is the least
 * count whose M reaches 1/a. Signs make it indifferent to the heavy tails of
 * latency (a preempted call counts once, whatever it took).
 *
 * Closed form: with P(Beta(k+1, n-k+1) > 1/2) = P(Bin(n+1, 1/2) <= k),
 *     ln M = (n+1) ln 2 + ln B(k+1, n-k+1) + ln P(Bin(n+1, 1/2) <= k).
 *
 * The samples must each be even odds around the true median when the
 * candidate is production: the arms of a call run in an order drawn on a
 * fair coin (guard/shadow.c), so an arm's position (warm caches, a second
 * run's head start) adds to half the samples and takes from the other
 * half, and P(r < c) for c < 0 stays under 1/2 whatever its size. What
 * the order cannot cancel is bounded from measurement instead: production
 * run twice side by side (A/A pairs) gives its own spread, which widens
 * delta (ust__seq_step); a route noisier than delta ends inconclusive
 * rather than promoted. tests/c/test_seqtest.c checks the error rates by
 * simulation, order effects and heavy tails included. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scorer/scorer.h"

/* ln of sum_{j=0}^{k} C(m, j): the terms by their ratio
 * C(m, j+1) = C(m, j) (m - j) / (j + 1), summed in log space as they come. */
static double log_binom_head(int m, int k) {
  double t = 0, s = 0; /* ln C(m, 0), and the running ln of the sum */
  for (int j = 1; j <= k; j++) {
    t += log((double)(m - j + 1)) - log((double)j);
    s = t > s ? t + log1p(exp(s - t)) : s + log1p(exp(t - s));
  }
  return s;
}

double ust__signmix_log(int k, int n) {
  if (n <= 0)
    return 0; /* M_0 = 1 */
  if (k < 0)
    k = 0;
  if (k > n)
    k = n;
  const double lbeta = lgamma((double)k + 1) + lgamma((double)(n - k) + 1) - lgamma((double)n + 2);
  /* P(Bin(n+1, 1/2) <= k) = 2^-(n+1) sum_{j<=k} C(n+1, j) */
  const double lhead = log_binom_head(n + 1, k) - (double)(n + 1) * M_LN2;
  return M_LN2 + (double)n * M_LN2 + lbeta + lhead;
}

int ust__signmix_kstar(int n, double alpha) {
  const double thr = -log(alpha);
  /* ln M grows with k: the least k whose M reaches 1/alpha, by bisection */
  if (n <= 0 || ust__signmix_log(n, n) < thr)
    return n + 1;
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (ust__signmix_log(mid, n) >= thr)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

int ust__seq_check(const double *r, int n, double alpha, double c_fast, double c_slow) {
  int below = 0, above = 0;
  for (int i = 0; i < n; i++) {
    below += r[i] < c_fast;
    above += r[i] > c_slow;
  }
  const double thr = -log(alpha / 2);
  if (ust__signmix_log(below, n) >= thr)
    return UST__SEQ_FASTER;
  if (ust__signmix_log(above, n) >= thr)
    return UST__SEQ_SLOWER;
  return UST__SEQ_OPEN;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void ust__seq_judge(const double *r, int n, double alpha, double c_fast, double c_slow, ust__seq_verdict *out) {
  memset(out, 0, sizeof *out);
  out->n = n;
  out->lower = -INFINITY;
  out->upper = INFINITY;
  out->median = NAN;
  if (n <= 0 || r == NULL)
    return;
  double *s = malloc((size_t)n * sizeof *s);
  if (s == NULL)
    return; /* judged again at the next sample */
  memcpy(s, r, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  out->median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  /* each side at alpha/2: the two one-sided sequences together cover the median with 1 - alpha */
  const int k = ust__signmix_kstar(n, alpha / 2);
  if (k <= n) {
    out->upper = s[k - 1]; /* "median >= c" rejected for every c above the k-th smallest */
    out->lower = s[n - k]; /* mirrored */
  }
  free(s);
  out->decision = out->upper < c_fast ? UST__SEQ_FASTER : out->lower > c_slow ? UST__SEQ_SLOWER : UST__SEQ_OPEN;
}

int ust__seq_kstar(ust__seq_kcache *c, int n, double alpha) {
  if (c->alpha == alpha && c->n == n && n > 0)
    return c->k;
  int k;
  if (c->alpha == alpha && c->n > 0 && n == c->n + 1)
    /* M(k, n) <= M(k, n - 1) and M(k + 1, n) >= M(k, n - 1): one more sample
     * keeps k* or adds one */
    k = c->k <= n && ust__signmix_log(c->k, n) >= -log(alpha) ? c->k : c->k + 1;
  else
    k = ust__signmix_kstar(n, alpha);
  c->alpha = alpha;
  c->n = n;
  c->k = k;
  return k;
}

double ust__seq_aa_spread(const double *aa, int n) {
  if (n <= 0 || aa == NULL)
    return -1;
  double *v = malloc((size_t)n * sizeof *v);
  if (v == NULL)
    return -1;
  for (int i = 0; i < n; i++)
    v[i] = fabs(aa[i]);
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  const double m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  free(v);
  return expm1(m);
}

int ust__seq_step(const double *r, int n, int kstar, double spread, int n_aa, const ust__seq_rule *rule,
                  ust__seq_state *out) {
  memset(out, 0, sizeof *out);
  out->spread = spread;
  out->delta_used = spread > rule->delta ? spread : rule->delta;
  out->c_fast = out->delta_used < 1 ? log1p(-out->delta_used) : -INFINITY;
  if (rule->min_speedup > 0 && -log(rule->min_speedup) < out->c_fast)
    out->c_fast = -log(rule->min_speedup);
  out->c_slow = log1p(out->delta_used);
  const int aa_ready = rule->aa_min <= 0 || n_aa >= rule->aa_min;
  if (aa_ready && kstar <= n && r != NULL) {
    int below_fast = 0, above_fast = 0, below_slow = 0, above_slow = 0;
    for (int i = 0; i < n; i++) {
      below_fast += r[i] < out->c_fast;
      above_fast += r[i] > out->c_fast;
      below_slow += r[i] < out->c_slow;
      above_slow += r[i] > out->c_slow;
    }
    if (below_fast >= kstar)
      out->decision = UST__SEQ_FASTER;
    else if (above_slow >= kstar)
      out->decision = UST__SEQ_SLOWER;
    else if (above_fast >= kstar && below_slow >= kstar)
      out->decision = UST__SEQ_INCONCLUSIVE;
    if (out->decision == UST__SEQ_INCONCLUSIVE)
      out->why = spread > rule->delta ? UST__SEQ_WHY_NOISE : UST__SEQ_WHY_WITHIN;
  }
  if (out->decision == UST__SEQ_OPEN && n >= rule->max_samples) {
    out->decision = UST__SEQ_INCONCLUSIVE;
    out->why = !aa_ready ? UST__SEQ_WHY_NO_AA : spread > rule->delta ? UST__SEQ_WHY_NOISE : UST__SEQ_WHY_UNDECIDED;
  }
  return out->decision;
}

void ust__seq_why_text(const ust__seq_state *st, const ust__seq_rule *rule, int n, int n_aa, char *out, size_t cap) {
  switch (st->why) {
  case UST__SEQ_WHY_WITHIN: snprintf(out, cap, "within delta %.3g of production", st->delta_used); break;
  case UST__SEQ_WHY_NOISE: snprintf(out, cap, "A/A spread %.3g > delta %.3g", st->spread, rule->delta); break;
  case UST__SEQ_WHY_UNDECIDED: snprintf(out, cap, "undecided after %d samples", n); break;
  case UST__SEQ_WHY_NO_AA: snprintf(out, cap, "%d A/A pairs of the %d needed", n_aa, rule->aa_min); break;
  default: snprintf(out, cap, "open"); break;
  }
}
