/* A report's derived figures from its additive ones, over plain structs:
 * quantiles, device-time estimates, importance weights, S per shape key,
 * operator and phase, S_agg, and how each key stands under CUDA graphs. */
#include <stdlib.h>
#include <string.h>

#include "scorer/scorer.h"

const char *ust__graph_status_name(int status) {
  switch (status) {
  case UST__GRAPH_OBSERVED:
    return "observed";
  case UST__GRAPH_GATED:
    return "gated";
  case UST__GRAPH_OBSERVE_ONLY:
    return "observe-only";
  default:
    return NULL;
  }
}

/* Growable arrays of S values, per operator and phase. */
typedef struct svals {
  double *v;
  int n, cap;
} svals;

static int push(svals *s, double x) {
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 16;
    double *v = realloc(s->v, (size_t)cap * sizeof *v);
    if (v == NULL)
      return ust__error(UST_ENOMEM, "report: out of memory");
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = x;
  return 0;
}

static double quantile(const ust__hist_sparse *h, double q) { return h != NULL ? ust__hist_sparse_quantile(h, q) : 0; }

/* Verdicts do not flow in its replays: kernels replayed by graphs understudy
 * did not see captured, captured calls a graph library changed in place,
 * captured calls holding production alone, shadows left ungated, captured
 * calls in a graph handed out. */
static int graph_status(const ust__derive_in *in) {
  if (in->unseen_kernels > 0 || in->graph_changed > 0 || in->graph_plain > 0 || in->graph_ungated > 0 ||
      in->graph_exposed > 0)
    return UST__GRAPH_OBSERVE_ONLY;
  if (in->graph_shadowed > 0)
    return UST__GRAPH_GATED;
  if (in->captured > 0 || in->replayed > 0)
    return UST__GRAPH_OBSERVED;
  return UST__GRAPH_NONE;
}

/* A key where both arms have an S counts in the candidates' headline. */
static void add_cand(ust__derive_cand *c, double e_ns, double s_cand, double s_prod) {
  c->routes++;
  c->time_ns += e_ns;
  c->s_cand += e_ns * s_cand;
  c->s_prod += e_ns * s_prod;
}

static void add_cand_sums(ust__derive_cand *to, const ust__derive_cand *c) {
  to->routes += c->routes;
  to->time_ns += c->time_ns;
  to->s_cand += c->s_cand;
  to->s_prod += c->s_prod;
}

static void finish_cand(ust__derive_cand *c, double total_ns) {
  c->device_share = total_ns > 0 ? c->time_ns / total_ns : 0.0;
  c->S_candidate = c->time_ns > 0 ? c->s_cand / c->time_ns : -1;
  c->S_production = c->time_ns > 0 ? c->s_prod / c->time_ns : -1;
}

/* A key's speedup, its S for either arm, its roofline chart's coordinates and
 * whether it was measured above its roof (from its first pass). */
static void derive_roofline(const ust__derive_in *x, ust__derive_shape *sh) {
  sh->speedup = sh->S = sh->S_candidate = -1;
  sh->intensity = sh->flops_mean = sh->achieved_flops_s = sh->cand_achieved_flops_s = -1;
  if (x->has_shadow && sh->p50 > 0 && sh->cand_p50 > 0)
    sh->speedup = sh->p50 / sh->cand_p50;
  if (!x->has_roofline)
    return;
  const double nc = x->roof_calls;
  sh->tsol_ns_mean = nc > 0 ? x->roof_tsol_ns / nc : 0.0;
  sh->S = ust__route_s(x->roof_tsol_ns, nc, sh->p50);
  sh->S_candidate = x->has_shadow && !x->rolled_back
                        ? ust__route_s(x->cand_roof_tsol_ns, x->cand_roof_calls, sh->cand_p50) : -1;
  /* the roofline chart's coordinates: FLOP per byte, and FLOP/s at the
   * median time (as S is), so a point lies S below its roof */
  const double wc = x->work_calls, w_mean = wc > 0 ? x->flops / wc : 0;
  sh->intensity = wc > 0 && x->bytes > 0 ? x->flops / x->bytes : -1;
  sh->flops_mean = wc > 0 ? w_mean : -1;
  sh->achieved_flops_s = w_mean > 0 && sh->p50 > 0 ? w_mean / sh->p50 * 1e9 : -1;
  sh->cand_achieved_flops_s = w_mean > 0 && sh->cand_p50 > 0 ? w_mean / sh->cand_p50 * 1e9 : -1;
  /* faster than the floor, by either arm: the profile is below what the device achieved */
  sh->above_roof = sh->S > 1 || sh->S_candidate > 1;
}

/* A key's shadow figures in the totals. */
static void add_shadow(ust__derive_totals *tot, const ust__derive_in *x) {
  if (!x->has_shadow)
    return;
  tot->shadow_calls += x->shadow_calls;
  tot->verified += x->verified;
  tot->failed += x->failed;
  tot->rollbacks += x->rolled_back;
}

/* First pass: a key's quantiles, device-time estimate and graph status. */
static void derive_key(const ust__derive_in *in, double replay_scale, ust__derive_shape *out) {
  memset(out, 0, sizeof *out);
  out->timed = in->lat != NULL ? (double)in->lat->count : 0;
  const double timed_sum = in->lat != NULL ? (double)in->lat->sum : 0;
  out->p50 = quantile(in->lat, 0.50);
  out->p90 = quantile(in->lat, 0.90);
  out->p99 = quantile(in->lat, 0.99);
  out->cand_timed = in->clat != NULL ? (double)in->clat->count : 0;
  out->cand_p50 = quantile(in->clat, 0.50);
  out->cand_p90 = quantile(in->clat, 0.90);
  out->cand_p99 = quantile(in->clat, 0.99);
  /* a replayed call is timed and runs without a dispatcher call: the
   * estimate counts it beside the calls (scaled to the whole time) */
  const double replayed = in->replayed * replay_scale;
  const ust__est_in est_in = {.timed = out->timed, .timed_sum_ns = timed_sum, .first_timed = in->first_timed,
                              .first_sum_ns = in->first_time_ns, .steady_timed = in->steady_timed,
                              .steady_sum_ns = in->steady_time_ns, .calls = in->calls + replayed,
                              .captured = in->captured, .steady_calls = in->steady_calls};
  double est = ust__est_device_time(&est_in);
  /* the calls the candidate served (canary, live) ran its kernels, not
   * production's: they count at the candidate's mean time (its timed runs,
   * verified calls and shadow runs), or production's while it has none */
  const double eligible = in->calls + replayed - in->captured;
  if (in->served_cand > 0 && eligible >= in->served_cand && out->cand_timed > 0)
    est = est * (eligible - in->served_cand) / eligible + in->served_cand * (double)in->clat->sum / out->cand_timed;
  out->replayed_est = replayed;
  out->est_device_time_ns = est;
  out->graph = graph_status(in);
}

int ust__derive(const ust__derive_in *in, int n, double replay_scale, ust__derive_shape *shapes, ust__derive_op *ops,
                int n_ops, ust__derive_totals *tot) {
  enum { NP = UST__DERIVE_PHASES };
  int rc = 0;
  memset(tot, 0, sizeof *tot);
  double total_ph[NP] = {0};
  for (int i = 0; i < n; i++) {
    derive_key(&in[i], replay_scale, &shapes[i]);
    tot->est_device_time_ns += shapes[i].est_device_time_ns;
    total_ph[in[i].phase] += shapes[i].est_device_time_ns;
  }
  const double total_est = tot->est_device_time_ns;
  double s_agg = 0, s_agg_cand = 0, s_agg_ph[NP] = {0}, s_agg_cand_ph[NP] = {0};
  /* the device-time share of the operators that have an S: S_agg is taken over it */
  double scored_w = 0, scored_w_ph[NP] = {0};
  /* the device-time share of the shape keys that have an S (scored_share),
   * overall and within each phase */
  double keys_scored = 0, keys_scored_ph[NP] = {0};
  /* scored operators that have a candidate, overall and per phase: without
   * one, the candidates' S_agg is null (no candidate was measured), not 0 */
  int cand_ops = 0, cand_ops_ph[NP] = {0};
  svals sv = {0}, cv = {0}, sph[NP] = {{0}}, cph[NP] = {{0}};
  for (int o = 0; o < n_ops; o++) {
    ust__derive_op *op = &ops[o];
    const int has_cand = op->has_candidate;
    memset(op, 0, sizeof *op);
    op->has_candidate = has_cand;
    double tsol_sum = 0, time_sum = 0;
    int cand_routes = 0, covered = 0;
    sv.n = cv.n = 0;
    for (int p = 0; p < NP; p++)
      sph[p].n = cph[p].n = 0;
    for (int i = 0; i < n; i++) {
      if (in[i].op != o)
        continue;
      const ust__derive_in *x = &in[i];
      ust__derive_shape *sh = &shapes[i];
      const int ph = x->phase;
      const double e_ns = sh->est_device_time_ns;
      sh->weight = total_est > 0 ? e_ns / total_est : 0.0;
      op->phases[ph].est_device_time_ns += e_ns;
      op->phases[ph].routes++;
      derive_roofline(x, sh);
      add_shadow(tot, x);
      if (x->has_roofline) {
        op->above_roof += sh->above_roof;
        if (sh->S >= 0 && sh->S_candidate >= 0)
          add_cand(&op->candidate_routes, e_ns, sh->S_candidate, sh->S);
        if (sh->S >= 0) {
          if ((rc = push(&sv, sh->S)) != 0 || (rc = push(&sph[ph], sh->S)) != 0)
            goto out;
          tsol_sum += x->roof_tsol_ns;
          time_sum += x->roof_time_ns;
          keys_scored += total_est > 0 ? e_ns / total_est : 0.0;
          keys_scored_ph[ph] += total_ph[ph] > 0 ? e_ns / total_ph[ph] : 0.0;
        }
        if (x->has_shadow) {
          cand_routes++;
          if (sh->S_candidate >= 0) {
            if ((rc = push(&cv, sh->S_candidate)) != 0 || (rc = push(&cph[ph], sh->S_candidate)) != 0)
              goto out;
            covered++;
          }
        }
      }
      op->calls += x->calls;
      op->timed += sh->timed;
      op->captured += x->captured;
      op->est_device_time_ns += e_ns;
      op->device_time_ns += x->lat != NULL ? (double)x->lat->sum : 0;
    }
    const double w_op = total_est > 0 ? op->est_device_time_ns / total_est : 0.0;
    op->weight = w_op;
    /* S_i: the median over shape keys (the paper), and the time-weighted
     * variant; for a candidate, over the keys where it verified correct.
     * Unscored is null, not 0: an operator nothing scored does not pull
     * S_agg down. */
    op->scored_shapes = sv.n;
    op->S = sv.n > 0 ? ust__median(sv.v, sv.n) : -1;
    op->S_weighted = time_sum > 0 ? tsol_sum / time_sum : -1;
    op->S_candidate = op->coverage = -1;
    tot->above_roof += op->above_roof;
    if (has_cand) {
      op->S_candidate = cv.n > 0 ? ust__median(cv.v, cv.n) : -1;
      op->coverage = cand_routes > 0 ? (double)covered / cand_routes : 0.0;
      tot->any_candidate = 1;
      add_cand_sums(&tot->candidate_routes, &op->candidate_routes);
      finish_cand(&op->candidate_routes, total_est);
      if (op->S >= 0) {
        s_agg_cand += w_op * (op->S_candidate >= 0 ? op->S_candidate : 0.0); /* unverified counts 0 */
        cand_ops++;
      }
    }
    if (op->S >= 0) {
      s_agg += w_op * op->S;
      scored_w += w_op;
    }
    /* The same per phase: weights are shares of that phase's device time. */
    for (int p = 0; p < NP; p++) {
      ust__derive_phase *x = &op->phases[p];
      x->S = x->S_candidate = -1;
      if (x->routes == 0)
        continue;
      x->weight = total_ph[p] > 0 ? x->est_device_time_ns / total_ph[p] : 0.0;
      x->S = sph[p].n > 0 ? ust__median(sph[p].v, sph[p].n) : -1;
      if (x->S >= 0) {
        s_agg_ph[p] += x->weight * x->S;
        scored_w_ph[p] += x->weight;
      }
      if (has_cand) {
        x->S_candidate = cph[p].n > 0 ? ust__median(cph[p].v, cph[p].n) : -1;
        if (x->S >= 0) {
          s_agg_cand_ph[p] += x->weight * (x->S_candidate >= 0 ? x->S_candidate : 0.0);
          cand_ops_ph[p]++;
        }
      }
    }
    tot->calls += op->calls;
    tot->timed += op->timed;
    tot->captured += op->captured;
  }
  /* S_agg = sum_i w_i S_i / sum_i w_i over the operators that have an S
   * (null when nothing was scored): production's (the headroom left) and the
   * candidates' (operators without a verified candidate count 0; null when
   * no scored operator has a candidate). Beside it the share of the device
   * time whose shape keys were scored: an operator's S stands for its
   * unscored keys too, which this share does not count. */
  tot->routes = n;
  tot->scored_share = keys_scored;
  tot->S_agg = scored_w > 0 ? s_agg / scored_w : -1;
  tot->S_agg_candidate = scored_w > 0 && cand_ops > 0 ? s_agg_cand / scored_w : -1;
  finish_cand(&tot->candidate_routes, total_est);
  for (int p = 0; p < NP; p++) {
    tot->phases[p].est_device_time_ns = total_ph[p];
    tot->phases[p].scored_share = keys_scored_ph[p];
    tot->phases[p].S_agg = scored_w_ph[p] > 0 ? s_agg_ph[p] / scored_w_ph[p] : -1;
    tot->phases[p].S_agg_candidate = scored_w_ph[p] > 0 && cand_ops_ph[p] > 0 ? s_agg_cand_ph[p] / scored_w_ph[p] : -1;
  }
out:
  free(sv.v);
  free(cv.v);
  for (int p = 0; p < NP; p++) {
    free(sph[p].v);
    free(cph[p].v);
  }
  return rc;
}
