/* What a route's figures hold, for the C tests: the production histogram's
 * count and sum (a snapshot each). */
#ifndef UST_TEST_FIGS_PROBE_H
#define UST_TEST_FIGS_PROBE_H

#include "runner.h"
#include "scorer/scorer.h"

static inline uint64_t hist_field(ust__figs *f, int sum) {
  ust__figs_snap s;
  ASSERT_INT_EQ(ust__figs_snapshot(f, &s), 0);
  const uint64_t v = sum ? s.hist.sum : s.hist.count;
  ust__figs_snap_free(&s);
  return v;
}

static inline uint64_t hist_count(ust__figs *f) { return hist_field(f, 0); }
static inline uint64_t hist_sum(ust__figs *f) { return hist_field(f, 1); }

#endif
