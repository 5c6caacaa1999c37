/*
 * plugin/: the top floor. The process context and the engine (lifecycle,
 * the worker), the config, operator definitions, candidates' loading, the
 * state file, and the report built from a plain snapshot of the routes.
 *
 * Internal header: never installed.
 */
#ifndef UST_PLUGIN_H
#define UST_PLUGIN_H

#include <stdint.h>

#include "base/base.h"
#include "dispatch/dispatch.h"
#include "guard/guard.h"
#include "guard/procrun.h"
#include "plugin/verify.h"

struct cJSON;

/* ---- operator definitions (problems/NAME.json) --------------------------- */

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
/* ---- config ------------------------------------------------------------- */

/* A candidate as the config names it. */
typedef struct ust__cand_config {
  int kind;                            /* 0 none, UST__CAND_NATIVE, UST__CAND_TORCH_OP */
  char *path;                          /* native: owned */
  char sha256[65];                     /* native: the pin, lowercase hex */
  int n_deps;                          /* native: its dependencies' pins */
  char *dep_path[UST__MAX_DEPS];       /* owned */
  char dep_sha256[UST__MAX_DEPS][65];
  char torch_op[UST__QUALNAME_MAX];    /* torch op: "ns::name" or "ns::name.overload" */
  char target[UST__QUALNAME_MAX + UST__NAME_MAX]; /* the binding it stands in for; "" = default */
  int qualify;                         /* UST__QUALIFY_HERE or UST__QUALIFY_PROCESS */
  int qualify_calls;                   /* process: passing calls a route needs there before it runs here */
  int qualify_memory_mb;               /* process: memory the candidate may take there (RLIMIT_DATA, beyond its own) */
  int qualify_cpu_s;                   /* process: CPU seconds that process may use (RLIMIT_CPU) */
  char *source;                        /* "source": the object as JSON text, owned; NULL: none */
  int n_when;                          /* "when": key dimensions a route must have */
  char when_dim[UST__MAX_WHEN][UST__NAME_MAX];
  int64_t when_value[UST__MAX_WHEN];
} ust__cand_config;

enum { UST__QUALIFY_HERE = 0, UST__QUALIFY_PROCESS = 1 };

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
  double sample_steady; /* the timed share once a key has had steady_after calls (<= sample) */
  uint64_t steady_after;
  double canary;     /* fraction of calls the candidate serves in canary mode */
  int strict;        /* canary/live: verify before serving (synchronises) */
  ust__promotion promotion;
  int n_routes;
  ust__route_config *routes; /* owned */
  ust__cand_config cand;
  int compare;       /* -1: the operator definition's */
  double atol, rtol; /* < 0: the defaults for each dtype */
  double aa_sample;  /* fraction of shadow calls that also run production twice */
  double deadline_ms; /* a candidate call longer than this is overdue: counted, and its route rolled back */
  double max_slowdown; /* shadowing stops on a route whose candidate's median is this many times production's */
  double repro_bytes;  /* a failing call whose inputs fit is kept whole in the report, to be replayed */
} ust__op_config;

/* A loaded candidate: what the guard runs and judges, and what keeps it
 * loaded. Owned by the engine. */
typedef struct ust__candidate {
  ust__cand cand;
  char *path;  /* owned, native only */
  char sha256[65];
  void *dl;    /* dlopen handle, native only */
  int dl_fd;   /* the memfd the object was loaded from (its name); open while loaded */
  ust__loaded_deps deps; /* its pinned dependencies, loaded before it */
  struct ust__procrun *proc; /* qualify "process": its qualifying process, owned; NULL otherwise */
  const ust__cand_config *config; /* borrowed from the engine's config: what loading it here verifies */
  int refusal_said;            /* the worker logged its refusal (worker only) */
} ust__candidate;

/* Load what the config names for operator oc (its definition p): verify and
 * open a native shared object, or note a torch op. Errors name the config
 * field. */
int ust__candidate_load(const ust__op_config *oc, const ust__problem *p, ust__candidate *out);
void ust__candidate_unload(ust__candidate *c);
/* A candidate qualifying in its own process, loaded into this one once a
 * route qualified there (the engine's worker calls it when
 * ust__procrun_passed says so): 1 loaded now, 0 nothing to do, or an error
 * (the candidate is refused then, with the evidence). */
int ust__candidate_load_here(ust__candidate *c);
/* The descriptor a loaded object exports, checked (entry point, size, ABI
 * version, run function, target); errors name path. */
struct ust_candidate;
int ust__candidate_descriptor(void *dl, const char *path, const struct ust_candidate **out);
/* Where the qualifying program is: $UNDERSTUDY_QUALIFIER, else
 * understudy-qualify beside the library holding this code. */
int ust__qualifier_path(char *out, size_t cap);

typedef struct ust__config {
  char *problems_dir;        /* owned, NULL: caller supplies */
  char *report_path;         /* owned, NULL: no periodic report */
  double report_interval_s;  /* <= 0: only at disable */
  double report_window_s;    /* the recent window the report gives beside the totals; 0: none */
  int log_level;
  int default_mode;
  double default_sample;
  double default_sample_steady; /* the timed share once a key has had steady_after calls */
  uint64_t steady_after;
  uint32_t key_every;        /* an observed operator without a candidate keys one call in key_every ... */
  uint64_t key_after;        /* ... past a thread's first key_after calls (ust__policy) */
  int max_routes;
  int shadow_max_inflight;   /* shadow calls whose comparison is pending, at most */
  int shadow_graph_beside_mb; /* what a captured shadow beside the chain may keep, MiB (0: none beside) */
  int shadow_graph_beside_launch; /* 1: its body launched from the device ("device"); 0: an IF node ("conditional") */
  int shadow_graph_start_kernel; /* 1: a host-started shadow behind its kernel in the chain ("kernel"); 0: behind
                                    the replay ("replay") */
  int shadow_graph_gate_replay;   /* 1: beside the chain, the host gates replays where it sees them ("replay");
                                     0: the device decides every replay ("device") */
  double disable_timeout_s;  /* disable returns after this long even while calls are inside candidates */
  char *hardware_dir;        /* owned, NULL: <problems_dir>/hardware */
  char *hardware_profile;    /* owned, NULL: picked by device name (none for CPUs) */
  char *state_path;          /* owned, NULL: rollout state is not persisted */
  int timer_kind;            /* ust__timer_kind */
  double timer_window_ms;    /* a kernel-tracing window's length */
  double timer_budget;       /* the share of host time the windows may cost */
  double timer_launch_cost_us; /* tracing's cost per kernel launch, for the budget */
  char *cupti_path;          /* owned, NULL: libcupti.so.13 as the loader finds it */
  int timer_callbacks;       /* timer.correlation "callbacks" */
  int timer_hold;            /* timer.hold: 0 auto (held where a GPU backend can), 1 off */
  double timer_hold_deadline_us; /* a held call's hold gives up after this long on the device */
  int all_operators;         /* 1 when "operators" is absent: every definition */
  int n_ops;
  ust__op_config *ops;       /* owned */
} ust__config;

/* ---- the config's fields -------------------------------------------------------------
 * Every field the config accepts is one entry of one table (plugin/config.c):
 * its place, type, range or choices, default and what it does. The parser
 * takes each object's keys from it (a key that is no entry is an unknown
 * field), checks and keeps the plain fields through it and starts from its
 * defaults; a field whose parsing depends on others is parsed by its
 * section's code, and is an entry all the same. docs/configuration.md is
 * generated from it (plugin/config_doc.c). */
typedef enum ust__field_type {
  UST__FIELD_INTEGER,  /* a JSON integer in [lo, hi], kept in an int */
  UST__FIELD_COUNT,    /* a whole number of calls in [lo, hi], kept in a uint32_t or a uint64_t */
  UST__FIELD_NUMBER,   /* a finite number between lo and hi (each bound open or closed), kept in a double */
  UST__FIELD_BOOL,     /* true or false, kept in an int */
  UST__FIELD_STRING,   /* a non-empty string, kept as an owned copy */
  UST__FIELD_PATH,     /* a non-empty string, kept with its placeholders expanded (ust__path_expand) */
  UST__FIELD_CHOICE,   /* one of choices, its index kept in an int */
  UST__FIELD_MODE,     /* off, observe, shadow, canary or live, kept in an int (ust__mode_parse) */
  UST__FIELD_OBJECT,   /* an object whose keys are the entries of its own path */
  UST__FIELD_MAP,      /* an object whose keys the user names (its values: the entry "<...>" under it, if any) */
  UST__FIELD_MODE_OR_OBJECT, /* a mode string, or an object whose keys are the entries of its own path */
} ust__field_type;

enum {
  UST__FIELD_BY_HAND = 1,    /* checked and kept by its section's code, which reads its range from the entry */
  UST__FIELD_RELOADABLE = 2, /* a reload may change it (ust__config_reload_check) */
};

typedef struct ust__config_field {
  const char *section; /* the object it is a key of, as a JSON path: "" (the top level), "report",
                          "operators.<name>.guard" (<name>, <key>: keys the user names) */
  const char *name;    /* its key there ("<name>": the value of every key of a map) */
  int type;            /* ust__field_type */
  int flags;           /* UST__FIELD_* */
  const char *what;    /* numbers: what the value is ("a number of seconds"); NULL: by its type */
  double lo, hi;       /* numbers: the range; hi INFINITY: no bound above */
  int lo_open, hi_open; /* a bound the value must not reach */
  const char *const *choices; /* choice: the names, NULL-terminated */
  const char *def;     /* the default as JSON ("4096", "\"events\""), which the parser starts from (for a field
                          kept nowhere, what acts on it does); or NULL */
  const char *def_words; /* a default that is no value of its own ("`defaults.sample`"), or NULL: none */
  const char *note;    /* said in parentheses after the range, in errors and on the page, or NULL */
  const char *doc;     /* what it does, in one to three sentences (Markdown) */
  size_t offset, size; /* where its section's struct keeps it; size 0: checked, kept nowhere */
} ust__config_field;

/* The table, in the order of each object's keys in errors and on the page.
 * *n receives its length. Static, read-only. */
const ust__config_field *ust__config_fields(int *n);
/* What field f accepts, as its errors say after "must be" ("a number of
 * seconds in (0, 86400]", "one of auto, cupti, events"), into buf (cap
 * bytes, truncated to fit). */
void ust__config_field_expects(const ust__config_field *f, char *buf, size_t cap);

/* Parse a JSON config (NULL or "" gives the defaults). Unknown fields are
 * errors, named with their JSON path. */
int ust__config_parse(const char *json, ust__config *out);
void ust__config_free(ust__config *cfg);
/* A path of the config with its placeholders expanded: {pid}, {rank},
 * {local_rank} ('{{' and '}}' for braces). subject names it in errors
 * ("config: 'report.path'")
 * (UST_ECONFIG: an unknown placeholder, an unmatched brace, a rank the
 * environment does not give). *out receives a new string (free). */
int ust__path_expand(const char *subject, const char *templ, char **out);
/* 0 when next differs from running only in what a reload may change
 * (operators' mode, canary, strict, promotion, routes); else UST_ECONFIG
 * naming the first field that differs. Both texts borrowed. */
int ust__config_reload_check(const char *running, const char *next);

/* ---- the rollout state file (plugin/state.c) ------------------------------------ */

/* Read path and hand each saved route to each (its error stops the read). A
 * missing file is no error; a bad one is UST_ECONFIG naming the field. */
int ust__state_read(const char *path, int (*each)(void *ctx, const ust__rollout_row *row), void *ctx);
/* Write rows to path atomically (temp file, fsync, rename). */
int ust__state_write(const char *path, const ust__rollout_row *rows, int n);

/* ---- the report (plugin/report.c) --------------------------------------------------
 * Schema "understudy.report", version 1. A report holds additive figures
 * (counts, sums, histogram buckets, maxima) and derived ones (quantiles,
 * device-time estimates, weights, S, S_agg). ust__report_derive computes the
 * derived figures from the additive ones in place: the in-process report and
 * a merge of many reports (ust_report_derive) use it alike. */
int ust__report_derive(struct cJSON *root);

/* ---- the qualifying process's confinement (plugin/confine.c) ------------------------
 * From now on, on every thread of this process: a signal to any process but
 * itself and its own process group, or a system call of another numbering
 * (i386's, x32's), kills this process with SIGSYS; ptrace and
 * process_vm_readv/writev fail with EPERM, and so do setsid and setpgid (it
 * and what it forks never leave its process group). 0; or -1 where the kernel or the
 * architecture (x86-64 and AArch64 have it) offers no filter, this process
 * then running unconfined and saying so on its standard error. Irrevocable:
 * for understudy-qualify (and the tests' forked children) only. */
int ust__confine_signals(void);

#endif /* UST_PLUGIN_H */
