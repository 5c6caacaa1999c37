/*
 * dispatch/: the C view of an intercepted call, key dimensions, the route
 * table and the per-call decision. torch_bridge.cpp (the only C++ file) fills
 * the view; everything else here is C and never sees a torch header.
 *
 * Internal header: never installed.
 */
#ifndef UST_DISPATCH_H
#define UST_DISPATCH_H

#include <stdatomic.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

/* uthash reports running out of memory here instead of exiting
 * (HASH_NONFATAL_OOM is set for the whole core); the item is then not added. */
extern _Thread_local int ust__hash_oom;
#define uthash_nonfatal_oom(obj) (ust__hash_oom = 1)
#include <uthash.h>

#include "dispatch/callview.h"
#include "plugin/plugin.h"
#include "scorer/scorer.h"

/* ---- key dimensions -------------------------------------------------------- */

typedef enum ust__dim_kind {
  UST__DIM_SIZE = 0, /* NAME[i] */
  UST__DIM_ROWS,     /* rows(NAME): product of all sizes but the last */
  UST__DIM_NUMEL,    /* numel(NAME) */
  UST__DIM_LEN,      /* len(NAME): length of an int[] argument */
  UST__DIM_SCALAR,   /* NAME: an int or bool argument */
  UST__DIM_ESIZE,    /* esize(NAME): bytes per element of a tensor argument */
  UST__DIM_BYTES,    /* bytes(NAME): numel * esize */
  UST__DIM_OBYTES,   /* obytes(NAME): bytes of an optional tensor, 0 when None */
} ust__dim_kind;

typedef struct ust__dim_prog {
  int kind;
  int dim;                    /* UST__DIM_SIZE: index, negative from the end */
  char arg[UST__NAME_MAX];
  int arg_index;              /* resolved against the schema; -1 if absent */
  int bucket;
} ust__dim_prog;

/* Compile a dimension expression; on error returns UST_EPROBLEM with a
 * message that quotes the expression. */
int ust__dim_compile(const char *expr, ust__dim_prog *out);
/* The index of the argument called name in a schema's names, or -1. */
int ust__arg_lookup(const char *name, int nargs, const char *const *names);
/* Bind p to its argument's index in a schema's names; -1 when it has none. */
int ust__dim_resolve(ust__dim_prog *p, int nargs, const char *const *names);
/* Evaluate against a call; -1 when the argument is missing or None. */
int64_t ust__dim_eval(const ust__dim_prog *p, const ust__call *call);
int64_t ust__dim_bucket(int bucket, int64_t v);

/* ---- a binding's roofline, compiled (scorer/roofline.c) -------------------- */

typedef struct ust__roofline_prog {
  int present;
  int n_vars;
  ust__dim_prog vars[UST__MAX_RVARS];
  ust__expr *w, *q_read, *q_write; /* owned */
  char w_dtype[UST__NAME_MAX];
  int w_dtype_index;               /* resolved against the schema; -1 if absent */
} ust__roofline_prog;

/* Compile def (borrowed); errors are UST_EPROBLEM naming where. */
int ust__roofline_compile(const ust__roofline_def *def, const char *where, ust__roofline_prog *out);
/* Resolve argument names (borrowed) once the schema is known. */
void ust__roofline_resolve(ust__roofline_prog *p, int nargs, const char *const *names, const char *display);
/* W per path and bytes read and written by one call: 0, or -1 when the
 * binding has no roofline or a dimension is missing from the call. */
int ust__roofline_eval(const ust__roofline_prog *p, const ust__call *call, double w[UST__N_PATHS], double *q_read,
                       double *q_write);
void ust__roofline_free(ust__roofline_prog *p);

/* ---- the hardware a call runs on ---------------------------------------------- */

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
} ust__hw_ctx;

/* The profile for a call's device, or NULL (a device no profile matches: a
 * host CPU without a calibrated profile, an unknown GPU). GPUs are picked by
 * their name, the host by its CPU model name (/proc/cpuinfo), unless the
 * config forces one. Thread-safe. */
const ust__hw_profile *ust__hw_for_call(ust__hw_ctx *hw, const ust__call *call);

/* ---- operators, bindings, routes -------------------------------------------- */

#define UST__MAX_ARGS 32 /* arguments of a schema understudy reads */

typedef struct ust__operator {
  char name[UST__NAME_MAX];
  const ust__problem *problem; /* borrowed from the engine's problem set */
  atomic_int mode;             /* ust__mode */
  uint32_t sample_q32;         /* measured fraction of calls (timed; shadowed in shadow mode; verified of the
                                  candidate's in canary and live), in 1/2^32 */
  _Atomic uint32_t canary_q32; /* the candidate's share of calls in canary mode, in 1/2^32 */
  atomic_int strict;           /* canary/live: verify before serving */
  ust__promotion promotion;    /* read and written under the rollout lock (guard/rollout.c) */
  ust__candidate *cand;        /* owned by the engine; NULL without one */
  double sample;
  UT_hash_handle hh; /* the engine's registry, by name */
} ust__operator;

/* One dispatcher op + overload bound by an operator. The bridge holds a
 * pointer to it for as long as its kernel is registered. */
typedef struct ust__binding {
  int index;
  ust__operator *op;
  char qualname[UST__QUALNAME_MAX]; /* "aten::mm" */
  char overload[UST__NAME_MAX];     /* "" or "out" */
  char display[UST__QUALNAME_MAX + UST__NAME_MAX]; /* "aten::mm.out" */
  int n_dims;
  ust__dim_prog dims[UST__MAX_DIMS];
  const ust__binding_def *def;
  atomic_int resolved;           /* 0 new, 1 resolving, 2 done */
  atomic_uint_fast64_t untracked; /* calls not tracked: route table full */
  void *seam_handle;             /* owned by the seam */
  struct ust__route_table *routes; /* the engine's table */
  struct ust__candidate *cand;   /* the operator's candidate when it targets this binding */
  uint32_t writes_mask;          /* arguments the op writes (schema and curated list), by index */
  int n_arg_names;
  char arg_names[UST__MAX_ARGS][UST__NAME_MAX]; /* the schema's, once resolved */
  ust__roofline_prog roofline;   /* compiled from def->roofline; present 0 without one */
  ust__hw_ctx *hw;               /* the engine's */
  UT_hash_handle hh;             /* the engine's registry, by display name */
} ust__binding;

#define UST__MAX_KEY_TENSORS 8

typedef struct ust__route_key {
  uint16_t binding;
  uint8_t device;
  uint8_t n_dtypes;
  uint8_t dtypes[UST__MAX_KEY_TENSORS];
  uint8_t phase; /* ust_phase of the calling thread */
  int64_t dims[UST__MAX_DIMS];
} ust__route_key;

typedef struct ust__route {
  ust__route_key key;
  uint64_t hash;
  ust__binding *binding;
  atomic_uint_fast64_t calls;    /* every call on this route */
  atomic_uint_fast64_t timed;    /* calls whose latency was recorded */
  atomic_uint_fast64_t captured; /* calls made while the stream captured a graph */
  atomic_uint_fast64_t timing_dropped; /* sampled but no timer slot free */
  ust__hist hist;                /* production latency, ns */

  /* Roofline (scorer): over timed calls whose T_SOL is known, the sum of
   * T_SOL and of the measured time; S = tsol / time. */
  _Atomic(const ust__hw_profile *) hw; /* the profile of the last scored call */
  atomic_uint_fast64_t roof_unscored;  /* timed calls whose T_SOL could not be computed */
  atomic_uint_fast64_t roof_calls;
  atomic_uint_fast64_t roof_tsol_ps;
  atomic_uint_fast64_t roof_time_ns;
  atomic_uint_fast64_t cand_roof_calls;  /* the same for the candidate, over passing shadow calls */
  atomic_uint_fast64_t cand_roof_tsol_ps;
  atomic_uint_fast64_t cand_roof_time_ns;

  /* Shadow mode (guard/shadow.c): written by the calling threads and the
   * worker; read by the report. */
  atomic_uint_fast64_t shadow_seen;   /* calls considered for shadowing (the sampling count) */
  atomic_uint_fast64_t shadow_calls;  /* sampled calls that took a slot; each ends verified, skipped or
                                         unverifiable */
  atomic_uint_fast64_t verified;      /* shadow calls that reached a verdict */
  atomic_uint_fast64_t passed;
  atomic_uint_fast64_t failed;
  atomic_uint_fast64_t skipped;       /* sampled, but no verdict: in-flight bound, production raised, or an
                                         internal error */
  atomic_uint_fast64_t unverifiable;  /* ran, but an output's dtype cannot be compared */
  atomic_uint_fast64_t aa_runs;       /* A/A checks: production against itself */
  atomic_uint_fast64_t aa_mismatching;
  atomic_uint_fast64_t max_abs_bits, max_rel_bits;       /* over passing verifications */
  atomic_uint_fast64_t aa_max_abs_bits, aa_max_rel_bits; /* production's own spread */
  atomic_int rolled_back;             /* 1 once a verified failure rolled the route back */
  ust__hist cand_hist;                /* candidate latency, ns */
  _Atomic(struct ust__evidence *) evidence; /* the failure that rolled the route back */

  /* Rollout (guard/rollout.c). The route's own mode, packed with its canary
   * share so that a reader never sees one without the other: 0 follows the
   * operator, else (mode + 1) | canary_q32 << 32. */
  atomic_uint_fast64_t rollout;
  atomic_uint_fast64_t served_cand;   /* calls whose outputs the candidate served */
  atomic_uint_fast64_t served_cand_verified; /* of those, verified on the call (a sample) */
  atomic_uint_fast64_t served_unlearned; /* candidate calls production served: the outputs' layout for the
                                            call's shapes was not learned yet */
  atomic_uint_fast64_t captured_cand; /* graph captures that captured the candidate (the rest: production) */
  atomic_uint_fast64_t canary_seen;   /* canary sampling count */
  atomic_uint_fast64_t verify_seen;   /* verification sampling count of candidate-served calls */
  atomic_uint_fast64_t stage_passes;  /* passing verifications since the route's last transition */
  atomic_uint_fast64_t transitions;
  _Atomic(void *) layouts[8];         /* outputs' layouts learned from production, by input signature
                                         (ust__route_layout_*); added once, freed with the route */
} ust__route;

/* A learned layout: the bridge's blob for calls whose inputs hash to sig. */
typedef struct ust__layout {
  uint64_t sig;
  size_t len;
  unsigned char blob[];
} ust__layout;
/* The layout learned for sig, or NULL. Lock-free. */
const ust__layout *ust__route_layout_find(ust__route *r, uint64_t sig);
/* Learn one (no-op once 8 are known or sig is). Thread-safe. */
void ust__route_layout_add(ust__route *r, uint64_t sig, const void *blob, size_t len);
/* A hash of a call's tensor sizes, strides, dtypes and scalar values: calls
 * with the same signature produce outputs of the same layout. */
uint64_t ust__call_signature(const ust__call *call);

typedef struct ust__route_table {
  uint32_t cap;   /* power of two, twice max_routes */
  uint32_t max_routes;
  atomic_uint count;
  _Atomic(ust__route *) *slots;
} ust__route_table;

int ust__routes_init(ust__route_table *t, int max_routes);
void ust__routes_free(ust__route_table *t);
/* Find or insert the route for key. Lock-free; NULL when the table is full
 * or memory ran out. Thread-safe. */
ust__route *ust__routes_get(ust__route_table *t, const ust__route_key *key, ust__binding *b);
/* T_SOL of a call in picoseconds (0 when unknown), and the route's profile
 * is noted. Called only for calls that are timed. */
uint64_t ust__route_tsol_ps(ust__route *r, const ust__call *call);
/* Add one timed call's T_SOL and time to the route's roofline sums. */
void ust__route_roof_add(ust__route *r, uint64_t tsol_ps, uint64_t time_ns, int candidate);

#define UST__N_PHASES 3
const char *ust__phase_name(int phase);

/* Build the key of a call; returns -1 if the call cannot be keyed. */
int ust__route_key_make(const ust__binding *b, const ust__call *call, ust__route_key *key);
/* "aten::mm|cpu|f32,f32|M=128,K=64,N=64" into buf. */
void ust__route_key_str(const ust__route *r, char *buf, size_t cap);

#endif /* UST_DISPATCH_H */
