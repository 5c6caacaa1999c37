/*
 * guard/: correctness and rollout, one header a topic, all included here:
 * the comparison (compare.h, compare_sync.h), the serving decision
 * (decision.h), modes and the operators' published policies (policy.h),
 * candidates as the guard runs and judges them (cand.h), what verifications
 * found (verify.h), the pool of shadow slots and the verdicts they conclude
 * (shadow.h), a shadow captured into CUDA graphs (graph.h, gate.h, ring.h),
 * the rollout state machine with its table of per-key modes (rollout.h), and
 * the candidate calls in flight, swept at their deadline (flight.h).
 *
 * A route (dispatch/) is made of parts declared by their owners; the guard
 * declares three, and only guard code writes them: ust__verify (what its
 * verifications found), ust__route_rollout (its mode and how it changes)
 * and ust__flight (its candidate's calls in flight). The guard knows nothing of routes beyond these parts: a shadow
 * slot carries an opaque cookie, and verdicts are published through one
 * sink (ust__verdict_sink_i) that the router owns.
 *
 * Stream discipline: everything a shadow call enqueues (events, the compare
 * kernel, the copy of its results to pinned host memory) goes on the
 * caller's stream; results are read by the engine's worker thread once the
 * slot's last event completed. Nothing here synchronises the serving path,
 * except ust__shadow_verdict with wait (strict serving) and the *_sync
 * functions, which say so.
 *
 * Includes only base/ and scorer/. Internal header: never installed.
 */
#ifndef UST_GUARD_H
#define UST_GUARD_H

#include <stdint.h>

#include "base/base.h"
#include "guard/cand.h"
#include "guard/compare.h"
#include "guard/compare_sync.h"
#include "guard/decision.h"
#include "guard/flight.h"
#include "guard/gate.h"
#include "guard/graph.h"
#include "guard/policy.h"
#include "guard/rollout.h"
#include "guard/shadow.h"
#include "guard/verify.h"
#include "scorer/scorer.h"

#endif /* UST_GUARD_H */
