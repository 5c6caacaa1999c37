/* A route's additive figures as the derivation (scorer/derive.c), the
 * report's window and the metrics read them: from a route snapshot, with
 * no JSON between, or from a report's shape. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "plugin/engine.h"

void ust__reading_free(ust__reading *r) {
  if (r == NULL)
    return;
  ust__hist_sparse_free(&r->lat);
  ust__hist_sparse_free(&r->clat);
}

void ust__readings_free(ust__reading *r, int n) {
  for (int i = 0; r != NULL && i < n; i++)
    ust__reading_free(&r[i]);
  free(r);
}

void ust__reading_link(ust__reading *r) {
  r->in.lat = r->has_lat ? &r->lat : NULL;
  r->in.clat = r->has_clat ? &r->clat : NULL;
}

int ust__engine_op_index(const ust__engine *e, const ust__operator *op) {
  const ust__engine_op *eo = (const ust__engine_op *)(const void *)((const char *)op - offsetof(ust__engine_op, op));
  return eo >= e->ops && eo < e->ops + e->n_ops ? (int)(eo - e->ops) : -1;
}

void ust__reading_of_snap(const ust__engine *e, ust__route_snap *s, ust__reading *r) {
  memset(r, 0, sizeof *r);
  const ust__binding *b = s->binding;
  const ust__figs_snap *f = &s->figs;
  ust__derive_in *in = &r->in;
  r->key = s->key;
  r->mode = ust__mode_name(s->rollout.mode);
  in->op = ust__engine_op_index(e, b->op);
  in->phase = s->k.phase < UST__N_PHASES ? s->k.phase : 0;
  in->on_host = s->k.device != UST__DEV_CUDA;
  in->has_shadow = s->has_cand;
  in->has_roofline = b->roofline.present;
  in->rolled_back = s->rollout.mode == UST__MODE_ROLLED_BACK;
  /* the histograms move from the snapshot to the reading */
  r->lat = s->figs.hist;
  memset(&s->figs.hist, 0, sizeof s->figs.hist);
  r->has_lat = 1;
  if (s->has_cand) {
    r->clat = s->figs.cand_hist;
    memset(&s->figs.cand_hist, 0, sizeof s->figs.cand_hist);
    r->has_clat = 1;
  }
  ust__reading_link(r);
  in->calls = (double)f->calls;
  in->captured = (double)f->captured;
  in->replayed = (double)f->replayed;
  in->kernel_timed = (double)f->kernel_timed;
  in->held_timed = (double)f->held_timed;
  in->first_timed = (double)f->first_timed;
  in->first_time_ns = (double)f->first_time_ns;
  in->steady_timed = (double)f->steady_timed;
  in->steady_time_ns = (double)f->steady_time_ns;
  /* the calls after the key's first steady_after, outside graph capture (as
   * the report counts them) */
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  const uint64_t late = f->calls > pol->steady_after ? f->calls - pol->steady_after : 0;
  in->steady_calls = late > f->late_captured ? (double)(late - f->late_captured) : 0.0;
  r->timing_dropped = (double)f->timing_dropped;
  if (in->has_roofline) {
    in->roof_calls = (double)f->prod.calls;
    in->roof_tsol_ns = (double)f->prod.tsol_ps / 1000.0;
    in->roof_time_ns = (double)f->prod.time_ns;
    in->cand_roof_calls = (double)f->cand.calls;
    in->cand_roof_tsol_ns = (double)f->cand.tsol_ps / 1000.0;
    in->cand_roof_time_ns = (double)f->cand.time_ns;
    in->work_calls = (double)f->work_calls;
    in->flops = f->flops;
    in->bytes = f->bytes;
    r->roof_unscored = (double)f->unscored;
  }
  in->unseen_kernels = (double)f->unseen_kernels;
  in->graph_changed = (double)f->graph_changed;
  if (s->has_cand) {
    const ust__verify_snap *v = &s->verify;
    const ust__rollout_snap *ro = &s->rollout;
    in->served_cand = (double)ro->served_cand;
    r->served_prod = (double)(f->calls - f->captured - ro->served_cand);
    in->shadow_calls = (double)v->calls;
    in->verified = (double)v->verified;
    in->failed = (double)v->failed;
    in->graph_plain = (double)v->graph_plain;
    in->graph_ungated = (double)v->graph_ungated;
    in->graph_exposed = (double)v->graph_exposed;
    in->graph_shadowed = (double)v->graph_shadowed;
    r->passed = (double)v->passed;
    r->skipped = (double)v->skipped;
    r->unverifiable = (double)v->unverifiable;
    r->overdue = (double)v->overdue;
    r->bytes_copied = (double)v->bytes_copied;
    r->aa_runs = (double)v->aa_runs;
    r->aa_mismatching = (double)v->aa_mismatching;
    r->served_cand_verified = (double)ro->served_cand_verified;
    r->captured_cand = (double)ro->captured_cand;
    r->transitions = (double)ro->transitions;
  }
}

/* ---- from a report's shape ------------------------------------------------------------ */

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

static const cJSON *obj(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

int ust__sparse_of_json(const cJSON *lat, ust__hist_sparse *out) {
  const cJSON *b = cJSON_IsArray(obj(lat, "buckets")) ? obj(lat, "buckets") : NULL;
  const double sum = num(lat, "sum");
  /* Buckets by index, whatever order (and repeats) a merge handed in. */
  uint64_t dense[UST__HIST_BUCKETS] = {0};
  const cJSON *pair;
  cJSON_ArrayForEach(pair, b) {
    const cJSON *i = cJSON_GetArrayItem(pair, 0), *c = cJSON_GetArrayItem(pair, 1);
    if (!cJSON_IsNumber(i) || !cJSON_IsNumber(c) || !(i->valuedouble >= 0) || i->valuedouble >= UST__HIST_BUCKETS ||
        !(c->valuedouble >= 0) || !(c->valuedouble < 9.2e18))
      continue;
    dense[(uint32_t)i->valuedouble] += (uint64_t)c->valuedouble;
  }
  return ust__hist_sparse_of_dense(dense, sum >= 0 && sum < 1.8e19 ? (uint64_t)sum : 0, out);
}

int ust__reading_of_json(const cJSON *sh, int op, ust__reading *r) {
  memset(r, 0, sizeof *r);
  ust__derive_in *in = &r->in;
  const cJSON *key = obj(sh, "key"), *mode = obj(sh, "mode"), *phase = obj(sh, "phase"), *dev = obj(sh, "device");
  r->key = cJSON_IsString(key) ? key->valuestring : "";
  r->mode = cJSON_IsString(mode) ? mode->valuestring : "observe";
  in->op = op;
  for (int i = 0; cJSON_IsString(phase) && i < UST__N_PHASES; i++)
    if (strcmp(phase->valuestring, ust__phase_name(i)) == 0)
      in->phase = i;
  in->on_host = cJSON_IsString(dev) && strcmp(dev->valuestring, "cpu") == 0;
  const cJSON *lat = obj(sh, "latency_ns"), *shadow = obj(sh, "shadow"), *roof = obj(sh, "roofline");
  in->has_shadow = cJSON_IsObject(shadow);
  in->has_roofline = cJSON_IsObject(roof);
  in->rolled_back = strcmp(r->mode, "rolled_back") == 0;
  const cJSON *clat = obj(shadow, "candidate_latency_ns");
  if (lat != NULL) {
    if (ust__sparse_of_json(lat, &r->lat) != 0)
      return UST_ENOMEM;
    r->has_lat = 1;
  }
  if (clat != NULL) {
    if (ust__sparse_of_json(clat, &r->clat) != 0)
      return UST_ENOMEM;
    r->has_clat = 1;
  }
  ust__reading_link(r);
  in->calls = num(sh, "calls");
  in->captured = num(sh, "captured");
  in->replayed = num(sh, "replayed");
  in->kernel_timed = num(sh, "kernel_timed");
  in->held_timed = num(sh, "held_timed");
  in->first_timed = num(sh, "first_timed");
  in->first_time_ns = num(sh, "first_time_ns");
  in->steady_timed = num(sh, "steady_timed");
  in->steady_time_ns = num(sh, "steady_time_ns");
  in->steady_calls = num(sh, "steady_calls");
  r->timing_dropped = num(sh, "timing_dropped");
  in->roof_calls = num(roof, "calls");
  in->roof_tsol_ns = num(roof, "tsol_ns_sum");
  in->roof_time_ns = num(roof, "time_ns_sum");
  in->cand_roof_calls = num(roof, "candidate_calls");
  in->cand_roof_tsol_ns = num(roof, "candidate_tsol_ns_sum");
  in->cand_roof_time_ns = num(roof, "candidate_time_ns_sum");
  in->work_calls = num(roof, "work_calls");
  in->flops = num(roof, "flops_sum");
  in->bytes = num(roof, "bytes_sum");
  r->roof_unscored = num(roof, "unscored");
  const cJSON *graph = obj(sh, "graph"), *sgraph = obj(shadow, "graph");
  in->unseen_kernels = num(graph, "unseen_kernels");
  in->graph_changed = num(graph, "changed");
  in->graph_plain = num(sgraph, "plain");
  in->graph_ungated = num(sgraph, "ungated");
  in->graph_exposed = num(sgraph, "exposed");
  in->graph_shadowed = num(sgraph, "shadowed");
  const cJSON *rollout = obj(sh, "rollout"), *served = obj(rollout, "served");
  in->served_cand = num(served, "candidate");
  in->shadow_calls = num(shadow, "calls");
  in->verified = num(shadow, "verified");
  in->failed = num(shadow, "failed");
  r->passed = num(shadow, "passed");
  r->skipped = num(shadow, "skipped");
  r->unverifiable = num(shadow, "unverifiable");
  r->overdue = num(shadow, "overdue");
  r->bytes_copied = num(shadow, "bytes_copied");
  r->aa_runs = num(obj(shadow, "aa"), "runs");
  r->aa_mismatching = num(obj(shadow, "aa"), "mismatching");
  r->served_prod = num(served, "production");
  r->served_cand_verified = num(served, "candidate_verified");
  r->captured_cand = num(obj(rollout, "captured"), "candidate");
  r->transitions = num(rollout, "transitions");
  return 0;
}

int ust__derive_readings(const ust__reading *r, int n, double replay_scale, ust__derive_shape *shapes,
                         ust__derive_op *ops, int n_ops, ust__derive_totals *tot) {
  ust__derive_in *in = n > 0 ? malloc((size_t)n * sizeof *in) : NULL;
  if (n > 0 && in == NULL)
    return ust__error(UST_ENOMEM, "report: out of memory");
  for (int i = 0; i < n; i++) {
    in[i] = r[i].in;
    if (in[i].op < 0 || in[i].op >= n_ops)
      in[i].op = 0; /* never: a reading's operator is one of those given */
  }
  const int rc = ust__derive(in, n, replay_scale, shapes, ops, n_ops, tot);
  free(in);
  return rc;
}
