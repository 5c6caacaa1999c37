/* The serving decision, exhaustively: every plan and flag, every event at
 * every step (events a step cannot produce included), each finished path
 * checked against the rules guard/decision.h states, the order of the
 * timed arms among them. */
#include "guard/decision.h"
#include "tests/c/runner.h"

typedef struct trace {
  int n;
  int flags; /* as the call began (the machine may drop its order: d->flags) */
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

/* The arms a call should have, as it began: its pair timed on copies (an
 * armed shadow) or verified serving; and the A/A run with it. */
static int armed_plan(int plan, int flags) {
  return plan == UST__PLAN_SERVE_VERIFIED ||
         (plan == UST__PLAN_SHADOW && (flags & UST__DF_ARMS) && !(flags & UST__DF_CAPTURED));
}

static void check_path(const ust__decision *d, const trace *t) {
  const int slot_plan = d->plan == UST__PLAN_SHADOW || d->plan == UST__PLAN_SERVE_VERIFIED;
  const int armed = armed_plan(d->plan, t->flags);
  const int prod_arm = d->plan == UST__PLAN_SHADOW ? UST__STEP_PROD_ON_COPIES : UST__STEP_PROD_ON_SNAPS;
  const int cand_arm = d->plan == UST__PLAN_SHADOW ? UST__STEP_CAND_ON_SNAPS : UST__STEP_CAND_ON_ARGS;
  int releases = 0, prod_args = 0, prod_args_ok = 0, prod_raised = 0, prod_snaps_ran = 0, cand_ok = 0,
      cand_failed = 0, cand_touched = 0, verdict_failed = 0, restored = 0, copied = 0, reported = 0, snap_ok = 0,
      internal_after_cand = 0, compared_ok = 0, compared = 0, aa_runs = 0, prod_copies = 0, no_layout = 0,
      arm_internal = 0;
  int at_cand = -1, at_prod = -1, at_aa = -1; /* where each arm ran (the candidate's: the run that ran) */
  for (int i = 0; i < t->n; i++) {
    const int s = t->step[i], e = effective(s, t->ev[i]);
    if (armed && s == cand_arm && e != UST__EV_NO_LAYOUT)
      at_cand = i;
    if (armed && s == prod_arm)
      at_prod = i;
    if (armed && (s == prod_arm || s == cand_arm || s == UST__STEP_AA_ON_COPIES) && e == UST__EV_INTERNAL)
      arm_internal = 1;
    switch (s) {
    case UST__STEP_SNAPSHOT: snap_ok |= e == UST__EV_OK; break;
    case UST__STEP_PROD_ON_ARGS:
      RULE(!prod_snaps_ran, "production never runs on the arguments after it ran on the snapshots");
      RULE(!(cand_touched && snap_ok) || restored, "the candidate's writes are undone before production runs");
      prod_args++;
      prod_raised |= e == UST__EV_RAISED;
      prod_args_ok |= e != UST__EV_RAISED; /* an event it cannot produce: it ran */
      break;
    case UST__STEP_PROD_ON_COPIES:
      RULE(d->plan == UST__PLAN_SHADOW && armed, "production runs on copies of its own only in an armed shadow");
      RULE(prod_args_ok, "production's timed copy runs only after it served the caller");
      RULE(!compared, "every arm runs before the comparison");
      prod_copies++;
      break;
    case UST__STEP_AA_ON_COPIES:
      RULE(armed && (t->flags & UST__DF_AA), "the A/A run only on a call drawn for it");
      RULE(!compared && aa_runs == 0, "one A/A run, before the comparison");
      RULE(d->plan != UST__PLAN_SHADOW || prod_args_ok, "production's A/A run only after it served the caller");
      aa_runs++;
      at_aa = i;
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
      no_layout |= e == UST__EV_NO_LAYOUT;
      RULE(!compared, "the candidate runs before the comparison");
      break;
    case UST__STEP_COMPARE:
      RULE(slot_plan && releases == 0, "compare only while the slot is held");
      compared = 1;
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
    /* a timed run of production on copies that fails loses its time only */
    if (e == UST__EV_INTERNAL && cand_touched && s != UST__STEP_PROD_ON_COPIES && s != UST__STEP_AA_ON_COPIES)
      internal_after_cand = 1;
  }
  RULE(t->n <= 12, "a call takes at most 12 steps");
  if (armed && at_cand >= 0 && at_prod >= 0) {
    RULE(at_cand - at_prod == 1 || at_prod - at_cand == 1, "production's arm runs right beside the candidate's");
    if (!no_layout)
      RULE((at_cand < at_prod) == ((t->flags & UST__DF_CAND_FIRST) != 0), "the arms run in the order drawn");
    else
      RULE(at_prod < at_cand, "a candidate that cannot run first runs after production");
  }
  if (at_aa >= 0) {
    RULE(at_prod >= 0 && (at_aa - at_prod == 1 || at_prod - at_aa == 1), "the A/A run is beside production's arm");
    RULE(at_cand < 0 || (at_aa - at_prod) * (at_cand - at_prod) < 0, "the A/A run is on the far side from the "
                                                                        "candidate's");
  }
  if (armed && compared_ok && !cand_failed && !arm_internal && !no_layout && d->outcome != UST__OUT_RAISE) {
    RULE(at_prod >= 0 && at_cand >= 0, "a compared call timed both arms");
    RULE(aa_runs == ((t->flags & UST__DF_AA) != 0), "the A/A run exactly on the calls drawn for it");
  }
  if (d->plan == UST__PLAN_SHADOW && armed)
    RULE(prod_copies <= 1, "production runs on its own copies at most once (and once more for A/A)");
  if (d->plan == UST__PLAN_SHADOW && !armed)
    RULE(prod_copies == 0 && aa_runs == 0, "an unarmed shadow runs production once");
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
  const int all_flags = UST__DF_NO_SNAPSHOTS | UST__DF_WAIT_VERDICT | UST__DF_CAPTURED | UST__DF_ARMS |
                        UST__DF_CAND_FIRST | UST__DF_AA;
  for (int plan = 0; plan < UST__PLAN_COUNT; plan++)
    for (int flags = 0; flags <= all_flags; flags++) {
      ust__decision d;
      trace t;
      memset(&t, 0, sizeof t);
      t.flags = flags;
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

/* The timed arms, spelled out: side by side in the order drawn, the A/A
 * run beside production's arm on the far side from the candidate's. */
TEST(decision_arms_in_their_order) {
  int s[32];
  const int ok[] = {UST__EV_OK, UST__EV_OK, UST__EV_OK, UST__EV_OK, UST__EV_OK, UST__EV_OK};
  /* shadow, production first, A/A: it serves, then A/A, production, the candidate on copies */
  ASSERT_INT_EQ(run(UST__PLAN_SHADOW, UST__DF_ARMS | UST__DF_AA, ok, 6, s), UST__OUT_PRODUCTION);
  const int shadow_pf[] = {UST__STEP_SNAPSHOT, UST__STEP_PROD_ON_ARGS, UST__STEP_AA_ON_COPIES,
                           UST__STEP_PROD_ON_COPIES, UST__STEP_CAND_ON_SNAPS, UST__STEP_COMPARE, UST__STEP_DONE};
  for (int i = 0; i < 7; i++)
    ASSERT_INT_EQ(s[i], shadow_pf[i]);
  /* shadow, the candidate first, no A/A */
  ASSERT_INT_EQ(run(UST__PLAN_SHADOW, UST__DF_ARMS | UST__DF_CAND_FIRST, ok, 6, s), UST__OUT_PRODUCTION);
  const int shadow_cf[] = {UST__STEP_SNAPSHOT, UST__STEP_PROD_ON_ARGS, UST__STEP_CAND_ON_SNAPS,
                           UST__STEP_PROD_ON_COPIES, UST__STEP_COMPARE, UST__STEP_DONE};
  for (int i = 0; i < 6; i++)
    ASSERT_INT_EQ(s[i], shadow_cf[i]);
  /* a captured shadow has no arms whatever it is given */
  ASSERT_INT_EQ(run(UST__PLAN_SHADOW, UST__DF_CAPTURED | UST__DF_ARMS | UST__DF_AA, ok, 6, s), UST__OUT_PRODUCTION);
  ASSERT_INT_EQ(s[2], UST__STEP_CAND_ON_SNAPS);
  ASSERT_INT_EQ(s[3], UST__STEP_COMPARE);
  /* verified serving, the candidate first, A/A: it serves on the arguments,
   * production on the snapshots, then A/A */
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, UST__DF_WAIT_VERDICT | UST__DF_CAND_FIRST | UST__DF_AA, ok, 6, s),
                UST__OUT_CANDIDATE);
  const int served_cf[] = {UST__STEP_SNAPSHOT, UST__STEP_CAND_ON_ARGS, UST__STEP_PROD_ON_SNAPS,
                           UST__STEP_AA_ON_COPIES, UST__STEP_COMPARE, UST__STEP_VERDICT, UST__STEP_DONE};
  for (int i = 0; i < 7; i++)
    ASSERT_INT_EQ(s[i], served_cf[i]);
  /* ... the candidate raising first: production still runs and serves, its
   * failure is the verdict */
  const int craise[] = {UST__EV_OK, UST__EV_RAISED, UST__EV_OK, UST__EV_OK, UST__EV_OK};
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, UST__DF_WAIT_VERDICT | UST__DF_CAND_FIRST | UST__DF_AA, craise, 5, s),
                UST__OUT_PROD_FROM_SNAPS);
  ASSERT_INT_EQ(s[2], UST__STEP_PROD_ON_SNAPS);
  ASSERT_INT_EQ(s[3], UST__STEP_COMPARE);
  ASSERT_INT_EQ(s[4], UST__STEP_COPY_BACK);
  /* ... and production raising after it: the verdict, then production's
   * writes and its exception */
  const int both[] = {UST__EV_OK, UST__EV_RAISED, UST__EV_RAISED, UST__EV_OK, UST__EV_OK};
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, UST__DF_CAND_FIRST, both, 5, s), UST__OUT_RAISE);
  ASSERT_INT_EQ(s[3], UST__STEP_COMPARE);
  ASSERT_INT_EQ(s[4], UST__STEP_COPY_BACK);
  /* ... a native candidate whose outputs' layout is not learned cannot run
   * first: production first, then the candidate */
  const int nolayout[] = {UST__EV_OK, UST__EV_NO_LAYOUT, UST__EV_OK, UST__EV_OK, UST__EV_OK};
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, UST__DF_CAND_FIRST | UST__DF_AA, nolayout, 5, s), UST__OUT_CANDIDATE);
  const int fallback[] = {UST__STEP_SNAPSHOT, UST__STEP_CAND_ON_ARGS, UST__STEP_PROD_ON_SNAPS,
                          UST__STEP_CAND_ON_ARGS, UST__STEP_COMPARE, UST__STEP_DONE};
  for (int i = 0; i < 6; i++)
    ASSERT_INT_EQ(s[i], fallback[i]);
  /* ... understudy failing inside the candidate's run on the arguments: they
   * are restored and production serves on them */
  const int internal[] = {UST__EV_OK, UST__EV_INTERNAL, UST__EV_OK, UST__EV_OK, UST__EV_OK};
  ASSERT_INT_EQ(run(UST__PLAN_SERVE_VERIFIED, UST__DF_CAND_FIRST, internal, 5, s), UST__OUT_PRODUCTION);
  const int restored[] = {UST__STEP_SNAPSHOT, UST__STEP_CAND_ON_ARGS, UST__STEP_ABANDON, UST__STEP_RESTORE,
                          UST__STEP_PROD_ON_ARGS, UST__STEP_DONE};
  for (int i = 0; i < 6; i++)
    ASSERT_INT_EQ(s[i], restored[i]);
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
