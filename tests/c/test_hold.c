/* The hold's state machine (dispatch/hold.h) against a stand-in device whose
 * clock the test moves: a hold released in time times the work less what
 * the pair adds; one released after its deadline (a call that synchronised
 * inside, or a slow host) is dropped and counted; an operator whose holds
 * give up twice in a row is not held again; nothing waits on a real clock. */
#include <string.h>

#include "runner.h"

#include "dispatch/hold.h"

#define SLOTS 8

/* A device whose holds give up deadline_ns after they began, by its clock. */
typedef struct fake_dev {
  uint64_t now; /* ns, moved by the test */
  struct {
    uint32_t seq, released, expired;
    uint64_t began, deadline;
  } slot[SLOTS];
  int refuse_hold;    /* the next holds cannot be enqueued */
  int calibrations;   /* samples taken */
  int calibrate_fail; /* the calibration cannot run */
} fake_dev;

/* Whether slot's hold seq gave up by now: never once released before its deadline. */
static int gave_up(fake_dev *f, int slot, uint32_t seq) {
  if (f->slot[slot].seq != seq)
    return 0;
  if (f->slot[slot].expired != seq && f->slot[slot].released != seq &&
      f->now - f->slot[slot].began >= f->slot[slot].deadline)
    f->slot[slot].expired = seq;
  return f->slot[slot].expired == seq;
}

static int fake_hold(void *ctx, int device, void *stream, int slot, uint32_t seq, uint64_t deadline_ns) {
  fake_dev *f = ctx;
  (void)device;
  (void)stream;
  if (f->refuse_hold)
    return -1;
  f->slot[slot].seq = seq;
  f->slot[slot].began = f->now;
  f->slot[slot].deadline = deadline_ns;
  return 0;
}

static void fake_release(void *ctx, int device, int slot, uint32_t seq) {
  fake_dev *f = ctx;
  (void)device;
  if (!gave_up(f, slot, seq))
    f->slot[slot].released = seq;
}

static int fake_expired(void *ctx, int device, int slot, uint32_t seq) {
  (void)device;
  return gave_up(ctx, slot, seq);
}

/* A pair 2,300 ns longer than what one kernel more adds to a chain, give or take 100. */
static int fake_calibrate(void *ctx, int device, double *pair_ns, double *inner_ns) {
  fake_dev *f = ctx;
  (void)device;
  if (f->calibrate_fail)
    return -1;
  const int k = f->calibrations++;
  *inner_ns = 2000.0;
  *pair_ns = 2000.0 + 2300.0 + (double)(k % 3 - 1) * 100.0;
  return 0;
}

static const ust__hold_dev_i fake_i = {fake_hold, fake_release, fake_expired, fake_calibrate};

#define DEADLINE_NS 1000000u

TEST(hold_released_in_time_times_the_work_less_what_the_pair_adds) {
  fake_dev f;
  memset(&f, 0, sizeof f);
  ust__hold h;
  ust__hold_word op = 0;
  ust__hold_init(&h, &fake_i, &f, DEADLINE_NS);
  uint32_t seq = 0;
  int struck = 0;
  ASSERT_INT_EQ(ust__hold_begin(&h, &op, 0, NULL, 3, &seq), 1);
  ASSERT_TRUE(seq != 0);
  f.now += 40000; /* the call launches its work: 40 us of host time */
  struck = ust__hold_end(&h, &op, 0, 3, seq);
  ASSERT_U64_EQ(f.slot[3].released, seq);
  double ns = -1;
  /* its device not calibrated yet: the sample waits */
  ASSERT_INT_EQ(ust__hold_conclude(&h, &op, 0, 3, seq, struck, 10300.0, &ns), -1);
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 0), UST__HOLD_CALIBRATED);
  ASSERT_INT_EQ(f.calibrations, UST__HOLD_CALIBRATION_SAMPLES);
  ASSERT_DBL_NEAR(h.offset_ns[0], 2300.0, 1e-9);
  ASSERT_DBL_NEAR(h.offset_spread_ns[0], 200.0, 1e-9);
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 0), UST__HOLD_CALIBRATED); /* once */
  ASSERT_INT_EQ(f.calibrations, UST__HOLD_CALIBRATION_SAMPLES);
  ASSERT_INT_EQ(ust__hold_conclude(&h, &op, 0, 3, seq, struck, 10300.0, &ns), 1);
  ASSERT_DBL_NEAR(ns, 8000.0, 1e-9);
  /* a pair shorter than what pairs add is no time at all, never negative */
  ASSERT_INT_EQ(ust__hold_conclude(&h, &op, 0, 3, seq, struck, 1000.0, &ns), 1);
  ASSERT_DBL_NEAR(ns, 0.0, 1e-9);
  /* a call not held is its pair */
  ASSERT_INT_EQ(ust__hold_conclude(&h, &op, 0, 4, 0, struck, 31000.0, &ns), 1);
  ASSERT_DBL_NEAR(ns, 31000.0, 1e-9);
  ASSERT_U64_EQ(atomic_load(&h.held), 1);
  ASSERT_U64_EQ(atomic_load(&h.expired), 0);
  ASSERT_INT_EQ(ust__hold_excluded(&op), 0);
}

TEST(a_call_that_synchronises_inside_while_held_is_dropped_at_the_deadline) {
  fake_dev f;
  memset(&f, 0, sizeof f);
  ust__hold h;
  ust__hold_word op = 0;
  ust__hold_init(&h, &fake_i, &f, DEADLINE_NS);
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 0), UST__HOLD_CALIBRATED);
  uint32_t seq = 0;
  int struck = 0;
  ASSERT_INT_EQ(ust__hold_begin(&h, &op, 0, NULL, 1, &seq), 1);
  /* .item() inside: the host waits for the stream, the stream for the hold,
   * until the hold gives up on the device's clock; then the call goes on */
  f.now += DEADLINE_NS + 35000;
  struck = ust__hold_end(&h, &op, 0, 1, seq);
  ASSERT_U64_EQ(atomic_load(&h.released_late), 1);
  ASSERT_TRUE(f.slot[1].released != seq);
  double ns = -1;
  ASSERT_INT_EQ(ust__hold_conclude(&h, &op, 0, 1, seq, struck, 1.05e6, &ns), 0); /* dropped */
  ASSERT_U64_EQ(atomic_load(&h.expired), 1);
  ASSERT_INT_EQ(ust__hold_excluded(&op), 0); /* one strike */
  ASSERT_INT_EQ((int)atomic_load(&op), 1);
  /* a hold that gave up only after its release was read (the device saw the
   * release too late): the strike comes at the conclusion, once */
  ust__hold_word late = 0;
  ASSERT_INT_EQ(ust__hold_begin(&h, &late, 0, NULL, 2, &seq), 1);
  ASSERT_INT_EQ(ust__hold_conclude(&h, &late, 0, 2, seq, 0, 1.05e6, &ns), 1); /* still in time: kept */
  ASSERT_INT_EQ((int)atomic_load(&late), 0);
  f.now += DEADLINE_NS;
  ASSERT_INT_EQ(ust__hold_conclude(&h, &late, 0, 2, seq, 0, 1.05e6, &ns), 0);
  ASSERT_INT_EQ((int)atomic_load(&late), 1);
}

TEST(an_operator_whose_holds_give_up_twice_in_a_row_is_not_held_again) {
  fake_dev f;
  memset(&f, 0, sizeof f);
  ust__hold h;
  ust__hold_word syncs = 0, other = 0;
  ust__hold_init(&h, &fake_i, &f, DEADLINE_NS);
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 0), UST__HOLD_CALIBRATED);
  uint32_t seq = 0;
  int struck = 0;
  double ns;
  for (int i = 0; i < 2; i++) {
    ASSERT_INT_EQ(ust__hold_begin(&h, &syncs, 0, NULL, 2, &seq), 1);
    f.now += 2 * DEADLINE_NS;
    struck = ust__hold_end(&h, &syncs, 0, 2, seq);
    ASSERT_INT_EQ(ust__hold_conclude(&h, &syncs, 0, 2, seq, struck, 2e6, &ns), 0);
  }
  ASSERT_INT_EQ(ust__hold_excluded(&syncs), 1);
  ASSERT_U64_EQ(atomic_load(&h.excluded), 1);
  /* not held again: timed by the plain pair, which the harvest takes as it is */
  ASSERT_INT_EQ(ust__hold_begin(&h, &syncs, 0, NULL, 2, &seq), 0);
  ASSERT_INT_EQ((int)seq, 0);
  ASSERT_INT_EQ(ust__hold_conclude(&h, &syncs, 0, 2, seq, struck, 2e6, &ns), 1);
  ASSERT_DBL_NEAR(ns, 2e6, 1e-9);
  /* another operator is held as before */
  ASSERT_INT_EQ(ust__hold_begin(&h, &other, 0, NULL, 5, &seq), 1);
  f.now += 1000;
  struck = ust__hold_end(&h, &other, 0, 5, seq);
  ASSERT_INT_EQ(ust__hold_conclude(&h, &other, 0, 5, seq, struck, 9300.0, &ns), 1);
  ASSERT_DBL_NEAR(ns, 7000.0, 1e-9);
  ASSERT_U64_EQ(atomic_load(&h.excluded), 1);
}

TEST(a_hold_released_in_time_between_two_that_gave_up_starts_the_count_over) {
  fake_dev f;
  memset(&f, 0, sizeof f);
  ust__hold h;
  ust__hold_word op = 0;
  ust__hold_init(&h, &fake_i, &f, DEADLINE_NS);
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 0), UST__HOLD_CALIBRATED);
  const uint64_t host_ns[3] = {2 * DEADLINE_NS, 5000, 2 * DEADLINE_NS}; /* late, in time, late */
  for (int i = 0; i < 3; i++) {
    uint32_t seq = 0;
    double ns;
    ASSERT_INT_EQ(ust__hold_begin(&h, &op, 0, NULL, 0, &seq), 1);
    f.now += host_ns[i];
    const int struck = ust__hold_end(&h, &op, 0, 0, seq);
    ASSERT_INT_EQ(ust__hold_conclude(&h, &op, 0, 0, seq, struck, 12000.0, &ns), i == 1 ? 1 : 0);
  }
  ASSERT_INT_EQ(ust__hold_excluded(&op), 0);
  ASSERT_U64_EQ(atomic_load(&h.expired), 2);
  ASSERT_U64_EQ(atomic_load(&h.held), 3);
}

TEST(a_device_whose_probe_cannot_run_and_a_hold_off_hold_nothing) {
  fake_dev f;
  memset(&f, 0, sizeof f);
  f.calibrate_fail = 1;
  ust__hold h;
  ust__hold_word op = 0;
  ust__hold_init(&h, &fake_i, &f, DEADLINE_NS);
  uint32_t seq = 0;
  int struck = 0;
  double ns;
  /* held before calibration, concluded after it failed: the pair as it is */
  ASSERT_INT_EQ(ust__hold_begin(&h, &op, 0, NULL, 6, &seq), 1);
  struck = ust__hold_end(&h, &op, 0, 6, seq);
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 0), UST__HOLD_UNAVAILABLE);
  ASSERT_INT_EQ(ust__hold_conclude(&h, &op, 0, 6, seq, struck, 5000.0, &ns), 1);
  ASSERT_DBL_NEAR(ns, 5000.0, 1e-9);
  ASSERT_INT_EQ(ust__hold_begin(&h, &op, 0, NULL, 6, &seq), 0);
  /* a hold that cannot be enqueued: the call goes unheld */
  f.calibrate_fail = 0;
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 1), UST__HOLD_CALIBRATED);
  f.refuse_hold = 1;
  ASSERT_INT_EQ(ust__hold_begin(&h, &op, 1, NULL, 6, &seq), 0);
  ASSERT_INT_EQ((int)seq, 0);
  /* timer.hold off */
  ust__hold_init(&h, &fake_i, &f, 0);
  f.refuse_hold = 0;
  ASSERT_INT_EQ(ust__hold_begin(&h, &op, 0, NULL, 6, &seq), 0);
  ASSERT_INT_EQ(ust__hold_calibrate(&h, 0), UST__HOLD_UNCALIBRATED);
  ASSERT_U64_EQ(atomic_load(&h.held), 0);
}
