/*
 * guard/decision.h: the serving decision. What runs for one intercepted call,
 * in which order, on which arguments (the caller's, or snapshots of them),
 * and what the caller receives after any failure, as one state machine the
 * bridge drives. The bridge performs the primitive steps it names and
 * reports each step's event; nothing else decides.
 *
 *   d = start(plan)             the router picked the plan (dispatch/router.c)
 *   loop: step = next(d, event) the event of the step just performed
 *   d->outcome                  what the caller receives
 *
 * Rules the machine keeps (tests/c/test_decision.c checks them over every
 * sequence of events):
 * - the caller sees production's exception exactly when production raised,
 *   and its arguments as production left them: production that raised on
 *   the snapshots has its partial writes copied back, and never runs again;
 * - the candidate's results reach the caller only when it ran without
 *   failing and, when this call is verified and waits for its verdict, the
 *   verdict passed;
 * - whatever the candidate wrote into the caller's arguments is undone
 *   (restored from the snapshots, or overwritten with production's results)
 *   before production's results are served;
 * - production runs on the caller's arguments at most once;
 * - a shadow slot taken for the call is released exactly once (a verdict or
 *   an abandon), and a candidate failure always reaches a verdict or the
 *   route's rollback.
 *
 * The times of a verified call are taken over the same scope on both sides
 * (the arms): production and the candidate each run on understudy's copies
 * (shadow: production once more, after serving on the caller's arguments;
 * verified serving: production on the snapshots), one right after the
 * other, in the order the slot drew for the call (UST__DF_CAND_FIRST), so
 * that neither warm caches nor position favour one. On an A/A call
 * (UST__DF_AA) production runs once more on copies of its own, on the far
 * side of its arm from the candidate's: its two runs, side by side as the
 * pair's are, measure production's own spread.
 *
 * Valid C and C++. Internal header: never installed.
 */
#ifndef UST_GUARD_DECISION_H
#define UST_GUARD_DECISION_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ust__plan {
  UST__PLAN_PASS = 0,       /* production on the caller's arguments */
  UST__PLAN_SHADOW,         /* production serves; the candidate runs on snapshots; a slot is held */
  UST__PLAN_SERVE,          /* the candidate serves on the caller's arguments, unverified */
  UST__PLAN_SERVE_VERIFIED, /* production on snapshots, the candidate serves, compared; a slot is held */
  UST__PLAN_COUNT
} ust__plan;

enum {
  UST__DF_NO_SNAPSHOTS = 1, /* serving inside a graph capture: nothing is copied (or restorable) */
  UST__DF_WAIT_VERDICT = 2, /* serving verified: this call's verdict decides what it serves */
  UST__DF_CAPTURED = 4,     /* shadow captured into a CUDA graph, run at the replays its gate verifies */
  UST__DF_ARMS = 8,         /* shadow: the pair is timed on copies (production again beside the candidate) */
  UST__DF_CAND_FIRST = 16,  /* the candidate's arm runs before production's (else after) */
  UST__DF_AA = 32,          /* A/A: production runs once more on copies, beside its own arm */
};

/* Why a captured call of a shadowed route holds production alone. */
typedef enum ust__graph_why {
  UST__GW_NONE = 0,
  UST__GW_TORCH_OP,    /* a torch-op candidate: its allocations cannot be captured into a conditional body */
  UST__GW_REMOTE,      /* the candidate still qualifies in its own process */
  UST__GW_UNSUPPORTED, /* this build has no CUDA conditional graph nodes */
  UST__GW_CAPTURE,     /* the shadow could not be captured (the log says why) */
  UST__GW_NODES,       /* the shadow holds nodes a conditional body cannot (events, host calls, ...) */
  UST__GW_LAYOUT,      /* an argument or result not a contiguous CUDA tensor, a tensor list, resized; a set comparison */
  UST__GW_FAILED,      /* the candidate failed while it was captured */
  UST__GW_KEPT,        /* a shadow beside the chain does not fit: over its bound, or no device memory */
  UST__GW_NO_CAPTURE,  /* the candidate says it cannot be captured (UST_CANDIDATE_NO_CAPTURE) */
  UST__GW_COUNT
} ust__graph_why;

typedef enum ust__step {
  UST__STEP_DONE = 0,
  UST__STEP_SNAPSHOT,      /* copy what the op writes (and inputs that alias it) */
  UST__STEP_PROD_ON_ARGS,  /* production on the caller's arguments */
  UST__STEP_PROD_ON_SNAPS, /* production on the snapshots */
  UST__STEP_CAND_ON_SNAPS, /* the candidate on the snapshots */
  UST__STEP_CAND_ON_ARGS,  /* the candidate on the caller's arguments */
  UST__STEP_COMPARE,       /* hand both sides (or the candidate's failure) to the guard; releases the slot */
  UST__STEP_ABANDON,       /* release the slot without a verdict */
  UST__STEP_VERDICT,       /* this call's verdict (waits for it on a GPU) */
  UST__STEP_CAND_FAILED,   /* tell the route its candidate failed serving unverified: it rolls back */
  UST__STEP_RESTORE,       /* the snapshots (the values before the call) back into the caller's arguments */
  UST__STEP_COPY_BACK,     /* production's writes (in the snapshots) into the caller's arguments */
  UST__STEP_PROD_ON_COPIES, /* shadow: production again, timed, on copies of its own: the candidate's counterpart */
  UST__STEP_AA_ON_COPIES,  /* A/A: production once more, timed, on copies of its own */
  UST__STEP_COUNT
} ust__step;

typedef enum ust__event {
  UST__EV_OK = 0,
  UST__EV_RAISED,         /* the op run by the step raised (production's exception is kept by the bridge) */
  UST__EV_FAILED,         /* the candidate returned an error status or results that do not line up */
  UST__EV_INTERNAL,       /* understudy's own work in the step failed; for a run step: the op did not run */
  UST__EV_NO_LAYOUT,      /* the candidate could not run: its outputs' layout is not learned yet */
  UST__EV_VERDICT_FAILED, /* VERDICT: this call's verification failed */
  UST__EV_COUNT
} ust__event;

typedef enum ust__outcome {
  UST__OUT_NONE = 0,
  UST__OUT_PRODUCTION,      /* production's results from its run on the caller's arguments */
  UST__OUT_PROD_FROM_SNAPS, /* production's returns from its run on the snapshots; its writes copied back */
  UST__OUT_CANDIDATE,       /* the candidate's results */
  UST__OUT_RAISE,           /* production's exception */
} ust__outcome;

enum {
  UST__NOTE_SERVED_CANDIDATE = 1, /* the candidate served the call */
  UST__NOTE_VERIFIED_SERVING = 2, /* ... and the call was verified */
  UST__NOTE_UNLEARNED = 4,        /* production served a candidate call: no layout for its outputs yet */
  UST__NOTE_INTERNAL = 8,         /* understudy failed somewhere in the call (counted) */
};

typedef struct ust__decision {
  int plan, flags;
  int at;           /* the step in progress (UST__STEP_DONE once finished) */
  int outcome;      /* ust__outcome, set when done */
  int notes;        /* UST__NOTE_* */
  int slot;         /* 1 while the call holds a shadow slot */
  int snapshots;    /* 1 once the snapshots exist */
  int cand_failed;  /* the candidate raised or failed */
  int cand_touched; /* the candidate ran (or began to) on the caller's arguments */
  int prod_on_snaps; /* production ran on the snapshots (returned or raised) */
  int after;        /* the step after a pending ABANDON (UST__STEP_DONE: finish with pending) */
  int pending;      /* the outcome a pending ABANDON or COPY_BACK finishes with */
  int steps;        /* steps taken, bounded */
  int arm;          /* the timed arms begun (their order: arm_step in decision.c) */
  int prod_raised;  /* production raised on the snapshots */
} ust__decision;

/* Begin plan (ust__plan) with UST__DF_* flags; returns the first step. An
 * unknown plan is served by production. */
int ust__decision_start(ust__decision *d, int plan, int flags);
/* The event of the step just performed (d->at); returns the next step,
 * UST__STEP_DONE when d->outcome is set. An event a step cannot produce is
 * taken as UST__EV_INTERNAL. */
int ust__decision_next(ust__decision *d, int event);

/* The PASS plan's end without its steps: production ran once on the
 * caller's arguments and returned (raised 0) or raised. d is left exactly
 * as ust__decision_start(d, UST__PLAN_PASS, 0) followed by one
 * ust__decision_next (UST__EV_OK or UST__EV_RAISED) leaves it; the common
 * path of an intercepted call runs this instead of the machine. */
static inline void ust__decision_passed(ust__decision *d, int raised) {
  const ust__decision ended = {UST__PLAN_PASS, 0, UST__STEP_DONE, raised ? UST__OUT_RAISE : UST__OUT_PRODUCTION,
                               0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};
  *d = ended;
}

const char *ust__step_name(int step);
const char *ust__event_name(int event);
const char *ust__outcome_name(int outcome);

#ifdef __cplusplus
}
#endif

#endif /* UST_GUARD_DECISION_H */
