/* The figures the Prometheus metrics expose (python-shim/understudy/metrics.py
 * turns them into metric families), read from a route snapshot with no JSON
 * report between, or from a report; folded into series by a reader that
 * keeps each counter as the sum of what its routes added between reads.
 *
 * A series is an operator and a phase, or, where a reader was made with
 * top_keys > 0, an operator, a shape key and a phase: the top_keys keys of
 * each operator with the most estimated device time have series of their
 * own, the others are summed into key "other". A route that moves between
 * series leaves what it counted where it was counted, so every counter only
 * grows (also across a disable and enable: a new session starts its routes
 * from zero, and what they count adds to the series).
 *
 * The output is a small JSON document whose size follows the series, not
 * the routes (schema "understudy.metrics", docs/metrics.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plugin/engine.h"

/* The exposed latency buckets' upper bounds: 2^10, 2^12, ... 2^30 ns (1.02 us
 * to 1.07 s, four times apart), each the lower edge of a report bucket, so
 * every report bucket lies inside one exposed bucket and counts carry over
 * exactly. The last exposed bucket is +Inf. */
#define N_BOUNDS 11
#define N_BUCKETS (N_BOUNDS + 1)
static uint64_t bound_ns(int j) { return (uint64_t)1 << (10 + 2 * j); }

/* The additive figures of a route or a series, by position. */
enum {
  F_CALLS,
  F_CAPTURED,
  F_TIMINGS_DROPPED,
  F_ROOF_CALLS,
  F_ROOF_UNSCORED,
  F_ROOF_FLOOR,
  F_ROOF_TIME,
  F_CAND_ROOF_CALLS,
  F_CAND_ROOF_FLOOR,
  F_CAND_ROOF_TIME,
  F_PASSED,
  F_FAILED,
  F_SKIPPED,
  F_UNVERIFIABLE,
  F_OVERDUE,
  F_BYTES,
  F_AA_RUNS,
  F_AA_MISMATCHING,
  F_SERVED_PROD,
  F_SERVED_CAND,
  F_SERVED_VERIFIED,
  F_CAPTURED_CAND,
  F_TRANSITIONS,
  F_LAT_SUM,
  F_LAT,                      /* N_BUCKETS counts */
  F_CLAT_SUM = F_LAT + N_BUCKETS,
  F_CLAT,                     /* N_BUCKETS counts */
  N_FIGS = F_CLAT + N_BUCKETS
};

/* The figures a series has, by the families its routes have. */
enum { HAS_ROOF = 1, HAS_CAND_ROOF = 2, HAS_SHADOW = 4 };

/* Counter names in the output, with the figure each reads and the family it needs. */
static const struct {
  const char *name;
  int fig, needs;
} counters[] = {
    {"calls", F_CALLS, 0},
    {"captured_calls", F_CAPTURED, 0},
    {"timings_dropped", F_TIMINGS_DROPPED, 0},
    {"roofline_calls", F_ROOF_CALLS, HAS_ROOF},
    {"roofline_unscored", F_ROOF_UNSCORED, HAS_ROOF},
    {"roofline_floor_ns", F_ROOF_FLOOR, HAS_ROOF},
    {"roofline_time_ns", F_ROOF_TIME, HAS_ROOF},
    {"cand_roofline_calls", F_CAND_ROOF_CALLS, HAS_CAND_ROOF},
    {"cand_roofline_floor_ns", F_CAND_ROOF_FLOOR, HAS_CAND_ROOF},
    {"cand_roofline_time_ns", F_CAND_ROOF_TIME, HAS_CAND_ROOF},
    {"shadow_passed", F_PASSED, HAS_SHADOW},
    {"shadow_failed", F_FAILED, HAS_SHADOW},
    {"shadow_skipped", F_SKIPPED, HAS_SHADOW},
    {"shadow_unverifiable", F_UNVERIFIABLE, HAS_SHADOW},
    {"shadow_overdue", F_OVERDUE, HAS_SHADOW},
    {"shadow_bytes", F_BYTES, HAS_SHADOW},
    {"aa_runs", F_AA_RUNS, HAS_SHADOW},
    {"aa_mismatching", F_AA_MISMATCHING, HAS_SHADOW},
    {"served_production", F_SERVED_PROD, HAS_SHADOW},
    {"served_candidate", F_SERVED_CAND, HAS_SHADOW},
    {"served_verified", F_SERVED_VERIFIED, HAS_SHADOW},
    {"captured_candidate", F_CAPTURED_CAND, HAS_SHADOW},
    {"transitions", F_TRANSITIONS, HAS_SHADOW},
};

static const char *const modes[] = {"off", "observe", "shadow", "canary", "live", "rolled_back"};
#define N_MODES 6

/* A route's previous figures (a reader with top_keys only). */
typedef struct route_last {
  char *id; /* "operator\x1fkey" */
  double f[N_FIGS];
  int seen; /* read at this read */
  UT_hash_handle hh;
} route_last;

typedef struct series {
  char *id; /* "operator\x1fkey\x1fphase" */
  char *op, *key; /* key: "" without top_keys */
  int phase;
  int has, shown, idx;
  double acc[N_FIGS];  /* what its routes added, over every read */
  double sum[N_FIGS];  /* without top_keys: its routes' figures at the last read of this session */
  UT_hash_handle hh;
} series;

struct ust_metrics {
  int top_keys;
  double session_pid, session_started;
  int has_session;
  route_last *last;
  series *series;
};

/* ---- a reader ------------------------------------------------------------------------ */

int ust_metrics_new(int top_keys, ust_metrics **out) {
  ust__clear_error();
  if (out == NULL)
    return ust__error(UST_EINVAL, "metrics: out is NULL");
  *out = NULL;
  if (top_keys < 0 || top_keys > 65536)
    return ust__error(UST_EINVAL, "metrics: top_keys %d is not in [0, 65536]", top_keys);
  ust_metrics *m = calloc(1, sizeof *m);
  if (m == NULL)
    return ust__error(UST_ENOMEM, "metrics: out of memory");
  m->top_keys = top_keys;
  *out = m;
  return 0;
}

static void forget_routes(ust_metrics *m) {
  route_last *r, *tmp;
  HASH_ITER(hh, m->last, r, tmp) {
    HASH_DEL(m->last, r);
    free(r->id);
    free(r);
  }
}

void ust_metrics_free(ust_metrics *m) {
  if (m == NULL)
    return;
  forget_routes(m);
  series *s, *tmp;
  HASH_ITER(hh, m->series, s, tmp) {
    HASH_DEL(m->series, s);
    free(s->id);
    free(s->op);
    free(s->key);
    free(s);
  }
  free(m);
}

/* ---- one route's figures ------------------------------------------------------------- */

static int coarse(uint32_t fine) {
  if (fine < 16)
    return 0; /* below 16 ns */
  const uint32_t e = (fine - 16) / 16 + 4, sub = (fine - 16) % 16;
  if (e > 30)
    return N_BOUNDS;
  const uint64_t lower = (uint64_t)(16 + sub) << (e - 4);
  int j = 0;
  while (j < N_BOUNDS && bound_ns(j) <= lower)
    j++;
  return j;
}

static void add_hist(double *f, int at, const ust__hist_sparse *h, int has) {
  if (!has)
    return;
  f[at - 1] = (double)h->sum; /* the sum sits before the buckets */
  for (int i = 0; i < h->n; i++)
    f[at + (h->index[i] < UST__HIST_BUCKETS ? coarse(h->index[i]) : N_BOUNDS)] += (double)h->counts[i];
}

static int figures_of(const ust__reading *r, double *f) {
  memset(f, 0, N_FIGS * sizeof *f);
  const ust__derive_in *in = &r->in;
  int has = 0;
  f[F_CALLS] = in->calls;
  f[F_CAPTURED] = in->captured;
  f[F_TIMINGS_DROPPED] = r->timing_dropped;
  add_hist(f, F_LAT, &r->lat, r->has_lat);
  if (in->has_roofline) {
    has |= HAS_ROOF;
    f[F_ROOF_CALLS] = in->roof_calls;
    f[F_ROOF_UNSCORED] = r->roof_unscored;
    f[F_ROOF_FLOOR] = in->roof_tsol_ns;
    f[F_ROOF_TIME] = in->roof_time_ns;
    if (in->has_shadow) {
      has |= HAS_CAND_ROOF;
      f[F_CAND_ROOF_CALLS] = in->cand_roof_calls;
      f[F_CAND_ROOF_FLOOR] = in->cand_roof_tsol_ns;
      f[F_CAND_ROOF_TIME] = in->cand_roof_time_ns;
    }
  }
  if (in->has_shadow) {
    has |= HAS_SHADOW;
    f[F_PASSED] = r->passed;
    f[F_FAILED] = in->failed;
    f[F_SKIPPED] = r->skipped;
    f[F_UNVERIFIABLE] = r->unverifiable;
    f[F_OVERDUE] = r->overdue;
    f[F_BYTES] = r->bytes_copied;
    f[F_AA_RUNS] = r->aa_runs;
    f[F_AA_MISMATCHING] = r->aa_mismatching;
    f[F_SERVED_PROD] = r->served_prod;
    f[F_SERVED_CAND] = in->served_cand;
    f[F_SERVED_VERIFIED] = r->served_cand_verified;
    f[F_CAPTURED_CAND] = r->captured_cand;
    f[F_TRANSITIONS] = r->transitions;
    add_hist(f, F_CLAT, &r->clat, r->has_clat);
  }
  return has;
}

/* ---- the fold ------------------------------------------------------------------------ */

/* One route as the fold takes it: its reading, its operator's name, its
 * estimated device time (the ranking). */
typedef struct row {
  const ust__reading *r;
  const char *op;
  double est;
} row;

static int by_op_then_rank(const void *a, const void *b) {
  const row *x = a, *y = b;
  const int c = strcmp(x->op, y->op);
  if (c != 0)
    return c;
  if (x->est != y->est)
    return x->est > y->est ? -1 : 1;
  if (x->r->in.calls != y->r->in.calls)
    return x->r->in.calls > y->r->in.calls ? -1 : 1;
  return strcmp(x->r->key, y->r->key);
}

static char *join(const char *a, const char *b, const char *c) {
  const size_t n = strlen(a) + strlen(b) + (c ? strlen(c) : 0) + 3;
  char *s = malloc(n);
  if (s != NULL)
    snprintf(s, n, c ? "%s\x1f%s\x1f%s" : "%s\x1f%s", a, b, c ? c : "");
  return s;
}

static series *series_get(ust_metrics *m, const char *op, const char *key, int phase) {
  char *id = join(op, key, ust__phase_name(phase));
  if (id == NULL)
    return NULL;
  series *s = NULL;
  HASH_FIND_STR(m->series, id, s);
  if (s != NULL) {
    free(id);
    return s;
  }
  s = calloc(1, sizeof *s);
  if (s == NULL || (s->op = strdup(op)) == NULL || (s->key = strdup(key)) == NULL) {
    if (s != NULL)
      free(s->op);
    free(s);
    free(id);
    return NULL;
  }
  s->id = id;
  s->phase = phase;
  HASH_ADD_KEYPTR(hh, m->series, s->id, strlen(s->id), s);
  return s;
}

/* With top_keys: each route's increments since the last read go to its series now. */
static int fold_keyed(ust_metrics *m, row *rows, int n) {
  double now[N_FIGS];
  for (int i = 0, rank = 0; i < n; i++, rank++) {
    if (i > 0 && strcmp(rows[i].op, rows[i - 1].op) != 0)
      rank = 0;
    const ust__reading *r = rows[i].r;
    series *s = series_get(m, rows[i].op, rank < m->top_keys ? r->key : "other", r->in.phase);
    char *rid = join(rows[i].op, r->key, NULL);
    if (s == NULL || rid == NULL) {
      free(rid);
      return ust__error(UST_ENOMEM, "metrics: out of memory");
    }
    s->has |= figures_of(r, now);
    s->shown = 1;
    route_last *last = NULL;
    HASH_FIND_STR(m->last, rid, last);
    if (last == NULL) {
      if ((last = calloc(1, sizeof *last)) == NULL) {
        free(rid);
        return ust__error(UST_ENOMEM, "metrics: out of memory");
      }
      last->id = rid;
      HASH_ADD_KEYPTR(hh, m->last, last->id, strlen(last->id), last);
    } else {
      free(rid);
    }
    int back = 0; /* figures went back: the route counts anew */
    for (int k = 0; k < N_FIGS && !back; k++)
      back = now[k] < last->f[k];
    for (int k = 0; k < N_FIGS; k++)
      s->acc[k] += now[k] - (back ? 0 : last->f[k]);
    memcpy(last->f, now, sizeof now);
  }
  return 0;
}

/* Without top_keys: a series is an operator and a phase, which a route never
 * leaves, so its figures are its routes' summed; what earlier reads and
 * sessions counted stays in acc. */
static int fold_plain(ust_metrics *m, row *rows, int n) {
  double now[N_FIGS];
  series **of = calloc((size_t)n + 1, sizeof *of);
  if (of == NULL)
    return ust__error(UST_ENOMEM, "metrics: out of memory");
  for (int i = 0; i < n; i++)
    if ((of[i] = series_get(m, rows[i].op, "", rows[i].r->in.phase)) == NULL) {
      free(of);
      return ust__error(UST_ENOMEM, "metrics: out of memory");
    }
  const int ns = HASH_COUNT(m->series);
  double *cur = calloc((size_t)ns * N_FIGS + 1, sizeof *cur);
  if (cur == NULL) {
    free(of);
    return ust__error(UST_ENOMEM, "metrics: out of memory");
  }
  int k = 0;
  series *s, *tmp;
  HASH_ITER(hh, m->series, s, tmp) s->idx = k++;
  for (int i = 0; i < n; i++) {
    of[i]->has |= figures_of(rows[i].r, now);
    for (int f = 0; f < N_FIGS; f++)
      cur[(size_t)of[i]->idx * N_FIGS + f] += now[f];
  }
  HASH_ITER(hh, m->series, s, tmp) {
    const double *c = &cur[(size_t)s->idx * N_FIGS];
    int back = 0; /* figures went back: the series counts its routes anew */
    for (int f = 0; f < N_FIGS && !back; f++)
      back = c[f] < s->sum[f];
    for (int f = 0; f < N_FIGS; f++)
      s->acc[f] += c[f] - (back ? 0 : s->sum[f]);
    memcpy(s->sum, c, sizeof s->sum);
    s->shown = 1; /* a series stays once it exists: it only grows */
  }
  free(cur);
  free(of);
  return 0;
}

static int fold(ust_metrics *m, double pid, double started, row *rows, int n) {
  if (!m->has_session || pid != m->session_pid || started != m->session_started) {
    /* a new enable: every route starts again from zero */
    forget_routes(m);
    series *s, *tmp;
    HASH_ITER(hh, m->series, s, tmp) memset(s->sum, 0, sizeof s->sum);
    m->has_session = 1;
    m->session_pid = pid;
    m->session_started = started;
  }
  qsort(rows, (size_t)n, sizeof *rows, by_op_then_rank);
  if (m->top_keys == 0)
    return fold_plain(m, rows, n);
  series *s, *tmp;
  HASH_ITER(hh, m->series, s, tmp) s->shown = strcmp(s->key, "other") == 0; /* "other" stays once it exists */
  return fold_keyed(m, rows, n);
}

/* ---- the output ---------------------------------------------------------------------- */

static cJSON *num_or_null(double v) { return v >= 0 && isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static cJSON *hist_out(const double *f, int sum_at) {
  cJSON *h = cJSON_CreateObject();
  cJSON *b = cJSON_AddArrayToObject(h, "buckets");
  for (int j = 0; j < N_BUCKETS; j++)
    cJSON_AddItemToArray(b, cJSON_CreateNumber(f[sum_at + 1 + j]));
  cJSON_AddNumberToObject(h, "sum_ns", f[sum_at]);
  return h;
}

static int by_id(const void *a, const void *b) {
  return strcmp((*(series *const *)a)->id, (*(series *const *)b)->id);
}

static cJSON *series_out(ust_metrics *m) {
  cJSON *arr = cJSON_CreateArray();
  const int ns = HASH_COUNT(m->series);
  series **list = calloc((size_t)ns + 1, sizeof *list);
  if (arr == NULL || list == NULL) {
    free(list);
    cJSON_Delete(arr);
    return NULL;
  }
  int k = 0;
  series *s, *tmp;
  HASH_ITER(hh, m->series, s, tmp) if (s->shown) list[k++] = s;
  qsort(list, (size_t)k, sizeof *list, by_id);
  for (int i = 0; i < k; i++) {
    s = list[i];
    cJSON *js = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, js);
    cJSON_AddStringToObject(js, "operator", s->op);
    if (m->top_keys > 0)
      cJSON_AddStringToObject(js, "key", s->key);
    cJSON_AddStringToObject(js, "phase", ust__phase_name(s->phase));
    cJSON *c = cJSON_AddObjectToObject(js, "counters");
    for (size_t j = 0; j < sizeof counters / sizeof counters[0]; j++)
      if ((s->has & counters[j].needs) == counters[j].needs)
        cJSON_AddNumberToObject(c, counters[j].name, s->acc[counters[j].fig]);
    cJSON_AddItemToObject(js, "latency", hist_out(s->acc, F_LAT_SUM));
    if (s->has & HAS_SHADOW)
      cJSON_AddItemToObject(js, "candidate_latency", hist_out(s->acc, F_CLAT_SUM));
  }
  free(list);
  return arr;
}

/* Who serves a route now (the report's served_by.now). */
static const char *const serving[] = {"production", "candidate", "both"};
#define N_SERVING 3

/* What an operator says beside its routes' series. */
typedef struct op_out {
  const char *name;
  int has_candidate, shown;
  double untracked, tallied, weight, S, S_candidate, coverage;
  double above_roof; /* its keys above their roof; -1: none scored */
  double modes[N_MODES];
  double graph[3]; /* gated, observed, observe_only */
  /* with a candidate: its name, its source's kind (else the candidate's) and
   * label, and its routes by who serves them now */
  const char *cand_name, *cand_source;
  char cand_kind[64];
  double serving[N_SERVING];
} op_out;

static void count_serving(op_out *o, const char *now) {
  for (int i = 0; i < N_SERVING; i++)
    if (strcmp(now, serving[i]) == 0)
      o->serving[i]++;
}

static void count_route(op_out *o, const char *mode, int graph) {
  for (int i = 0; i < N_MODES; i++)
    if (strcmp(mode, modes[i]) == 0)
      o->modes[i]++;
  if (graph == UST__GRAPH_GATED)
    o->graph[0]++;
  else if (graph == UST__GRAPH_OBSERVED)
    o->graph[1]++;
  else if (graph == UST__GRAPH_OBSERVE_ONLY)
    o->graph[2]++;
}

static cJSON *ops_out(const op_out *ops, int n_ops) {
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; arr != NULL && i < n_ops; i++) {
    const op_out *o = &ops[i];
    if (!o->shown)
      continue;
    cJSON *jo = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, jo);
    cJSON_AddStringToObject(jo, "name", o->name);
    cJSON_AddBoolToObject(jo, "candidate", o->has_candidate);
    cJSON *jm = cJSON_AddObjectToObject(jo, "routes");
    for (int k = 0; k < N_MODES; k++)
      cJSON_AddNumberToObject(jm, modes[k], o->modes[k]);
    cJSON *jg = cJSON_AddObjectToObject(jo, "graph");
    cJSON_AddNumberToObject(jg, "gated", o->graph[0]);
    cJSON_AddNumberToObject(jg, "observed", o->graph[1]);
    cJSON_AddNumberToObject(jg, "observe_only", o->graph[2]);
    cJSON_AddNumberToObject(jo, "weight", o->weight);
    cJSON_AddItemToObject(jo, "S", num_or_null(o->S));
    if (o->has_candidate) {
      cJSON_AddItemToObject(jo, "S_candidate", num_or_null(o->S_candidate));
      cJSON_AddItemToObject(jo, "coverage", num_or_null(o->coverage));
    }
    if (o->above_roof >= 0)
      cJSON_AddNumberToObject(jo, "above_roof", o->above_roof);
    cJSON_AddNumberToObject(jo, "untracked", o->untracked);
    cJSON_AddNumberToObject(jo, "tallied", o->tallied);
  }
  return arr;
}

/* Each operator's candidate, whether or not its routes saw calls. */
static cJSON *candidates_out(const op_out *ops, int n_ops) {
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; arr != NULL && i < n_ops; i++) {
    const op_out *o = &ops[i];
    if (!o->has_candidate)
      continue;
    cJSON *jc = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, jc);
    cJSON_AddStringToObject(jc, "operator", o->name);
    cJSON_AddStringToObject(jc, "candidate", o->cand_name != NULL ? o->cand_name : "");
    cJSON_AddStringToObject(jc, "kind", o->cand_kind);
    cJSON_AddStringToObject(jc, "source", o->cand_source != NULL ? o->cand_source : "");
    cJSON *js = cJSON_AddObjectToObject(jc, "serving");
    for (int k = 0; k < N_SERVING; k++)
      cJSON_AddNumberToObject(js, serving[k], o->serving[k]);
  }
  return arr;
}

/* The candidates' headline (the report's totals.candidate_routes); null
 * without a candidate. */
static void cand_routes_out(cJSON *jt, int present, double routes, double share, double s_cand, double s_prod) {
  if (!present) {
    cJSON_AddNullToObject(jt, "candidate_routes");
    return;
  }
  cJSON *c = cJSON_AddObjectToObject(jt, "candidate_routes");
  cJSON_AddNumberToObject(c, "routes", routes);
  cJSON_AddNumberToObject(c, "device_share", share);
  cJSON_AddItemToObject(c, "S_candidate", num_or_null(s_cand));
  cJSON_AddItemToObject(c, "S_production", num_or_null(s_prod));
}

static cJSON *head(const char *lib, const char *torch, double pid, double started, int keyed) {
  cJSON *root = cJSON_CreateObject();
  if (root == NULL)
    return NULL;
  cJSON_AddStringToObject(root, "schema", "understudy.metrics");
  cJSON_AddNumberToObject(root, "version", 1);
  cJSON_AddStringToObject(root, "library_version", lib);
  cJSON_AddStringToObject(root, "torch_version", torch);
  cJSON_AddNumberToObject(root, "pid", pid);
  cJSON_AddNumberToObject(root, "started_unix_ms", started);
  cJSON_AddBoolToObject(root, "keyed", keyed);
  cJSON *b = cJSON_AddArrayToObject(root, "bounds_ns");
  for (int j = 0; j < N_BOUNDS; j++)
    cJSON_AddItemToArray(b, cJSON_CreateNumber((double)bound_ns(j)));
  return root;
}

static int finish(ust_metrics *m, cJSON *root, const op_out *ops, int n_ops, char **out) {
  cJSON *jseries = series_out(m), *jops = ops_out(ops, n_ops), *jcands = candidates_out(ops, n_ops);
  if (jseries != NULL)
    cJSON_AddItemToObject(root, "series", jseries);
  if (jops != NULL)
    cJSON_AddItemToObject(root, "operators", jops);
  if (jcands != NULL)
    cJSON_AddItemToObject(root, "candidates", jcands);
  *out = jseries != NULL && jops != NULL && jcands != NULL ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return *out != NULL ? 0 : ust__error(UST_ENOMEM, "metrics: out of memory");
}

static void totals_out(cJSON *root, const ust__derive_totals *t, double internal_errors) {
  cJSON *jt = cJSON_AddObjectToObject(root, "totals");
  cJSON_AddNumberToObject(jt, "internal_errors", internal_errors);
  cJSON_AddNumberToObject(jt, "scored_share", t->scored_share);
  cJSON_AddItemToObject(jt, "S_agg", num_or_null(t->S_agg));
  cJSON_AddItemToObject(jt, "S_agg_candidate", num_or_null(t->S_agg_candidate));
  const ust__derive_cand *c = &t->candidate_routes;
  cand_routes_out(jt, t->any_candidate, c->routes, c->device_share, c->S_candidate, c->S_production);
  cJSON *jp = cJSON_AddObjectToObject(jt, "phases");
  for (int p = 0; p < UST__N_PHASES; p++) {
    if (t->phases[p].est_device_time_ns <= 0)
      continue;
    cJSON *x = cJSON_AddObjectToObject(jp, ust__phase_name(p));
    cJSON_AddItemToObject(x, "S_agg", num_or_null(t->phases[p].S_agg));
    cJSON_AddItemToObject(x, "S_agg_candidate", num_or_null(t->phases[p].S_agg_candidate));
  }
}

/* ---- from this process's routes -------------------------------------------------------- */

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

/* The window's S per operator and S_agg (the report's "window", in brief). */
static int window_out(ust__engine *e, cJSON *root, const ust__reading *r, int n, const cJSON *timer,
                      ust__derive_op *ops) {
  ust__reading *w = NULL;
  ust__derive_shape *d = NULL;
  ust__derive_totals tot;
  int nw = 0;
  double since = 0, scale = 1;
  int rc = ust__window_readings(e, r, n, num(timer, "window_ns"), num(timer, "elapsed_ns"), &w, &nw, &since, &scale);
  if (rc == 0 && (d = calloc((size_t)nw + 1, sizeof *d)) == NULL)
    rc = ust__error(UST_ENOMEM, "metrics: out of memory");
  if (rc == 0)
    rc = ust__derive_readings(w, nw, scale, d, ops, e->n_ops, &tot);
  if (rc == 0) {
    cJSON *jw = cJSON_AddObjectToObject(root, "window");
    cJSON_AddNumberToObject(jw, "span_s", ((double)ust__unix_ms() - since) / 1000.0);
    cJSON *jt = cJSON_AddObjectToObject(jw, "totals");
    cJSON_AddItemToObject(jt, "S_agg", num_or_null(tot.S_agg));
    cJSON *jo = cJSON_AddArrayToObject(jw, "operators");
    for (int o = 0; o < e->n_ops; o++) {
      int any = 0;
      for (int i = 0; i < nw && !any; i++)
        any = w[i].in.op == o;
      if (!any)
        continue;
      cJSON *x = cJSON_CreateObject();
      cJSON_AddItemToArray(jo, x);
      cJSON_AddStringToObject(x, "name", e->ops[o].op.name);
      cJSON_AddItemToObject(x, "S", num_or_null(ops[o].S));
    }
  }
  free(d);
  ust__readings_free(w, nw);
  return rc;
}

/* An operator's candidate as the report names it: its name, its source's
 * kind (else native or torch_op) and label. */
static void cand_of_engine(op_out *o, const ust__cand *c) {
  o->cand_name = c->name;
  o->cand_source = c->label;
  snprintf(o->cand_kind, sizeof o->cand_kind, "%s", c->kind == UST__CAND_NATIVE ? "native" : "torch_op");
  cJSON *src = c->source_json != NULL ? cJSON_Parse(c->source_json) : NULL;
  const cJSON *kind = cJSON_GetObjectItemCaseSensitive(src, "kind");
  if (cJSON_IsString(kind))
    snprintf(o->cand_kind, sizeof o->cand_kind, "%s", kind->valuestring);
  cJSON_Delete(src);
}

int ust__metrics_read_engine(ust_metrics *m, ust__engine *e, char **out) {
  *out = NULL;
  ust__route_snap *snaps = NULL;
  int nr = 0, rc = 0;
  ust__reading *r = NULL;
  ust__derive_shape *d = NULL;
  ust__derive_op *dops = calloc((size_t)e->n_ops + 1, sizeof *dops), *wops = NULL;
  op_out *ops = calloc((size_t)e->n_ops + 1, sizeof *ops);
  row *rows = NULL;
  cJSON *root = NULL, *timer = NULL;
  ust__derive_totals tot;
  if (dops == NULL || ops == NULL || ust__routes_snapshot(&e->router, &snaps, &nr) != 0)
    goto oom;
  r = calloc((size_t)nr + 1, sizeof *r);
  d = calloc((size_t)nr + 1, sizeof *d);
  rows = calloc((size_t)nr + 1, sizeof *rows);
  if (r == NULL || d == NULL || rows == NULL || (timer = ust__report_timer(e)) == NULL)
    goto oom;
  for (int i = 0; i < nr; i++)
    ust__reading_of_snap(e, &snaps[i], &r[i]);
  for (int o = 0; o < e->n_ops; o++) {
    const ust__engine_op *eo = &e->ops[o];
    ops[o].name = eo->op.name;
    ops[o].has_candidate = dops[o].has_candidate = eo->op.cand != NULL;
    if (eo->op.cand != NULL)
      cand_of_engine(&ops[o], eo->op.cand);
    for (int bi = 0; bi < e->n_bindings; bi++)
      if (e->bindings[bi].op == &eo->op) {
        ops[o].untracked += (double)atomic_load(&e->bindings[bi].untracked);
        ops[o].tallied += (double)ust__binding_tallied_count(&e->bindings[bi]);
      }
  }
  double elapsed = num(timer, "elapsed_ns"), win = num(timer, "window_ns");
  if ((rc = ust__derive_readings(r, nr, win > 0 && elapsed > win ? elapsed / win : 1.0, d, dops, e->n_ops, &tot)) != 0)
    goto out;
  for (int i = 0; i < nr; i++) {
    const int o = r[i].in.op >= 0 ? r[i].in.op : 0;
    rows[i] = (row){.r = &r[i], .op = e->ops[o].op.name, .est = d[i].est_device_time_ns};
    count_route(&ops[o], r[i].mode, d[i].graph);
    if (ops[o].has_candidate)
      count_serving(&ops[o], ust__report_served_now(&snaps[i]));
    ops[o].shown = 1;
  }
  for (int o = 0; o < e->n_ops; o++) {
    ops[o].shown |= ops[o].untracked > 0 || ops[o].tallied > 0;
    ops[o].above_roof = dops[o].scored_shapes > 0 ? dops[o].above_roof : -1;
    ops[o].weight = dops[o].weight;
    ops[o].S = dops[o].S;
    ops[o].S_candidate = dops[o].S_candidate;
    ops[o].coverage = dops[o].coverage;
  }
  root = head(ust_version(), ust_torch_version(), (double)getpid(), (double)e->started_unix_ms, m->top_keys > 0);
  if (root == NULL)
    goto oom;
  totals_out(root, &tot, (double)atomic_load(&e->router.internal_errors));
  cJSON_AddItemToObject(root, "timer", timer);
  timer = NULL;
  if (e->cfg.report_window_s > 0) {
    if ((wops = calloc((size_t)e->n_ops + 1, sizeof *wops)) == NULL)
      goto oom;
    for (int o = 0; o < e->n_ops; o++)
      wops[o].has_candidate = dops[o].has_candidate;
    if ((rc = window_out(e, root, r, nr, cJSON_GetObjectItemCaseSensitive(root, "timer"), wops)) != 0)
      goto out;
  }
  if ((rc = fold(m, (double)getpid(), (double)e->started_unix_ms, rows, nr)) != 0)
    goto out;
  rc = finish(m, root, ops, e->n_ops, out);
  root = NULL;
  goto out;
oom:
  rc = ust__error(UST_ENOMEM, "metrics: out of memory");
out:
  cJSON_Delete(root);
  cJSON_Delete(timer);
  free(rows);
  free(d);
  free(dops);
  free(wops);
  free(ops);
  ust__readings_free(r, nr);
  ust__routes_snapshot_free(snaps, nr);
  return rc;
}

/* ---- from a report -------------------------------------------------------------------- */

static const char *str(const cJSON *o, const char *k, const char *dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : dflt;
}

static double num_or(const cJSON *o, const char *k, double dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static int graph_of(const cJSON *sh) {
  const char *st = str(cJSON_GetObjectItemCaseSensitive(sh, "graph"), "status", "");
  for (int g = UST__GRAPH_OBSERVED; g <= UST__GRAPH_OBSERVE_ONLY; g++)
    if (strcmp(st, ust__graph_status_name(g)) == 0)
      return g;
  return UST__GRAPH_NONE;
}

/* An operator's candidate object in a report: its name, its source's kind
 * (else its own) and label. */
static void cand_of_report(op_out *o, const cJSON *c) {
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(c, "source");
  o->cand_name = str(c, "name", "");
  o->cand_source = str(src, "label", "");
  snprintf(o->cand_kind, sizeof o->cand_kind, "%s", str(src, "kind", str(c, "kind", "")));
}

/* The candidates' headline as the report gives it. */
static void cand_routes_of_report(cJSON *jt, const cJSON *tot) {
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(tot, "candidate_routes");
  cand_routes_out(jt, cJSON_IsObject(c), num(c, "routes"), num(c, "device_share"), num_or(c, "S_candidate", -1),
                  num_or(c, "S_production", -1));
}

/* The report's figures as it gives them: its derived ones are taken, not derived again. */
static int read_report(ust_metrics *m, const cJSON *rep, char **out) {
  const cJSON *hist = cJSON_GetObjectItemCaseSensitive(rep, "histogram");
  if (hist != NULL && (strcmp(str(hist, "scheme", UST__HIST_SCHEME), UST__HIST_SCHEME) != 0 ||
                       num_or(hist, "buckets", UST__HIST_BUCKETS) != UST__HIST_BUCKETS))
    return ust__error(UST_EINVAL, "metrics: the report's histograms are '%s' with %.0f buckets, this library "
                      "reads '%s' with %d", str(hist, "scheme", "?"), num(hist, "buckets"), UST__HIST_SCHEME,
                      UST__HIST_BUCKETS);
  const cJSON *jops = cJSON_GetObjectItemCaseSensitive(rep, "operators"), *op, *sh;
  int n = 0, n_ops = 0;
  cJSON_ArrayForEach(op, jops) {
    n_ops++;
    n += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(op, "shapes"));
  }
  ust__reading *r = calloc((size_t)n + 1, sizeof *r);
  row *rows = calloc((size_t)n + 1, sizeof *rows);
  op_out *ops = calloc((size_t)n_ops + 1, sizeof *ops);
  int rc = 0, k = 0, o = 0;
  if (r == NULL || rows == NULL || ops == NULL) {
    rc = ust__error(UST_ENOMEM, "metrics: out of memory");
    goto out;
  }
  cJSON_ArrayForEach(op, jops) {
    op_out *x = &ops[o];
    x->name = str(op, "name", "");
    const cJSON *rl = cJSON_GetObjectItemCaseSensitive(op, "roofline");
    x->has_candidate = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(op, "candidate"));
    x->weight = num(op, "weight");
    x->S = num_or(rl, "S", -1);
    x->S_candidate = num_or(rl, "S_candidate", -1);
    x->coverage = num_or(rl, "coverage", -1);
    x->above_roof = num(rl, "scored_shapes") > 0 ? num(rl, "above_roof") : -1;
    x->untracked = num(op, "untracked");
    x->tallied = num(op, "tallied");
    x->shown = x->untracked > 0 || x->tallied > 0;
    if (x->has_candidate)
      cand_of_report(x, cJSON_GetObjectItemCaseSensitive(op, "candidate"));
    cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(op, "shapes")) {
      if (k == n)
        break;
      rc = ust__reading_of_json(sh, o, &r[k]);
      k++;
      if (rc != 0)
        goto out;
      rows[k - 1] = (row){.r = &r[k - 1], .op = x->name, .est = num(sh, "est_device_time_ns")};
      count_route(x, r[k - 1].mode, graph_of(sh));
      if (x->has_candidate)
        count_serving(x, str(cJSON_GetObjectItemCaseSensitive(sh, "served_by"), "now", "production"));
      x->shown = 1;
    }
    o++;
  }
  cJSON *root = head(str(rep, "library_version", ""), str(rep, "torch_version", ""), num(rep, "pid"),
                     num(rep, "started_unix_ms"), m->top_keys > 0);
  if (root == NULL) {
    rc = ust__error(UST_ENOMEM, "metrics: out of memory");
    goto out;
  }
  const cJSON *tot = cJSON_GetObjectItemCaseSensitive(rep, "totals"), *ph;
  cJSON *jt = cJSON_AddObjectToObject(root, "totals");
  cJSON_AddNumberToObject(jt, "internal_errors", num(tot, "internal_errors"));
  cJSON_AddNumberToObject(jt, "scored_share", num(tot, "scored_share"));
  cJSON_AddItemToObject(jt, "S_agg", num_or_null(num_or(tot, "S_agg", -1)));
  cJSON_AddItemToObject(jt, "S_agg_candidate", num_or_null(num_or(tot, "S_agg_candidate", -1)));
  cand_routes_of_report(jt, tot);
  cJSON *jp = cJSON_AddObjectToObject(jt, "phases");
  cJSON_ArrayForEach(ph, cJSON_GetObjectItemCaseSensitive(tot, "phases")) {
    if (ph->string == NULL)
      continue;
    cJSON *x = cJSON_AddObjectToObject(jp, ph->string);
    cJSON_AddItemToObject(x, "S_agg", num_or_null(num_or(ph, "S_agg", -1)));
    cJSON_AddItemToObject(x, "S_agg_candidate", num_or_null(num_or(ph, "S_agg_candidate", -1)));
  }
  const cJSON *timer = cJSON_GetObjectItemCaseSensitive(rep, "timer");
  if (cJSON_IsObject(timer))
    cJSON_AddItemToObject(root, "timer", cJSON_Duplicate(timer, 1));
  const cJSON *win = cJSON_GetObjectItemCaseSensitive(rep, "window");
  if (cJSON_IsObject(win)) {
    cJSON *jw = cJSON_AddObjectToObject(root, "window");
    cJSON_AddNumberToObject(jw, "span_s", num(win, "span_s"));
    cJSON *wt = cJSON_AddObjectToObject(jw, "totals");
    cJSON_AddItemToObject(wt, "S_agg", num_or_null(num_or(cJSON_GetObjectItemCaseSensitive(win, "totals"), "S_agg", -1)));
    cJSON *wo = cJSON_AddArrayToObject(jw, "operators");
    cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(win, "operators")) {
      cJSON *x = cJSON_CreateObject();
      cJSON_AddItemToArray(wo, x);
      cJSON_AddStringToObject(x, "name", str(op, "name", ""));
      cJSON_AddItemToObject(x, "S", num_or_null(num_or(op, "S", -1)));
    }
  }
  if ((rc = fold(m, num(rep, "pid"), num(rep, "started_unix_ms"), rows, k)) != 0) {
    cJSON_Delete(root);
    goto out;
  }
  rc = finish(m, root, ops, n_ops, out);
out:
  ust__readings_free(r, k);
  free(rows);
  free(ops);
  return rc;
}

int ust__metrics_read_report(ust_metrics *m, const char *report_json, char **out) {
  *out = NULL;
  cJSON *rep = cJSON_Parse(report_json);
  if (rep == NULL)
    return ust__error(UST_EINVAL, "metrics: the report is not JSON");
  const int rc = cJSON_IsObject(rep) ? read_report(m, rep, out)
                                     : ust__error(UST_EINVAL, "metrics: the report is not a JSON object");
  cJSON_Delete(rep);
  return rc;
}
