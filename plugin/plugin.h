/*
 * plugin/: lifecycle, config, operator definitions, errors and logging.
 *
 * Owns: the engine (one per enabled period), the parsed config, the loaded
 * problem definitions, the thread-local last error and the log sink.
 * Internal header: never installed.
 */
#ifndef UST_PLUGIN_H
#define UST_PLUGIN_H

#include <stdarg.h>
#include <stdint.h>
#include <stdatomic.h>
#include <pthread.h>

#include "understudy/understudy.h"
#include "dispatch/callview.h" /* UST__CAND_* */

struct cJSON;

/* ---- errors and logging ---------------------------------------------- */

/* Set the calling thread's last error and return err (so callers write
 * `return ust__error(UST_ECONFIG, "...")`). */
int ust__error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ust__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ust__clear_error(void);
/* The level the config asks for; the host's sink (ust_set_log) stays. */
void ust__log_set_level(int max_level);
/* A share in [0, 1] as a fraction of 2^32, saturating: shares within 2^-33
 * of 1 are UINT32_MAX (all), not a wrapped 0. */
uint32_t ust__share_q32(double p);

/* ---- modes ------------------------------------------------------------ */

typedef enum ust__mode {
  UST__MODE_OFF = 0,
  UST__MODE_OBSERVE = 1,
  UST__MODE_SHADOW = 2,      /* observe, and run the candidate beside production on sampled calls */
  UST__MODE_CANARY = 3,      /* the candidate serves a fraction of the calls, a sample of them verified */
  UST__MODE_LIVE = 4,        /* the candidate serves every call, a sample of them verified */
  UST__MODE_ROLLED_BACK = 5, /* a route's verdict: production serves, the candidate no longer runs */
} ust__mode;

/* off, observe, shadow, canary, live (and rolled_back when allow_rolled_back). */
int ust__mode_parse(const char *s, int *mode);
int ust__mode_parse_any(const char *s, int *mode, int allow_rolled_back);
/* "allclose", "exact", "set" -> ust__cmp_kind; -1 otherwise. */
int ust__cmp_kind_parse(const char *s);
const char *ust__cmp_kind_name(int kind);
const char *ust__mode_name(int mode);

/* ---- operator definitions (problems/NAME.json) --------------------------- */

#define UST__NAME_MAX 64
#define UST__QUALNAME_MAX 160
#define UST__MAX_DIMS 8
#define UST__MAX_OVERLOADS 8
#define UST__MAX_WRITES 8

typedef enum ust__bucket {
  UST__BUCKET_EXACT = 0,
  UST__BUCKET_POW2 = 1,
} ust__bucket;

/* A key dimension as written in the file: name = expression over the
 * call's arguments (see dispatch/dimexpr.h for the grammar). */
typedef struct ust__dim_def {
  char name[UST__NAME_MAX];
  char expr[UST__QUALNAME_MAX];
  int bucket; /* ust__bucket */
} ust__dim_def;

#define UST__MAX_RVARS 16
#define UST__EXPR_MAX 512

/* A binding's roofline: W (FLOPs) and Q (bytes read, written) as expressions
 * (scorer/expr.c) over named dimensions of the call (the key-dimension
 * grammar plus esize(NAME) and bytes(NAME), evaluated exactly, unbucketed).
 * W is booked on the path of w_dtype's dtype (bf16, fp16, fp8, fp32). */
typedef struct ust__roofline_def {
  int present;
  int n_vars;
  ust__dim_def vars[UST__MAX_RVARS];
  char w[UST__EXPR_MAX];
  char w_dtype[UST__NAME_MAX]; /* argument whose dtype selects W's path */
  char q_read[UST__EXPR_MAX];
  char q_write[UST__EXPR_MAX];
  char estimate[UST__EXPR_MAX]; /* "" when W and Q are exact; else how they approximate */
} ust__roofline_def;

typedef struct ust__binding_def {
  char op[UST__QUALNAME_MAX]; /* "aten::mm", "_C::rms_norm" */
  int n_overloads;
  char overloads[UST__MAX_OVERLOADS][UST__NAME_MAX]; /* "" is the default overload */
  int n_writes;
  char writes[UST__MAX_WRITES][UST__NAME_MAX]; /* argument names the op writes */
  int n_dims;
  ust__dim_def dims[UST__MAX_DIMS];
  int compared_returns; /* the leading returns a candidate is judged on; -1: all (the rest are
                           not data: RNG state, debug masks, sizes) */
  ust__roofline_def roofline;
} ust__binding_def;

typedef struct ust__problem {
  char name[UST__NAME_MAX];
  int compare; /* ust__cmp_kind (guard/guard.h): how candidates' outputs are judged */
  char *path;        /* owned */
  char *description; /* owned, may be NULL */
  int n_bindings;
  ust__binding_def *bindings; /* owned */
  /* An operator that is no dispatcher op of its own in the frameworks (a
   * kernel inside another op, or a chain of aten ops): the ops it runs in,
   * "ns::op" each; it then binds nothing and its traffic is scored under
   * the operators that bind those ops. */
  int n_hosted;
  char hosted_in[UST__MAX_OVERLOADS][UST__QUALNAME_MAX];
} ust__problem;

typedef struct ust__problem_set {
  int n;
  ust__problem *items; /* owned */
} ust__problem_set;

/* Parse one definition. text and path are borrowed; on error returns
 * UST_EPROBLEM with a message naming path and the field. */
int ust__problem_parse(const char *text, const char *path, ust__problem *out);
/* Load every *.json file of dir (sorted by name; names must be unique). */
int ust__problems_load_dir(const char *dir, ust__problem_set *out);
void ust__problem_free(ust__problem *p);
void ust__problems_free(ust__problem_set *set);
const ust__problem *ust__problems_find(const ust__problem_set *set, const char *name);
/* Read every *.json file of dir (hidden ones left out), sorted by name, and
 * hand each to cb with its path and text (borrowed for the call), its index
 * and the number of files. Stops at cb's first error and returns it;
 * UST_EPROBLEM naming `what` and the directory when it cannot be read or
 * holds no *.json file. */
typedef int (*ust__json_file_cb)(const char *path, const char *text, int index, int count, void *ctx);
int ust__load_json_dir(const char *dir, const char *what, ust__json_file_cb cb, void *ctx);

/* ---- config ------------------------------------------------------------- */

/* A candidate as the config names it. */
typedef struct ust__cand_config {
  int kind;                            /* 0 none, UST__CAND_NATIVE, UST__CAND_TORCH_OP */
  char *path;                          /* native: owned */
  char sha256[65];                     /* native: the pin, lowercase hex */
  char torch_op[UST__QUALNAME_MAX];    /* torch op: "ns::name" or "ns::name.overload" */
  char target[UST__QUALNAME_MAX + UST__NAME_MAX]; /* the binding it stands in for; "" = default */
} ust__cand_config;

/* The promotion policy of an operator's routes: shadow -> canary(canary) ->
 * live, each step after min_verified passing verifications in the stage with
 * the candidate's median at least min_speedup times faster than
 * production's; with dry_run the step is recorded, not taken. */
typedef struct ust__promotion {
  int enabled;
  int min_verified;
  double min_speedup;
  double canary;
  int dry_run;
} ust__promotion;

/* A mode set for one shape key in the config ("routes"). */
typedef struct ust__route_config {
  char key[512];
  int mode;
  double canary; /* < 0: the operator's */
} ust__route_config;

typedef struct ust__op_config {
  char name[UST__NAME_MAX];
  int mode;
  double sample;
  double canary;     /* fraction of calls the candidate serves in canary mode */
  int strict;        /* canary/live: verify before serving (synchronises) */
  ust__promotion promotion;
  int n_routes;
  ust__route_config *routes; /* owned */
  ust__cand_config cand;
  int compare;       /* -1: the operator definition's */
  double atol, rtol; /* < 0: the defaults for each dtype */
  double aa_sample;  /* fraction of shadow calls that also run production twice */
} ust__op_config;

/* A loaded candidate; owned by the engine, borrowed by bindings. */
typedef struct ust__candidate {
  int kind;
  char name[UST__QUALNAME_MAX];
  char target[UST__QUALNAME_MAX + UST__NAME_MAX];
  char torch_op[UST__QUALNAME_MAX]; /* "ns::name" */
  char torch_overload[UST__NAME_MAX];
  char *path;                       /* owned, native only */
  char sha256[65];
  void *dl;                         /* dlopen handle, native only */
  int dl_fd;                        /* the memfd the object was loaded from (its name); open while loaded */
  const struct ust_candidate *desc; /* native only; lives in dl */
  int compare;
  double atol, rtol;                /* < 0: per-dtype defaults */
  double aa_sample;
  uint32_t aa_q32;
} ust__candidate;

/* Load what cc names for operator op (its definition p): verify and open a
 * native shared object, or note a torch op. Errors name the config field. */
int ust__candidate_load(const ust__op_config *oc, const ust__problem *p, ust__candidate *out);
void ust__candidate_unload(ust__candidate *c);

typedef struct ust__config {
  char *problems_dir;        /* owned, NULL: caller supplies */
  char *report_path;         /* owned, NULL: no periodic report */
  double report_interval_s;  /* <= 0: only at disable */
  int log_level;
  int default_mode;
  double default_sample;
  int max_routes;
  int shadow_max_inflight;   /* shadow calls whose comparison is pending, at most */
  char *hardware_dir;        /* owned, NULL: <problems_dir>/hardware */
  char *hardware_profile;    /* owned, NULL: picked by device name (none for CPUs) */
  char *state_path;          /* owned, NULL: rollout state is not persisted */
  int all_operators;         /* 1 when "operators" is absent: every definition */
  int n_ops;
  ust__op_config *ops;       /* owned */
} ust__config;

/* Parse a JSON config (NULL or "" gives the defaults). Unknown fields are
 * errors, named with their JSON path. */
int ust__config_parse(const char *json, ust__config *out);
void ust__config_free(ust__config *cfg);

/* ---- the rollout state file (plugin/state.c) ------------------------------ */

#define UST__ROUTE_KEY_MAX 512

/* One route's own mode as the state file keeps it; strings borrowed. */
typedef struct ust__state_row {
  const char *key;
  int mode;      /* ust__mode */
  double canary; /* canary mode's share */
  const char *reason;
  const char *candidate; /* the candidate the mode was given for ("" any): another one does not inherit it */
  uint64_t unix_ms;
} ust__state_row;

/* Read path and call each per saved route (its error stops the read). A
 * missing file is no error; a bad one is UST_ECONFIG naming the field. */
int ust__state_read(const char *path, int (*each)(void *ctx, const ust__state_row *row), void *ctx);
/* Write rows to path atomically (temp file, fsync, rename). */
int ust__state_write(const char *path, const ust__state_row *rows, int n);

/* ---- JSON helpers shared by the parsers --------------------------------- */

char *ust__read_file(const char *path, size_t *len_out);
/* Replace path with text atomically: a temp file beside it, fsync, rename.
 * Errors (UST_EIO) start with what ("report", "state file"). */
int ust__write_file_atomic(const char *path, const char *text, const char *what);
char *ust__strdup(const char *s);
/* Copy src into dst[cap]; returns -1 if it does not fit. */
int ust__copy_name(char *dst, size_t cap, const char *src);

#endif /* UST_PLUGIN_H */
