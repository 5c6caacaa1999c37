/*
 * A binding's roofline compiled (dispatch/roofcall.c), and the hardware
 * profile a call runs on: what a timed call's floor is computed from.
 * Internal header: never installed.
 */
#ifndef UST_DISPATCH_ROOFCALL_H
#define UST_DISPATCH_ROOFCALL_H

#include <stdatomic.h>

#include "dispatch/dims.h"
#include "scorer/scorer.h"


typedef struct ust__roofline_prog {
  int present;
  int n_vars;
  ust__dim_prog vars[UST__MAX_RVARS];
  ust__expr *w, *q_read, *q_write; /* owned */
  ust__expr *bound[UST__MAX_RVARS]; /* owned, by var: what a var that reads lengths takes when they cannot be read */
  int reads_values;                 /* some var reads lengths */
  char w_dtype[UST__NAME_MAX];
  int w_dtype_index;               /* resolved against the schema; -1 if absent */
  int w_tf32;                      /* ust__roofline_def.w_tf32 */
  char unscorable[200];            /* once resolved: why its calls cannot be scored, "" when they can */
} ust__roofline_prog;

/* Compile def (borrowed); errors are UST_EPROBLEM naming where. */
int ust__roofline_compile(const ust__roofline_def *def, const char *where, ust__roofline_prog *out);
/* Resolve argument names (borrowed) once the schema is known; what the
 * schema lacks is said to log. */
void ust__roofline_resolve(ust__roofline_prog *p, int nargs, const char *const *names, const char *display,
                           ust__log_sink *log);
/* W per path and bytes read and written by one call: 0 when exact;
 * UST__ROOF_BOUNDED when lengths the host could not read took their bounds;
 * -1 when the binding has no roofline, a dimension is missing from the call
 * or a var that cannot be read has no bound. tf32: torch lets float32
 * matrix products use TF32 for this call (a w_tf32 roofline then books
 * float32 W on the tf32 path). Reads no device memory. */
#define UST__ROOF_BOUNDED 1
int ust__roofline_eval(const ust__roofline_prog *p, const ust__call *call, int tf32, double w[UST__N_PATHS],
                       double *q_read, double *q_write);
void ust__roofline_free(ust__roofline_prog *p);

/* ---- the hardware a call runs on ---------------------------------------------------- */

#define UST__HW_MAX_DEVICES 64

/* The engine's hardware profiles and, per GPU, the one its name picked
 * (resolved at the first call on that GPU). */
typedef struct ust__hw_ctx {
  ust__hw_set set;
  const ust__hw_profile *forced;          /* config hardware.profile: every device */
  _Atomic(const ust__hw_profile *) gpu[UST__HW_MAX_DEVICES];
  atomic_int gpu_resolved[UST__HW_MAX_DEVICES];
  _Atomic(const ust__hw_profile *) cpu; /* the host's, by its model name */
  atomic_int cpu_resolved;
  ust__log_sink *log;
} ust__hw_ctx;

/* The profile for a call's device, or NULL (a device no profile matches: a
 * host CPU without a calibrated profile, an unknown GPU). GPUs are picked by
 * their name, the host by its CPU model name (/proc/cpuinfo), unless the
 * config forces one. Thread-safe. */
const ust__hw_profile *ust__hw_for_call(ust__hw_ctx *hw, const ust__call *call);

#endif /* UST_DISPATCH_ROOFCALL_H */
