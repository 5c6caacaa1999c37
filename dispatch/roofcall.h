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

/* A call's floor deferred until the lengths of its varlen batch, on the
 * device, are in host memory: copied in stream order before the timed work
 * (dispatch/timer_gpu.c) and read once the timing completes, so that the
 * floor is each sequence's, not the bound, without waiting on the device.
 * The vars that read no lengths are evaluated at the call; each var that
 * reads lengths keeps where its operands lie in the copied bytes. */
#define UST__DEFER_SOURCES 4
#define UST__DEFER_BYTES 16384 /* bytes of lengths copied for one call at most */
typedef struct ust__floor_defer {
  const ust__roofline_prog *prog;  /* borrowed: its binding's */
  const struct ust__hw_profile *hw; /* the call's device's profile */
  int device;                      /* the call's device (its lengths' areas are that device's) */
  ust__figs *figs;                 /* its route's: where its work is noted */
  int path;                        /* the path W is booked on */
  uint64_t bound_tsol_ps;          /* the bounded floor, and work, the lengths' own replace */
  double bound_flops, bound_bytes;
  int work_noted;                  /* the bounded work was noted on figs (else it is not corrected) */
  double vals[UST__MAX_RVARS];     /* the vars that read no lengths */
  int64_t div[UST__MAX_RVARS];     /* a seqcdiv's divisor */
  int8_t src[UST__MAX_RVARS][2];   /* a length var's operands: a source below, -1 every source None */
  int8_t offsets[UST__MAX_RVARS][2];
  int n_src;
  struct {
    const void *dev;    /* the tensor's values on the device */
    size_t at, bytes;   /* where they go in the copied bytes, and how many */
    int64_t numel;
    int wide, arg;
  } srcs[UST__DEFER_SOURCES];
} ust__floor_defer;
/* 0 with the call's deferral in *d (prog, vals, sources; hw, figs and the
 * bounds are the caller's) when every length the roofline reads is in one
 * contiguous tensor on the device and they fit UST__DEFER_BYTES; else -1
 * (the call keeps its bound). */
int ust__roofline_defer(const ust__roofline_prog *p, const ust__call *call, int tf32, ust__floor_defer *d);
/* W per path and the bytes of the deferred call, its lengths read from
 * staged (the copied bytes): 0, or -1 when they make no lengths. */
int ust__floor_resolve(const ust__floor_defer *d, const unsigned char *staged, double w[UST__N_PATHS],
                       double *q_read, double *q_write);

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
