/* The hold's state machine (dispatch/hold.h). */
#include <stdlib.h>
#include <string.h>

#include "dispatch/hold.h"

void ust__hold_init(ust__hold *h, const ust__hold_dev_i *dev, void *ctx, uint64_t deadline_ns) {
  memset(h, 0, sizeof *h);
  h->dev = dev;
  h->ctx = ctx;
  h->deadline_ns = dev != NULL ? deadline_ns : 0;
  for (int d = 0; d < UST__HOLD_MAX_DEVICES; d++)
    atomic_init(&h->state[d], UST__HOLD_UNCALIBRATED);
  atomic_init(&h->seq, 0);
}

int ust__hold_state(const ust__hold *h, int device) {
  if (device < 0 || device >= UST__HOLD_MAX_DEVICES)
    return UST__HOLD_UNAVAILABLE;
  return atomic_load_explicit(&((ust__hold *)h)->state[device], memory_order_acquire);
}

int ust__hold_excluded(const ust__hold_word *w) {
  return w != NULL && (atomic_load_explicit((ust__hold_word *)w, memory_order_relaxed) & UST__HOLD_EXCLUDED) != 0;
}

/* A held call of the operator that gave up at its deadline: one more in a
 * row; at UST__HOLD_STRIKES the operator is not held again (counted once). */
static void strike(ust__hold *h, ust__hold_word *w) {
  if (w == NULL)
    return;
  unsigned old = atomic_load_explicit(w, memory_order_relaxed), next;
  do {
    if (old & UST__HOLD_EXCLUDED)
      return;
    next = old + 1 >= UST__HOLD_STRIKES ? UST__HOLD_EXCLUDED : old + 1;
  } while (!atomic_compare_exchange_weak_explicit(w, &old, next, memory_order_relaxed, memory_order_relaxed));
  if (next & UST__HOLD_EXCLUDED)
    atomic_fetch_add_explicit(&h->excluded, 1, memory_order_relaxed);
}

/* A held call that was released in time: the expiries in a row start over. */
static void clean(ust__hold_word *w) {
  if (w == NULL)
    return;
  unsigned old = atomic_load_explicit(w, memory_order_relaxed);
  while (old != 0 && !(old & UST__HOLD_EXCLUDED) &&
         !atomic_compare_exchange_weak_explicit(w, &old, 0, memory_order_relaxed, memory_order_relaxed))
    ;
}

int ust__hold_begin(ust__hold *h, ust__hold_word *w, int device, void *stream, int slot, uint32_t *seq) {
  *seq = 0;
  if (h->deadline_ns == 0 || ust__hold_excluded(w) || ust__hold_state(h, device) == UST__HOLD_UNAVAILABLE)
    return 0;
  uint32_t s = (uint32_t)atomic_fetch_add_explicit(&h->seq, 1, memory_order_relaxed) + 1;
  if (s == 0) /* 0 means "not held": skipped when the count wraps */
    s = (uint32_t)atomic_fetch_add_explicit(&h->seq, 1, memory_order_relaxed) + 1;
  if (h->dev->hold(h->ctx, device, stream, slot, s, h->deadline_ns) != 0)
    return 0;
  atomic_fetch_add_explicit(&h->held, 1, memory_order_relaxed);
  *seq = s;
  return 1;
}

int ust__hold_end(ust__hold *h, ust__hold_word *w, int device, int slot, uint32_t seq) {
  if (seq == 0)
    return 0;
  h->dev->release(h->ctx, device, slot, seq);
  if (!h->dev->expired(h->ctx, device, slot, seq))
    return 0;
  atomic_fetch_add_explicit(&h->released_late, 1, memory_order_relaxed);
  strike(h, w);
  return 1;
}

int ust__hold_conclude(ust__hold *h, ust__hold_word *w, int device, int slot, uint32_t seq, int struck,
                       double pair_ns, double *ns) {
  if (seq == 0) {
    *ns = pair_ns;
    return 1;
  }
  const int state = ust__hold_state(h, device);
  if (state == UST__HOLD_UNCALIBRATED)
    return -1;
  if (h->dev->expired(h->ctx, device, slot, seq)) {
    atomic_fetch_add_explicit(&h->expired, 1, memory_order_relaxed);
    if (!struck) /* it gave up after its release was read, or as it was */
      strike(h, w);
    return 0;
  }
  clean(w);
  /* uncalibrated for good (the calibration could not run): the pair as it is */
  const double offset = state == UST__HOLD_CALIBRATED ? h->offset_ns[device] : 0.0;
  *ns = pair_ns > offset ? pair_ns - offset : 0.0;
  return 1;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int ust__hold_calibrate(ust__hold *h, int device) {
  const int state = ust__hold_state(h, device);
  if (state != UST__HOLD_UNCALIBRATED || h->deadline_ns == 0)
    return state;
  double off[UST__HOLD_CALIBRATION_SAMPLES];
  int n = 0;
  for (int i = 0; i < UST__HOLD_CALIBRATION_SAMPLES; i++) {
    double pair = 0, inner = 0;
    if (h->dev->calibrate(h->ctx, device, &pair, &inner) == 0 && pair >= inner)
      off[n++] = pair - inner;
  }
  if (n < UST__HOLD_CALIBRATION_SAMPLES / 2) {
    /* the calibration could not run: the device's calls are timed by the plain pair */
    atomic_store_explicit(&h->state[device], UST__HOLD_UNAVAILABLE, memory_order_release);
    return UST__HOLD_UNAVAILABLE;
  }
  qsort(off, (size_t)n, sizeof off[0], cmp_double);
  h->offset_ns[device] = off[n / 2];
  h->offset_spread_ns[device] = off[(3 * n) / 4] - off[n / 4];
  atomic_store_explicit(&h->state[device], UST__HOLD_CALIBRATED, memory_order_release);
  return UST__HOLD_CALIBRATED;
}
