/*
 * The router's sink (guard/guard.h): verdicts into routes, and what a
 * route's captured calls run at each replay (its gate); the candidate
 * calls found past their deadline while inside, into rollbacks; and a
 * route's first failing call, kept to be replayed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dispatch/dispatch.h"
#include "guard/gate.h"
#include "guard/shadow_dev.h"


/* ---- the sink: verdicts into routes ------------------------------------------------ */

static void sink_failed(void *ctx, void *cookie, ust__evidence *ev) {
  (void)ctx;
  ust__route *r = cookie;
  ust__rollout_roll_back(&r->rollout, ev);
}

static void sink_concluded(void *ctx, void *cookie, const ust__verdict *v) {
  ust__router *router = ctx;
  ust__route *r = cookie;
  /* the floor, from the lengths copied for it where it waited for them */
  const uint64_t tsol_ps = ust__timers_stage_floor(router->timers, v->floor_tag1, v->tsol_ps);
  if (v->remote) {
    /* a call run in the qualifying process: production's time counts, the
     * candidate's is the wire's, not its kernel's: neither scored nor held
     * against the budget */
    if (v->have_times)
      ust__figs_timed(&r->figs, v->prod_ns, tsol_ps, v->timed_kind);
    if (v->kind == UST__VERDICT_PASSED)
      ust__rollout_passed(&r->rollout, v->stage, !v->serving, NAN);
    return;
  }
  if (v->replay) {
    /* a replay's verdict: it qualifies the candidate to serve, but has no
     * times to weigh a promotion with */
    if (v->kind == UST__VERDICT_PASSED && !v->serving)
      ust__rollout_qualify(&r->rollout);
    return;
  }
  if (isfinite(v->aa_log_ratio))
    ust__rollout_aa(&r->rollout, v->aa_log_ratio);
  if (v->have_times) {
    ust__figs_timed(&r->figs, v->prod_ns, tsol_ps, v->timed_kind);
    ust__figs_cand_time(&r->figs, v->cand_ns, tsol_ps, v->kind == UST__VERDICT_PASSED);
    if (r->binding->cand != NULL && ust__verify_budget(&r->verify, &r->figs, r->binding->cand->max_slowdown))
      ust__log(router->log, UST_LOG_WARN, "%s: shadowing stopped: the candidate's median is %.1fx production's, "
               "over its budget of %gx", r->key_str, (double)atomic_load(&r->verify.paused_ratio_milli) / 1000.0,
               r->binding->cand->max_slowdown);
  }
  /* the promotion's sample: the call's arms, both timed over the same scope
   * in the order drawn, exact ns of each (no histogram bucket between) */
  if (v->kind == UST__VERDICT_PASSED)
    ust__rollout_passed(&r->rollout, v->stage, !v->serving,
                        v->paired && v->prod_ns > 0 && v->cand_ns > 0 ? log((double)v->cand_ns / (double)v->prod_ns)
                                                                      : NAN);
}

/* 1 once a graph library changed one of r's captured calls in place (the
 * kernel tracer's callbacks saw it): its replays may no longer run what was
 * captured. */
static int route_replays_stale(ust__route *r) {
  return atomic_load_explicit(&r->figs.graph_changed, memory_order_relaxed) != 0;
}

/* A route's captured calls follow its mode at every replay, as its eager
 * calls do: shadow verifies the sample; canary and live serve the
 * candidate in their share of replays and verify the sample of those
 * (whatever the shadow budget, as eager served calls), once a call on
 * copies has passed (until then every replay is verified on copies, as in
 * shadow); a candidate over its shadow budget is verified in no replay it
 * does not serve; any other mode runs production alone. strict serving
 * waits for a call's verdict before it serves, which a replay cannot: a
 * strict canary or live route's replays are verified as in shadow, with
 * production serving. */
uint64_t ust__route_gate(ust__route *r) {
  uint32_t canary_q32 = 0;
  const int mode = ust__rollout_mode(&r->rollout, &canary_q32);
  const ust__policy *pol = atomic_load_explicit(&r->binding->op->policy, memory_order_acquire);
  if (pol == NULL)
    return 0;
  /* a captured call of the route changed in place by a graph library (the
   * kernel tracer's callbacks saw it): what its sites copy, compare or
   * serve over may no longer be what production's nodes read and write,
   * so its replays run production alone from now on (the route is
   * observe-only under graphs; eager calls are not touched) */
  if (route_replays_stale(r))
    return 0;
  const int paused = atomic_load_explicit(&r->verify.paused, memory_order_relaxed) != 0;
  const int serving = mode == UST__MODE_CANARY || mode == UST__MODE_LIVE;
  const int qualified = ust__rollout_qualified(&r->rollout);
  ust__replay_gate g = {UST__GATE_OFF, pol->sample_q32, 0};
  if (serving && qualified && !pol->strict) {
    g.mode = mode == UST__MODE_LIVE ? UST__GATE_LIVE : UST__GATE_CANARY;
    g.canary_q32 = mode == UST__MODE_LIVE ? UINT32_MAX : canary_q32;
  } else if (serving && !qualified && !paused) {
    g.mode = UST__GATE_SHADOW;
    g.sample_q32 = UINT32_MAX;
  } else if ((mode == UST__MODE_SHADOW || serving) && !paused) {
    g.mode = UST__GATE_SHADOW;
  }
  return g.mode == UST__GATE_OFF ? 0 : ust__gate_pack(g);
}

static uint64_t sink_gate(void *ctx, void *cookie) {
  (void)ctx;
  return ust__route_gate(cookie);
}

static int sink_replays_stale(void *ctx, void *cookie) {
  (void)ctx;
  return route_replays_stale(cookie);
}

const ust__verdict_sink_i ust__router_sink = {sink_failed, sink_concluded, sink_gate, sink_replays_stale};

/* ---- calls past their deadline, while inside ------------------------------------------ */

static void overdue_found(void *ctx, const ust__overdue_call *c) {
  (void)ctx;
  ust__route *r = c->cookie;
  ust__verify_overdue(&r->verify);
  ust__evidence *e = calloc(1, sizeof *e);
  if (e != NULL) {
    e->unix_ms = ust__unix_ms();
    e->serving = c->serving;
    e->served_at = atomic_load(&r->rollout.served_cand);
    snprintf(e->reason, sizeof e->reason, "deadline");
    snprintf(e->message, sizeof e->message, "a call of the candidate was still running %llu ms after it began, past "
             "its deadline of %llu ms: the route rolled back while it runs", (unsigned long long)(c->ran_ns / 1000000u),
             (unsigned long long)(c->deadline_ns / 1000000u));
  }
  ust__rollout_roll_back(&r->rollout, e); /* said in the log there */
}

int ust__router_sweep(ust__router *r, uint64_t now_ns, uint64_t *next_ns) {
  if (r->flights == NULL) {
    if (next_ns != NULL)
      *next_ns = UINT64_MAX;
    return 0;
  }
  return ust__flights_sweep(r->flights, now_ns, overdue_found, r, next_ns);
}

/* ---- a failing call kept to be replayed ------------------------------------------- */

uint64_t ust__call_repro_bound(const ust__call_state *st) {
  const ust__route *r = st->route;
  if (r == NULL || r->binding->cand == NULL || atomic_load_explicit(&r->repro, memory_order_relaxed) != NULL)
    return 0;
  return r->binding->cand->repro_bytes;
}

/* A call's keeper, told its verdict (ust__shadow_keep): a failed call's
 * becomes its route's first, anything else goes. */
static void repro_concluded(void *ctx, void *cookie, const ust__keep_verdict *v) {
  ust__repro *keep = ctx;
  ust__route *r = cookie;
  if (v->failed && r != NULL) {
    snprintf(keep->reason, sizeof keep->reason, "%s", v->reason != NULL ? v->reason : "");
    snprintf(keep->output, sizeof keep->output, "%s", v->output != NULL ? v->output : "");
    keep->first_mismatch = v->first_mismatch;
    keep->settle(keep);
    ust__repro *none = NULL;
    if (atomic_compare_exchange_strong(&r->repro, &none, keep))
      return;
  }
  keep->destroy(keep);
}

void ust__call_keep(ust__call_state *st, ust__repro *keep) {
  if (keep == NULL)
    return;
  if (st->slot == NULL) {
    keep->destroy(keep);
    return;
  }
  ust__shadow_keep(st->slot, keep, repro_concluded);
}

int ust__call_relaxed_begin(void) { return ust__shadow_dev_relaxed_begin(); }

void ust__call_relaxed_end(int mode) { ust__shadow_dev_relaxed_end(mode); }
