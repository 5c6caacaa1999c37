/*
 * The plan of a keyed call: its route's mode and sampling decide whether
 * production alone serves it (timed or not), a shadow runs beside it, or a
 * candidate serves; during graph capture what the graph holds. Then the
 * steps of the serving decision the C core performs for the bridge (marks,
 * comparisons, verdicts, a captured shadow's parts, the layouts production's
 * returns were learned in) and the call's end.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/routes.h"
#include "guard/procrun.h"


/* T_SOL of a call in picoseconds (0 when unknown); the route's profile is
 * noted. Called only for calls that are timed. */
/* A binding's floor for one call: 0 with seconds, W (FLOPs, every path)
 * and Q (bytes), and the profile; -1 when it has no roofline, no profile
 * matches, or a dimension is missing. */
enum { FLOOR_BOUNDED = 1, FLOOR_TF32 = 2 }; /* how a floor was taken */
static int binding_floor(const ust__binding *b, const ust__call *call, const ust__hw_profile **hw_out,
                         double *seconds, double *flops, double *bytes, int *how) {
  if (!b->roofline.present)
    return -1;
  const ust__hw_profile *hw = ust__hw_for_call(b->router->hw, call);
  if (hw == NULL)
    return -1;
  double w[UST__N_PATHS], qr, qw;
  const ust__seam_i *seam = b->router->seam;
  /* TF32 where torch allows it and the profile has its peak */
  const int tf32 = b->roofline.w_tf32 && hw->p_peak[UST__PATH_TF32] > 0 && seam != NULL &&
                   seam->tf32_matmul != NULL && seam->tf32_matmul(call->device);
  /* exact, or with bounds where the lengths of a varlen batch live on the
   * device (the definition's estimate says which) */
  const int rc = ust__roofline_eval(&b->roofline, call, tf32, w, &qr, &qw);
  if (rc < 0 || ust__roofline_tsol_quiet(hw, w, qr + qw, seconds) != 0)
    return -1;
  if (how != NULL)
    *how = (rc == UST__ROOF_BOUNDED ? FLOOR_BOUNDED : 0) | (tf32 ? FLOOR_TF32 : 0);
  *flops = 0;
  for (int p = 0; p < UST__N_PATHS; p++)
    *flops += w[p];
  *bytes = qr + qw;
  *hw_out = hw;
  return 0;
}


/* A bounded floor (how) deferred into d with its bounds: 1, or 0 (it cannot wait for its lengths). */
static int floor_defer(const ust__binding *b, const ust__call *call, int how, const ust__hw_profile *hw, ust__figs *figs,
                       double seconds, double flops, double bytes, int work_noted, ust__floor_defer *d) {
  if (!(how & FLOOR_BOUNDED) || ust__roofline_defer(&b->roofline, call, how & FLOOR_TF32, d) != 0)
    return 0;
  d->hw = hw;
  d->figs = figs;
  d->bound_tsol_ps = (uint64_t)(seconds * 1e12 + 0.5);
  d->bound_flops = flops;
  d->bound_bytes = bytes;
  d->work_noted = work_noted;
  return 1;
}

/* The call's own floor in ps (0: unknown). Its work is noted now, or, for a
 * call whose floor may still come from its nested ops, kept in st for
 * ust__call_nested_done. A floor bounded for lengths on the device is also
 * left in *defer (when given) for its timer (*deferring 1). */
static uint64_t call_tsol_ps(ust__route *r, const ust__call *call, ust__call_state *st, ust__floor_defer *defer,
                                int *deferring) {
  const ust__binding *b = r->binding;
  const ust__hw_profile *hw = NULL;
  double seconds = 0, flops = 0, bytes = 0;
  int how = 0;
  const int ok = binding_floor(b, call, &hw, &seconds, &flops, &bytes, &how) == 0;
  /* its bounded work noted below, or where the call's floor settles */
  if (ok && defer != NULL && floor_defer(b, call, how, hw, &r->figs, seconds, flops, bytes, !st->nested_ok, defer))
    *deferring = 1;
  if (st->nested_ok) {
    st->own_flops = ok ? flops : 0;
    st->own_bytes = ok ? bytes : 0;
    if (ok)
      ust__figs_note_hw(&r->figs, hw);
    return ok ? (uint64_t)(seconds * 1e12 + 0.5) : 0;
  }
  if (!b->roofline.present)
    return 0;
  if (!ok) {
    ust__figs_unscored(&r->figs);
    return 0;
  }
  ust__figs_note_hw(&r->figs, hw);
  ust__figs_note_work(&r->figs, flops, bytes);
  return (uint64_t)(seconds * 1e12 + 0.5);
}

int ust__call_wants_nested(const ust__call_state *st) {
  return st->route != NULL && st->nested_ok && (st->timing != 0 || st->slot != NULL);
}

int ust__binding_work(const ust__binding *b, const ust__call *call, double *flops, double *bytes) {
  double w[UST__N_PATHS], qr, qw;
  if (!b->roofline.present || ust__roofline_eval(&b->roofline, call, 0, w, &qr, &qw) < 0)
    return -1;
  *flops = 0;
  for (int p = 0; p < UST__N_PATHS; p++)
    *flops += w[p];
  *bytes = qr + qw;
  return 0;
}

void ust__binding_nested_floor(ust__binding *b, const ust__call *call, ust__nested *acc) {
  const ust__hw_profile *hw = NULL;
  double seconds = 0, flops = 0, bytes = 0;
  acc->n++;
  double wf = 0, wb = 0;
  if (ust__binding_work(b, call, &wf, &wb) == 0) {
    acc->work_flops += wf;
    acc->work_bytes += wb;
  } else {
    acc->unworked++;
  }
  int how = 0;
  if (binding_floor(b, call, &hw, &seconds, &flops, &bytes, &how) != 0) {
    acc->unscored++;
    return;
  }
  ust__route *outer = acc->outer;
  ust__floor_defer defer; /* the outer's timer waits for one callee's lengths; nested_done notes the work */
  if (acc->token1 > 0 && floor_defer(b, call, how, hw, &outer->figs, seconds, flops, bytes, 1, &defer) &&
      ust__timers_defer_floor(outer->binding->router->timers, acc->token1 - 1, &defer, UST__FLOOR_CALLEES) == 0)
    acc->token1 = 0;
  acc->tsol_ps += (uint64_t)(seconds * 1e12 + 0.5);
  acc->flops += flops;
  acc->bytes += bytes;
}

void ust__call_nested_open(const ust__call_state *st, ust__nested *acc) {
  acc->outer = st->route;
  acc->token1 = st->route != NULL && st->timing == 2 ? st->gpu_slot + 1 : 0;
}

void ust__call_nested_done(ust__call_state *st, const ust__nested *acc) {
  ust__route *r = st->route;
  if (r == NULL || !st->nested_ok)
    return;
  if (acc->n > 0 && acc->unscored == 0 && acc->tsol_ps > 0) {
    st->tsol_ps = acc->tsol_ps;
    if (st->slot != NULL)
      ust__shadow_set_floor(st->slot, acc->tsol_ps);
    ust__timers_stage_floor(r->binding->router->timers, st->floor_tag1, 0); /* its own floor's lengths let go */
    st->floor_tag1 = 0;
    if (st->timing == 2) /* a deferral of its own floor's is let go */
      ust__timers_floor_settled(r->binding->router->timers, st->gpu_slot, UST__FLOOR_CALLEES);
    ust__figs_nested_scored(&r->figs);
    ust__figs_note_work(&r->figs, acc->flops, acc->bytes);
  } else if (st->tsol_ps > 0) {
    if (st->timing == 2) /* a deferral of its callees' floor is let go */
      ust__timers_floor_settled(r->binding->router->timers, st->gpu_slot, UST__FLOOR_OWN);
    ust__figs_note_work(&r->figs, st->own_flops, st->own_bytes);
  } else if (r->binding->roofline.present) {
    ust__figs_unscored(&r->figs);
  }
  st->nested_ok = 0; /* settled */
}

/* 1 when the candidate may run in this process for route r: always, but
 * for one qualifying in its own process, until the route qualified there
 * and the engine loaded it here. */
static int ready_here(ust__cand *c, const ust__route *r) {
  if (c == NULL || (c->proc == NULL && !c->torch_qualify))
    return 1;
  const int passed =
      atomic_load_explicit(&((ust__route *)r)->verify.proc_passed, memory_order_relaxed) >= c->qualify_calls;
  return passed && (c->torch_qualify || atomic_load_explicit(&c->loaded, memory_order_acquire) != NULL);
}

int ust__route_when_holds(const ust__binding *b, const ust__route_key *k) {
  const ust__cand *c = b->cand;
  if (c == NULL)
    return 1;
  for (int w = 0; w < c->n_when; w++)
    for (int d = 0; d < b->n_dims; d++)
      if (strcmp(b->def->dims[d].name, c->when_dim[w]) == 0 && k->dims[d] != c->when_value[w])
        return 0;
  return 1;
}

/* A torch op's handle by name, resolved once and kept in *slot (the op may
 * be defined after enable); NULL while it is not defined. */
static void *torch_handle(ust__binding *b, _Atomic(void *) *slot, const char *qualname, const char *overload) {
  void *h = atomic_load_explicit(slot, memory_order_acquire);
  if (h == NULL && b->router->seam != NULL && b->router->seam->resolve_op != NULL &&
      (h = b->router->seam->resolve_op(qualname, overload)) != NULL)
    atomic_store_explicit(slot, h, memory_order_release);
  return h;
}

/* The candidate as the bridge runs it for a call of route r (serving: the
 * candidate would serve it); 0, or -1 when it cannot run now: a torch op not
 * defined in this process yet, or a candidate qualifying in its own process
 * that may not run here yet (or was refused there). */
static int cand_view(ust__binding *b, const ust__route *r, const ust__call *call, int serving, ust__cand_view *v) {
  ust__cand *c = b->cand;
  memset(v, 0, sizeof *v);
  v->kind = c->kind;
  v->native = c->native;
  if (c->n_when > 0 && !ust__route_when_holds(b, &r->key))
    return -1; /* not a route the candidate is for: production's alone */
  if (c->kind == UST__CAND_NATIVE && c->proc != NULL) {
    if (ust__procrun_lost(c->proc, NULL, 0))
      return -1;
    if (ready_here(c, r)) {
      v->native = atomic_load_explicit(&c->loaded, memory_order_acquire);
    } else if (serving || (call->device != UST__DEV_CPU && !ust__procrun_gpu())) {
      return -1; /* qualifies first, on copies of the calls it sees in shadow */
    } else if (ust__procrun_busy(c->proc)) {
      ust__procrun_note_busy(c->proc); /* another thread's call is there: production alone, not waiting */
      return -1;
    } else {
      v->proc = c->proc;
      v->remote = 1;
    }
  }
  v->abi = c->abi;
  v->compare = c->compare;
  v->writes_mask = b->writes_mask;
  v->overwrites_mask = b->overwrites_mask;
  v->compared_returns = b->def->compared_returns;
  v->deadline_ns = c->deadline_ns;
  v->torch_op_name = c->torch_op;
  if (c->kind != UST__CAND_TORCH_OP)
    return 0;
  /* the op may be defined after enable: resolved at its first call then */
  void *h = torch_handle(b, &c->seam_op, c->torch_op, c->torch_overload);
  if (h != NULL && c->torch_qualify && !ready_here(c, r)) {
    if (serving)
      return -1; /* qualifies first, on copies of the calls it sees in shadow */
    h = torch_handle(b, &c->seam_qualify_op, c->torch_op, "qualify");
    v->remote = 1;
  }
  if (h == NULL)
    atomic_fetch_add_explicit(&c->waiting, 1, memory_order_relaxed);
  v->torch_op = h;
  return h != NULL ? 0 : -1;
}

/* Whether the call may run its candidate now (guard/flight.h): 1 admitted,
 * its place among the calls in flight in st; 0 when production serves it
 * instead (a call of the candidate is inside past its deadline, or as many
 * as it has earned; counted on the route). A call run in the qualifying
 * process (native, or a torch op's qualifying overload) is tracked but held
 * to its deadline there. */
static int admit_cand(ust__binding *b, ust__route *r, int serving, ust__call_state *st) {
  ust__flight_ticket tk;
  const uint64_t deadline = st->cand.remote ? 0 : st->cand.deadline_ns;
  if (!ust__flight_admit(b->router->flights, &r->flight, r, deadline, serving, &tk))
    return 0;
  st->flight = tk.index + 1;
  st->flight_gen = tk.gen;
  return 1;
}

/* The call leaves the table of calls in flight, if it is there; 1 when the
 * sweep found it past its deadline, with how long it ran in *ran_ns. */
static int leave_flight(ust__call_state *st, uint64_t *ran_ns) {
  ust__route *r = st->route;
  *ran_ns = 0;
  if (st->flight == 0 || r == NULL)
    return 0;
  ust__flight_ticket tk = {st->flight - 1, st->flight_gen};
  st->flight = 0;
  return ust__flight_end(r->binding->router->flights, &r->flight, &tk, ust__now_ns(), ran_ns);
}

/* A slot for a sampled call (count: the route's sampling counter; pol NULL:
 * every call is); NULL when not sampled or none is free (the skip is
 * counted). arms: how its times may be taken (ust__slot_route's). */
static void *take_slot(ust__binding *b, const ust__call *call, ust__route *r, atomic_uint_fast64_t *count,
                       const ust__policy *pol, int serving, int remote, int arms, ust__call_state *st) {
#if !defined(UST_GPU_CUDA) && !defined(UST_GPU_HIP)
  if (call->device != UST__DEV_CPU)
    return NULL;
#endif
  uint64_t n = atomic_fetch_add_explicit(count, 1, memory_order_relaxed) + 1;
  if (pol != NULL && !ust__sampled(n, pol->sample_q32))
    return NULL;
  ust__floor_defer defer; /* a varlen floor whose lengths are on the device waits for them */
  int deferring = 0;
  const uint64_t tsol_ps = call_tsol_ps(r, call, st, call->device == UST__DEV_CPU ? NULL : &defer, &deferring);
  const int tag1 = deferring ? ust__timers_stage(b->router->timers, call->device_id, &defer) : 0;
  ust__slot_route sr = {r, &r->verify, b->cand, serving, remote,
                        atomic_load_explicit(&r->rollout.served_cand, memory_order_relaxed),
                        atomic_load_explicit(&r->rollout.transitions, memory_order_relaxed), tsol_ps,
                        st->timed_kind, arms, tag1};
  void *slot = ust__shadow_acquire(b->router->shadow, &sr);
  if (slot == NULL)
    ust__timers_stage_floor(b->router->timers, tag1, 0); /* its area back */
  st->floor_tag1 = slot != NULL ? tag1 : 0;
  return slot;
}

/* A call the route's sampling would have verified, but that goes without:
 * counted as skipped for reason. */
static void skip_sampled(ust__route *r, int mode, const ust__policy *pol, int reason) {
  atomic_uint_fast64_t *count = mode == UST__MODE_SHADOW ? &r->shadow_seen : &r->verify_seen;
  if (mode != UST__MODE_SHADOW && mode != UST__MODE_CANARY && mode != UST__MODE_LIVE)
    return;
  uint64_t n = atomic_fetch_add_explicit(count, 1, memory_order_relaxed) + 1;
  if (ust__sampled(n, pol->sample_q32))
    ust__verify_skipped(&r->verify, reason);
}

/* The evidence of a candidate's failure known on the host (fail: ust__fail;
 * the message after prefix), or NULL out of memory. */
static ust__evidence *failure_evidence(int fail, const char *prefix, const char *msg) {
  ust__evidence *e = calloc(1, sizeof *e);
  if (e != NULL) {
    e->unix_ms = ust__unix_ms();
    snprintf(e->reason, sizeof e->reason, "%s", ust__fail_name(fail > 0 ? fail : UST__FAIL_ERROR));
    snprintf(e->message, sizeof e->message, "%s%s", prefix, msg != NULL ? msg : "");
  }
  return e;
}

/* A captured call holds production alone for why: counted; said in the log
 * when the route's reason changes (a capture holds thousands of calls). */
static void graph_plain(ust__route *r, int why, const char *detail) {
  const int before = atomic_load_explicit(&r->verify.graph_why, memory_order_relaxed);
  ust__verify_graph_plain(&r->verify, why);
  if (before != why && detail != NULL && detail[0] != '\0')
    ust__log(r->binding->router->log, UST_LOG_WARN, "%s: captured without its shadow: %s", r->key_str, detail);
}

/* A call of a shadow, canary or live route being captured into a CUDA
 * graph: the candidate's side is captured with production (guard/graph.c),
 * when its candidate can be: the gate then decides at each replay whether
 * it runs, is verified, serves. Else the call holds production alone,
 * counted with the reason. 0 when the plan is the captured shadow. */
static int graph_shadow_begin(ust__binding *b, ust__route *r, int mode, const ust__call *call,
                              const ust__policy *pol, ust__call_state *st) {
  ust__graphs *g = b->router->graphs;
  if (g == NULL || b->cand == NULL)
    return -1;
  if (b->cand->no_capture) {
    ust__verify_graph_plain(&r->verify, UST__GW_NO_CAPTURE);
    return -1;
  }
  if (mode == UST__MODE_SHADOW ? pol->sample_q32 == 0 || atomic_load_explicit(&r->verify.paused, memory_order_relaxed)
                               : b->cand->kind != UST__CAND_NATIVE || b->cand->proc != NULL)
    return -1; /* nothing to verify; or canary, live: the candidate is captured alone (below) */
  if (cand_view(b, r, call, 0, &st->cand) != 0) {
    if (b->cand->kind == UST__CAND_NATIVE && b->cand->proc != NULL)
      ust__verify_graph_plain(&r->verify, UST__GW_REMOTE);
    return -1;
  }
  if (st->cand.kind != UST__CAND_NATIVE || st->cand.proc != NULL) {
    ust__verify_graph_plain(&r->verify, st->cand.proc != NULL ? UST__GW_REMOTE : UST__GW_TORCH_OP);
    memset(&st->cand, 0, sizeof st->cand);
    return -1;
  }
  ust__graph_call *c = malloc(sizeof *c);
  const ust__slot_route sr = {r, &r->verify, b->cand, 0, 0,
                              atomic_load_explicit(&r->rollout.served_cand, memory_order_relaxed),
                              atomic_load_explicit(&r->rollout.transitions, memory_order_relaxed),
                              call_tsol_ps(r, call, st, NULL, NULL)};
  if (c == NULL || ust__graph_call_begin(g, &sr, call->device_id, call->stream, c) != 0) {
#if defined(UST_GPU_CUDA)
    graph_plain(r, UST__GW_CAPTURE, c == NULL ? "out of memory" : ust_last_error());
#else
    graph_plain(r, UST__GW_UNSUPPORTED, ust_last_error());
#endif
    free(c);
    memset(&st->cand, 0, sizeof st->cand);
    return -1;
  }
  /* shadow's replays only verify: beside the chain, when it fits */
  c->beside = mode == UST__MODE_SHADOW && b->router->graph_beside_max > 0;
  c->kept_max = b->router->graph_beside_max;
  c->launch = b->router->graph_beside_launch;
  c->start_kernel = b->router->graph_start_kernel;
  st->graph = c;
  st->plan = UST__PLAN_SHADOW;
  st->flags = UST__DF_CAPTURED;
  st->tsol_ps = sr.tsol_ps;
  return 0;
}

/* The call's captured shadow, dropped (ok 0) or whole in its graph. */
static void graph_shadow_end(ust__call_state *st, int ok, int why) {
  ust__graph_call *c = st->graph;
  if (c == NULL)
    return;
  st->graph = NULL;
  ust__route *r = st->route;
  if (c->open)
    ust__graph_part_end(c, 0);
  if (ok)
    ust__verify_graph_shadowed(&r->verify, c->beside);
  else
    graph_plain(r, why, c->why);
  ust__graph_call_end(c, ok);
  /* its parts took graph ids: the tracer's map of the capture's replays */
  ust__timers_graph_made(r->binding->router->timers, c->stream);
  free(c);
}

int ust__call_graph_part_begin(ust__call_state *st, void **side) {
  *side = NULL;
  if (st->graph == NULL)
    return -1;
  ust__graph_call *c = st->graph;
  if (ust__graph_part_begin(c, side) != 0) {
    snprintf(c->why, sizeof c->why, "%s", ust_last_error());
    graph_shadow_end(st, 0, UST__GW_CAPTURE);
    return -1;
  }
  return 0;
}

int ust__call_graph_part_end(ust__call_state *st, int keep, int why) {
  ust__graph_call *c = st->graph;
  if (c == NULL)
    return -1;
  if (ust__graph_part_end(c, keep) != 0 || !keep) {
    graph_shadow_end(st, 0, keep ? c->why_code : why);
    return -1;
  }
  return 0;
}

int ust__call_graph_beside(const ust__call_state *st) {
  const ust__graph_call *c = st->graph;
  return c != NULL && c->beside;
}

void ust__call_graph_beside_plan(ust__call_state *st, uint64_t bytes) {
  ust__graph_call *c = st->graph;
  if (c != NULL && c->parts == 0 && !c->open && bytes > c->kept_max)
    c->beside = 0;
}

void *ust__call_graph_alloc(ust__call_state *st, uint64_t bytes) {
  ust__graph_call *c = st->graph;
  if (c == NULL || !c->beside)
    return NULL;
  if (c->kept + bytes > c->kept_max) {
    ust__error(UST_EINVAL, "its copies beside the chain would keep more than %llu bytes (shadow.graph_beside_max_mb)",
               (unsigned long long)c->kept_max);
    return NULL;
  }
  void *p = ust__graph_keep(c, (size_t)bytes); /* NULL: the error says why */
  c->kept += p != NULL ? bytes : 0;
  return p;
}

void ust__call_graph_drop(ust__call_state *st, int why, const char *detail) {
  ust__graph_call *c = st->graph;
  if (c != NULL && detail != NULL && detail[0] != '\0')
    snprintf(c->why, sizeof c->why, "%s", detail);
  graph_shadow_end(st, 0, why);
}

/* rc of a step of the call's open part: on failure its shadow is dropped. */
static int graph_step(ust__call_state *st, int rc) {
  if (rc != 0)
    graph_shadow_end(st, 0, UST__GW_CAPTURE);
  return rc != 0 ? -1 : 0;
}

int ust__call_graph_copy(ust__call_state *st, void *dst, const void *src, size_t bytes) {
  return st->graph == NULL ? -1 : graph_step(st, ust__graph_copy(st->graph, dst, src, bytes));
}

int ust__call_graph_fill(ust__call_state *st, void *dst, int byte, size_t bytes) {
  return st->graph == NULL ? -1 : graph_step(st, ust__graph_fill(st->graph, dst, byte, bytes));
}

int ust__call_graph_compare(ust__call_state *st, const ust__pair *pairs, int n_pairs, void *dev_stats, int servable) {
  ust__graph_call *c = st->graph;
  if (c == NULL)
    return -1;
  if (graph_step(st, ust__graph_call_finish(c, pairs, n_pairs, dev_stats, servable)) != 0 ||
      ust__call_graph_part_end(st, 1, UST__GW_CAPTURE) != 0)
    return -1;
  graph_shadow_end(st, 1, UST__GW_NONE);
  return 0;
}

void ust__call_graph_prod(ust__call_state *st, const ust__call *call, int end) {
  ust__route *r = st->route;
  if (r == NULL || !(st->flags & UST__DF_CAPTURED))
    return;
  ust__timers *t = r->binding->router->timers;
  if (!end) {
    st->capture_marked = ust__timers_capture_mark(t, call->stream, &st->capture_from) == 0;
  } else if (st->capture_marked) {
    /* now, before the shadow's second part: production's nodes alone */
    ust__timers_captured(t, call->stream, st->capture_from, &r->figs, st->tsol_ps);
    st->capture_marked = 0;
  }
}

int ust__call_graph_active(const ust__call_state *st) {
  return st->graph != NULL && ust__graph_part_active(st->graph);
}

void ust__call_graph_failed(ust__call_state *st, int fail, const char *msg) {
  ust__route *r = st->route;
  if (r == NULL)
    return;
  /* a shadow call that failed: its own verdict, as an eager call's failure */
  const uint64_t n = ust__verify_failed_call(&r->verify);
  ust__evidence *e = failure_evidence(fail, "while captured into a CUDA graph: ", msg);
  if (e != NULL)
    e->shadow_call = n;
  ust__rollout_roll_back(&r->rollout, e);
}

/* The parts of a call's plan that an observed call does not run, each
 * out of its body so that the observed path stays a few lines of code: */

/* a call made while its stream captures a graph. Replays do not come back
 * here: what is captured is what they run. */
static UST__NOINLINE void begin_captured(ust__binding *b, ust__route *r, int mode, const ust__call *call,
                                         const ust__policy *pol, ust__call_state *st) {
  st->capturing = 1;
  ust__figs_captured_call(&r->figs, st->timed_kind == UST__TIMED_STEADY);
  if ((mode == UST__MODE_SHADOW || mode == UST__MODE_CANARY || mode == UST__MODE_LIVE) &&
      graph_shadow_begin(b, r, mode, call, pol, st) == 0)
    return; /* both arms captured, the gate choosing at each replay */
  if (b->cand != NULL)
    skip_sampled(r, mode, pol, UST__SKIP_CAPTURE);
  if (mode == UST__MODE_LIVE && ust__rollout_qualified(&r->rollout) && !b->cand->no_capture &&
      cand_view(b, r, call, 1, &st->cand) == 0) {
    st->plan = UST__PLAN_SERVE;
    st->flags = UST__DF_NO_SNAPSHOTS;
  } else if (mode != UST__MODE_OFF && ust__timers_capture_mark(b->router->timers, call->stream, &st->capture_from) == 0) {
    /* production's nodes: their replays are this route's calls */
    st->capture_marked = 1;
    st->tsol_ps = call_tsol_ps(r, call, st, NULL, NULL);
  }
}

/* a route with a candidate (shadow, canary, live): 1 when the call's plan
 * is set, 0 when it is observed as any other (sampled for timing) */
static UST__NOINLINE int begin_candidate(ust__binding *b, ust__route *r, int mode, uint32_t canary_q32,
                                         const ust__call *call, const ust__policy *pol, ust__call_state *st) {
  if ((mode == UST__MODE_CANARY || mode == UST__MODE_LIVE) &&
      (!ust__rollout_qualified(&r->rollout) || !ready_here(b->cand, r))) {
    /* Before its first served call the candidate qualifies on copies of the
     * arguments, as in shadow: every call is shadowed until one passes
     * (production runs once: its times are no sample). */
    if (atomic_load_explicit(&r->verify.paused, memory_order_relaxed))
      ust__verify_skipped(&r->verify, UST__SKIP_BUDGET);
    else if (cand_view(b, r, call, 0, &st->cand) == 0 && admit_cand(b, r, 0, st) &&
             (st->slot = take_slot(b, call, r, &r->shadow_seen, NULL, 0, st->cand.remote, 0, st)) != NULL) {
      st->plan = UST__PLAN_SHADOW;
      return 1;
    }
  } else if (mode == UST__MODE_CANARY || mode == UST__MODE_LIVE) {
    uint64_t c = atomic_fetch_add_explicit(&r->canary_seen, 1, memory_order_relaxed) + 1;
    if ((mode == UST__MODE_LIVE || ust__sampled(c, canary_q32)) && cand_view(b, r, call, 1, &st->cand) == 0 &&
        admit_cand(b, r, 1, st)) {
      /* A/A runs where the verified calls' times decide: a canary's promotion by speed */
      const int aa = mode == UST__MODE_CANARY && pol->promotion.enabled && pol->promotion.min_speedup > 0;
      st->slot = take_slot(b, call, r, &r->verify_seen, pol, 1, 0, aa ? UST__DF_AA : 0, st);
      st->plan = st->slot != NULL ? UST__PLAN_SERVE_VERIFIED : UST__PLAN_SERVE;
      /* a host comparison concludes at once; a device one waits only when strict */
      if (st->slot != NULL && (call->device != UST__DEV_CUDA || pol->strict))
        st->flags = UST__DF_WAIT_VERDICT;
      st->flags |= ust__shadow_arms(st->slot); /* the order its arms run in */
      return 1;
    }
  } else if (mode == UST__MODE_SHADOW && atomic_load_explicit(&r->verify.paused, memory_order_relaxed)) {
    skip_sampled(r, mode, pol, UST__SKIP_BUDGET);
  } else if (mode == UST__MODE_SHADOW && cand_view(b, r, call, 0, &st->cand) == 0 && admit_cand(b, r, 0, st)) {
    if ((st->slot = take_slot(b, call, r, &r->shadow_seen, pol, 0, st->cand.remote, UST__DF_ARMS | UST__DF_AA,
                              st)) != NULL) {
      st->plan = UST__PLAN_SHADOW; /* a shadowed call times production itself, beside the candidate */
      st->flags |= ust__shadow_arms(st->slot);
      return 1;
    }
  }
  uint64_t ran;
  leave_flight(st, &ran); /* admitted, but not sampled or no slot: production alone */
  return 0;
}

/* a call chosen to be timed: its floor, and its timer started */
static UST__NOINLINE void begin_timing(ust__binding *b, ust__route *r, const ust__call *call, int legacy,
                                       ust__call_state *st) {
  ust__floor_defer defer; /* a varlen floor whose lengths are on the device waits for them */
  int deferring = 0;
  st->tsol_ps = call_tsol_ps(r, call, st, call->device == UST__DEV_CPU ? NULL : &defer, &deferring);
  if (call->device == UST__DEV_CPU) {
    st->timing = 1;
    st->t0_ns = ust__now_ns();
  } else if (!legacy || !ust__gpu_capturing(NULL)) { /* an error there: another thread captures */
    st->gpu_slot = ust__timers_begin(b->router->timers, call->device_id, call->stream, &b->hold);
    if (st->gpu_slot >= 0)
      st->timing = 2;
    else
      ust__figs_timing_dropped(&r->figs);
    if (st->gpu_slot >= 0 && deferring) { /* its work noted now, or by ust__call_nested_done */
      defer.work_noted = 1;
      ust__timers_defer_floor(b->router->timers, st->gpu_slot, &defer, UST__FLOOR_OWN);
    }
  }
}

/* Whether the n-th call of a route that only observes (standing for w
 * calls) is timed: -1 when it is not, else the stratum it is timed in (UST__TIMED_*). Timed are a sample
 * (the steady share past the key's first steady_after calls) and the first
 * UST__FIRST_TIMED calls of every key, so that no key seen is without a
 * latency, whatever the sampling (sample 0 times none); inside a
 * kernel-tracing window every CUDA call is timed by its kernels; between
 * windows, while the tracer is the timer, only the key's first calls are (by
 * events, kept apart), so that the sampled figures are all kernel time. */
static UST__INLINE int timed_kind(const ust__binding *b, const ust__policy *pol, uint64_t n, unsigned w,
                                  const ust__call *call) {
  if (pol->sample_q32 == 0)
    return -1;
  const int late = n > pol->steady_after;
  /* a call that stands for w calls (n - w + 1 .. n) is sampled when one of them would be */
  const uint32_t q = late ? pol->steady_q32 : pol->sample_q32;
  const int sampled = q == UINT32_MAX || ust__share_floor(n, q) != ust__share_floor(n - w, q);
  const int early = n - w < UST__FIRST_TIMED;
  const int tracing = call->device == UST__DEV_CUDA && b->router->tracer ? ust__timers_tracing(b->router->timers)
                                                                         : UST__TRACING_OFF;
  if (tracing != UST__TRACING_WINDOW && !early && (!sampled || tracing == UST__TRACING_BETWEEN))
    return -1;
  if (early && (!sampled || tracing == UST__TRACING_BETWEEN))
    return UST__TIMED_FIRST; /* timed for being one of the key's first calls */
  return late ? UST__TIMED_STEADY : UST__TIMED_SAMPLED;
}

/* Whether a call in mode asks if its stream captures a graph: a CUDA call.
 * CUDA refuses to capture torch's default stream (the legacy one, NULL): a
 * call on it that only observes skips the question (a driver call, cold on
 * every call of a model); the timer asks before it records there. */
static UST__INLINE int asks_capture(const ust__call *call, int mode) {
  return call->device == UST__DEV_CUDA &&
         (call->stream != NULL || (mode != UST__MODE_OBSERVE && mode != UST__MODE_OFF));
}

/* The plan of the n-th call of route r (DESIGN.md, one call step by step):
 * - during graph capture nothing is timed; a shadow, canary or live route
 *   whose candidate the graph can hold captures both arms behind a gate
 *   (guard/graph.c); else a live candidate is captured alone, everything
 *   else is production;
 * - shadow: production serves; sampled calls also run the candidate;
 * - canary(p): the candidate serves a p share of the calls, live all of
 *   them; a sample of those is verified against production;
 * - otherwise production serves, timed as timed_kind says. */
static UST__NOINLINE void begin_route(ust__binding *b, ust__route *r, uint64_t n, unsigned w, int mode,
                                      uint32_t canary_q32, const ust__call *call, ust__call_state *st) {
  memset(st, 0, sizeof *st);
  st->plan = UST__PLAN_PASS;
  st->route = r;
  st->nested_ok = b->nested_ok;
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  /* past its first steady_after calls a key is sampled at the steady share,
   * and whatever times it is the estimate's late stratum (ust__est_device_time) */
  st->timed_kind = n > pol->steady_after ? UST__TIMED_STEADY : UST__TIMED_SAMPLED;
  const int legacy = call->device == UST__DEV_CUDA && call->stream == NULL;
  if (asks_capture(call, mode) && ust__gpu_capturing(call->stream)) {
    begin_captured(b, r, mode, call, pol, st);
    return;
  }
  if (mode == UST__MODE_OFF)
    return;
  if (mode != UST__MODE_OBSERVE && begin_candidate(b, r, mode, canary_q32, call, pol, st))
    return;
  const int kind = timed_kind(b, pol, n, w, call);
  if (kind < 0)
    return;
  st->timed_kind = kind;
  begin_timing(b, r, call, legacy, st);
}

/* The common case settled in a few lines: a call counted on its route that
 * production alone serves untimed (observed, not sampled, not captured), or
 * an untracked one; st->route says which (NULL: untracked). The rest are
 * planned by begin_route. */
UST__HOT int ust__call_settle(ust__binding *b, const ust__call *call, unsigned w, ust__call_state *st) {
  st->route = NULL;
  if (call->device == UST__DEV_OTHER)
    return 1;
  ust__route_key key;
  const uint64_t h = key_build(b, call, &key);
  ust__route *r = routes_find(b->router, &key, h, b);
  st->route = r;
  if (r == NULL) { /* every call it stands for */
    atomic_fetch_add_explicit(&b->untracked, w, memory_order_relaxed);
    return 1;
  }
  uint32_t canary_q32 = 0;
  const int mode = ust__rollout_mode(&r->rollout, &canary_q32);
  const uint64_t n = ust__figs_count(&r->figs, w);
  if (mode == UST__MODE_OBSERVE && !asks_capture(call, mode) &&
      timed_kind(b, atomic_load_explicit(&b->op->policy, memory_order_acquire), n, w, call) < 0)
    return 1;
  begin_route(b, r, n, w, mode, canary_q32, call, st);
  return 0;
}

UST__HOT void ust__call_end(const ust__call *call, ust__call_state *st, const ust__decision *d) {
  ust__route *r = st->route;
  if (r == NULL)
    return;
  if (st->nested_ok && st->timing != 0) {
    const ust__nested none = {0};
    ust__call_nested_done(st, &none); /* no nested floor reached it: its own */
  }
  if (d->notes & UST__NOTE_INTERNAL)
    ust__call_internal_error(r->binding);
  uint64_t ran;
  leave_flight(st, &ran); /* its candidate never ran, or ran without ust__call_cand_end */
  if (st->graph != NULL) /* a captured shadow the decision did not take to its comparison */
    graph_shadow_end(st, 0, UST__GW_CAPTURE);
  if (d->notes != 0)
    ust__rollout_served(&r->rollout, d->notes, st->capturing);
  if (st->capture_marked && d->outcome == UST__OUT_PRODUCTION)
    ust__timers_captured(r->binding->router->timers, call->stream, st->capture_from, &r->figs, st->tsol_ps);
  if (st->timing == 2) {
    if (d->outcome == UST__OUT_PRODUCTION)
      ust__timers_end(r->binding->router->timers, st->gpu_slot, call->stream, &r->figs, st->tsol_ps, st->timed_kind);
    else
      ust__timers_cancel(r->binding->router->timers, st->gpu_slot);
  } else if (st->timing == 1 && d->outcome == UST__OUT_PRODUCTION) {
    ust__figs_timed(&r->figs, ust__now_ns() - st->t0_ns, st->tsol_ps, st->timed_kind);
  }
  st->timing = 0;
}

void ust__call_mark(ust__call_state *st, int mark, const ust__call *call) {
  if (st->slot != NULL)
    ust__shadow_mark(st->slot, mark, call->device, call->stream);
}

int ust__call_slot_alive(const ust__call_state *st) { return ust__shadow_alive(st->slot); }

void ust__call_note_copied(ust__call_state *st, uint64_t bytes) { ust__shadow_note_copied(st->slot, bytes); }

int ust__call_aa(const ust__call_state *st) { return st->slot != NULL && ust__shadow_aa(st->slot); }

void ust__call_compare(ust__call_state *st, const ust__call *call, const ust__pair *pairs, int n_pairs, int fail,
                       const char *msg) {
  void *slot = st->slot;
  st->slot = NULL;
  if (st->floor_tag1 > 0) /* before the comparison that fences the verdict; the sink reads them */
    ust__timers_stage_copy(((ust__route *)st->route)->binding->router->timers, st->floor_tag1, call->stream);
  st->floor_tag1 = 0;
  ust__shadow_finish(slot, call->device, call->stream, pairs, n_pairs, fail, msg);
}

void ust__call_abandon(ust__call_state *st, const ust__call *call) {
  graph_shadow_end(st, 0, UST__GW_CAPTURE);
  void *slot = st->slot;
  st->slot = NULL;
  st->floor_tag1 = 0; /* not copied: the sink gives its area back */
  ust__shadow_abandon(slot, call->device, call->stream);
}

void ust__call_want_verdict(ust__call_state *st) { ust__shadow_want_verdict(st->slot, &st->verdict); }

int ust__call_verdict(ust__call_state *st, const ust__call *call) {
  ust__route *r = st->route;
  return ust__shadow_verdict(r->binding->router->shadow, &st->verdict, call->device, call->stream, 1) == 1;
}

void ust__call_cand_failed(ust__call_state *st, int fail, const char *msg) {
  ust__route *r = st->route;
  if (r == NULL)
    return;
  ust__evidence *e = failure_evidence(fail, "", msg);
  if (e != NULL) {
    e->serving = 1;
    e->served_at = atomic_load(&r->rollout.served_cand);
  }
  ust__rollout_roll_back(&r->rollout, e);
}

void ust__call_cand_begin(ust__call_state *st) {
  ust__route *r = st->route;
  if (st->flight != 0 && r != NULL) {
    const ust__flight_ticket tk = {st->flight - 1, st->flight_gen};
    ust__flight_begin(r->binding->router->flights, &tk, ust__now_ns());
  }
}

int ust__call_cand_end(ust__call_state *st, char *msg, size_t cap) {
  ust__route *r = st->route;
  uint64_t ran = 0;
  const int swept = leave_flight(st, &ran);
  const uint64_t deadline = st->cand.remote ? 0 : st->cand.deadline_ns;
  if (r == NULL || st->capturing || (!swept && (deadline == 0 || ran <= deadline)))
    return 0;
  if (!swept)
    ust__verify_overdue(&r->verify); /* the sweep counted the others */
  snprintf(msg, cap, "candidate took %llu ms, over its deadline of %llu ms%s", (unsigned long long)(ran / 1000000u),
           (unsigned long long)(deadline / 1000000u),
           swept ? " (its route was rolled back at the deadline, while the call ran)" : "");
  return 1;
}

int ust__call_run_remote(ust__call_state *st, const struct ust_candidate_call *call, char *msg, size_t cap) {
  _Static_assert(UST__CALL_REMOTE_LOST == UST__PROCRUN_LOST && UST__CALL_REMOTE_UNSENT == UST__PROCRUN_UNSENT &&
                     UST__CALL_REMOTE_BUSY == UST__PROCRUN_BUSY,
                 "one set of codes");
  return ust__procrun_call(st->cand.proc, call, st->cand.deadline_ns, msg, cap);
}

void ust__call_internal_error(const ust__binding *b) {
  atomic_fetch_add_explicit(&b->router->internal_errors, 1, memory_order_relaxed);
}

/* ---- learned output layouts ------------------------------------------------------ */

uint64_t ust__call_signature(const ust__call *call) {
  uint64_t h = 0xcbf29ce484222325ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 0x100000001b3ull)
  MIX(call->device);
  MIX(call->device_id); /* a layout names the device its outputs live on */
  for (int i = 0; i < call->nargs; i++) {
    const ust__arg *a = &call->args[i];
    MIX(a->kind);
    if (a->kind == UST__ARG_TENSOR) {
      MIX(a->dtype);
      MIX(a->t.ndim);
      for (int d = 0; d < a->t.ndim; d++) {
        MIX(a->t.shape[d]);
        MIX(a->t.strides != NULL ? a->t.strides[d] : 0);
      }
    } else if (a->kind == UST__ARG_INT || a->kind == UST__ARG_BOOL) {
      MIX(a->i);
    } else if (a->kind == UST__ARG_TENSORLIST) {
      return 0; /* the view carries the first tensor only */
    } else if (a->kind == UST__ARG_INTLIST) {
      if (a->i < 0 || a->i > UST__MAX_LIST)
        return 0; /* values the view does not carry could change the layout */
      MIX(a->i);
      for (int64_t k = 0; k < a->i; k++)
        MIX(a->list[k]);
    } else if (a->kind == UST__ARG_DOUBLE) {
      uint64_t bits;
      memcpy(&bits, &a->f, sizeof bits);
      MIX(bits);
    }
  }
#undef MIX
  return h != 0 ? h : 1;
}

int ust__call_layout(const ust__call_state *st, const ust__call *call, ust__layout *out) {
  const ust__route *r = st->route;
  if (r == NULL)
    return -1;
  const uint64_t sig = ust__call_signature(call);
  if (sig == 0)
    return -1;
  for (int i = 0; i < UST__MAX_LAYOUTS; i++) {
    const ust__layout *l = atomic_load_explicit(&((ust__route *)r)->layouts[i], memory_order_acquire);
    if (l == NULL)
      return -1;
    if (l->sig == sig) {
      *out = *l;
      return 0;
    }
  }
  return -1;
}

void ust__call_learn_layout(const ust__call_state *st, const ust__call *call, const ust__layout *l) {
  ust__route *r = st->route;
  const uint64_t sig = ust__call_signature(call);
  if (r == NULL || sig == 0 || l->n_returns < 0 || l->n_returns > UST__MAX_RETURNS)
    return;
  ust__layout *copy = malloc(sizeof *copy);
  if (copy == NULL) {
    ust__call_internal_error(r->binding); /* not learned: served calls without verification fall to production */
    return;
  }
  *copy = *l;
  copy->sig = sig;
  for (int i = 0; i < UST__MAX_LAYOUTS; i++) {
    ust__layout *expected = NULL;
    if (atomic_compare_exchange_strong(&r->layouts[i], &expected, copy))
      return;
    if (expected->sig == sig)
      break; /* learned already */
  }
  free(copy);
}
