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
  if (s->has_cand) {
    cJSON_AddItemToObject(js, "shadow", shadow_json(s));
    cJSON_AddItemToObject(js, "rollout", ust__report_rollout(s));
    cJSON_AddItemToObject(js, "in_flight", ust__report_flight(&s->flight));
    cJSON_AddItemToObject(js, "served_by", ust__report_served_by(s));
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

/* The candidates' headline: S of the candidates over their own scored shape
 * keys beside production's S over the same keys, each the keys' S weighted
 * by their device time, and the share of the device time those keys hold.
 * S_agg_candidate counts 0 for every operator without a verified candidate,
 * so a candidate on a sliver of the traffic reads as far worse than
 * production; these figures compare the two arms where both ran. */
typedef struct cand_sums {
  double routes, time_ns, s_cand, s_prod; /* s_* are sums of S times the keys' device time */
} cand_sums;

static void put_cand_sums(cJSON *o, const char *k, const cand_sums *c, double total_ns) {
  cJSON_DeleteItemFromObjectCaseSensitive(o, k);
  cJSON *x = cJSON_AddObjectToObject(o, k);
  if (x == NULL)
    return;
  add_num(x, "routes", c->routes);
  add_num(x, "device_share", total_ns > 0 ? c->time_ns / total_ns : 0.0);
  set_s(x, "S_candidate", c->time_ns > 0 ? c->s_cand / c->time_ns : -1);
  set_s(x, "S_production", c->time_ns > 0 ? c->s_prod / c->time_ns : -1);
}

/* A histogram object's buckets as a sparse histogram (owned arrays), its
 * count taken from the buckets. */
static int sparse_of(const cJSON *lat, ust__hist_sparse *out) {
  memset(out, 0, sizeof *out);
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(lat, "buckets");
  const int n = cJSON_IsArray(b) ? cJSON_GetArraySize(b) : 0;
  const double sum = num(lat, "sum");
  out->sum = sum >= 0 && sum < 1.8e19 ? (uint64_t)sum : 0;
  if (n == 0)
    return 0;
  out->index = malloc((size_t)n * sizeof *out->index);
  out->counts = malloc((size_t)n * sizeof *out->counts);
  if (out->index == NULL || out->counts == NULL) {
    ust__hist_sparse_free(out);
    return ust__error(UST_ENOMEM, "report: out of memory");
  }
  /* Buckets by index, whatever order (and repeats) a merge handed in. */
  uint64_t *dense = calloc(UST__HIST_BUCKETS, sizeof *dense);
  if (dense == NULL) {
    ust__hist_sparse_free(out);
    return ust__error(UST_ENOMEM, "report: out of memory");
  }
  const cJSON *pair;
  cJSON_ArrayForEach(pair, b) {
    const cJSON *i = cJSON_GetArrayItem(pair, 0), *c = cJSON_GetArrayItem(pair, 1);
    if (!cJSON_IsNumber(i) || !cJSON_IsNumber(c) || !(i->valuedouble >= 0) || i->valuedouble >= UST__HIST_BUCKETS ||
        !(c->valuedouble >= 0) || !(c->valuedouble < 9.2e18))
      continue;
    dense[(uint32_t)i->valuedouble] += (uint64_t)c->valuedouble;
  }
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++)
    if (dense[i] != 0) {
      out->index[out->n] = i;
      out->counts[out->n++] = dense[i];
      out->count += dense[i];
    }
  free(dense);
  return 0;
}

/* Quantiles of a histogram object, in place; its median into *p50. */
static int derive_hist(cJSON *lat, double *p50) {
  *p50 = 0;
  if (lat == NULL)
    return 0;
  ust__hist_sparse s;
  if (sparse_of(lat, &s) != 0)
    return UST_ENOMEM;
  *p50 = ust__hist_sparse_quantile(&s, 0.50);
  set_num(lat, "p50", *p50);
  set_num(lat, "p90", ust__hist_sparse_quantile(&s, 0.90));
  set_num(lat, "p99", ust__hist_sparse_quantile(&s, 0.99));
  set_num(lat, "count", (double)s.count);
  ust__hist_sparse_free(&s);
  return 0;
}

/* The calls of a route that its candidate served (rollout.served.candidate). */
static double served_by_candidate(const cJSON *shape) {
  return num(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(shape, "rollout"), "served"),
             "candidate");
}

static int phase_index(const cJSON *shape) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(shape, "phase");
  if (cJSON_IsString(p))
    for (int i = 0; i < UST__N_PHASES; i++)
      if (strcmp(p->valuestring, ust__phase_name(i)) == 0)
        return i;
  return 0;
}

static int is_rolled_back(const cJSON *shape) {
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(shape, "mode");
  return cJSON_IsString(m) && strcmp(m->valuestring, "rolled_back") == 0;
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

/* A route under CUDA graphs, from its figures: "gated" (its captured calls
 * hold their shadow or both arms, decided at each replay), "observed" (its
 * captured calls are timed by their replays; no candidate's side was
 * captured), "observe-only" with the reasons verdicts do not flow there
 * (its kernels replayed by graphs understudy did not see captured, captured
 * calls a graph library changed in place, captured calls that hold
 * production alone, shadows left ungated in an executable graph, captured
 * calls in a graph handed out), or null
 * (no graph ran it). */
static void derive_graph(cJSON *sh) {
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
  const char *status = NULL;
  if (why[0] != '\0')
    status = "observe-only";
  else if (num(sg, "shadowed") > 0)
    status = "gated";
  else if (num(sh, "captured") > 0 || num(sh, "replayed") > 0)
    status = "observed";
  cJSON_DeleteItemFromObjectCaseSensitive(g, "status");
  cJSON_DeleteItemFromObjectCaseSensitive(g, "reason");
  if (status != NULL)
    cJSON_AddStringToObject(g, "status", status);
  else
    cJSON_AddNullToObject(g, "status");
  if (why[0] != '\0')
    cJSON_AddStringToObject(g, "reason", why);
  else
    cJSON_AddNullToObject(g, "reason");
}

int ust__report_derive(cJSON *root) {
  cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "operators");
  if (!cJSON_IsArray(ops))
    return ust__error(UST_EINVAL, "report: no 'operators' array");
  const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "histogram"), "scheme");
  if (scheme != NULL && (!cJSON_IsString(scheme) || strcmp(scheme->valuestring, UST__HIST_SCHEME) != 0))
    return ust__error(UST_EINVAL, "report: histogram scheme '%s', this library reads '%s'",
                      cJSON_IsString(scheme) ? scheme->valuestring : "?", UST__HIST_SCHEME);
  int rc = 0;
  /* First pass: per shape, quantiles and device time; the totals they add to. */
  double total_est = 0, total_ph[UST__N_PHASES] = {0};
  /* graph replays are seen only inside the tracer's windows: they stand for
   * elapsed / window time as many */
  const cJSON *tmr = cJSON_GetObjectItemCaseSensitive(root, "timer");
  const double win_ns = num(tmr, "window_ns"), elapsed_ns = num(tmr, "elapsed_ns");
  const double replay_scale = win_ns > 0 && elapsed_ns > win_ns ? elapsed_ns / win_ns : 1.0;
  cJSON *op;
  cJSON_ArrayForEach(op, ops) {
    cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(op, "shapes")) {
      double p50 = 0;
      cJSON *lat = cJSON_GetObjectItemCaseSensitive(sh, "latency_ns");
      if ((rc = derive_hist(lat, &p50)) != 0)
        return rc;
      const double timed = num(lat, "count");
      set_num(sh, "timed", timed);
      set_num(sh, "device_time_ns", num(lat, "sum"));
      /* which timer produced the shape's figures, and the samples dropped, by why */
      const double by_kernels = num(sh, "kernel_timed"), by_held = num(sh, "held_timed");
      const double by_rest = timed > by_kernels + by_held ? timed - by_kernels - by_held : 0;
      const cJSON *dev = cJSON_GetObjectItemCaseSensitive(sh, "device");
      const int on_host = cJSON_IsString(dev) && strcmp(dev->valuestring, "cpu") == 0;
      cJSON_DeleteItemFromObjectCaseSensitive(sh, "timed_by");
      cJSON *tb = cJSON_AddObjectToObject(sh, "timed_by");
      if (tb == NULL)
        return ust__error(UST_ENOMEM, "report: out of memory");
      set_num(tb, "kernels", by_kernels);
      set_num(tb, "held_pair", by_held);
      set_num(tb, on_host ? "host_clock" : "pair", by_rest);
      cJSON_DeleteItemFromObjectCaseSensitive(sh, "dropped");
      cJSON *dr = cJSON_AddObjectToObject(sh, "dropped");
      if (dr == NULL)
        return ust__error(UST_ENOMEM, "report: out of memory");
      set_num(dr, "no_timer", num(sh, "timing_dropped"));
      set_num(dr, "hold_expired", num(sh, "hold_expired"));
      /* a replayed call is timed and runs without a dispatcher call: the
       * estimate counts it beside the calls (scaled to the whole time) */
      const double replayed = num(sh, "replayed") * replay_scale;
      const ust__est_in in = {.timed = timed, .timed_sum_ns = num(lat, "sum"), .first_timed = num(sh, "first_timed"),
                              .first_sum_ns = num(sh, "first_time_ns"), .steady_timed = num(sh, "steady_timed"),
                              .steady_sum_ns = num(sh, "steady_time_ns"), .calls = num(sh, "calls") + replayed,
                              .captured = num(sh, "captured"), .steady_calls = num(sh, "steady_calls")};
      double est = ust__est_device_time(&in);
      /* the calls the candidate served (canary, live) ran its kernels, not
       * production's: they count at the candidate's mean time (its timed
       * runs, verified calls and shadow runs), or production's while it has
       * none */
      const double served = served_by_candidate(sh);
      cJSON *clat = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(sh, "shadow"),
                                                     "candidate_latency_ns");
      double cp50 = 0; /* the candidate's quantiles and count, read by the second pass and below (a merged
                        * report carries the buckets only) */
      if ((rc = derive_hist(clat, &cp50)) != 0)
        return rc;
      const double eligible = num(sh, "calls") + replayed - num(sh, "captured");
      if (served > 0 && eligible >= served && num(clat, "count") > 0)
        est = est * (eligible - served) / eligible + served * num(clat, "sum") / num(clat, "count");
      if (replayed > 0)
        set_num(sh, "replayed_est", replayed);
      /* a route's calls: eager (dispatched and run), captured into a graph
       * (dispatched once, run by its replays), replayed (seen in windows) */
      set_num(sh, "eager", num(sh, "calls") - num(sh, "captured"));
      derive_graph(sh);
      set_num(sh, "est_device_time_ns", est);
      total_est += est;
      total_ph[phase_index(sh)] += est;
    }
  }
  double t_calls = 0, t_timed = 0, t_captured = 0, t_shadow = 0, t_verified = 0, t_failed = 0, t_rollbacks = 0;
  double s_agg = 0, s_agg_cand = 0, s_agg_ph[UST__N_PHASES] = {0}, s_agg_cand_ph[UST__N_PHASES] = {0};
  /* the device-time share of the operators that have an S: S_agg is taken over it */
  double scored_w = 0, scored_w_ph[UST__N_PHASES] = {0};
  /* the device-time share of the shape keys that have an S (scored_share),
   * overall and within each phase */
  double keys_scored = 0, keys_scored_ph[UST__N_PHASES] = {0};
  /* scored operators that have a candidate, overall and per phase: without
   * one, the candidates' S_agg is null (no candidate was measured), not 0 */
  int cand_ops = 0, cand_ops_ph[UST__N_PHASES] = {0};
  /* shape keys measured faster than their floor (S > 1, by either arm): the
   * profile is below what the device achieved, and the score says so */
  double t_above = 0;
  cand_sums t_cand = {0};
  svals sv = {0}, cv = {0}, sph[UST__N_PHASES] = {{0}}, cph[UST__N_PHASES] = {{0}};
  cJSON_ArrayForEach(op, ops) {
    const int has_cand = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(op, "candidate"));
    double calls = 0, timed = 0, captured = 0, est = 0, measured = 0, tsol_sum = 0, time_sum = 0;
    double est_ph[UST__N_PHASES] = {0};
    int routes_ph[UST__N_PHASES] = {0}, cand_routes = 0, covered = 0, above = 0;
    cand_sums o_cand = {0};
    sv.n = cv.n = 0;
    for (int p = 0; p < UST__N_PHASES; p++)
      sph[p].n = cph[p].n = 0;
    cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(op, "shapes")) {
      const int ph = phase_index(sh);
      const double e_ns = num(sh, "est_device_time_ns");
      set_num(sh, "weight", total_est > 0 ? e_ns / total_est : 0.0);
      est_ph[ph] += e_ns;
      routes_ph[ph]++;
      cJSON *lat = cJSON_GetObjectItemCaseSensitive(sh, "latency_ns");
      const double p50 = num(lat, "p50");
      cJSON *shadow = cJSON_GetObjectItemCaseSensitive(sh, "shadow");
      double cp50 = 0;
      if (cJSON_IsObject(shadow)) {
        cp50 = num(cJSON_GetObjectItemCaseSensitive(shadow, "candidate_latency_ns"), "p50"); /* derived above */
        if (p50 > 0 && cp50 > 0)
          set_num(shadow, "speedup", p50 / cp50);
        else
          set_null(shadow, "speedup");
        t_shadow += num(shadow, "calls");
        t_verified += num(shadow, "verified");
        t_failed += num(shadow, "failed");
        t_rollbacks += is_rolled_back(sh);
      }
      cJSON *roof = cJSON_GetObjectItemCaseSensitive(sh, "roofline");
      if (cJSON_IsObject(roof)) {
        const double n = num(roof, "calls"), nc = num(roof, "candidate_calls");
        set_num(roof, "tsol_ns_mean", n > 0 ? num(roof, "tsol_ns_sum") / n : 0.0);
        const double sp = ust__route_s(num(roof, "tsol_ns_sum"), n, p50);
        const double sc = cJSON_IsObject(shadow) && !is_rolled_back(sh)
                              ? ust__route_s(num(roof, "candidate_tsol_ns_sum"), nc, cp50) : -1;
        set_s(roof, "S", sp);
        set_s(roof, "S_candidate", sc);
        set_bool(roof, "above_roof", sp > 1 || sc > 1);
        above += sp > 1 || sc > 1;
        if (sp >= 0 && sc >= 0) {
          o_cand.routes++;
          o_cand.time_ns += e_ns;
          o_cand.s_cand += e_ns * sc;
          o_cand.s_prod += e_ns * sp;
        }
        /* the roofline chart's coordinates: FLOP per byte, and FLOP/s at
         * the median time (as S is), so a point lies S below its roof */
        const double wc = num(roof, "work_calls"), fl = num(roof, "flops_sum"), by = num(roof, "bytes_sum");
        const double w_mean = wc > 0 ? fl / wc : 0;
        set_s(roof, "intensity", wc > 0 && by > 0 ? fl / by : -1);
        set_s(roof, "flops_mean", wc > 0 ? w_mean : -1);
        set_s(roof, "achieved_flops_s", w_mean > 0 && p50 > 0 ? w_mean / p50 * 1e9 : -1);
        set_s(roof, "candidate_achieved_flops_s", w_mean > 0 && cp50 > 0 ? w_mean / cp50 * 1e9 : -1);
        if (sp >= 0) {
          if ((rc = push(&sv, sp)) != 0 || (rc = push(&sph[ph], sp)) != 0)
            goto out;
          tsol_sum += num(roof, "tsol_ns_sum");
          time_sum += num(roof, "time_ns_sum");
          keys_scored += total_est > 0 ? e_ns / total_est : 0.0;
          keys_scored_ph[ph] += total_ph[ph] > 0 ? e_ns / total_ph[ph] : 0.0;
        }
        if (cJSON_IsObject(shadow)) {
          cand_routes++;
          if (sc >= 0) {
            if ((rc = push(&cv, sc)) != 0 || (rc = push(&cph[ph], sc)) != 0)
              goto out;
            covered++;
          }
        }
      }
      calls += num(sh, "calls");
      timed += num(sh, "timed");
      captured += num(sh, "captured");
      est += e_ns;
      measured += num(sh, "device_time_ns");
    }
    set_num(op, "calls", calls);
    set_num(op, "timed", timed);
    set_num(op, "captured", captured);
    set_num(op, "device_time_ns", measured);
    set_num(op, "est_device_time_ns", est);
    const double w_op = total_est > 0 ? est / total_est : 0.0;
    set_num(op, "weight", w_op);
    /* S_i: the median over shape keys (the paper), and the time-weighted
     * variant; for a candidate, over the keys where it verified correct. */
    /* unscored is null, not 0: an operator nothing scored does not pull S_agg down */
    const double s_op = sv.n > 0 ? ust__median(sv.v, sv.n) : -1;
    cJSON_DeleteItemFromObjectCaseSensitive(op, "roofline");
    cJSON *jr = cJSON_AddObjectToObject(op, "roofline");
    add_num(jr, "scored_shapes", sv.n);
    set_s(jr, "S", s_op);
    set_s(jr, "S_weighted", time_sum > 0 ? tsol_sum / time_sum : -1);
    add_num(jr, "above_roof", above);
    t_above += above;
    if (has_cand) {
      const double s_c = cv.n > 0 ? ust__median(cv.v, cv.n) : -1;
      set_s(jr, "S_candidate", s_c);
      add_num(jr, "coverage", cand_routes > 0 ? (double)covered / cand_routes : 0.0);
      put_cand_sums(jr, "candidate_routes", &o_cand, total_est);
      t_cand.routes += o_cand.routes;
      t_cand.time_ns += o_cand.time_ns;
      t_cand.s_cand += o_cand.s_cand;
      t_cand.s_prod += o_cand.s_prod;
      if (s_op >= 0) {
        s_agg_cand += w_op * (s_c >= 0 ? s_c : 0.0); /* an unverified candidate counts 0 where production scores */
        cand_ops++;
      }
    }
    if (s_op >= 0) {
      s_agg += w_op * s_op;
      scored_w += w_op;
    }
    /* The same per phase: weights are shares of that phase's device time. */
    cJSON_DeleteItemFromObjectCaseSensitive(op, "phases");
    cJSON *jp = cJSON_AddObjectToObject(op, "phases");
    for (int p = 0; p < UST__N_PHASES; p++) {
      if (routes_ph[p] == 0)
        continue;
      cJSON *x = cJSON_AddObjectToObject(jp, ust__phase_name(p));
      const double wp = total_ph[p] > 0 ? est_ph[p] / total_ph[p] : 0.0;
      const double sp_op = sph[p].n > 0 ? ust__median(sph[p].v, sph[p].n) : -1;
      add_num(x, "est_device_time_ns", est_ph[p]);
      add_num(x, "weight", wp);
      set_s(x, "S", sp_op);
      if (sp_op >= 0) {
        s_agg_ph[p] += wp * sp_op;
        scored_w_ph[p] += wp;
      }
      if (has_cand) {
        const double sc_op = cph[p].n > 0 ? ust__median(cph[p].v, cph[p].n) : -1;
        set_s(x, "S_candidate", sc_op);
        if (sp_op >= 0) {
          s_agg_cand_ph[p] += wp * (sc_op >= 0 ? sc_op : 0.0);
          cand_ops_ph[p]++;
        }
      }
    }
    t_calls += calls;
    t_timed += timed;
    t_captured += captured;
  }
  {
    cJSON *tot = cJSON_GetObjectItemCaseSensitive(root, "totals");
    if (!cJSON_IsObject(tot))
      tot = cJSON_AddObjectToObject(root, "totals");
    int routes = 0;
    cJSON_ArrayForEach(op, ops) routes += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(op, "shapes"));
    set_num(tot, "calls", t_calls);
    set_num(tot, "timed", t_timed);
    set_num(tot, "captured", t_captured);
    set_num(tot, "routes", routes);
    set_num(tot, "est_device_time_ns", total_est);
    set_num(tot, "shadow_calls", t_shadow);
    set_num(tot, "verified", t_verified);
    set_num(tot, "failed", t_failed);
    set_num(tot, "rollbacks", t_rollbacks);
    /* S_agg = sum_i w_i S_i / sum_i w_i over the operators that have an S
     * (null when nothing was scored): production's (the headroom left) and
     * the candidates' (operators without a verified candidate count 0; null
     * when no scored operator has a candidate). Beside it the share of the
     * device time whose shape keys were scored: an operator's S stands for
     * its unscored keys too, which this share does not count. */
    set_num(tot, "scored_share", keys_scored);
    set_s(tot, "S_agg", scored_w > 0 ? s_agg / scored_w : -1);
    set_s(tot, "S_agg_candidate", scored_w > 0 && cand_ops > 0 ? s_agg_cand / scored_w : -1);
    set_num(tot, "above_roof", t_above);
    int any_cand = 0;
    cJSON_ArrayForEach(op, ops) any_cand |= cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(op, "candidate"));
    if (any_cand)
      put_cand_sums(tot, "candidate_routes", &t_cand, total_est);
    else
      set_null(tot, "candidate_routes");
    /* the kernel tracer's coverage: the share of all kernel time in its
     * windows that was launched inside timed calls of bound ops */
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(root, "timer");
    if (cJSON_IsObject(tm)) {
      const double kns = num(tm, "kernel_ns");
      if (kns > 0)
        set_num((cJSON *)tm, "coverage", num(tm, "attributed_ns") / kns);
      else
        cJSON_DeleteItemFromObjectCaseSensitive((cJSON *)tm, "coverage");
      cJSON *tph;
      cJSON_ArrayForEach(tph, cJSON_GetObjectItemCaseSensitive(tm, "phases")) {
        const double pk = num(tph, "kernel_ns");
        if (pk > 0)
          set_num(tph, "coverage", num(tph, "attributed_ns") / pk);
        else
          cJSON_DeleteItemFromObjectCaseSensitive(tph, "coverage");
      }
    }
    cJSON_DeleteItemFromObjectCaseSensitive(tot, "phases");
    cJSON *tp = cJSON_AddObjectToObject(tot, "phases");
    for (int p = 0; p < UST__N_PHASES; p++) {
      if (total_ph[p] <= 0)
        continue;
      cJSON *x = cJSON_AddObjectToObject(tp, ust__phase_name(p));
      add_num(x, "est_device_time_ns", total_ph[p]);
      add_num(x, "scored_share", keys_scored_ph[p]);
      set_s(x, "S_agg", scored_w_ph[p] > 0 ? s_agg_ph[p] / scored_w_ph[p] : -1);
      set_s(x, "S_agg_candidate",
            scored_w_ph[p] > 0 && cand_ops_ph[p] > 0 ? s_agg_cand_ph[p] / scored_w_ph[p] : -1);
    }
  }
out:
  free(sv.v);
  free(cv.v);
  for (int p = 0; p < UST__N_PHASES; p++) {
    free(sph[p].v);
    free(cph[p].v);
  }
  return rc;
}

/* ---- the recent window ------------------------------------------------------------- */

/* o.k -= base.k for each additive field named in keys (absent counts 0) */
static void sub_fields(cJSON *o, const cJSON *base, const char *const *keys) {
  for (; *keys != NULL; keys++) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, *keys);
    if (cJSON_IsNumber(v)) {
      const double d = v->valuedouble - num(base, *keys);
      cJSON_SetNumberValue(v, d > 0 ? d : 0);
    }
  }
}

/* A histogram less its earlier self, bucket by bucket. */
static int sub_hist(cJSON *lat, const cJSON *base) {
  if (lat == NULL || base == NULL)
    return 0;
  ust__hist_sparse now, then;
  if (sparse_of(lat, &now) != 0)
    return UST_ENOMEM;
  if (sparse_of(base, &then) != 0) {
    ust__hist_sparse_free(&now);
    return UST_ENOMEM;
  }
  cJSON *b = cJSON_CreateArray();
  double count = 0;
  for (int i = 0, j = 0; b != NULL && i < now.n; i++) {
    while (j < then.n && then.index[j] < now.index[i])
      j++;
    const uint64_t before = j < then.n && then.index[j] == now.index[i] ? then.counts[j] : 0;
    if (now.counts[i] > before) {
      cJSON *pair = cJSON_CreateArray();
      cJSON_AddItemToArray(pair, cJSON_CreateNumber(now.index[i]));
      cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)(now.counts[i] - before)));
      cJSON_AddItemToArray(b, pair);
      count += (double)(now.counts[i] - before);
    }
  }
  const double sum = now.sum > then.sum ? (double)(now.sum - then.sum) : 0;
  ust__hist_sparse_free(&now);
  ust__hist_sparse_free(&then);
  if (b == NULL)
    return UST_ENOMEM;
  cJSON_ReplaceItemInObjectCaseSensitive(lat, "buckets", b);
  set_num(lat, "count", count);
  set_num(lat, "sum", sum);
  return 0;
}

/* base's shape keys, by key */
typedef struct base_shape {
  const char *key;
  const cJSON *shape;
  UT_hash_handle hh;
} base_shape;

static base_shape *index_shapes(const cJSON *base, base_shape *cells, int cap) {
  base_shape *by_key = NULL;
  int n = 0;
  const cJSON *op, *sh;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(base, "operators"))
  cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(op, "shapes")) {
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(sh, "key");
    base_shape *found = NULL;
    if (n == cap || !cJSON_IsString(key))
      continue;
    HASH_FIND_STR(by_key, key->valuestring, found);
    if (found != NULL)
      continue;
    cells[n].key = key->valuestring;
    cells[n].shape = sh;
    HASH_ADD_KEYPTR(hh, by_key, cells[n].key, strlen(cells[n].key), &cells[n]);
    n++;
  }
  return by_key;
}

static int count_shapes(const cJSON *doc) {
  int n = 0;
  const cJSON *op;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(doc, "operators"))
  n += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(op, "shapes"));
  return n;
}

/* The additive figures of now less those of base (NULL: since enable), as
 * a report of its own: shape keys without a call in between are left out. */
static cJSON *window_doc(const cJSON *now, const cJSON *base) {
  static const char *const shape_keys[] = {"calls", "estimated", "captured", "timing_dropped", "first_timed",
                                            "first_time_ns",
                                            "steady_timed", "steady_time_ns", "steady_calls", "kernel_timed",
                                            "kernel_span_ns", "replayed", "held_timed", "hold_expired", NULL};
  static const char *const roof_keys[] = {"calls", "unscored", "scored_by_callees", "tsol_ns_sum", "time_ns_sum",
                                          "candidate_calls", "candidate_tsol_ns_sum", "candidate_time_ns_sum",
                                          "work_calls", "flops_sum", "bytes_sum", NULL};
  static const char *const shadow_keys[] = {"calls", "verified", "passed", "failed", "skipped", "unverifiable", NULL};
  static const char *const graph_keys[] = {"unseen_kernels", "unseen_ns", "changed", "dropped", NULL};
  const int n_base = base != NULL ? count_shapes(base) : 0;
  base_shape *cells = n_base > 0 ? calloc((size_t)n_base, sizeof *cells) : NULL;
  if (n_base > 0 && cells == NULL)
    return NULL;
  base_shape *by_key = cells != NULL ? index_shapes(base, cells, n_base) : NULL;
  cJSON *w = cJSON_CreateObject();
  cJSON *ops = w != NULL ? cJSON_AddArrayToObject(w, "operators") : NULL;
  if (ops == NULL)
    goto oom;
  const cJSON *op;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(now, "operators")) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(op, "name");
    if (!cJSON_IsString(name))
      continue;
    cJSON *wo = cJSON_CreateObject();
    cJSON_AddItemToArray(ops, wo);
    cJSON_AddStringToObject(wo, "name", name->valuestring);
    if (cJSON_GetObjectItemCaseSensitive(op, "candidate") != NULL)
      cJSON_AddItemToObject(wo, "candidate", cJSON_CreateObject());
    cJSON *shapes = cJSON_AddArrayToObject(wo, "shapes");
    const cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(op, "shapes")) {
      const cJSON *key = cJSON_GetObjectItemCaseSensitive(sh, "key");
      base_shape *cell = NULL;
      if (by_key != NULL && cJSON_IsString(key))
        HASH_FIND_STR(by_key, key->valuestring, cell);
      const cJSON *bsh = cell != NULL ? cell->shape : NULL;
      if (num(sh, "calls") - num(bsh, "calls") <= 0 && num(sh, "replayed") - num(bsh, "replayed") <= 0)
        continue; /* neither called nor replayed in the interval */
      cJSON *ws = cJSON_Duplicate(sh, 1);
      if (ws == NULL)
        goto oom;
      cJSON_AddItemToArray(shapes, ws);
      /* a route's verdicts and timeline are the totals' business; the calls
       * the candidate served in the interval stay (the device-time estimate
       * counts them at its time) */
      const double served = served_by_candidate(sh) - served_by_candidate(bsh);
      cJSON_DeleteItemFromObjectCaseSensitive(ws, "rollout");
      cJSON *wserved = cJSON_AddObjectToObject(cJSON_AddObjectToObject(ws, "rollout"), "served");
      if (wserved == NULL || add_num(wserved, "candidate", served) == NULL)
        goto oom;
      sub_fields(ws, bsh, shape_keys);
      sub_fields(cJSON_GetObjectItemCaseSensitive(ws, "graph"), cJSON_GetObjectItemCaseSensitive(bsh, "graph"),
                 graph_keys);
      if (sub_hist(cJSON_GetObjectItemCaseSensitive(ws, "latency_ns"),
                   cJSON_GetObjectItemCaseSensitive(bsh, "latency_ns")) != 0)
        goto oom;
      sub_fields(cJSON_GetObjectItemCaseSensitive(ws, "roofline"), cJSON_GetObjectItemCaseSensitive(bsh, "roofline"),
                 roof_keys);
      cJSON *wsh = cJSON_GetObjectItemCaseSensitive(ws, "shadow");
      const cJSON *bshd = cJSON_GetObjectItemCaseSensitive(bsh, "shadow");
      sub_fields(wsh, bshd, shadow_keys);
      if (sub_hist(cJSON_GetObjectItemCaseSensitive(wsh, "candidate_latency_ns"),
                   cJSON_GetObjectItemCaseSensitive(bshd, "candidate_latency_ns")) != 0)
        goto oom;
    }
  }
  {
    /* the tracer's windows within the interval: the scale of its replays */
    const cJSON *tn = cJSON_GetObjectItemCaseSensitive(now, "timer");
    const cJSON *tb = cJSON_GetObjectItemCaseSensitive(base, "timer");
    cJSON *tw = cJSON_AddObjectToObject(w, "timer");
    if (tw == NULL)
      goto oom;
    add_num(tw, "window_ns", num(tn, "window_ns") - num(tb, "window_ns"));
    add_num(tw, "elapsed_ns", num(tn, "elapsed_ns") - num(tb, "elapsed_ns"));
  }
  HASH_CLEAR(hh, by_key);
  free(cells);
  return w;
oom:
  HASH_CLEAR(hh, by_key);
  free(cells);
  cJSON_Delete(w);
  return NULL;
}

/* dst.k = a copy of src.k, when src has k */
static void copy_item(cJSON *dst, const cJSON *src, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, k);
  if (v != NULL)
    cJSON_AddItemToObject(dst, k, cJSON_Duplicate(v, 0));
}

/* The window's figures, derived, in brief: per operator and shape key
 * with calls in it, calls, weight and S; in total S_agg. */
static int add_window(cJSON *root, ust__engine *e) {
  pthread_mutex_lock(&e->window_lock);
  const cJSON *base = e->window_base[0] != NULL ? e->window_base[0] : e->window_base[1];
  cJSON *w = window_doc(root, base);
  const double since = base != NULL ? num(base, "generated_unix_ms") : (double)e->started_unix_ms;
  pthread_mutex_unlock(&e->window_lock);
  if (w == NULL || ust__report_derive(w) != 0) {
    cJSON_Delete(w);
    return UST_ENOMEM;
  }
  cJSON *out = cJSON_AddObjectToObject(root, "window");
  add_num(out, "since_unix_ms", since);
  add_num(out, "span_s", (num(root, "generated_unix_ms") - since) / 1000.0);
  add_num(out, "window_s", e->cfg.report_window_s);
  const cJSON *tot = cJSON_GetObjectItemCaseSensitive(w, "totals");
  cJSON *jt = cJSON_AddObjectToObject(out, "totals");
  static const char *const tkeys[] = {"calls", "timed", "est_device_time_ns", "scored_share", "S_agg",
                                      "S_agg_candidate", "above_roof", "candidate_routes", NULL};
  for (const char *const *k = tkeys; *k != NULL; k++)
    copy_item(jt, tot, *k);
  cJSON *jops = cJSON_AddArrayToObject(out, "operators");
  const cJSON *op;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(w, "operators")) {
    const cJSON *shapes = cJSON_GetObjectItemCaseSensitive(op, "shapes");
    if (cJSON_GetArraySize(shapes) == 0)
      continue;
    cJSON *jo = cJSON_CreateObject();
    cJSON_AddItemToArray(jops, jo);
    copy_item(jo, op, "name");
    add_num(jo, "calls", num(op, "calls"));
    add_num(jo, "weight", num(op, "weight"));
    const cJSON *rl = cJSON_GetObjectItemCaseSensitive(op, "roofline");
    copy_item(jo, rl, "S");
    copy_item(jo, rl, "S_candidate");
    copy_item(jo, rl, "above_roof");
    cJSON *jss = cJSON_AddArrayToObject(jo, "shapes");
    const cJSON *sh;
    cJSON_ArrayForEach(sh, shapes) {
      cJSON *js = cJSON_CreateObject();
      cJSON_AddItemToArray(jss, js);
      copy_item(js, sh, "key");
      add_num(js, "calls", num(sh, "calls"));
      add_num(js, "timed", num(sh, "timed"));
      const cJSON *lat = cJSON_GetObjectItemCaseSensitive(sh, "latency_ns");
      if (num(lat, "count") > 0)
        add_num(js, "p50_ns", num(lat, "p50"));
      else
        cJSON_AddNullToObject(js, "p50_ns");
      const cJSON *srl = cJSON_GetObjectItemCaseSensitive(sh, "roofline");
      cJSON_AddItemToObject(js, "S", srl != NULL ? cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(srl, "S"), 0)
                                                 : cJSON_CreateNull());
      copy_item(js, srl, "above_roof");
    }
  }
  cJSON_Delete(w);
  return 0;
}

void ust__report_window_rotate(ust__engine *e) {
  cJSON *now = report_raw(e);
  if (now == NULL)
    return; /* out of memory: the window grows until the next rotation */
  pthread_mutex_lock(&e->window_lock);
  cJSON_Delete(e->window_base[0]);
  e->window_base[0] = e->window_base[1];
  e->window_base[1] = now;
  pthread_mutex_unlock(&e->window_lock);
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
