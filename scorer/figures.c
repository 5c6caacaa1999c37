/* A route's figures (the scorer's part of a route), their plain snapshots,
 * and the rules that derive estimates and S from additive figures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scorer/scorer.h"

int ust__figs_init(ust__figs *f) {
  memset(f, 0, sizeof *f);
  if (ust__hist_init(&f->hist) != 0 || ust__hist_init(&f->cand_hist) != 0) {
    ust__figs_free(f);
    return ust__error(UST_ENOMEM, "out of memory for a route's histograms");
  }
  return 0;
}

void ust__figs_free(ust__figs *f) {
  if (f == NULL)
    return;
  ust__hist_free(&f->hist);
  ust__hist_free(&f->cand_hist);
}

static void roof_add(ust__roof_sums *r, uint64_t tsol_ps, uint64_t ns) {
  if (tsol_ps == 0 || ns == 0)
    return;
  atomic_fetch_add_explicit(&r->calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->tsol_ps, tsol_ps, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->time_ns, ns, memory_order_relaxed);
}

void ust__figs_timed(ust__figs *f, uint64_t ns, uint64_t tsol_ps, int kind) {
  ust__hist_record(&f->hist, ns);
  roof_add(&f->prod, tsol_ps, ns);
  if (kind == UST__TIMED_FIRST) {
    atomic_fetch_add_explicit(&f->first_time_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&f->first_timed, 1, memory_order_relaxed);
  } else if (kind == UST__TIMED_STEADY) {
    atomic_fetch_add_explicit(&f->steady_time_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&f->steady_timed, 1, memory_order_relaxed);
  }
}

void ust__figs_kernel_time(ust__figs *f, uint64_t sum_ns, uint64_t span_ns, uint32_t kernels, uint64_t tsol_ps,
                           int kind) {
  ust__figs_timed(f, sum_ns, tsol_ps, kind);
  atomic_fetch_add_explicit(&f->kernel_span_ns, span_ns, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->kernels, kernels, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->kernel_timed, 1, memory_order_relaxed);
}

void ust__figs_cand_time(ust__figs *f, uint64_t ns, uint64_t tsol_ps, int passed) {
  ust__hist_record(&f->cand_hist, ns);
  if (passed)
    roof_add(&f->cand, tsol_ps, ns);
}

void ust__figs_note_hw(ust__figs *f, const struct ust__hw_profile *hw) {
  if (atomic_load_explicit(&f->hw, memory_order_relaxed) != hw)
    atomic_store_explicit(&f->hw, hw, memory_order_relaxed);
}

static void add_double(_Atomic uint64_t *a, double x) {
  uint64_t old = atomic_load_explicit(a, memory_order_relaxed), next;
  do {
    double d;
    memcpy(&d, &old, sizeof d);
    d += x;
    memcpy(&next, &d, sizeof next);
  } while (!atomic_compare_exchange_weak_explicit(a, &old, next, memory_order_relaxed, memory_order_relaxed));
}

static double load_double(_Atomic uint64_t *a) {
  uint64_t bits = atomic_load(a);
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

void ust__figs_note_work(ust__figs *f, double flops, double bytes) {
  add_double(&f->flops_bits, flops);
  add_double(&f->bytes_bits, bytes);
  atomic_fetch_add_explicit(&f->work_calls, 1, memory_order_relaxed);
}

void ust__figs_adjust_work(ust__figs *f, double dflops, double dbytes) {
  add_double(&f->flops_bits, dflops);
  add_double(&f->bytes_bits, dbytes);
}

double ust__figs_speedup(ust__figs *f) {
  double tp = ust__hist_quantile_live(&f->hist, 0.5), tc = ust__hist_quantile_live(&f->cand_hist, 0.5);
  return tp > 0 && tc > 0 ? tp / tc : 0;
}

int ust__hist_sparse_of_dense(const uint64_t *dense, uint64_t sum, ust__hist_sparse *out) {
  memset(out, 0, sizeof *out);
  out->sum = sum;
  int n = 0;
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++)
    n += dense[i] != 0;
  if (n == 0)
    return 0;
  out->index = malloc((size_t)n * sizeof *out->index);
  out->counts = malloc((size_t)n * sizeof *out->counts);
  if (out->index == NULL || out->counts == NULL) {
    ust__hist_sparse_free(out);
    return ust__error(UST_ENOMEM, "out of memory for a histogram's buckets");
  }
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++)
    if (dense[i] != 0) {
      out->index[out->n] = i;
      out->counts[out->n++] = dense[i];
      out->count += dense[i];
    }
  return 0;
}

int ust__hist_sparse_take(const ust__hist *h, ust__hist_sparse *out) {
  uint64_t dense[UST__HIST_BUCKETS];
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++)
    dense[i] = atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
  /* the buckets are the truth (count is their sum): a snapshot taken while others record stays consistent */
  return ust__hist_sparse_of_dense(dense, atomic_load_explicit(&h->sum, memory_order_relaxed), out);
}

void ust__hist_sparse_free(ust__hist_sparse *s) {
  if (s == NULL)
    return;
  free(s->index);
  free(s->counts);
  s->index = NULL;
  s->counts = NULL;
  s->n = 0;
}

double ust__hist_sparse_quantile(const ust__hist_sparse *s, double q) {
  if (s->count == 0)
    return 0.0;
  uint64_t rank = (uint64_t)ceil(q * (double)s->count);
  if (rank < 1)
    rank = 1;
  uint64_t seen = 0;
  for (int i = 0; i < s->n; i++) {
    seen += s->counts[i];
    if (seen >= rank)
      return (double)ust__hist_lower(s->index[i]) + (double)(ust__hist_width(s->index[i]) - 1) / 2.0;
  }
  return 0.0;
}

static void roof_snap(ust__roof_sums *r, ust__roof_snap *out) {
  out->calls = atomic_load(&r->calls);
  out->tsol_ps = atomic_load(&r->tsol_ps);
  out->time_ns = atomic_load(&r->time_ns);
}

int ust__figs_snapshot(ust__figs *f, ust__figs_snap *out) {
  memset(out, 0, sizeof *out);
  out->captured = atomic_load(&f->captured);
  out->kernel_lost = atomic_load(&f->kernel_lost); /* before the total they are part of */
  out->pair_failed = atomic_load(&f->pair_failed);
  out->timing_dropped = atomic_load(&f->timing_dropped);
  out->first_timed = atomic_load(&f->first_timed);
  out->first_time_ns = atomic_load(&f->first_time_ns);
  out->steady_timed = atomic_load(&f->steady_timed);
  out->steady_time_ns = atomic_load(&f->steady_time_ns);
  out->late_captured = atomic_load(&f->late_captured);
  out->kernel_timed = atomic_load(&f->kernel_timed);
  out->held_timed = atomic_load(&f->held_timed);
  out->hold_expired = atomic_load(&f->hold_expired);
  out->kernel_span_ns = atomic_load(&f->kernel_span_ns);
  out->kernels = atomic_load(&f->kernels);
  out->replayed = atomic_load(&f->replayed);
  out->unseen_kernels = atomic_load(&f->unseen_kernels);
  for (int i = 0; i < UST__FIGS_KERNEL_NAMES; i++)
    out->kernel_names[i] = atomic_load_explicit(&f->kernel_names[i], memory_order_acquire);
  out->unseen_ns = atomic_load(&f->unseen_ns);
  out->graph_changed = atomic_load(&f->graph_changed);
  out->estimated = atomic_load(&f->estimated); /* before calls: never more than its share of them */
  out->calls = atomic_load(&f->calls);
  out->unscored = atomic_load(&f->unscored);
  out->nested_scored = atomic_load(&f->nested_scored);
  out->hw = atomic_load(&f->hw);
  roof_snap(&f->prod, &out->prod);
  roof_snap(&f->cand, &out->cand);
  out->work_calls = atomic_load(&f->work_calls);
  out->flops = load_double(&f->flops_bits);
  out->bytes = load_double(&f->bytes_bits);
  if (ust__hist_sparse_take(&f->hist, &out->hist) != 0 || ust__hist_sparse_take(&f->cand_hist, &out->cand_hist) != 0)
    return UST_ENOMEM;
  return 0;
}

void ust__figs_snap_free(ust__figs_snap *s) {
  if (s == NULL)
    return;
  ust__hist_sparse_free(&s->hist);
  ust__hist_sparse_free(&s->cand_hist);
}

double ust__est_device_time(const ust__est_in *in) {
  const double eligible = in->calls > in->captured ? in->calls - in->captured : 0;
  const double late = fmin(fmax(in->steady_calls, 0), eligible);
  const double n_early = in->timed - in->first_timed - in->steady_timed;
  const double s_early = in->timed_sum_ns - in->first_sum_ns - in->steady_sum_ns;
  double early_mean = n_early > 0 && s_early >= 0 ? s_early / n_early : -1;
  double late_mean = in->steady_timed > 0 ? in->steady_sum_ns / in->steady_timed : -1;
  if (early_mean < 0 && late_mean < 0)
    return in->timed > 0 ? in->timed_sum_ns * eligible / in->timed : 0.0;
  if (early_mean < 0)
    early_mean = late_mean;
  if (late_mean < 0)
    late_mean = early_mean;
  return early_mean * (eligible - late) + late_mean * late;
}

double ust__route_s(double tsol_sum_ns, double scored_calls, double p50_ns) {
  if (!(scored_calls > 0) || !(p50_ns > 0))
    return -1;
  return tsol_sum_ns / scored_calls / p50_ns;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double ust__median(double *v, int n) {
  if (n <= 0)
    return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void ust__figs_kernel_name(ust__figs *f, const char *name) {
  if (f == NULL || name == NULL)
    return;
  for (int i = 0; i < UST__FIGS_KERNEL_NAMES; i++) {
    const char *had = atomic_load_explicit(&f->kernel_names[i], memory_order_acquire);
    if (had == NULL && atomic_compare_exchange_strong(&f->kernel_names[i], &had, name))
      return;
    if (had == name || strcmp(had, name) == 0)
      return;
  }
}
