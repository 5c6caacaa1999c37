/* The serving decision (guard/decision.h): a state machine over the steps
 * the bridge performs. Every transition is in ust__decision_next. */
#include <string.h>

#include "base/base.h"
#include "guard/decision.h"

#define MAX_STEPS 16

static int go(ust__decision *d, int step) { return d->at = step; }

static int done(ust__decision *d, int outcome) {
  d->outcome = outcome;
  if (outcome == UST__OUT_CANDIDATE) {
    d->notes |= UST__NOTE_SERVED_CANDIDATE;
    if (d->plan == UST__PLAN_SERVE_VERIFIED)
      d->notes |= UST__NOTE_VERIFIED_SERVING;
  }
  return go(d, UST__STEP_DONE);
}

/* Production serves on the caller's arguments, after undoing whatever the
 * candidate may have written there. */
static int production_on_args(ust__decision *d) {
  if (d->cand_touched && d->snapshots)
    return go(d, UST__STEP_RESTORE);
  return go(d, UST__STEP_PROD_ON_ARGS);
}

/* Release the slot, if the call holds one, then take step. */
static int abandon_then(ust__decision *d, int step) {
  if (d->slot) {
    d->after = step;
    return go(d, UST__STEP_ABANDON);
  }
  return step == UST__STEP_PROD_ON_ARGS ? production_on_args(d) : go(d, step);
}

/* Release the slot, if held, then finish with outcome. */
static int abandon_then_done(ust__decision *d, int outcome) {
  if (d->slot) {
    d->after = UST__STEP_DONE;
    d->pending = outcome;
    return go(d, UST__STEP_ABANDON);
  }
  return done(d, outcome);
}

/* Production ran on the snapshots: its writes go back into the caller's
 * arguments, then outcome (its returns, or its exception). */
static int copy_back_then(ust__decision *d, int outcome) {
  d->pending = outcome;
  return abandon_then(d, UST__STEP_COPY_BACK);
}

/* The timed arms of a call, in its order: production's beside the
 * candidate's, the A/A run on the far side of production's, so that the
 * pair compared is always side by side and the A/A pair too:
 *   production first: [A/A], production, candidate
 *   candidate first:  candidate, production, [A/A]
 * In shadow production's arm is a run on copies of its own (it served on
 * the caller's arguments already); serving verified, its run on the
 * snapshots. The step after the last arm is the comparison. */
static int arm_step(const ust__decision *d, int i) {
  const int shadow = d->plan == UST__PLAN_SHADOW;
  const int prod = shadow ? UST__STEP_PROD_ON_COPIES : UST__STEP_PROD_ON_SNAPS;
  const int cand = shadow ? UST__STEP_CAND_ON_SNAPS : UST__STEP_CAND_ON_ARGS;
  const int aa = (d->flags & UST__DF_AA) != 0;
  int seq[3], n = 0;
  if (d->flags & UST__DF_CAND_FIRST) {
    seq[n++] = cand;
    seq[n++] = prod;
    if (aa)
      seq[n++] = UST__STEP_AA_ON_COPIES;
  } else {
    if (aa)
      seq[n++] = UST__STEP_AA_ON_COPIES;
    seq[n++] = prod;
    seq[n++] = cand;
  }
  return i < n ? seq[i] : UST__STEP_COMPARE;
}

static int next_arm(ust__decision *d) { return go(d, arm_step(d, d->arm++)); }

/* Whether a shadow call's pair is timed on copies (arms), or production is
 * timed serving and the candidate after it (a captured shadow, whose
 * replays have no times; a candidate qualifying in its own process, whose
 * time is the wire's). */
static int armed(const ust__decision *d) {
  return d->plan == UST__PLAN_SERVE_VERIFIED || (d->plan == UST__PLAN_SHADOW && (d->flags & UST__DF_ARMS));
}

UST__HOT int ust__decision_start(ust__decision *d, int plan, int flags) {
  memset(d, 0, sizeof *d);
  d->plan = plan >= 0 && plan < UST__PLAN_COUNT ? plan : UST__PLAN_PASS;
  if (d->plan != UST__PLAN_SHADOW || (flags & UST__DF_CAPTURED))
    flags &= ~UST__DF_ARMS;
  d->flags = flags;
  if (!armed(d)) /* an order only where there are arms */
    d->flags &= ~(UST__DF_CAND_FIRST | UST__DF_AA);
  d->slot = d->plan == UST__PLAN_SHADOW || d->plan == UST__PLAN_SERVE_VERIFIED;
  if (d->plan == UST__PLAN_PASS)
    return go(d, UST__STEP_PROD_ON_ARGS);
  if (d->plan == UST__PLAN_SERVE && (flags & UST__DF_NO_SNAPSHOTS))
    return go(d, UST__STEP_CAND_ON_ARGS);
  return go(d, UST__STEP_SNAPSHOT);
}

/* The events each step can produce; anything else is taken as internal. */
static int valid(int step, int ev) {
  switch (step) {
  case UST__STEP_PROD_ON_ARGS:
    return ev == UST__EV_OK || ev == UST__EV_RAISED;
  case UST__STEP_PROD_ON_SNAPS:
  case UST__STEP_PROD_ON_COPIES:
  case UST__STEP_AA_ON_COPIES:
    return ev == UST__EV_OK || ev == UST__EV_RAISED || ev == UST__EV_INTERNAL;
  case UST__STEP_CAND_ON_SNAPS:
  case UST__STEP_CAND_ON_ARGS:
    return ev == UST__EV_OK || ev == UST__EV_RAISED || ev == UST__EV_FAILED || ev == UST__EV_INTERNAL ||
           ev == UST__EV_NO_LAYOUT;
  case UST__STEP_VERDICT:
    return ev == UST__EV_OK || ev == UST__EV_VERDICT_FAILED || ev == UST__EV_INTERNAL;
  default:
    return ev == UST__EV_OK || ev == UST__EV_INTERNAL;
  }
}

UST__HOT int ust__decision_next(ust__decision *d, int ev) {
  const int step = d->at;
  if (step == UST__STEP_DONE)
    return UST__STEP_DONE;
  if (ev < 0 || ev >= UST__EV_COUNT || !valid(step, ev))
    ev = UST__EV_INTERNAL;
  if (ev == UST__EV_INTERNAL)
    d->notes |= UST__NOTE_INTERNAL;
  if (++d->steps > MAX_STEPS) /* no path is this long; production is the safe answer */
    return done(d, d->prod_on_snaps ? UST__OUT_PROD_FROM_SNAPS : UST__OUT_PRODUCTION);

  switch (step) {
  case UST__STEP_SNAPSHOT:
    if (ev != UST__EV_OK) /* nothing ran yet: production serves as if understudy were not there */
      return abandon_then(d, UST__STEP_PROD_ON_ARGS);
    d->snapshots = 1;
    if (d->plan == UST__PLAN_SHADOW)
      return go(d, UST__STEP_PROD_ON_ARGS);
    if (d->plan == UST__PLAN_SERVE_VERIFIED)
      return next_arm(d);
    return go(d, UST__STEP_CAND_ON_ARGS);

  case UST__STEP_PROD_ON_ARGS:
    if (ev == UST__EV_RAISED)
      return abandon_then_done(d, UST__OUT_RAISE);
    if (d->plan == UST__PLAN_SHADOW && d->slot)
      return armed(d) ? next_arm(d) : go(d, UST__STEP_CAND_ON_SNAPS);
    return done(d, UST__OUT_PRODUCTION);

  case UST__STEP_PROD_ON_COPIES:
  case UST__STEP_AA_ON_COPIES: /* a run that failed loses its time, nothing else */
    return next_arm(d);

  case UST__STEP_PROD_ON_SNAPS:
    if (ev == UST__EV_INTERNAL) /* production did not run: it serves plainly (the candidate's writes undone) */
      return abandon_then(d, UST__STEP_PROD_ON_ARGS);
    d->prod_on_snaps = 1;
    if (ev == UST__EV_RAISED) { /* what production alone leaves: its partial writes, its exception */
      d->prod_raised = 1;
      if (d->cand_failed) /* the candidate's failure is this call's verdict still */
        return go(d, UST__STEP_COMPARE);
      return copy_back_then(d, UST__OUT_RAISE);
    }
    if (d->cand_failed)
      return go(d, UST__STEP_COMPARE);
    return next_arm(d);

  case UST__STEP_CAND_ON_SNAPS:
    if (ev == UST__EV_RAISED || ev == UST__EV_FAILED)
      d->cand_failed = 1; /* the failure is the verdict */
    if (d->cand_failed)
      return go(d, UST__STEP_COMPARE);
    if (ev == UST__EV_OK)
      return armed(d) ? next_arm(d) : go(d, UST__STEP_COMPARE);
    return abandon_then_done(d, UST__OUT_PRODUCTION);

  case UST__STEP_CAND_ON_ARGS:
    if (ev != UST__EV_NO_LAYOUT)
      d->cand_touched = 1;
    if (ev == UST__EV_RAISED || ev == UST__EV_FAILED)
      d->cand_failed = 1;
    if (d->plan == UST__PLAN_SERVE_VERIFIED && !d->prod_on_snaps) { /* the candidate first */
      if (ev == UST__EV_OK || d->cand_failed) /* production runs (and serves if need be) either way */
        return next_arm(d);
      if (ev == UST__EV_NO_LAYOUT) { /* it could not run before production: production first, untimed */
        d->flags &= ~(UST__DF_CAND_FIRST | UST__DF_AA);
        d->arm = 0;
        return next_arm(d);
      }
      return abandon_then(d, UST__STEP_PROD_ON_ARGS);
    }
    if (d->plan == UST__PLAN_SERVE_VERIFIED) {
      if (ev == UST__EV_OK || d->cand_failed)
        return go(d, UST__STEP_COMPARE);
      return copy_back_then(d, UST__OUT_PROD_FROM_SNAPS);
    }
    if (ev == UST__EV_OK)
      return done(d, UST__OUT_CANDIDATE);
    if (ev == UST__EV_NO_LAYOUT) {
      d->notes |= UST__NOTE_UNLEARNED;
      return go(d, UST__STEP_PROD_ON_ARGS);
    }
    if (d->cand_failed)
      return go(d, UST__STEP_CAND_FAILED);
    return production_on_args(d);

  case UST__STEP_CAND_FAILED:
    return production_on_args(d);

  case UST__STEP_COMPARE:
    if (ev != UST__EV_OK) { /* the guard did not take the slot */
      if (d->plan == UST__PLAN_SHADOW)
        return abandon_then_done(d, UST__OUT_PRODUCTION);
      return copy_back_then(d, d->prod_raised ? UST__OUT_RAISE : UST__OUT_PROD_FROM_SNAPS);
    }
    d->slot = 0;
    if (d->plan == UST__PLAN_SHADOW)
      return done(d, UST__OUT_PRODUCTION);
    if (d->prod_raised)
      return copy_back_then(d, UST__OUT_RAISE);
    if (d->cand_failed)
      return copy_back_then(d, UST__OUT_PROD_FROM_SNAPS);
    if (d->flags & UST__DF_WAIT_VERDICT)
      return go(d, UST__STEP_VERDICT);
    return done(d, UST__OUT_CANDIDATE);

  case UST__STEP_VERDICT:
    if (ev == UST__EV_OK)
      return done(d, UST__OUT_CANDIDATE);
    return copy_back_then(d, UST__OUT_PROD_FROM_SNAPS);

  case UST__STEP_ABANDON:
    d->slot = 0;
    if (d->after == UST__STEP_DONE)
      return done(d, d->pending);
    return abandon_then(d, d->after);

  case UST__STEP_RESTORE: /* a failed restore still leaves production as the best answer */
    return go(d, UST__STEP_PROD_ON_ARGS);

  case UST__STEP_COPY_BACK:
    return done(d, d->pending);
  }
  return done(d, UST__OUT_PRODUCTION);
}

const char *ust__step_name(int step) {
  static const char *const names[UST__STEP_COUNT] = {
      "done", "snapshot", "prod_on_args", "prod_on_snaps", "cand_on_snaps", "cand_on_args", "compare",
      "abandon", "verdict", "cand_failed", "restore", "copy_back", "prod_on_copies", "aa_on_copies"};
  return step >= 0 && step < UST__STEP_COUNT ? names[step] : "?";
}

const char *ust__event_name(int event) {
  static const char *const names[UST__EV_COUNT] = {"ok", "raised", "failed", "internal", "no_layout",
                                                   "verdict_failed"};
  return event >= 0 && event < UST__EV_COUNT ? names[event] : "?";
}

const char *ust__outcome_name(int outcome) {
  static const char *const names[] = {"none", "production", "prod_from_snaps", "candidate", "raise"};
  return outcome >= 0 && outcome <= UST__OUT_RAISE ? names[outcome] : "?";
}
