/*
 * A candidate as the guard runs and judges it (loaded by plugin/candidates.c).
 * Internal header: never installed.
 */
#ifndef UST_GUARD_CAND_H
#define UST_GUARD_CAND_H

#include <stdatomic.h>
#include <stdint.h>

#include "guard/policy.h"

struct ust_candidate;
struct ust__procrun;

/* ---- candidates ------------------------------------------------------------------ */

enum { UST__CAND_NATIVE = 1, UST__CAND_TORCH_OP = 2 };

#define UST__MAX_WHEN 8 /* candidate.when: key dimensions a route must have */

/* A candidate as the guard runs and judges it. Filled by the engine's
 * loader (plugin/candidates.c), read-only while enabled. */
typedef struct ust__cand {
  int kind;                          /* UST__CAND_NATIVE or UST__CAND_TORCH_OP */
  char name[UST__QUALNAME_MAX];      /* shown in reports */
  char target[UST__DISPLAY_MAX];     /* the binding it stands in for: "ns::op[.overload]" */
  char id[UST__QUALNAME_MAX + 16];   /* identity kept with saved modes: "sha256:HEX" or "torch_op:NAME" */
  const struct ust_candidate *native; /* native: the descriptor, in the loaded object */
  int abi;                           /* native: the candidate ABI version it was built for */
  int no_capture;                    /* native: its descriptor says UST_CANDIDATE_NO_CAPTURE (never captured) */
  char torch_op[UST__QUALNAME_MAX];  /* torch op: "ns::name" */
  char torch_overload[UST__NAME_MAX];
  _Atomic(void *) seam_op;           /* torch op: the seam's handle once the op is defined (lives as long as the
                                        process), else NULL */
  atomic_uint_fast64_t waiting;      /* calls the candidate missed: its torch op was not defined yet */
  int compare;                       /* ust__cmp_kind */
  double atol, rtol;                 /* < 0: the per-dtype defaults */
  double aa_sample;                  /* share of shadow calls that also run production twice */
  uint32_t aa_q32;
  uint64_t deadline_ns;              /* a call of the candidate longer than this is overdue */
  double max_slowdown;               /* the shadow budget: a candidate this many times slower is not shadowed */
  uint64_t repro_bytes;              /* a route's first failing call is kept when its arguments fit; 0: never */
  /* qualify "process": the candidate runs in its own process (proc) until
   * a route's qualify_calls verifications there passed, and in this one
   * (loaded, NULL until the engine loaded it after the first such route)
   * from then on; never here once proc is lost (crash, hang, failure). */
  struct ust__procrun *proc;
  uint64_t qualify_calls;
  _Atomic(const struct ust_candidate *) loaded;
  /* torch op with qualify "process": its overload `qualify` (a stand-in that
   * runs the candidate in a process of its own) serves a route's shadows
   * until qualify_calls of them passed there; the op itself from then on. */
  int torch_qualify;
  _Atomic(void *) seam_qualify_op;   /* the seam's handle of that overload once defined, else NULL */
  /* where the candidate comes from, as the config's candidate.source said:
   * the object as JSON text (the config's, which outlives the candidate;
   * NULL: none) and its label,
   * named in reports beside each route and in rollback evidence */
  const char *source_json;
  char label[UST__DISPLAY_MAX];
  /* candidate.when: the key dimensions a route must have for the candidate
   * to run on it; other routes are production's alone */
  int n_when;
  char when_dim[UST__MAX_WHEN][UST__NAME_MAX];
  int64_t when_value[UST__MAX_WHEN];
} ust__cand;

#endif /* UST_GUARD_CAND_H */
