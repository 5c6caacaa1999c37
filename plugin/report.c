/*
 * The JSON report (schema "understudy.report", version 1).
 *
 * Per operator and per shape key: calls, timed calls, captured calls,
 * latency quantiles and the sparse histogram (so reports merge exactly), the
 * device time, and the importance weight: the share of observed device time,
 * normalised to 1 over everything this process observed. When only a sample
 * of calls is timed, device time is estimated as the timed sum scaled by
 * calls / timed; both figures are reported.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "guard/guard.h"
#include "plugin/engine.h"

typedef struct route_fig {
  ust__route *r;
  uint64_t calls, timed, captured, dropped;
  double est_ns;
  ust__hist_snap *hist;
} route_fig;

static cJSON *add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v); }

static cJSON *hist_json(const ust__hist_snap *s) {
  cJSON *lat = cJSON_CreateObject();
  add_num(lat, "p50", ust__hist_quantile(s, 0.50));
  add_num(lat, "p90", ust__hist_quantile(s, 0.90));
  add_num(lat, "p99", ust__hist_quantile(s, 0.99));
  add_num(lat, "count", (double)s->count);
  add_num(lat, "sum", (double)s->sum);
  cJSON *b = cJSON_AddArrayToObject(lat, "buckets");
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++)
    if (s->buckets[i] != 0) {
      cJSON *pair = cJSON_CreateArray();
      cJSON_AddItemToArray(pair, cJSON_CreateNumber(i));
      cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)s->buckets[i]));
      cJSON_AddItemToArray(b, pair);
    }
  return lat;
}

static double u64_as_double(atomic_uint_fast64_t *a) { return ust__bits_to_double(atomic_load(a)); }

/* The route's effective mode (guard/rollout.c). */
static const char *route_mode(const ust__route *r) { return ust__mode_name(ust__route_mode(r, NULL)); }

static cJSON *evidence_json(const ust__evidence *ev) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "reason", ev->reason);
  cJSON_AddStringToObject(j, "output", ev->output);
  cJSON_AddStringToObject(j, "message", ev->message);
  add_num(j, "shadow_call", (double)ev->shadow_call);
  cJSON_AddBoolToObject(j, "while_serving", ev->serving);
  if (ev->serving)
    add_num(j, "served_before_verdict", (double)ev->served_before_verdict);
  add_num(j, "unix_ms", (double)ev->unix_ms);
  cJSON *shape = cJSON_AddArrayToObject(j, "shape");
  for (int d = 0; d < ev->ndim; d++)
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ev->shape[d]));
  if (!ev->has_stats)
    return j;
  const ust__cmp_stats *st = &ev->stats;
  add_num(j, "atol", ev->atol);
  add_num(j, "rtol", ev->rtol);
  add_num(j, "elements", (double)st->n);
  add_num(j, "mismatches", (double)st->mismatches);
  add_num(j, "nonfinite_production", (double)st->nonfinite_prod);
  add_num(j, "nonfinite_candidate", (double)st->nonfinite_cand);
  add_num(j, "nonfinite_where_production_finite", (double)st->nonfinite_bad);
  add_num(j, "max_abs_err", ust__bits_to_double(st->max_abs_bits));
  add_num(j, "max_rel_err", ust__bits_to_double(st->max_rel_bits));
  add_num(j, "rel_l2_err", st->sum_sq_prod > 0 ? sqrt(st->sum_sq_diff / st->sum_sq_prod) : 0.0);
  int64_t first = ust__cmp_first_mismatch(st);
  if (first < 0) {
    cJSON_AddNullToObject(j, "first_mismatch");
  } else {
    cJSON *fm = cJSON_AddObjectToObject(j, "first_mismatch");
    add_num(fm, "flat_index", (double)first);
    cJSON *idx = cJSON_AddArrayToObject(fm, "index");
    for (int d = 0; d < ev->ndim; d++)
      cJSON_AddItemToArray(idx, cJSON_CreateNumber((double)ev->first_index[d]));
  }
  return j;
}

static cJSON *shadow_json(ust__route *r, const ust__hist_snap *prod, const ust__hist_snap *cand_snap) {
  cJSON *j = cJSON_CreateObject();
  add_num(j, "calls", (double)atomic_load(&r->shadow_calls));
  add_num(j, "verified", (double)atomic_load(&r->verified));
  add_num(j, "passed", (double)atomic_load(&r->passed));
  add_num(j, "failed", (double)atomic_load(&r->failed));
  add_num(j, "skipped", (double)atomic_load(&r->skipped));
  add_num(j, "unverifiable", (double)atomic_load(&r->unverifiable));
  add_num(j, "max_abs_err", u64_as_double(&r->max_abs_bits));
  add_num(j, "max_rel_err", u64_as_double(&r->max_rel_bits));
  cJSON_AddItemToObject(j, "candidate_latency_ns", hist_json(cand_snap));
  double tp = ust__hist_quantile(prod, 0.5), tc = ust__hist_quantile(cand_snap, 0.5);
  if (tp > 0 && tc > 0)
    add_num(j, "speedup", tp / tc);
  else
    cJSON_AddNullToObject(j, "speedup");
  cJSON *aa = cJSON_AddObjectToObject(j, "aa");
  add_num(aa, "runs", (double)atomic_load(&r->aa_runs));
  add_num(aa, "mismatching", (double)atomic_load(&r->aa_mismatching));
  add_num(aa, "max_abs_err", u64_as_double(&r->aa_max_abs_bits));
  add_num(aa, "max_rel_err", u64_as_double(&r->aa_max_rel_bits));
  const ust__evidence *ev = atomic_load(&r->evidence);
  if (ev != NULL)
    cJSON_AddItemToObject(j, "rollback", evidence_json(ev));
  else
    cJSON_AddNullToObject(j, "rollback");
  return j;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  if (n == 0)
    return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* S of a route as DESIGN.md defines it: the mean T_SOL of its scored calls
 * over the median measured time (production's, or the candidate's over its
 * passing shadow calls); -1 when unknown. */
static double route_s(ust__route *r, int candidate, const ust__hist_snap *times) {
  uint64_t n = atomic_load(candidate ? &r->cand_roof_calls : &r->roof_calls);
  double p50 = ust__hist_quantile(times, 0.5);
  if (n == 0 || p50 <= 0)
    return -1;
  return (double)atomic_load(candidate ? &r->cand_roof_tsol_ps : &r->roof_tsol_ps) / 1000.0 / (double)n / p50;
}

/* sp, sc: the route's S and its candidate's, -1 when unknown (route_s). */
static cJSON *roofline_json(ust__route *r, double sp, double sc) {
  cJSON *j = cJSON_CreateObject();
  const ust__hw_profile *hw = atomic_load(&r->hw);
  if (hw != NULL)
    cJSON_AddStringToObject(j, "hardware", hw->name);
  else
    cJSON_AddNullToObject(j, "hardware");
  uint64_t n = atomic_load(&r->roof_calls);
  add_num(j, "calls", (double)n);
  add_num(j, "unscored", (double)atomic_load(&r->roof_unscored));
  add_num(j, "tsol_ns_mean", n ? (double)atomic_load(&r->roof_tsol_ps) / 1000.0 / (double)n : 0.0);
  /* sums (ns), so that reports merge exactly */
  add_num(j, "tsol_ns_sum", (double)atomic_load(&r->roof_tsol_ps) / 1000.0);
  add_num(j, "time_ns_sum", (double)atomic_load(&r->roof_time_ns));
  add_num(j, "candidate_calls", (double)atomic_load(&r->cand_roof_calls));
  add_num(j, "candidate_tsol_ns_sum", (double)atomic_load(&r->cand_roof_tsol_ps) / 1000.0);
  add_num(j, "candidate_time_ns_sum", (double)atomic_load(&r->cand_roof_time_ns));
  if (sp >= 0)
    add_num(j, "S", sp);
  else
    cJSON_AddNullToObject(j, "S");
  if (r->binding->cand != NULL && sc >= 0 && !atomic_load(&r->rolled_back))
    add_num(j, "S_candidate", sc);
  else
    cJSON_AddNullToObject(j, "S_candidate");
  const char *est = r->binding->def->roofline.estimate;
  if (est[0] != '\0')
    cJSON_AddStringToObject(j, "estimate", est);
  return j;
}

cJSON *ust__report_build(ust__engine *e) {
  int nr = 0;
  /* Routes inserted while this runs are left for the next report. */
  uint32_t n_alloc = atomic_load(&e->routes.count) + 1;
  route_fig *figs = calloc(n_alloc, sizeof *figs);
  ust__hist_snap *snaps = calloc(n_alloc, sizeof *snaps);
  ust__hist_snap *cand_snap = malloc(sizeof *cand_snap);
  double *svals = calloc(n_alloc, sizeof *svals), *cvals = calloc(n_alloc, sizeof *cvals);
  /* per phase: S of the operator's routes, production and candidate */
  double *sph = calloc((size_t)n_alloc * UST__N_PHASES, sizeof *sph), *cph = calloc((size_t)n_alloc * UST__N_PHASES, sizeof *cph);
  cJSON *root = cJSON_CreateObject();
  if (figs == NULL || snaps == NULL || cand_snap == NULL || svals == NULL || cvals == NULL || sph == NULL ||
      cph == NULL || root == NULL) {
    free(figs);
    free(snaps);
    free(cand_snap);
    free(svals);
    free(cvals);
    free(sph);
    free(cph);
    cJSON_Delete(root);
    return NULL;
  }
  double total_est = 0, total_ph[UST__N_PHASES] = {0};
  for (uint32_t i = 0; i < e->routes.cap && nr < (int)n_alloc; i++) {
    ust__route *r = atomic_load_explicit(&e->routes.slots[i], memory_order_acquire);
    if (r == NULL)
      continue;
    route_fig *f = &figs[nr];
    f->r = r;
    f->hist = &snaps[nr];
    ust__hist_snapshot(&r->hist, f->hist);
    f->calls = atomic_load(&r->calls);
    f->timed = f->hist->count;
    f->captured = atomic_load(&r->captured);
    f->dropped = atomic_load(&r->timing_dropped);
    uint64_t eligible = f->calls - f->captured;
    f->est_ns = f->timed > 0 ? (double)f->hist->sum * (double)eligible / (double)f->timed : 0.0;
    total_est += f->est_ns;
    total_ph[r->key.phase < UST__N_PHASES ? r->key.phase : 0] += f->est_ns;
    nr++;
  }

  struct timeval tv;
  gettimeofday(&tv, NULL);
  cJSON_AddStringToObject(root, "schema", "understudy.report");
  add_num(root, "version", 1);
  cJSON_AddStringToObject(root, "library_version", ust_version());
  cJSON_AddStringToObject(root, "torch_version", ust_torch_version());
  add_num(root, "pid", (double)getpid());
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  cJSON_AddStringToObject(root, "host", host);
  add_num(root, "started_unix_ms", (double)e->started_unix_ms);
  add_num(root, "generated_unix_ms", (double)tv.tv_sec * 1000.0 + (double)(tv.tv_usec / 1000));
  cJSON *hs = cJSON_AddObjectToObject(root, "histogram");
  cJSON_AddStringToObject(hs, "scheme", UST__HIST_SCHEME);
  cJSON_AddStringToObject(hs, "unit", "ns");
  add_num(hs, "buckets", UST__HIST_BUCKETS);

  uint64_t t_calls = 0, t_timed = 0, t_captured = 0, t_untracked = 0;
  uint64_t t_shadow = 0, t_verified = 0, t_failed = 0, t_rollbacks = 0;
  double s_agg = 0, s_agg_cand = 0, s_agg_ph[UST__N_PHASES] = {0}, s_agg_cand_ph[UST__N_PHASES] = {0};
  cJSON *ops = cJSON_AddArrayToObject(root, "operators");
  for (int oi = 0; oi < e->n_ops; oi++) {
    ust__operator *op = &e->ops[oi];
    cJSON *jo = cJSON_CreateObject();
    cJSON_AddStringToObject(jo, "name", op->name);
    cJSON_AddStringToObject(jo, "mode", ust__mode_name(atomic_load(&op->mode)));
    add_num(jo, "sample", op->sample);
    cJSON_AddStringToObject(jo, "definition", op->problem->path);
    if (op->cand != NULL) {
      const ust__candidate *c = op->cand;
      cJSON *jc = cJSON_AddObjectToObject(jo, "candidate");
      cJSON_AddStringToObject(jc, "kind", c->kind == UST__CAND_NATIVE ? "native" : "torch_op");
      cJSON_AddStringToObject(jc, "name", c->name);
      cJSON_AddStringToObject(jc, "target", c->target);
      if (c->kind == UST__CAND_NATIVE) {
        cJSON_AddStringToObject(jc, "path", c->path);
        cJSON_AddStringToObject(jc, "sha256", c->sha256);
      }
      cJSON_AddStringToObject(jc, "compare", ust__cmp_kind_name(c->compare));
      if (c->atol >= 0)
        add_num(jc, "atol", c->atol);
      if (c->rtol >= 0)
        add_num(jc, "rtol", c->rtol);
      add_num(jc, "aa_sample", c->aa_sample);
    }
    uint64_t calls = 0, timed = 0, captured = 0, untracked = 0;
    double est = 0, measured = 0;
    cJSON *bindings = cJSON_AddArrayToObject(jo, "bindings");
    for (int bi = 0; bi < e->n_bindings; bi++)
      if (e->bindings[bi].op == op) {
        cJSON_AddItemToArray(bindings, cJSON_CreateString(e->bindings[bi].display));
        untracked += atomic_load(&e->bindings[bi].untracked);
      }
    if (op->problem->n_hosted > 0) {
      /* no op of its own: its traffic is scored under the operators binding these */
      cJSON *h = cJSON_AddArrayToObject(jo, "hosted_in");
      for (int k = 0; k < op->problem->n_hosted; k++)
        cJSON_AddItemToArray(h, cJSON_CreateString(op->problem->hosted_in[k]));
    }
    cJSON *shapes = cJSON_CreateArray();
    int ns = 0, nc = 0, cand_routes = 0, covered = 0;
    int nsp[UST__N_PHASES] = {0}, ncp[UST__N_PHASES] = {0}, routes_ph[UST__N_PHASES] = {0};
    double tsol_sum = 0, time_sum = 0, est_ph[UST__N_PHASES] = {0};
    for (int i = 0; i < nr; i++) {
      route_fig *f = &figs[i];
      if (f->r->binding->op != op)
        continue;
      const ust__binding *b = f->r->binding;
      cJSON *js = cJSON_CreateObject();
      char key[512];
      ust__route_key_str(f->r, key, sizeof key);
      cJSON_AddStringToObject(js, "key", key);
      cJSON_AddStringToObject(js, "op", b->display);
      cJSON_AddStringToObject(js, "mode", route_mode(f->r));
      const int ph = f->r->key.phase < UST__N_PHASES ? f->r->key.phase : 0;
      cJSON_AddStringToObject(js, "phase", ust__phase_name(ph));
      est_ph[ph] += f->est_ns;
      routes_ph[ph]++;
      cJSON_AddStringToObject(js, "device", f->r->key.device == UST__DEV_CUDA ? "cuda" : "cpu");
      cJSON *dts = cJSON_AddArrayToObject(js, "dtypes");
      for (int d = 0; d < f->r->key.n_dtypes; d++)
        cJSON_AddItemToArray(dts, cJSON_CreateString(ust__dtype_name(f->r->key.dtypes[d])));
      cJSON *dims = cJSON_AddObjectToObject(js, "dims");
      for (int d = 0; d < b->n_dims; d++)
        add_num(dims, b->def->dims[d].name, (double)f->r->key.dims[d]);
      add_num(js, "calls", (double)f->calls);
      add_num(js, "timed", (double)f->timed);
      add_num(js, "captured", (double)f->captured);
      add_num(js, "timing_dropped", (double)f->dropped);
      add_num(js, "device_time_ns", (double)f->hist->sum);
      add_num(js, "est_device_time_ns", f->est_ns);
      add_num(js, "weight", total_est > 0 ? f->est_ns / total_est : 0.0);
      cJSON_AddItemToObject(js, "latency_ns", hist_json(f->hist));
      /* One snapshot of the candidate's latency serves both its shadow
       * figures and its S. */
      if (b->cand != NULL)
        ust__hist_snapshot(&f->r->cand_hist, cand_snap);
      if (b->roofline.present) {
        double sp = route_s(f->r, 0, f->hist), sc = b->cand != NULL ? route_s(f->r, 1, cand_snap) : -1;
        cJSON_AddItemToObject(js, "roofline", roofline_json(f->r, sp, sc));
        if (sp >= 0) {
          svals[ns++] = sp;
          sph[ph * n_alloc + nsp[ph]++] = sp;
          tsol_sum += (double)atomic_load(&f->r->roof_tsol_ps) / 1000.0;
          time_sum += (double)atomic_load(&f->r->roof_time_ns);
        }
        if (b->cand != NULL) {
          cand_routes++;
          if (sc >= 0 && !atomic_load(&f->r->rolled_back)) {
            cvals[nc++] = sc;
            cph[ph * n_alloc + ncp[ph]++] = sc;
            covered++;
          }
        }
      }
      if (b->cand != NULL) {
        cJSON_AddItemToObject(js, "shadow", shadow_json(f->r, f->hist, cand_snap));
        cJSON_AddItemToObject(js, "rollout", ust__rollout_json(f->r));
        t_shadow += atomic_load(&f->r->shadow_calls);
        t_verified += atomic_load(&f->r->verified);
        t_failed += atomic_load(&f->r->failed);
        t_rollbacks += atomic_load(&f->r->rolled_back) ? 1u : 0u;
      }
      cJSON_AddItemToArray(shapes, js);
      calls += f->calls;
      timed += f->timed;
      captured += f->captured;
      est += f->est_ns;
      measured += (double)f->hist->sum;
    }
    add_num(jo, "calls", (double)calls);
    add_num(jo, "timed", (double)timed);
    add_num(jo, "captured", (double)captured);
    add_num(jo, "untracked", (double)untracked);
    add_num(jo, "device_time_ns", measured);
    add_num(jo, "est_device_time_ns", est);
    const double w_op = total_est > 0 ? est / total_est : 0.0;
    add_num(jo, "weight", w_op);
    /* S_i: the median over shape keys (the paper), and the time-weighted
     * variant; for a candidate, over the keys where it verified correct. */
    const double s_op = median(svals, ns);
    cJSON *jr = cJSON_AddObjectToObject(jo, "roofline");
    add_num(jr, "scored_shapes", ns);
    add_num(jr, "S", s_op);
    add_num(jr, "S_weighted", time_sum > 0 ? tsol_sum / time_sum : 0.0);
    if (op->cand != NULL) {
      const double s_c = median(cvals, nc);
      add_num(jr, "S_candidate", s_c);
      add_num(jr, "coverage", cand_routes > 0 ? (double)covered / cand_routes : 0.0);
      s_agg_cand += w_op * s_c;
    }
    s_agg += w_op * s_op;
    /* The same per phase: weights are shares of that phase's device time. */
    cJSON *jp = cJSON_AddObjectToObject(jo, "phases");
    for (int p = 0; p < UST__N_PHASES; p++) {
      if (routes_ph[p] == 0)
        continue;
      cJSON *x = cJSON_AddObjectToObject(jp, ust__phase_name(p));
      const double wp = total_ph[p] > 0 ? est_ph[p] / total_ph[p] : 0.0;
      const double sp_op = median(sph + p * n_alloc, nsp[p]);
      add_num(x, "est_device_time_ns", est_ph[p]);
      add_num(x, "weight", wp);
      add_num(x, "S", sp_op);
      s_agg_ph[p] += wp * sp_op;
      if (op->cand != NULL) {
        const double sc_op = median(cph + p * n_alloc, ncp[p]);
        add_num(x, "S_candidate", sc_op);
        s_agg_cand_ph[p] += wp * sc_op;
      }
    }
    cJSON_AddItemToObject(jo, "shapes", shapes);
    cJSON_AddItemToArray(ops, jo);
    t_calls += calls;
    t_timed += timed;
    t_captured += captured;
    t_untracked += untracked;
  }
  cJSON *tot = cJSON_AddObjectToObject(root, "totals");
  add_num(tot, "calls", (double)t_calls);
  add_num(tot, "timed", (double)t_timed);
  add_num(tot, "captured", (double)t_captured);
  add_num(tot, "untracked", (double)t_untracked);
  add_num(tot, "routes", nr);
  add_num(tot, "internal_errors", (double)ust__internal_errors());
  add_num(tot, "est_device_time_ns", total_est);
  add_num(tot, "shadow_calls", (double)t_shadow);
  add_num(tot, "verified", (double)t_verified);
  add_num(tot, "failed", (double)t_failed);
  add_num(tot, "rollbacks", (double)t_rollbacks);
  /* S_agg = sum_i w_i S_i: production's (the headroom left) and the
   * candidates' (operators without a verified candidate count 0). */
  add_num(tot, "S_agg", s_agg);
  add_num(tot, "S_agg_candidate", s_agg_cand);
  cJSON *tp = cJSON_AddObjectToObject(tot, "phases");
  for (int p = 0; p < UST__N_PHASES; p++) {
    if (total_ph[p] <= 0)
      continue;
    cJSON *x = cJSON_AddObjectToObject(tp, ust__phase_name(p));
    add_num(x, "est_device_time_ns", total_ph[p]);
    add_num(x, "S_agg", s_agg_ph[p]);
    add_num(x, "S_agg_candidate", s_agg_cand_ph[p]);
  }
  free(sph);
  free(cph);
  free(figs);
  free(snaps);
  free(cand_snap);
  free(svals);
  free(cvals);
  return root;
}

int ust__report_write_file(ust__engine *e, const char *path) {
  cJSON *j = ust__report_build(e);
  char *text = j != NULL ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  if (text == NULL)
    return ust__error(UST_ENOMEM, "report: out of memory");
  int rc = ust__write_file_atomic(path, text, "report");
  free(text);
  return rc;
}
