/* The serving decision, exhaustively: every plan and flag, every event at
 * every step (events a step cannot produce included), each finished path
 * checked against the rules guard/decision.h states. */
#include "guard/decision.h"
#include "tests/c/runner.h"

typedef struct trace {
  int n;
  int step[32], ev[32];
} trace;

static void print_trace(const ust__decision *d, const trace *t) {
  fprintf(stderr, "plan %d flags %d:", d->plan, d->flags);
  for (int i = 0; i < t->n; i++)
    fprintf(stderr, " %s(%s)", ust__step_name(t->step[i]), ust__event_name(t->ev[i]));
  fprintf(stderr, " -> %s notes %d\n", ust__outcome_name(d->outcome), d->notes);
}

#define RULE(cond, what)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "rule broken: %s\n", what);                                             \
      print_trace(d, t);                                                                      \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

/* An event as the machine takes it: one a step cannot produce is internal. */
static int effective(int step, int ev) {
  ust__decision probe;
  memset(&probe, 0, sizeof probe);
  probe.at = step;
  probe.plan = UST__PLAN_SHADOW;
  ust__decision_next(&probe, ev);
  return (probe.notes & UST__NOTE_INTERNAL) ? UST__EV_INTERNAL : ev;
}

static void check_path(const ust__decision *d, const trace *t) {
  const int slot_plan = d->plan == UST__PLAN_SHADOW || d->plan == UST__PLAN_SERVE_VERIFIED;
  int releases = 0, prod_args = 0, prod_raised = 0, prod_snaps_ran = 0, cand_ok = 0, cand_failed = 0,
      cand_touched = 0, verdict_failed = 0, restored = 0, copied = 0, reported = 0, snap_ok = 0,
      internal_after_cand = 0, compared_ok = 0;
  for (int i = 0; i < t->n; i++) {
    const int s = t->step[i], e = effective(s, t->ev[i]);
    switch (s) {
    case UST__STEP_SNAPSHOT: snap_ok |= e == UST__EV_OK; break;
    case UST__STEP_PROD_ON_ARGS:
      RULE(!prod_snaps_ran, "production never runs on the arguments after it ran on the snapshots");
      RULE(!(cand_touched && snap_ok) || restored, "the candidate's writes are undone before production runs");
      prod_args++;
      prod_raised |= e == UST__EV_RAISED;
      break;
    case UST__STEP_PROD_ON_SNAPS:
      RULE(snap_ok, "production runs on snapshots only once they exist");
      prod_snaps_ran |= e == UST__EV_OK || e == UST__EV_RAISED;
      prod_raised |= e == UST__EV_RAISED;
      break;
    case UST__STEP_CAND_ON_SNAPS:
      RULE(snap_ok, "the candidate runs on snapshots only once they exist");
      /* fallthrough */
    case UST__STEP_CAND_ON_ARGS:
      RULE(d->plan != UST__PLAN_PASS, "a plain call never runs the candidate");
      cand_ok |= e == UST__EV_OK;
      cand_failed |= e == UST__EV_RAISED || e == UST__EV_FAILED;
      if (s == UST__STEP_CAND_ON_ARGS)
        cand_touched |= e != UST__EV_NO_LAYOUT;
      break;
    case UST__STEP_COMPARE:
      RULE(slot_plan && releases == 0, "compare only while the slot is held");
      if (e == UST__EV_OK) {
        releases++;
        compared_ok = 1;
      }
      break;
    case UST__STEP_ABANDON:
      RULE(slot_plan && releases == 0, "abandon only while the slot is held");
      releases++;
      break;
    case UST__STEP_VERDICT:
      RULE(compared_ok && (d->flags & UST__DF_WAIT_VERDICT), "a verdict is asked only after compare, when waited for");
      verdict_failed |= e != UST__EV_OK;
      break;
    case UST__STEP_CAND_FAILED:
      RULE(d->plan == UST__PLAN_SERVE && cand_failed, "the route hears of a failure only on an unverified serve");
      reported++;
      break;
    case UST__STEP_RESTORE:
      RULE(snap_ok && cand_touched && !prod_snaps_ran, "restore only what the candidate touched, from snapshots");
      restored++;
      break;
    case UST__STEP_COPY_BACK:
      RULE(prod_snaps_ran, "copy back only production's writes");
      copied++;
      break;
    }
    if (e == UST__EV_INTERNAL && cand_touched)
      internal_after_cand = 1;
  }
  RULE(t->n <= 12, "a call takes at most 12 steps");
  RULE(d->at == UST__STEP_DONE && d->outcome != UST__OUT_NONE, "every path finishes with an outcome");
  RULE(!slot_plan || releases == 1, "a slot is released exactly once");
  RULE(prod_args <= 1, "production runs on the caller's arguments at most once");
  RULE((d->outcome == UST__OUT_RAISE) == (prod_raised != 0), "production's exception reaches the caller exactly "
                                                             "when production raised");
  if (d->outcome == UST__OUT_CANDIDATE) {
    RULE(cand_ok && !cand_failed && !verdict_failed && !internal_after_cand,
         "the candidate's results are served only when it ran cleanly and no verdict said otherwise");
    RULE(d->plan == UST__PLAN_SERVE || compared_ok, "a verified call serves the candidate only after compare");
    RULE(d->notes & UST__NOTE_SERVED_CANDIDATE, "a call the candidate served is counted");
  } else {
    RULE(!(d->notes & UST__NOTE_SERVED_CANDIDATE), "only calls the candidate served are counted so");
  }
  if (d->outcome == UST__OUT_PROD_FROM_SNAPS || (d->outcome == UST__OUT_RAISE && prod_snaps_ran))
    RULE(copied == 1, "production's writes on the snapshots reach the caller's arguments");
  if (d->outcome == UST__OUT_PRODUCTION)
    RULE(prod_args == 1, "production's results come from its run on the arguments");
  if (cand_failed && d->plan == UST__PLAN_SERVE)
    RULE(reported == 1, "an unverified serving failure rolls the route back");
  if (cand_failed && slot_plan)
    RULE(compared_ok || releases == 1, "a verified failure reaches the guard unless the guard failed");
  if (cand_failed && slot_plan && !(d->notes & UST__NOTE_INTERNAL))
    RULE(compared_ok, "a candidate failure on a verified call is a verdict");
}

static long paths;

static void explore(ust__decision d, trace t, int step) {
  if (step == UST__STEP_DONE) {
    paths++;
    check_path(&d, &t);
    return;
  }
  ASSERT_TRUE(t.n < 32);
  for (int ev = 0; ev < UST__EV_COUNT + 1; ev++) { /* one past the last: an event no step knows */
    ust__decision next = d;
    trace nt = t;
    nt.step[nt.n] = step;
    nt.ev[nt.n++] = ev;
    explore(next, nt, ust__decision_next(&next, ev));
  }
}

TEST(decision_keeps_its_rules_on_every_path) {
  for (int plan = 0; plan < UST__PLAN_COUNT; plan++)
    for (int flags = 0; flags < 4; flags++) {
      ust__decision d;
      trace t;
      memset(&t, 0, sizeof t);
      int first = ust__decision_start(&d, plan, flags);
      explore(d, t, first);
    }
  printf("%ld paths checked\n", paths);
  ASSERT_TRUE(paths > 1000);
}

/* The paths that matter most, spelled out. */
static int run(int plan, int flags, const int *events, int n, int *steps_out) {
  ust__decision d;
  int step = ust__decision_start(&d, plan, flags), k = 0;
  for (int i = 0; step != UST__STEP_DONE; i++) {
    steps_out[k++] = step;
    step = ust__decision_next(&d, i < n ? events[i] : UST__EV_OK);
  }
  steps_out[k] = UST__STEP_DONE;
  return d.outcome;
}

TEST(decision_named_paths) {
  int s[32];
  /* shadow, all well: production serves, the candidate on snapshots, compared */
  int ok[] = {UST__EV_OK, UST__EV_OK, UST__EV_OK, UST__EV_OK};
  ASSERT_INT_EQ(run(UST__PLAN_SHADOW, 0, ok, 4, s), UST__OUT_PRODUCTION);
  ASSERT_INT_EQ(s[0], UST__STEP_SNAPSHOT);
  ASSERT_INT_EQ(s[1], UST__STEP_PROD_ON_ARGS);
  ASSERT_INT_EQ(s[2], UST__STEP_CAND_ON_SNAPS);
  ASSERT_INT_EQ(s[3], UST__STEP_COMPARE);
  /* live, verified, production raising on the snapshots after writing part
   * of them: its writes are copied back and its exception raised; it does
   * not run again */
  int raise[] = {UST__EV_OK, UST__EV_RAISED};
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, UST__DF_WAIT_VERDICT, raise, 2, s), UST__OUT_RAISE);
  ASSERT_INT_EQ(s[2], UST__STEP_ABANDON);
  ASSERT_INT_EQ(s[3], UST__STEP_COPY_BACK);
  ASSERT_INT_EQ(s[4], UST__STEP_DONE);
  /* live, unverified, the candidate raising: the route hears of it, the
   * arguments are restored, production serves */
  int craise[] = {UST__EV_OK, UST__EV_RAISED};
  ASSERT_INT_EQ(run(UST__PLAN_SERVE, 0, craise, 2, s), UST__OUT_PRODUCTION);
  ASSERT_INT_EQ(s[2], UST__STEP_CAND_FAILED);
  ASSERT_INT_EQ(s[3], UST__STEP_RESTORE);
  ASSERT_INT_EQ(s[4], UST__STEP_PROD_ON_ARGS);
  /* verified and waited for: a failing verdict serves production's results */
  int vfail[] = {UST__EV_OK, UST__EV_OK, UST__EV_OK, UST__EV_OK, UST__EV_VERDICT_FAILED};
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, UST__DF_WAIT_VERDICT, vfail, 5, s), UST__OUT_PROD_FROM_SNAPS);
  ASSERT_INT_EQ(s[4], UST__STEP_VERDICT);
  ASSERT_INT_EQ(s[5], UST__STEP_COPY_BACK);
  /* not waited for (a GPU's verdict arrives later): the candidate serves */
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, 0, ok, 4, s), UST__OUT_CANDIDATE);
  /* inside a capture nothing is copied: the candidate is captured */
  ASSERT_INT_EQ(run(UST__PLAN_SERVE, UST__DF_NO_SNAPSHOTS, ok, 1, s), UST__OUT_CANDIDATE);
  ASSERT_INT_EQ(s[0], UST__STEP_CAND_ON_ARGS);
}

/* The common path's shortcut (ust__decision_passed) leaves what the machine
 * leaves for a plain call, field for field. */
TEST(decision_passed_is_the_machines_plain_call) {
  for (int raised = 0; raised < 2; raised++) {
    ust__decision machine, shortcut;
    memset(&machine, 0x5a, sizeof machine);
    memset(&shortcut, 0x5a, sizeof shortcut);
    ASSERT_INT_EQ(ust__decision_start(&machine, UST__PLAN_PASS, 0), UST__STEP_PROD_ON_ARGS);
    ASSERT_INT_EQ(ust__decision_next(&machine, raised ? UST__EV_RAISED : UST__EV_OK), UST__STEP_DONE);
    ust__decision_passed(&shortcut, raised);
    ASSERT_INT_EQ(shortcut.outcome, raised ? UST__OUT_RAISE : UST__OUT_PRODUCTION);
    ASSERT_TRUE(memcmp(&machine, &shortcut, sizeof machine) == 0);
  }
}
