/*
 * The JSON report (schema "understudy.report", version 1), built from a
 * plain snapshot of the routes (dispatch/), never from the routes
 * themselves.
 *
 * Per operator and per shape key: calls, timed calls, captured calls, the
 * sparse latency histogram, roofline sums, verification counts and rollout
 * figures: additive figures that reports from many processes add exactly.
 * ust__report_derive then computes every derived figure from them in place
 * (quantiles, device time, the importance weights, S and S_agg): the one
 * place those rules live, used alike by the in-process report and by merges
 * (ust_report_derive).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plugin/engine.h"

static cJSON *add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v); }

/* ---- additive figures ---------------------------------------------------------------- */

static cJSON *hist_json(const ust__hist_sparse *s) {
  cJSON *lat = cJSON_CreateObject();
  add_num(lat, "count", (double)s->count);
  add_num(lat, "sum", (double)s->sum);
  cJSON *b = cJSON_AddArrayToObject(lat, "buckets");
  for (int i = 0; i < s->n; i++) {
    cJSON *pair = cJSON_CreateArray();
    cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->index[i]));
    cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)s->counts[i]));
    cJSON_AddItemToArray(b, pair);
  }
  return lat;
}

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

static cJSON *shadow_json(const ust__route_snap *s) {
  const ust__verify_snap *v = &s->verify;
  cJSON *j = cJSON_CreateObject();
  add_num(j, "calls", (double)v->calls);
  add_num(j, "verified", (double)v->verified);
  add_num(j, "passed", (double)v->passed);
  add_num(j, "failed", (double)v->failed);
  add_num(j, "skipped", (double)v->skipped);
  cJSON *by = cJSON_AddObjectToObject(j, "skipped_by");
  for (int i = 0; i < UST__SKIP_COUNT; i++)
    add_num(by, ust__skip_name(i), (double)v->skipped_by[i]);
  add_num(j, "unverifiable", (double)v->unverifiable);
  add_num(j, "max_abs_err", v->max_abs);
  add_num(j, "max_rel_err", v->max_rel);
  add_num(j, "bytes_copied", (double)v->bytes_copied);
  add_num(j, "overdue", (double)v->overdue);
  add_num(j, "process_passed", (double)v->proc_passed);
  /* captured calls: whose graph holds their shadow, whose holds production alone (and why) */
  cJSON *gr = cJSON_AddObjectToObject(j, "graph");
  add_num(gr, "shadowed", (double)v->graph_shadowed);
  add_num(gr, "plain", (double)v->graph_plain);
  add_num(gr, "beside", (double)v->graph_beside);
  add_num(gr, "ungated", (double)v->graph_ungated);
  add_num(gr, "exposed", (double)v->graph_exposed);
  if (v->graph_plain > 0 && v->graph_why > 0)
    cJSON_AddStringToObject(gr, "reason", ust__graph_why_text(v->graph_why));
  else
    cJSON_AddNullToObject(gr, "reason");
  if (v->paused) {
    cJSON *pz = cJSON_AddObjectToObject(j, "paused");
    cJSON_AddStringToObject(pz, "reason", "over the shadow budget");
    add_num(pz, "slowdown", v->paused_ratio);
  }
  cJSON_AddItemToObject(j, "candidate_latency_ns", hist_json(&s->figs.cand_hist));
  cJSON *aa = cJSON_AddObjectToObject(j, "aa");
  add_num(aa, "runs", (double)v->aa_runs);
  add_num(aa, "mismatching", (double)v->aa_mismatching);
  add_num(aa, "max_abs_err", v->aa_max_abs);
  add_num(aa, "max_rel_err", v->aa_max_rel);
  if (s->rollout.evidence != NULL) {
    cJSON *ev = evidence_json(s->rollout.evidence);
    if (s->binding->cand != NULL) /* the candidate it names: the one the route ran, as configured */
      cJSON_AddStringToObject(ev, "candidate", ust__report_cand_label(s->binding->cand));
    cJSON_AddItemToObject(j, "rollback", ev);
  }
  else
    cJSON_AddNullToObject(j, "rollback");
  /* the first failing call, kept whole to be replayed (`understudy repro`) */
  const char *call = s->repro != NULL ? s->repro->text(s->repro) : NULL;
  if (call != NULL && s->binding->cand != NULL) {
    cJSON *rp = cJSON_AddObjectToObject(j, "repro");
    cJSON *cd = cJSON_AddObjectToObject(rp, "candidate");
    const ust__cand *c = s->binding->cand;
    cJSON_AddStringToObject(cd, "kind", c->kind == UST__CAND_NATIVE ? "native" : "torch_op");
    cJSON_AddStringToObject(cd, "name", c->name);
    cJSON_AddStringToObject(cd, "id", c->id);
    cJSON_AddStringToObject(cd, "label", ust__report_cand_label(c));
    cJSON_AddItemToObject(rp, "call", cJSON_CreateRaw(call));
  } else {
    cJSON_AddNullToObject(j, "repro");
  }
  return j;
}

static cJSON *roofline_json(const ust__route_snap *s) {
  const ust__figs_snap *f = &s->figs;
  cJSON *j = cJSON_CreateObject();
  if (f->hw != NULL)
    cJSON_AddStringToObject(j, "hardware", f->hw->name);
  else
    cJSON_AddNullToObject(j, "hardware");
  add_num(j, "calls", (double)f->prod.calls);
  add_num(j, "unscored", (double)f->unscored);
  /* timed calls floored by the bound ops they called, not by their own (estimated or absent) roofline */
  add_num(j, "scored_by_callees", (double)f->nested_scored);
  /* sums (ns), so that reports merge exactly */
  add_num(j, "tsol_ns_sum", (double)f->prod.tsol_ps / 1000.0);
  add_num(j, "time_ns_sum", (double)f->prod.time_ns);
  add_num(j, "candidate_calls", (double)f->cand.calls);
  add_num(j, "candidate_tsol_ns_sum", (double)f->cand.tsol_ps / 1000.0);
  add_num(j, "candidate_time_ns_sum", (double)f->cand.time_ns);
  /* W and Q summed over the calls whose floor was evaluated: intensity and
   * achieved FLOP/s for a roofline chart */
  add_num(j, "work_calls", (double)f->work_calls);
  add_num(j, "flops_sum", f->flops);
  add_num(j, "bytes_sum", f->bytes);
  const char *est = s->binding->def->roofline.estimate;
  if (est[0] != '\0')
    cJSON_AddStringToObject(j, "estimate", est);
  return j;
}

static cJSON *shape_json(const ust__route_snap *s) {
  const ust__binding *b = s->binding;
  cJSON *js = cJSON_CreateObject();
  cJSON_AddStringToObject(js, "key", s->key);
  cJSON_AddStringToObject(js, "op", b->display);
  cJSON_AddStringToObject(js, "mode", ust__mode_name(s->rollout.mode));
  cJSON_AddStringToObject(js, "phase", ust__phase_name(s->k.phase < UST__N_PHASES ? s->k.phase : 0));
  cJSON_AddStringToObject(js, "device", s->k.device == UST__DEV_CUDA ? "cuda" : "cpu");
  cJSON *dts = cJSON_AddArrayToObject(js, "dtypes");
  for (int d = 0; d < s->k.n_dtypes; d++)
    cJSON_AddItemToArray(dts, cJSON_CreateString(ust__dtype_name(s->k.dtypes[d])));
  cJSON *dims = cJSON_AddObjectToObject(js, "dims");
  for (int d = 0; d < b->n_dims; d++)
    add_num(dims, b->def->dims[d].name, (double)s->k.dims[d]);
  add_num(js, "calls", (double)s->figs.calls);
  /* of the calls, those a call keyed at random stood for (its operator keys
   * one call in key_every once a thread is warm): the count is an estimate */
  add_num(js, "estimated", (double)s->figs.estimated);
  add_num(js, "timed", (double)s->figs.hist.count);
  add_num(js, "captured", (double)s->figs.captured);
  add_num(js, "timing_dropped", (double)s->figs.timing_dropped);
  /* of those, the tracer's calls whose kernel records did not all come, and
   * event pairs the device could not time */
  add_num(js, "kernel_lost", (double)s->figs.kernel_lost);
  add_num(js, "pair_failed", (double)s->figs.pair_failed);
  /* of the timed calls, the key's first ones (timed whatever the sampling) */
  add_num(js, "first_timed", (double)s->figs.first_timed);
  add_num(js, "first_time_ns", (double)s->figs.first_time_ns);
  /* the calls after the key's first steady_after, outside graph capture, and
   * those of them timed: the estimate's late stratum (steady_after is not
   * reloaded, so the current policy's is the one the calls saw) */
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  const uint64_t late = s->figs.calls > pol->steady_after ? s->figs.calls - pol->steady_after : 0;
  add_num(js, "steady_timed", (double)s->figs.steady_timed);
  add_num(js, "steady_time_ns", (double)s->figs.steady_time_ns);
  add_num(js, "steady_calls", late > s->figs.late_captured ? (double)(late - s->figs.late_captured) : 0.0);
  add_num(js, "kernel_timed", (double)s->figs.kernel_timed);
  add_num(js, "kernel_span_ns", (double)s->figs.kernel_span_ns);
  add_num(js, "kernels", (double)s->figs.kernels); /* the kernels those calls ran (a nested call's counted in) */
  /* of the timed calls, those timed by a held pair (their work back to back,
   * dispatch/hold.h); the held calls whose hold gave up, their samples dropped */
  add_num(js, "held_timed", (double)s->figs.held_timed);
  add_num(js, "hold_expired", (double)s->figs.hold_expired);
  add_num(js, "replayed", (double)s->figs.replayed);
  /* its kernels run by graphs understudy did not see captured; the graph
   * status and its reason are derived (ust__report_derive) */
  cJSON *gr = cJSON_AddObjectToObject(js, "graph");
  add_num(gr, "unseen_kernels", (double)s->figs.unseen_kernels);
  add_num(gr, "unseen_ns", (double)s->figs.unseen_ns);
  add_num(gr, "changed", (double)s->figs.graph_changed);
  add_num(gr, "dropped", (double)s->verify.graph_dropped);
  add_num(js, "device_time_ns", (double)s->figs.hist.sum);
  cJSON_AddItemToObject(js, "latency_ns", hist_json(&s->figs.hist));
  if (b->roofline.present)
    cJSON_AddItemToObject(js, "roofline", roofline_json(s));
  /* which implementation serves the route: every route says, with or without a candidate */
  cJSON_AddItemToObject(js, "served_by", ust__report_served_by(s));
  if (s->has_cand) {
    cJSON_AddItemToObject(js, "shadow", shadow_json(s));
    cJSON_AddItemToObject(js, "rollout", ust__report_rollout(s));
    cJSON_AddItemToObject(js, "in_flight", ust__report_flight(&s->flight));
    cJSON_AddItemToObject(js, "fallback", ust__report_fallback(s));
  }
  return js;
}

static cJSON *candidate_json(const ust__candidate *c) {
  cJSON *jc = cJSON_CreateObject();
  cJSON_AddStringToObject(jc, "kind", c->cand.kind == UST__CAND_NATIVE ? "native" : "torch_op");
  cJSON_AddStringToObject(jc, "name", c->cand.name);
  cJSON_AddStringToObject(jc, "target", c->cand.target);
  if (c->cand.kind == UST__CAND_NATIVE) {
    cJSON_AddStringToObject(jc, "path", c->path);
    cJSON_AddStringToObject(jc, "sha256", c->sha256);
    cJSON_AddStringToObject(jc, "qualify", c->proc != NULL ? "process" : "here");
    if (c->proc != NULL) {
      ust__procrun *pr = c->proc;
      cJSON *q = cJSON_AddObjectToObject(jc, "qualifying_process");
      const long pid = ust__procrun_pid(pr);
      if (pid > 0)
        add_num(q, "pid", (double)pid);
      else
        cJSON_AddNullToObject(q, "pid");
      add_num(q, "qualify_calls", (double)c->cand.qualify_calls);
      add_num(q, "runs", (double)ust__procrun_runs(pr));
      add_num(q, "passed", (double)ust__procrun_passed(pr));
      add_num(q, "routes_qualified", (double)ust__procrun_routes_qualified(pr));
      add_num(q, "busy", (double)ust__procrun_busy_count(pr)); /* calls production served: another call was there */
      ust__procrun_usage u;
      ust__procrun_get_usage(pr, &u);
      add_num(q, "peak_rss_mb", (double)u.peak_rss_kb / 1024.0);
      add_num(q, "cpu_s", (double)u.cpu_us / 1e6);
      add_num(q, "memory_limit_mb", (double)(u.memory_limit_bytes >> 20));
      add_num(q, "cpu_limit_s", (double)u.cpu_limit_s);
      cJSON_AddBoolToObject(q, "loaded_here", atomic_load(&((ust__candidate *)c)->cand.loaded) != NULL);
      char why[600];
      if (ust__procrun_lost(pr, why, sizeof why))
        cJSON_AddStringToObject(q, "refused", why);
      else
        cJSON_AddNullToObject(q, "refused");
    }
  } else {
    cJSON_AddStringToObject(jc, "op_state", atomic_load(&c->cand.seam_op) != NULL ? "resolved" : "waiting for op");
    add_num(jc, "calls_waiting_for_op", (double)atomic_load(&((ust__candidate *)c)->cand.waiting));
    cJSON_AddStringToObject(jc, "qualify", c->cand.torch_qualify ? "process" : "here");
    if (c->cand.torch_qualify)
      add_num(jc, "qualify_calls", (double)c->cand.qualify_calls);
  }
  ust__report_source(jc, &c->cand);
  cJSON_AddStringToObject(jc, "compare", ust__cmp_kind_name(c->cand.compare));
  if (c->cand.atol >= 0)
    add_num(jc, "atol", c->cand.atol);
  if (c->cand.rtol >= 0)
    add_num(jc, "rtol", c->cand.rtol);
  add_num(jc, "aa_sample", c->cand.aa_sample);
  add_num(jc, "deadline_ms", (double)c->cand.deadline_ns / 1e6);
  add_num(jc, "max_slowdown", c->cand.max_slowdown);
  return jc;
}

/* The hardware profiles the routes were scored against: their ceilings,
 * so that a reader of the report draws the roofline without the files. */
static cJSON *profiles_json(const ust__route_snap *snaps, int nr) {
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; i < nr; i++) {
    const ust__hw_profile *hw = snaps[i].figs.hw;
    int seen = hw == NULL;
    for (int k = 0; k < i && !seen; k++)
      seen = snaps[k].figs.hw == hw;
    if (seen)
      continue;
    cJSON *jh = cJSON_CreateObject();
    cJSON_AddStringToObject(jh, "name", hw->name);
    cJSON *pk = cJSON_AddObjectToObject(jh, "p_peak");
    for (int p = 0; p < UST__N_PATHS; p++)
      if (hw->p_peak[p] > 0)
        add_num(pk, ust__path_name(p), hw->p_peak[p]);
    add_num(jh, "b_peak", hw->b_peak);
    cJSON_AddStringToObject(jh, "source", hw->source != NULL ? hw->source : "");
    cJSON_AddItemToArray(arr, jh);
  }
  return arr;
}

/* Which timer produced the device times, and what the kernel tracer's
 * windows saw: every kernel's time against the time of the kernels launched
 * inside timed calls (coverage, derived), the unattributed kernels by name. */
static cJSON *timer_json(ust__timers *t, uint64_t elapsed_ns) {
  ust__timer_status st;
  ust__timers_status(t, &st);
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "kind", st.kind);
  if (st.state != NULL)
    cJSON_AddStringToObject(j, "state", st.state);
  if (st.why[0] != '\0')
    cJSON_AddStringToObject(j, "why", st.why);
  if (st.version != 0)
    add_num(j, "cupti_version", st.version);
  if (st.correlation != NULL)
    cJSON_AddStringToObject(j, "correlation", st.correlation);
  if (st.ns_per_tick > 0 && st.ns_per_tick != 1.0)
    add_num(j, "ns_per_tick", st.ns_per_tick); /* another client's clock, converted */
  const ust__kt_totals *k = &st.totals;
  add_num(j, "windows", (double)k->windows);
  add_num(j, "window_ns", (double)k->window_ns);
  add_num(j, "elapsed_ns", (double)elapsed_ns); /* since enable: the time the windows sample */
  add_num(j, "yields", (double)st.yields);
  add_num(j, "windows_cut", (double)st.windows_cut);
  add_num(j, "kernels", (double)k->kernels);
  add_num(j, "kernel_ns", (double)k->kernel_ns);
  add_num(j, "attributed_kernels", (double)k->attributed);
  add_num(j, "attributed_ns", (double)k->attributed_ns);
  add_num(j, "calls_timed", (double)k->calls_timed);
  add_num(j, "calls_dropped", (double)k->calls_dropped);
  add_num(j, "calls_empty", (double)k->calls_empty);
  add_num(j, "calls_replayed", (double)k->calls_replayed);
  add_num(j, "captured_unmapped", (double)k->captured_unmapped);
  add_num(j, "graph_unknown_kernels", (double)k->graph_unknown);
  add_num(j, "graph_unknown_ns", (double)k->graph_unknown_ns);
  add_num(j, "graph_own_kernels", (double)k->graph_own);
  add_num(j, "graph_own_ns", (double)k->graph_own_ns);
  add_num(j, "records_lost", (double)(k->records_lost + st.buffers_short));
  /* by the phase of the thread that launched the kernels (known for the
   * launches the callbacks saw; the others count as unknown) */
  cJSON *ph = cJSON_AddObjectToObject(j, "phases");
  for (int p = 0; p < UST__N_PHASES; p++) {
    cJSON *x = cJSON_AddObjectToObject(ph, ust__phase_name(p));
    add_num(x, "kernel_ns", (double)k->phase_kernel_ns[p]);
    add_num(x, "attributed_ns", (double)k->phase_attributed_ns[p]);
  }
  /* the hold of the event pairs: its deadline, each device's calibration
   * (what a held pair adds around its work), the holds that gave up, and the
   * operators no longer held */
  ust__hold_status hs;
  ust__timers_hold_status(t, &hs);
  cJSON *hj = cJSON_AddObjectToObject(j, "hold");
  cJSON_AddStringToObject(hj, "state", hs.deadline_ns > 0 ? "on" : "off");
  add_num(hj, "deadline_ns", (double)hs.deadline_ns);
  add_num(hj, "held", (double)hs.held);
  add_num(hj, "expired", (double)hs.expired);
  add_num(hj, "released_late", (double)hs.released_late);
  add_num(hj, "operators_excluded", (double)hs.excluded);
  cJSON *hd = cJSON_AddArrayToObject(hj, "devices");
  for (int i = 0; i < hs.n_devices; i++) {
    cJSON *x = cJSON_CreateObject();
    add_num(x, "device", hs.devices[i].device);
    cJSON_AddStringToObject(x, "calibration", hs.devices[i].state == UST__HOLD_CALIBRATED ? "calibrated"
                                              : hs.devices[i].state == UST__HOLD_UNAVAILABLE ? "unavailable"
                                                                                            : "pending");
    add_num(x, "pair_offset_ns", hs.devices[i].offset_ns);
    add_num(x, "pair_offset_spread_ns", hs.devices[i].spread_ns);
    cJSON_AddItemToArray(hd, x);
  }
  cJSON *un = cJSON_AddArrayToObject(j, "unattributed");
  for (int i = 0; i < k->n_names && i < UST__KT_TOP; i++) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "name", k->names[i].name);
    add_num(x, "ns", (double)k->names[i].ns);
    add_num(x, "kernels", (double)k->names[i].kernels);
    cJSON_AddItemToArray(un, x);
  }
  return j;
}

/* The additive report of e: figures as counted, nothing derived. */
static cJSON *report_raw(ust__engine *e) {
  ust__route_snap *snaps = NULL;
  int nr = 0;
  if (ust__routes_snapshot(&e->router, &snaps, &nr) != 0) {
    ust__routes_snapshot_free(snaps, nr);
    return NULL;
  }
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "schema", "understudy.report");
  add_num(root, "version", 1);
  cJSON_AddStringToObject(root, "library_version", ust_version());
  cJSON_AddStringToObject(root, "torch_version", ust_torch_version());
  add_num(root, "pid", (double)getpid());
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  cJSON_AddStringToObject(root, "host", host);
  add_num(root, "started_unix_ms", (double)e->started_unix_ms);
  add_num(root, "generated_unix_ms", (double)ust__unix_ms());
  cJSON *hs = cJSON_AddObjectToObject(root, "histogram");
  cJSON_AddStringToObject(hs, "scheme", UST__HIST_SCHEME);
  cJSON_AddStringToObject(hs, "unit", "ns");
  add_num(hs, "buckets", UST__HIST_BUCKETS);
  cJSON *ops = cJSON_AddArrayToObject(root, "operators");
  double untracked_all = 0, tallied_all = 0;
  for (int oi = 0; oi < e->n_ops; oi++) {
    const ust__engine_op *eo = &e->ops[oi];
    cJSON *jo = cJSON_CreateObject();
    cJSON_AddStringToObject(jo, "name", eo->op.name);
    const ust__policy *pol = atomic_load(&((ust__engine_op *)eo)->op.policy);
    cJSON_AddStringToObject(jo, "mode", ust__mode_name(pol->mode));
    add_num(jo, "sample", pol->sample);
    if (pol->steady_after != UINT64_MAX) { /* the share once a key is steady */
      add_num(jo, "sample_steady", pol->sample_steady);
      add_num(jo, "steady_after", (double)pol->steady_after);
    }
    /* past a thread's first key_after calls, one call in key_every is keyed
     * (1: every call; an operator with a candidate, or not observing) */
    add_num(jo, "key_every", (double)pol->key_every);
    add_num(jo, "key_after", (double)pol->key_after);
    cJSON_AddStringToObject(jo, "definition", eo->problem->path);
    if (eo->op.cand != NULL)
      cJSON_AddItemToObject(jo, "candidate", candidate_json(&eo->candidate));
    double untracked = 0, tallied = 0;
    cJSON *bindings = cJSON_AddArrayToObject(jo, "bindings");
    cJSON *unscorable = NULL;
    for (int bi = 0; bi < e->n_bindings; bi++)
      if (e->bindings[bi].op == &eo->op) {
        const ust__binding *b = &e->bindings[bi];
        cJSON_AddItemToArray(bindings, cJSON_CreateString(b->display));
        untracked += (double)atomic_load(&b->untracked);
        if (ust__hold_excluded(&b->hold)) { /* its held calls gave up twice in a row: timed by the plain pair */
          cJSON *nh = cJSON_GetObjectItemCaseSensitive(jo, "not_held");
          if (nh == NULL)
            nh = cJSON_AddArrayToObject(jo, "not_held");
          cJSON_AddItemToArray(nh, cJSON_CreateString(b->display));
        }
        tallied += (double)ust__binding_tallied_count((ust__binding *)b);
        /* resolved once its op's schema was read (at enable, or its first call) */
        const char *why = !b->roofline.present ? "its definition has no roofline"
                          : atomic_load(&((ust__binding *)b)->resolved) == 2 && b->roofline.unscorable[0] != '\0'
                              ? b->roofline.unscorable
                              : NULL;
        if (why != NULL) {
          if (unscorable == NULL)
            unscorable = cJSON_AddObjectToObject(jo, "unscorable");
          cJSON_AddStringToObject(unscorable, b->display, why);
        }
      }
    if (eo->problem->n_hosted > 0) {
      /* no op of its own: its traffic is scored under the operators binding these */
      cJSON *h = cJSON_AddArrayToObject(jo, "hosted_in");
      for (int k = 0; k < eo->problem->n_hosted; k++)
        cJSON_AddItemToArray(h, cJSON_CreateString(eo->problem->hosted_in[k]));
    }
    add_num(jo, "untracked", untracked);
    untracked_all += untracked;
    /* calls counted without a key: the shapes' estimated calls stand for them */
    add_num(jo, "tallied", tallied);
    tallied_all += tallied;
    cJSON *shapes = cJSON_AddArrayToObject(jo, "shapes");
    for (int i = 0; i < nr; i++)
      if (snaps[i].binding->op == &eo->op)
        cJSON_AddItemToArray(shapes, shape_json(&snaps[i]));
    cJSON_AddItemToArray(ops, jo);
  }
  cJSON *tot = cJSON_AddObjectToObject(root, "totals");
  add_num(tot, "untracked", untracked_all);
  add_num(tot, "tallied", tallied_all);
  add_num(tot, "internal_errors", (double)atomic_load(&e->router.internal_errors));
  cJSON_AddItemToObject(root, "hardware", profiles_json(snaps, nr));
  cJSON_AddItemToObject(root, "timer", timer_json(e->router.timers, ust__now_ns() - e->started_ns));
  ust__graphs_figs gf;
  ust__graphs_figures(e->router.graphs, &gf);
  cJSON *gr = cJSON_AddObjectToObject(root, "graphs");
  add_num(gr, "sites", (double)gf.sites);
  add_num(gr, "live", (double)gf.live);
  add_num(gr, "open", (double)gf.open);
  add_num(gr, "unknown", (double)gf.unknown);
  add_num(gr, "lost", (double)gf.lost);
  add_num(gr, "launched", (double)gf.launched);
  add_num(gr, "refused", (double)gf.refused);
  add_num(gr, "gated", (double)gf.gated);
  add_num(gr, "gated_replays", (double)gf.gated_replays);
  add_num(gr, "gate_failed", (double)gf.gate_failed);
  add_num(gr, "hosted", (double)gf.hosted);
  add_num(gr, "host_starts", (double)gf.host_starts);
  add_num(gr, "unseen", (double)gf.unseen);
  ust__routes_snapshot_free(snaps, nr);
  return root;
}

/* ---- derived figures ------------------------------------------------------------- */

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

static void set_num(cJSON *o, const char *k, double v) {
  cJSON *old = cJSON_GetObjectItemCaseSensitive(o, k);
  if (old != NULL)
    cJSON_SetNumberValue(old, v);
  else
    add_num(o, k, v);
}

static void set_null(cJSON *o, const char *k) {
  cJSON_DeleteItemFromObjectCaseSensitive(o, k);
  cJSON_AddNullToObject(o, k);
}

/* S (>= 0) or null. */
static void set_s(cJSON *o, const char *k, double s) {
  if (s >= 0)
    set_num(o, k, s);
  else
    set_null(o, k);
}

static void set_bool(cJSON *o, const char *k, int b) {
  cJSON_DeleteItemFromObjectCaseSensitive(o, k);
  cJSON_AddBoolToObject(o, k, b);
}

/* The candidates' headline (scorer/derive.c): S of the candidates over their
 * own scored shape keys beside production's S over the same keys, and the
 * share of the device time those keys hold. */
static void put_cand(cJSON *o, const char *k, const ust__derive_cand *c) {
  cJSON_DeleteItemFromObjectCaseSensitive(o, k);
  cJSON *x = cJSON_AddObjectToObject(o, k);
  if (x == NULL)
    return;
  add_num(x, "routes", c->routes);
  add_num(x, "device_share", c->device_share);
  set_s(x, "S_candidate", c->S_candidate);
  set_s(x, "S_production", c->S_production);
}

static void put_cand_totals(cJSON *o, const ust__derive_totals *t) {
  if (t->any_candidate)
    put_cand(o, "candidate_routes", &t->candidate_routes);
  else
    set_null(o, "candidate_routes");
}

static void set_quantiles(cJSON *lat, double count, double p50, double p90, double p99) {
  if (lat == NULL)
    return;
  set_num(lat, "p50", p50);
  set_num(lat, "p90", p90);
  set_num(lat, "p99", p99);
  set_num(lat, "count", count);
}

/* A route under CUDA graphs: its status (derived) and, when verdicts do not
 * flow in its replays, why (scorer/derive.c decides the status from the same
 * figures). */
static void derive_graph(cJSON *sh, int status) {
  cJSON *g = cJSON_GetObjectItemCaseSensitive(sh, "graph");
  if (!cJSON_IsObject(g)) {
    cJSON_DeleteItemFromObjectCaseSensitive(sh, "graph");
    g = cJSON_AddObjectToObject(sh, "graph");
    add_num(g, "unseen_kernels", 0);
    add_num(g, "unseen_ns", 0);
    add_num(g, "changed", 0);
    add_num(g, "dropped", 0);
  }
  const cJSON *sg = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(sh, "shadow"), "graph");
  const double unseen = num(g, "unseen_kernels"), changed = num(g, "changed"), dropped = num(g, "dropped"),
               plain = num(sg, "plain"), ungated = num(sg, "ungated"), exposed = num(sg, "exposed");
  char why[1024] = "";
  size_t n = 0;
  if (unseen > 0)
    n += (size_t)snprintf(why + n, sizeof why - n, "%.0f of its kernels ran in graphs understudy did not see captured "
                          "(captured before enable(), or while it was off): seen by name only, neither timed as "
                          "calls, verified nor routed", unseen);
  if (changed > 0 && n < sizeof why)
    n += (size_t)snprintf(why + n, sizeof why - n, "%s%.0f of its captured calls changed in place in an executable "
                          "graph by a graph library (a node's parameters set, or the graph updated): its replays "
                          "may not run what was captured, so they run production alone", n ? "; " : "", changed);
  if (changed > 0 && dropped > 0 && n < sizeof why)
    n += (size_t)snprintf(why + n, sizeof why - n, " (%.0f replays' comparisons dropped since, not judged)", dropped);
  if (plain > 0 && n < sizeof why) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(sg, "reason");
    n += (size_t)snprintf(why + n, sizeof why - n, "%s%.0f captured calls hold production alone: %s", n ? "; " : "",
                          plain, cJSON_IsString(r) ? r->valuestring : "the log says why");
  }
  if (ungated > 0 && n < sizeof why)
    n += (size_t)snprintf(why + n, sizeof why - n, "%s%.0f captured shadows left ungated in an executable graph (its "
                          "binding failed: the log says why): production alone there", n ? "; " : "", ungated);
  if (exposed > 0 && n < sizeof why)
    snprintf(why + n, sizeof why - n, "%s%.0f of its captured calls are in a graph whose raw handle was handed to code "
             "outside understudy, which may change its kernels in place unseen: production alone in its replays",
             n ? "; " : "", exposed);
  const char *name = ust__graph_status_name(status);
  cJSON_DeleteItemFromObjectCaseSensitive(g, "status");
  cJSON_DeleteItemFromObjectCaseSensitive(g, "reason");
  if (name != NULL)
    cJSON_AddStringToObject(g, "status", name);
  else
    cJSON_AddNullToObject(g, "status");
  if (status == UST__GRAPH_OBSERVE_ONLY && why[0] != '\0')
    cJSON_AddStringToObject(g, "reason", why);
  else
    cJSON_AddNullToObject(g, "reason");
}

/* A shape's derived figures, written in place. */
static int write_shape(cJSON *sh, const ust__reading *r, const ust__derive_shape *d) {
  cJSON *lat = cJSON_GetObjectItemCaseSensitive(sh, "latency_ns");
  set_quantiles(lat, d->timed, d->p50, d->p90, d->p99);
  set_num(sh, "timed", d->timed);
  set_num(sh, "device_time_ns", num(lat, "sum"));
  /* which timer produced the shape's figures, and the samples dropped, by why */
  const double by_kernels = r->in.kernel_timed, by_held = r->in.held_timed;
  const double by_rest = d->timed > by_kernels + by_held ? d->timed - by_kernels - by_held : 0;
  cJSON_DeleteItemFromObjectCaseSensitive(sh, "timed_by");
  cJSON *tb = cJSON_AddObjectToObject(sh, "timed_by");
  cJSON_DeleteItemFromObjectCaseSensitive(sh, "dropped");
  cJSON *dr = cJSON_AddObjectToObject(sh, "dropped");
  if (tb == NULL || dr == NULL)
    return ust__error(UST_ENOMEM, "report: out of memory");
  set_num(tb, "kernels", by_kernels);
  set_num(tb, "held_pair", by_held);
  /* the kernels a call timed by its kernels ran, on average (null: none was) */
  cJSON_DeleteItemFromObjectCaseSensitive(sh, "kernels_per_call");
  if (by_kernels > 0)
    set_num(sh, "kernels_per_call", num(sh, "kernels") / by_kernels);
  else
    cJSON_AddNullToObject(sh, "kernels_per_call");
  set_num(tb, r->in.on_host ? "host_clock" : "pair", by_rest);
  const double lost = num(sh, "kernel_lost"), failed = num(sh, "pair_failed");
  set_num(dr, "no_timer", r->timing_dropped > lost + failed ? r->timing_dropped - lost - failed : 0);
  set_num(dr, "kernel_records_lost", lost);
  set_num(dr, "pair_failed", failed);
  set_num(dr, "hold_expired", num(sh, "hold_expired"));
  cJSON *shadow = cJSON_GetObjectItemCaseSensitive(sh, "shadow");
  set_quantiles(cJSON_GetObjectItemCaseSensitive(shadow, "candidate_latency_ns"), d->cand_timed, d->cand_p50,
                d->cand_p90, d->cand_p99);
  if (d->replayed_est > 0)
    set_num(sh, "replayed_est", d->replayed_est);
  /* a route's calls: eager (dispatched and run), captured into a graph
   * (dispatched once, run by its replays), replayed (seen in windows) */
  set_num(sh, "eager", r->in.calls - r->in.captured);
  derive_graph(sh, d->graph);
  set_num(sh, "est_device_time_ns", d->est_device_time_ns);
  set_num(sh, "weight", d->weight);
  if (cJSON_IsObject(shadow))
    set_s(shadow, "speedup", d->speedup);
  cJSON *roof = cJSON_GetObjectItemCaseSensitive(sh, "roofline");
  if (cJSON_IsObject(roof)) {
    set_num(roof, "tsol_ns_mean", d->tsol_ns_mean);
    set_s(roof, "S", d->S);
    set_s(roof, "S_candidate", d->S_candidate);
    set_bool(roof, "above_roof", d->above_roof);
    /* the roofline chart's coordinates: FLOP per byte, and FLOP/s at the
     * median time (as S is), so a point lies S below its roof */
    set_s(roof, "intensity", d->intensity);
    set_s(roof, "flops_mean", d->flops_mean);
    set_s(roof, "achieved_flops_s", d->achieved_flops_s);
    set_s(roof, "candidate_achieved_flops_s", d->cand_achieved_flops_s);
  }
  return 0;
}

static void write_op(cJSON *op, const ust__derive_op *d) {
  set_num(op, "calls", d->calls);
  set_num(op, "timed", d->timed);
  set_num(op, "captured", d->captured);
  set_num(op, "device_time_ns", d->device_time_ns);
  set_num(op, "est_device_time_ns", d->est_device_time_ns);
  set_num(op, "weight", d->weight);
  /* S_i: the median over shape keys (the paper), and the time-weighted
   * variant; for a candidate, over the keys where it verified correct */
  cJSON_DeleteItemFromObjectCaseSensitive(op, "roofline");
  cJSON *jr = cJSON_AddObjectToObject(op, "roofline");
  add_num(jr, "scored_shapes", d->scored_shapes);
  set_s(jr, "S", d->S);
  set_s(jr, "S_weighted", d->S_weighted);
  add_num(jr, "above_roof", d->above_roof); /* its keys measured faster than their floor */
  if (d->has_candidate) {
    set_s(jr, "S_candidate", d->S_candidate);
    add_num(jr, "coverage", d->coverage);
    put_cand(jr, "candidate_routes", &d->candidate_routes);
  }
  /* the same per phase: weights are shares of that phase's device time */
  cJSON_DeleteItemFromObjectCaseSensitive(op, "phases");
  cJSON *jp = cJSON_AddObjectToObject(op, "phases");
  for (int p = 0; p < UST__N_PHASES; p++) {
    const ust__derive_phase *x = &d->phases[p];
    if (x->routes == 0)
      continue;
    cJSON *jx = cJSON_AddObjectToObject(jp, ust__phase_name(p));
    add_num(jx, "est_device_time_ns", x->est_device_time_ns);
    add_num(jx, "weight", x->weight);
    set_s(jx, "S", x->S);
    if (d->has_candidate)
      set_s(jx, "S_candidate", x->S_candidate);
  }
}

/* The kernel tracer's coverage: the share of all kernel time in its windows
 * that was launched inside timed calls of bound ops, overall and by phase. */
static void timer_coverage(cJSON *tm) {
  if (!cJSON_IsObject(tm))
    return;
  const double kns = num(tm, "kernel_ns");
  if (kns > 0)
    set_num(tm, "coverage", num(tm, "attributed_ns") / kns);
  else
    cJSON_DeleteItemFromObjectCaseSensitive(tm, "coverage");
  cJSON *tph;
  cJSON_ArrayForEach(tph, cJSON_GetObjectItemCaseSensitive(tm, "phases")) {
    const double pk = num(tph, "kernel_ns");
    if (pk > 0)
      set_num(tph, "coverage", num(tph, "attributed_ns") / pk);
    else
      cJSON_DeleteItemFromObjectCaseSensitive(tph, "coverage");
  }
}

static void write_totals(cJSON *root, const ust__derive_totals *t) {
  cJSON *tot = cJSON_GetObjectItemCaseSensitive(root, "totals");
  if (!cJSON_IsObject(tot))
    tot = cJSON_AddObjectToObject(root, "totals");
  set_num(tot, "calls", t->calls);
  set_num(tot, "timed", t->timed);
  set_num(tot, "captured", t->captured);
  set_num(tot, "routes", t->routes);
  set_num(tot, "est_device_time_ns", t->est_device_time_ns);
  set_num(tot, "shadow_calls", t->shadow_calls);
  set_num(tot, "verified", t->verified);
  set_num(tot, "failed", t->failed);
  set_num(tot, "rollbacks", t->rollbacks);
  /* S_agg over the operators that have an S, and the share of the device
   * time whose shape keys were scored (scorer/derive.c) */
  set_num(tot, "scored_share", t->scored_share);
  set_s(tot, "S_agg", t->S_agg);
  set_s(tot, "S_agg_candidate", t->S_agg_candidate);
  set_num(tot, "above_roof", t->above_roof);
  put_cand_totals(tot, t);
  timer_coverage(cJSON_GetObjectItemCaseSensitive(root, "timer"));
  cJSON_DeleteItemFromObjectCaseSensitive(tot, "phases");
  cJSON *tp = cJSON_AddObjectToObject(tot, "phases");
  for (int p = 0; p < UST__N_PHASES; p++) {
    if (t->phases[p].est_device_time_ns <= 0)
      continue;
    cJSON *x = cJSON_AddObjectToObject(tp, ust__phase_name(p));
    add_num(x, "est_device_time_ns", t->phases[p].est_device_time_ns);
    add_num(x, "scored_share", t->phases[p].scored_share);
    set_s(x, "S_agg", t->phases[p].S_agg);
    set_s(x, "S_agg_candidate", t->phases[p].S_agg_candidate);
  }
}

/* The readings of a report's shapes (sh_of: each reading's shape), and
 * each operator's candidate, as the derivation takes them. */
typedef struct json_readings {
  ust__reading *r;
  cJSON **sh_of;
  ust__derive_op *ops;
  int n, n_ops;
} json_readings;

static void json_readings_free(json_readings *j) {
  ust__readings_free(j->r, j->n);
  free(j->sh_of);
  free(j->ops);
}

static int json_readings_of(cJSON *ops, json_readings *j) {
  memset(j, 0, sizeof *j);
  int n = 0, n_ops = 0;
  cJSON *op, *sh;
  cJSON_ArrayForEach(op, ops) {
    n_ops++;
    n += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(op, "shapes"));
  }
  j->r = calloc((size_t)n + 1, sizeof *j->r);
  j->sh_of = calloc((size_t)n + 1, sizeof *j->sh_of);
  j->ops = calloc((size_t)n_ops + 1, sizeof *j->ops);
  if (j->r == NULL || j->sh_of == NULL || j->ops == NULL)
    return ust__error(UST_ENOMEM, "report: out of memory");
  int o = 0;
  cJSON_ArrayForEach(op, ops) {
    j->ops[o].has_candidate = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(op, "candidate"));
    cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(op, "shapes")) {
      if (j->n == n)
        break;
      j->sh_of[j->n] = sh;
      const int rc = ust__reading_of_json(sh, o, &j->r[j->n]);
      j->n++;
      if (rc != 0)
        return rc;
    }
    o++;
  }
  j->n_ops = n_ops;
  return 0;
}

/* graph replays are seen only inside the tracer's windows: they stand for
 * elapsed / window time as many */
static double replay_scale_of(const cJSON *root) {
  const cJSON *tmr = cJSON_GetObjectItemCaseSensitive(root, "timer");
  const double win_ns = num(tmr, "window_ns"), elapsed_ns = num(tmr, "elapsed_ns");
  return win_ns > 0 && elapsed_ns > win_ns ? elapsed_ns / win_ns : 1.0;
}

int ust__report_derive(cJSON *root) {
  cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "operators");
  if (!cJSON_IsArray(ops))
    return ust__error(UST_EINVAL, "report: no 'operators' array");
  const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "histogram"), "scheme");
  if (scheme != NULL && (!cJSON_IsString(scheme) || strcmp(scheme->valuestring, UST__HIST_SCHEME) != 0))
    return ust__error(UST_EINVAL, "report: histogram scheme '%s', this library reads '%s'",
                      cJSON_IsString(scheme) ? scheme->valuestring : "?", UST__HIST_SCHEME);
  json_readings j;
  ust__derive_shape *d = NULL;
  ust__derive_totals tot;
  int rc = json_readings_of(ops, &j);
  if (rc == 0 && (d = calloc((size_t)j.n + 1, sizeof *d)) == NULL)
    rc = ust__error(UST_ENOMEM, "report: out of memory");
  if (rc == 0)
    rc = ust__derive_readings(j.r, j.n, replay_scale_of(root), d, j.ops, j.n_ops, &tot);
  for (int i = 0; rc == 0 && i < j.n; i++)
    rc = write_shape(j.sh_of[i], &j.r[i], &d[i]);
  if (rc == 0) {
    int o = 0;
    cJSON *op;
    cJSON_ArrayForEach(op, ops) write_op(op, &j.ops[o++]);
    write_totals(root, &tot);
  }
  free(d);
  json_readings_free(&j);
  return rc;
}

/* ---- the recent window ------------------------------------------------------------- */

/* The window's figures, derived, in brief: per operator and shape key with
 * calls in it, calls, weight and S; in total S_agg. */
static int add_window(cJSON *root, ust__engine *e) {
  const cJSON *tmr = cJSON_GetObjectItemCaseSensitive(root, "timer");
  json_readings now;
  ust__reading *w = NULL;
  ust__derive_shape *d = NULL;
  ust__derive_totals tot;
  int nw = 0;
  double since = 0, scale = 1;
  int rc = json_readings_of(cJSON_GetObjectItemCaseSensitive(root, "operators"), &now);
  if (rc == 0)
    rc = ust__window_readings(e, now.r, now.n, num(tmr, "window_ns"), num(tmr, "elapsed_ns"), &w, &nw, &since,
                              &scale);
  if (rc == 0 && (d = calloc((size_t)nw + 1, sizeof *d)) == NULL)
    rc = ust__error(UST_ENOMEM, "report: out of memory");
  if (rc == 0)
    rc = ust__derive_readings(w, nw, scale, d, now.ops, now.n_ops, &tot);
  if (rc != 0)
    goto out;
  cJSON *out = cJSON_AddObjectToObject(root, "window");
  add_num(out, "since_unix_ms", since);
  add_num(out, "span_s", (num(root, "generated_unix_ms") - since) / 1000.0);
  add_num(out, "window_s", e->cfg.report_window_s);
  cJSON *jt = cJSON_AddObjectToObject(out, "totals");
  add_num(jt, "calls", tot.calls);
  add_num(jt, "timed", tot.timed);
  add_num(jt, "est_device_time_ns", tot.est_device_time_ns);
  add_num(jt, "scored_share", tot.scored_share);
  set_s(jt, "S_agg", tot.S_agg);
  set_s(jt, "S_agg_candidate", tot.S_agg_candidate);
  add_num(jt, "above_roof", tot.above_roof);
  put_cand_totals(jt, &tot);
  cJSON *jops = cJSON_AddArrayToObject(out, "operators");
  const cJSON *op;
  int o = 0;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(root, "operators")) {
    const ust__derive_op *dop = &now.ops[o++];
    cJSON *jo = NULL, *jss = NULL;
    for (int i = 0; i < nw; i++) {
      if (w[i].in.op != o - 1)
        continue;
      if (jo == NULL) {
        jo = cJSON_CreateObject();
        cJSON_AddItemToArray(jops, jo);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(op, "name");
        cJSON_AddStringToObject(jo, "name", cJSON_IsString(name) ? name->valuestring : "");
        add_num(jo, "calls", dop->calls);
        add_num(jo, "weight", dop->weight);
        set_s(jo, "S", dop->S);
        if (dop->has_candidate)
          set_s(jo, "S_candidate", dop->S_candidate);
        add_num(jo, "above_roof", dop->above_roof);
        jss = cJSON_AddArrayToObject(jo, "shapes");
      }
      cJSON *js = cJSON_CreateObject();
      cJSON_AddItemToArray(jss, js);
      cJSON_AddStringToObject(js, "key", w[i].key);
      add_num(js, "calls", w[i].in.calls);
      add_num(js, "timed", d[i].timed);
      set_s(js, "p50_ns", d[i].timed > 0 ? d[i].p50 : -1);
      set_s(js, "S", w[i].in.has_roofline ? d[i].S : -1);
      if (w[i].in.has_roofline)
        cJSON_AddBoolToObject(js, "above_roof", d[i].above_roof);
    }
  }
out:
  free(d);
  ust__readings_free(w, nw);
  json_readings_free(&now);
  return rc;
}

cJSON *ust__report_timer(ust__engine *e) {
  cJSON *tm = timer_json(e->router.timers, ust__now_ns() - e->started_ns);
  timer_coverage(tm);
  return tm;
}

cJSON *ust__report_build(ust__engine *e) {
  cJSON *root = report_raw(e);
  if (root != NULL && e->cfg.report_window_s > 0 && add_window(root, e) != 0) {
    cJSON_Delete(root);
    return NULL;
  }
  if (root != NULL && ust__report_derive(root) != 0) {
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

/* ---- the report file -------------------------------------------------------------- */

/* One report.path may be configured in many processes (a server's processes
 * share one config: vLLM's API server and its engine both load the plugin).
 * Whether this process's report replaces the file at the configured path:
 *   - no report there, or this process's own (same host and pid): replaced;
 *   - a report with calls, and this process observed none: kept (said once);
 *   - a report with calls of another process that still runs (same host and
 *     its pid alive; on another host it is taken to run): kept, and this
 *     process writes to a name of its own from then on, the path with -PID
 *     before its extension (said once);
 *   - otherwise (a report without calls, or of a process that has ended):
 *     replaced.
 * The look and the rename happen under an exclusive flock of the folder,
 * which every process writing a report there takes, so two processes never
 * both find the path free. A path passed to ust_report_write is written as
 * asked. */

/* Where this process last wrote its configured report, so that a file it
 * wrote itself is not read again: the configured path, whether it went to
 * the name of its own, and the file as it left it (an inode number alone
 * is reused once another process's rename frees it). */
static struct {
  pthread_mutex_t lock;
  pid_t pid;
  char path[4096];
  int own_name;
  int known; /* st holds the file as written */
  struct stat st;
  int said_kept, said_own_name;
} g_written = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int same_file(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
         a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* path with -pid before the extension of its last component. */
static int own_name(const char *path, pid_t pid, char *out, size_t size) {
  const char *slash = strrchr(path, '/');
  const char *dot = strrchr(slash != NULL ? slash + 1 : path, '.');
  const size_t stem = dot != NULL && dot != (slash != NULL ? slash + 1 : path) ? (size_t)(dot - path) : strlen(path);
  return (size_t)snprintf(out, size, "%.*s-%ld%s", (int)stem, path, (long)pid, path + stem) < size ? 0 : -1;
}

typedef struct {
  long pid;
  char host[256];
  double calls;
} report_owner;

/* The owner of the report at path: 1 when path holds a report, else 0. */
static int read_owner(const char *path, report_owner *o) {
  char *text = ust__read_text_file(path, 1u << 30);
  cJSON *j = text != NULL ? cJSON_Parse(text) : NULL;
  free(text);
  const cJSON *schema = cJSON_GetObjectItemCaseSensitive(j, "schema");
  const cJSON *pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
  const cJSON *host = cJSON_GetObjectItemCaseSensitive(j, "host");
  const cJSON *calls = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "totals"), "calls");
  int is = cJSON_IsString(schema) && strcmp(schema->valuestring, "understudy.report") == 0 && cJSON_IsNumber(pid);
  if (is) {
    o->pid = (long)pid->valuedouble;
    snprintf(o->host, sizeof o->host, "%s", cJSON_IsString(host) ? host->valuestring : "");
    o->calls = cJSON_IsNumber(calls) ? calls->valuedouble : 0;
  }
  cJSON_Delete(j);
  ust__clear_error();
  return is;
}

static int runs(const report_owner *o, const char *host) {
  if (strcmp(o->host, host) != 0)
    return 1; /* another machine's process: nothing here can tell, so it is not overwritten */
  return o->pid > 0 && (kill((pid_t)o->pid, 0) == 0 || errno == EPERM);
}

/* Writes text, this process's report with calls calls, to the configured
 * path (or the name of its own); under g_written.lock. */
static int write_shared(ust__engine *e, const char *path, const char *text, double calls) {
  const pid_t me = getpid();
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char mine[4200];
  if (own_name(path, me, mine, sizeof mine) != 0)
    return ust__error(UST_EIO, "report: the path '%s' is too long", path);
  if (g_written.pid != me || strcmp(g_written.path, path) != 0) {
    g_written.pid = me;
    snprintf(g_written.path, sizeof g_written.path, "%s", path);
    g_written.own_name = g_written.known = 0;
  }
  char dir[4096];
  const char *slash = strrchr(path, '/');
  snprintf(dir, sizeof dir, "%.*s", slash == NULL ? 1 : slash == path ? 1 : (int)(slash - path),
           slash == NULL ? "." : path);
  const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0)
    while (flock(dfd, LOCK_EX) != 0 && errno == EINTR) {
    }
  const char *target = path;
  struct stat st;
  if (g_written.own_name) {
    target = mine;
  } else if (!(g_written.known && stat(path, &st) == 0 && same_file(&st, &g_written.st))) {
    report_owner o;
    if (read_owner(path, &o) && !(o.pid == (long)me && strcmp(o.host, host) == 0) && o.calls > 0) {
      const char *on = strcmp(o.host, host) != 0 ? " on " : "", *there = *on ? o.host : "";
      if (calls <= 0) {
        if (!g_written.said_kept)
          ust__log(&e->ctx->log, UST_LOG_WARN, "report: process %ld observed no call, and '%s' holds the report of "
                   "process %ld%s%s with %.0f calls: left as it is", (long)me, path, o.pid, on, there, o.calls);
        g_written.said_kept = 1;
        target = NULL;
      } else if (runs(&o, host)) {
        if (!g_written.said_own_name)
          ust__log(&e->ctx->log, UST_LOG_WARN, "report: '%s' holds the report of process %ld%s%s, still running, "
                   "with %.0f calls: process %ld writes its own to '%s' (name the processes' reports apart with "
                   "{pid} or {rank} in report.path)", path, o.pid, on, there, o.calls, (long)me, mine);
        g_written.said_own_name = 1;
        g_written.own_name = 1;
        target = mine;
      }
    }
  }
  int rc = 0;
  if (target != NULL) {
    rc = ust__write_file_atomic(target, text, "report");
    g_written.known = rc == 0 && target == path && stat(path, &g_written.st) == 0;
  }
  if (dfd >= 0)
    close(dfd); /* and the flock with it */
  return rc;
}

int ust__report_write_file(ust__engine *e, const char *path) {
  cJSON *j = ust__report_build(e);
  const double calls = j != NULL ? num(cJSON_GetObjectItemCaseSensitive(j, "totals"), "calls") : 0;
  char *text = j != NULL ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  if (text == NULL)
    return ust__error(UST_ENOMEM, "report: out of memory");
  int rc;
  if (e->cfg.report_path != NULL && strcmp(path, e->cfg.report_path) == 0) {
    pthread_mutex_lock(&g_written.lock);
    rc = write_shared(e, path, text, calls);
    pthread_mutex_unlock(&g_written.lock);
  } else {
    rc = ust__write_file_atomic(path, text, "report");
  }
  free(text);
  return rc;
}

int ust_report_derive(const char *report_json, char **out) {
  ust__clear_error();
  if (report_json == NULL || out == NULL)
    return ust__error(UST_EINVAL, "report_derive: a report and out are required");
  *out = NULL;
  cJSON *root = cJSON_Parse(report_json);
  if (root == NULL)
    return ust__error(UST_EINVAL, "report_derive: not JSON");
  int rc = ust__report_derive(root);
  if (rc == 0 && (*out = cJSON_PrintUnformatted(root)) == NULL)
    rc = ust__error(UST_ENOMEM, "report_derive: out of memory");
  cJSON_Delete(root);
  return rc;
}
