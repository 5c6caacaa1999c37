/* Log-bucketed, mergeable latency histograms. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scorer/scorer.h"

uint32_t ust__hist_index(uint64_t v) {
  if (v < UST__HIST_SUB)
    return (uint32_t)v;
  uint32_t e = 63u - (uint32_t)__builtin_clzll(v); /* e >= SUB_BITS */
  uint32_t sub = (uint32_t)(v >> (e - UST__HIST_SUB_BITS)) & (UST__HIST_SUB - 1);
  return UST__HIST_SUB + (e - UST__HIST_SUB_BITS) * UST__HIST_SUB + sub;
}

uint64_t ust__hist_lower(uint32_t idx) {
  if (idx < UST__HIST_SUB)
    return idx;
  uint32_t e = (idx - UST__HIST_SUB) / UST__HIST_SUB + UST__HIST_SUB_BITS;
  uint64_t sub = (idx - UST__HIST_SUB) % UST__HIST_SUB;
  return (UST__HIST_SUB + sub) << (e - UST__HIST_SUB_BITS);
}

uint64_t ust__hist_width(uint32_t idx) {
  if (idx < UST__HIST_SUB)
    return 1;
  uint32_t e = (idx - UST__HIST_SUB) / UST__HIST_SUB + UST__HIST_SUB_BITS;
  return 1ull << (e - UST__HIST_SUB_BITS);
}

int ust__hist_init(ust__hist *h) {
  h->buckets = calloc(UST__HIST_BUCKETS, sizeof *h->buckets);
  atomic_init(&h->count, 0);
  atomic_init(&h->sum, 0);
  return h->buckets == NULL ? -1 : 0;
}

void ust__hist_free(ust__hist *h) {
  if (h == NULL)
    return;
  free(h->buckets);
  h->buckets = NULL;
}

void ust__hist_record(ust__hist *h, uint64_t ns) {
  atomic_fetch_add_explicit(&h->buckets[ust__hist_index(ns)], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum, ns, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

void ust__hist_snapshot(const ust__hist *h, ust__hist_snap *out) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++) {
    out->buckets[i] = atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
    n += out->buckets[i];
  }
  /* The bucket counts are the truth; count is derived so a snapshot taken
   * while other threads record is still self-consistent. */
  out->count = n;
  out->sum = atomic_load_explicit(&h->sum, memory_order_relaxed);
}

void ust__hist_merge(ust__hist_snap *dst, const ust__hist_snap *src) {
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++)
    dst->buckets[i] += src->buckets[i];
  dst->count += src->count;
  dst->sum += src->sum;
}

double ust__hist_quantile(const ust__hist_snap *s, double q) {
  if (s->count == 0)
    return 0.0;
  uint64_t rank = (uint64_t)ceil(q * (double)s->count);
  if (rank < 1)
    rank = 1;
  uint64_t seen = 0;
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++) {
    seen += s->buckets[i];
    if (seen >= rank)
      return (double)ust__hist_lower(i) + (double)(ust__hist_width(i) - 1) / 2.0;
  }
  return 0.0;
}

double ust__hist_quantile_live(ust__hist *h, double q) {
  uint64_t count = 0;
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++)
    count += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
  if (count == 0)
    return 0.0;
  uint64_t rank = (uint64_t)ceil(q * (double)count), seen = 0;
  if (rank < 1)
    rank = 1;
  for (uint32_t i = 0; i < UST__HIST_BUCKETS; i++) {
    seen += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
    if (seen >= rank)
      return (double)ust__hist_lower(i) + (double)(ust__hist_width(i) - 1) / 2.0;
  }
  return (double)ust__hist_lower(UST__HIST_BUCKETS - 1);
}
