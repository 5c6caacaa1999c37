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

#endif /* UST_SCORER_H */
