/*
 * A route's guard parts in the report (plugin/report.c calls these): its
 * rollout (the mode, the calls each arm served, the last transition, the
 * promotion test) and the candidate's calls in flight. Additive figures
 * only: what is derived from them is ust__report_derive's.
 */
#include <math.h>

#include <cjson/cJSON.h>

#include "plugin/engine.h"

static cJSON *add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v); }

/* The candidate's calls in flight on the route (guard/flight.h). */
cJSON *ust__report_flight(const ust__flight_snap *f) {
  cJSON *j = cJSON_CreateObject();
  add_num(j, "inside", (double)f->inside);
  add_num(j, "overdue_inside", (double)f->overdue_inside);
  add_num(j, "bound", (double)(1 + f->in_time));
  add_num(j, "swept", (double)f->swept);
  cJSON *held = cJSON_AddObjectToObject(j, "held");
  for (int i = 0; i < UST__HELD_COUNT; i++)
    add_num(held, ust__held_name(i), (double)f->held[i]);
  return j;
}

/* The route's rollout: its mode, who served its calls, its last
 * transition and its promotion test. */
cJSON *ust__report_rollout(const ust__route_snap *s) {
  const ust__rollout_snap *r = &s->rollout;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "mode", ust__mode_name(r->mode));
  if (r->mode == UST__MODE_CANARY)
    add_num(j, "canary", r->canary);
  cJSON_AddStringToObject(j, "set_by", r->own ? "route" : "operator");
  cJSON_AddBoolToObject(j, "qualified", r->qualified);
  /* Every tracked call outside capture that the candidate did not serve was
   * production's (its outputs, or its exception): derived, not counted per
   * call. The snapshot read the served count before the calls. */
  cJSON *sv = cJSON_AddObjectToObject(j, "served");
  add_num(sv, "production", (double)(s->figs.calls - s->figs.captured - r->served_cand));
  add_num(sv, "candidate", (double)r->served_cand);
  add_num(sv, "candidate_verified", (double)r->served_cand_verified);
  add_num(sv, "unlearned", (double)r->served_unlearned);
  cJSON *cap = cJSON_AddObjectToObject(j, "captured");
  add_num(cap, "production", (double)(s->figs.captured - r->captured_cand));
  add_num(cap, "candidate", (double)r->captured_cand);
  add_num(j, "transitions", (double)r->transitions);
  if (r->has_last) {
    cJSON *t = cJSON_AddObjectToObject(j, "last_transition");
    cJSON_AddStringToObject(t, "from", r->last_from);
    cJSON_AddStringToObject(t, "to", r->last_to);
    cJSON_AddStringToObject(t, "by", r->last_by);
    cJSON_AddStringToObject(t, "reason", r->last_reason);
    add_num(t, "unix_ms", (double)r->last_unix_ms);
  }
  if (r->promotion_state[0] != '\0') {
    cJSON *pr = cJSON_AddObjectToObject(j, "promotion");
    cJSON_AddStringToObject(pr, "state", r->promotion_state);
    add_num(pr, "passes_in_stage", (double)r->stage_passes);
    add_num(pr, "needed", r->promotion_needed);
    add_num(pr, "min_speedup", r->promotion_min_speedup);
    add_num(pr, "alpha", r->promotion.alpha);
    add_num(pr, "delta", r->promotion.delta);
    /* the delta judged with: production's own A/A spread on the route when larger */
    add_num(pr, "delta_used", r->promotion_delta);
    cJSON *aa = cJSON_AddObjectToObject(pr, "aa_spread");
    add_num(aa, "checks", r->aa_samples);
    if (r->aa_spread >= 0)
      add_num(aa, "median", r->aa_spread);
    else
      cJSON_AddNullToObject(aa, "median");
    add_num(pr, "max_samples", r->promotion.max_samples);
    const ust__seq_verdict *v = &r->promotion_test;
    if (v->n > 0) {
      /* the stage's paired samples, as ratios T_candidate / T_production */
      cJSON *t = cJSON_AddObjectToObject(pr, "test");
      add_num(t, "samples", v->n);
      add_num(t, "ratio_median", exp(v->median));
      if (isfinite(v->lower) && isfinite(v->upper)) {
        add_num(t, "ratio_lower", exp(v->lower));
        add_num(t, "ratio_upper", exp(v->upper));
      } else {
        cJSON_AddNullToObject(t, "ratio_lower");
        cJSON_AddNullToObject(t, "ratio_upper");
      }
    }
    if (r->promotion_note[0] != '\0')
      cJSON_AddStringToObject(pr, "note", r->promotion_note);
  }
  return j;
}
