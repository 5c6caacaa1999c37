/*
 * scorer/: mergeable latency histograms and the JSON report.
 *
 * Histograms are log-bucketed with 16 sub-buckets per power of two (the
 * representative value of a bucket is within 1/32 of any value in it), so
 * histograms from many processes merge exactly by adding counts.
 *
 * Internal header: never installed.
 */
#ifndef UST_SCORER_H
#define UST_SCORER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define UST__HIST_SUB_BITS 4
#define UST__HIST_SUB (1u << UST__HIST_SUB_BITS)
#define UST__HIST_BUCKETS (UST__HIST_SUB + (64 - UST__HIST_SUB_BITS) * UST__HIST_SUB)
#define UST__HIST_SCHEME "log2-sub16-ns"

/* Concurrent histogram: record from any thread, read racily for reports. */
typedef struct ust__hist {
  atomic_uint_fast64_t *buckets; /* UST__HIST_BUCKETS counts, owned */
  atomic_uint_fast64_t count;
  atomic_uint_fast64_t sum;      /* ns */
} ust__hist;

/* A plain snapshot used for merging, quantiles and tests. */
typedef struct ust__hist_snap {
  uint64_t buckets[UST__HIST_BUCKETS];
  uint64_t count;
  uint64_t sum;
} ust__hist_snap;

int ust__hist_init(ust__hist *h);
void ust__hist_free(ust__hist *h);
void ust__hist_record(ust__hist *h, uint64_t ns);
void ust__hist_snapshot(const ust__hist *h, ust__hist_snap *out);

uint32_t ust__hist_index(uint64_t v);
uint64_t ust__hist_lower(uint32_t idx);
uint64_t ust__hist_width(uint32_t idx);
/* Add src into dst: exact. */
void ust__hist_merge(ust__hist_snap *dst, const ust__hist_snap *src);
/* The q-quantile (0 < q <= 1) as the representative value of the bucket that
 * holds rank ceil(q * count); 0 for an empty histogram. */
double ust__hist_quantile(const ust__hist_snap *s, double q);

/* ---- roofline expressions ---------------------------------------------------
 *
 * W (FLOPs) and Q (bytes) of an operator are expressions over the call's
 * dimensions, compiled once and evaluated per shape key without Python:
 *
 *   expr    := term (('+' | '-') term)*
 *   term    := unary (('*' | '/' | '%') unary)*
 *   unary   := ('-' | '+') unary | power
 *   power   := primary ('^' unary)?
 *   primary := NUMBER | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'
 *
 * NAME is one of the variables given at compile time; the functions are
 * min, max (two or more arguments), ceil, floor, abs (one), cdiv(a, b)
 * (ceil(a / b)). Evaluation is in double: integers are exact up to 2^53.
 * The program is bounded (1024 characters, 256 steps, nesting 64), so any
 * input compiles or fails in bounded time and memory. */

typedef struct ust__expr ust__expr;

/* Compile text against the variable names (borrowed). On success *out is a
 * new program (free with ust__expr_free); on error returns UST_EPROBLEM with
 * a message that quotes the text and the position. */
int ust__expr_compile(const char *text, const char *const *vars, int n_vars, ust__expr **out);
/* Evaluate with values[i] for vars[i]. Returns UST_EINVAL (message names
 * the expression) for a division by zero or a non-finite result. */
int ust__expr_eval(const ust__expr *e, const double *values, double *out);
/* The same without setting the thread's last error: for the per-call path. */
int ust__expr_eval_quiet(const ust__expr *e, const double *values, double *out);
void ust__expr_free(ust__expr *e);

/* ---- hardware profiles (problems/hardware/NAME.json) ------------------------
 *
 * Dense peak rates per execution path and the memory bandwidth, picked by
 * the device's name. The paths are named after the W buckets of an
 * operator's FLOPs: bf16, fp16, fp8_e4m3, tf32, fp32. */

enum { UST__PATH_BF16 = 0, UST__PATH_FP16, UST__PATH_FP8_E4M3, UST__PATH_TF32, UST__PATH_FP32, UST__N_PATHS };
const char *ust__path_name(int path);
/* -1 for an unknown name. */
int ust__path_parse(const char *name);

#define UST__HW_MAX_MATCH 8

typedef struct ust__hw_profile {
  char name[64];
  int n_match;
  char match[UST__HW_MAX_MATCH][64]; /* whole words of the device name that select this profile */
  int n_exclude;
  char exclude[UST__HW_MAX_MATCH][64]; /* whole words that rule it out ("NVL", "PCIe": other SKUs) */
  double p_peak[UST__N_PATHS];       /* FLOP/s; 0: the device has no such path */
  double b_peak;                     /* bytes/s */
  char *source;                      /* owned */
  char *path;                        /* owned: the file it came from */
} ust__hw_profile;

typedef struct ust__hw_set {
  int n;
  ust__hw_profile *items; /* owned */
} ust__hw_set;

/* Parse one profile; text and path borrowed. Errors are UST_EPROBLEM naming
 * path and field. */
int ust__hw_parse(const char *text, const char *path, ust__hw_profile *out);
/* Every *.json of dir. */
int ust__hw_load_dir(const char *dir, ust__hw_set *out);
void ust__hw_free(ust__hw_set *set);
/* The profile whose match words appear as whole words in device_name and
 * whose exclude words do not ("NVIDIA H200" picks H200, not H20; "NVIDIA
 * H200 NVL" not the SXM profile); the longest match wins; NULL when none. */
const ust__hw_profile *ust__hw_pick(const ust__hw_set *set, const char *device_name);
/* The host's CPU model name ("model name" of /proc/cpuinfo) into buf; 0, or
 * -1 when there is none. */
int ust__host_cpu_name(char *buf, size_t cap);

/* The roofline floor of one call: T_SOL = max(sum_d W[d] / P[d], Q / B), in
 * seconds (the Atrex-Bench evaluator's hybrid rule). W on a path the profile
 * lacks is an error (UST_EINVAL naming the path). */
int ust__roofline_tsol(const ust__hw_profile *hw, const double w[UST__N_PATHS], double q_bytes, double *seconds);
/* The same without setting the thread's last error: for the per-call path. */
int ust__roofline_tsol_quiet(const ust__hw_profile *hw, const double w[UST__N_PATHS], double q_bytes,
                             double *seconds);

#endif /* UST_SCORER_H */
