/*
 * The hold: kernel time from an event pair, without a tracer.
 *
 * An event pair around a call measures its stream, not its kernels: in
 * launch-bound decode the stream sits idle between the two records while the
 * host launches, and a 1.5 us kernel reads 20-30 us. A held call is timed as
 * NVBench times a kernel (nvbench/blocking_kernel.cu): a one-thread kernel is
 * enqueued first and spins until the host releases it; the start event, the
 * call's own work and the stop event queue up behind it; the host releases
 * the hold once the call has returned (its work is all enqueued), so the
 * events bracket the work run back to back. What the pair adds around the
 * work on the device (the records and the first launch's latency, a few us)
 * is measured once per device and taken off: a held pair around one empty
 * kernel, less what one more kernel adds to a held chain of them (its own
 * time and the gap before it).
 *
 * A serving process must survive what a benchmark never meets: a call that
 * synchronises inside (nonzero, .item(), an allocator that frees, another
 * thread's device-wide sync, a lazily loaded module) would wait for a stream
 * that waits for it. So a hold always ends: the kernel gives up at a deadline
 * measured on the device, and says so; the call then goes on, its sample is
 * dropped and counted, and an operator whose held calls expire twice in a row
 * is not held again (its calls are timed by the plain pair). Only sampled,
 * timed calls are held, never while a stream captures a graph.
 *
 * This file is the hold's state machine, in C over a device interface: the
 * GPU's (dispatch/hold.cu, driven by dispatch/timer_gpu.c) or a stand-in (the
 * C tests), so that release, deadline, drop and exclusion are tested without a
 * GPU and without waiting on a clock. C only (C11 atomics); internal header:
 * never installed.
 */
#ifndef UST_DISPATCH_HOLD_H
#define UST_DISPATCH_HOLD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* What the hold asks of a device. Every function is called from one thread
 * at a time per slot; slots are the timer's (one event pair each). */
typedef struct ust__hold_dev_i {
  /* Enqueue a hold of slot on stream: the stream waits until the slot's
   * release word reaches seq, or until deadline_ns passed on the device
   * since the hold began (then the slot's expired word is set to seq).
   * 0, or -1 (nothing enqueued). */
  int (*hold)(void *ctx, int device, void *stream, int slot, uint32_t seq, uint64_t deadline_ns);
  /* Release the slot's hold seq (a host store the device sees). */
  void (*release)(void *ctx, int device, int slot, uint32_t seq);
  /* 1 when the slot's hold seq gave up at its deadline. Read after the
   * hold's stream passed it (at the timer's conclusion), or at the release
   * as a hint. */
  int (*expired)(void *ctx, int device, int slot, uint32_t seq);
  /* One calibration sample (synchronises a private stream, never a serving
   * one): a held event pair around one kernel, its span, and what one
   * kernel more adds to a held chain of them, in ns; their difference is
   * what a pair adds around its work. 0, or -1 (no sample). */
  int (*calibrate)(void *ctx, int device, double *pair_ns, double *inner_ns);
} ust__hold_dev_i;

#define UST__HOLD_MAX_DEVICES 64
#define UST__HOLD_CALIBRATION_SAMPLES 64
/* Held calls of an operator that expire in a row before it is not held again. */
#define UST__HOLD_STRIKES 2

/* A device's calibration. */
enum { UST__HOLD_UNCALIBRATED = 0, UST__HOLD_CALIBRATED = 1, UST__HOLD_UNAVAILABLE = -1 };

typedef struct ust__hold {
  const ust__hold_dev_i *dev; /* borrowed */
  void *ctx;
  uint64_t deadline_ns; /* 0: calls are not held */
  atomic_int state[UST__HOLD_MAX_DEVICES];    /* UST__HOLD_* */
  double offset_ns[UST__HOLD_MAX_DEVICES];    /* what a held pair adds around its work; set before state */
  double offset_spread_ns[UST__HOLD_MAX_DEVICES]; /* the calibration's interquartile range */
  atomic_uint_fast32_t seq;                   /* the last hold's number */
  atomic_uint_fast64_t held, released_late, expired, excluded;
} ust__hold;

/* An operator's standing with the hold (one per binding, zero-initialised):
 * its held calls that expired in a row, and whether it is held at all. */
typedef atomic_uint ust__hold_word;
#define UST__HOLD_EXCLUDED 0x80000000u

/* deadline_ns 0: off. dev and ctx borrowed. */
void ust__hold_init(ust__hold *h, const ust__hold_dev_i *dev, void *ctx, uint64_t deadline_ns);

/* Serving thread, before the start event: holds the slot's stream when the
 * operator (w) may be held on device; *seq receives the hold's number (0:
 * not held). Returns 1 when held. */
int ust__hold_begin(ust__hold *h, ust__hold_word *w, int device, void *stream, int slot, uint32_t *seq);
/* Serving thread, after the stop event: releases hold seq (0: none). A hold
 * that already gave up is a strike against the operator now, so that one
 * that synchronises inside is not held again before its sample is read;
 * returns 1 then. */
int ust__hold_end(ust__hold *h, ust__hold_word *w, int device, int slot, uint32_t seq);

/* The harvest, once the stop event completed: the kernel time of a held
 * call from its pair's span (pair_ns). 1 with *ns set; 0 when the hold gave
 * up (the sample is dropped: counted, and a strike against the operator
 * unless ust__hold_end struck already: struck); -1 when the device is not
 * calibrated yet (the sample waits). A call not held (seq 0) is its span. */
int ust__hold_conclude(ust__hold *h, ust__hold_word *w, int device, int slot, uint32_t seq, int struck,
                       double pair_ns, double *ns);

/* The harvest's thread: calibrates device if a held call ran there and it
 * is not calibrated yet (synchronises a private stream). Its state after. */
int ust__hold_calibrate(ust__hold *h, int device);
/* UST__HOLD_* of device; relaxed. */
int ust__hold_state(const ust__hold *h, int device);

/* Whether the operator's calls are held, and why not. */
int ust__hold_excluded(const ust__hold_word *w);

#endif /* UST_DISPATCH_HOLD_H */
