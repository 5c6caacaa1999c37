/* The event timer's queue of pending timings (dispatch/timer_queue.h),
 * without a GPU: the oldest handed out first, the ones not ready put back
 * ahead of what was added meanwhile, and a flush that waits for a batch
 * another harvest holds while it asks the device. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "runner.h"

#include "dispatch/timer_queue.h"

TEST(timer_queue_hands_out_the_oldest_and_takes_back_what_was_not_ready) {
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  ust__tqueue q;
  ASSERT_INT_EQ(ust__tqueue_init(&q, &lock, 16), 0);
  for (int i = 1; i <= 10; i++)
    ust__tqueue_push(&q, i);
  int out[16];
  ASSERT_INT_EQ(ust__tqueue_take(&q, out, 4, 0), 4);
  for (int i = 0; i < 4; i++)
    ASSERT_INT_EQ(out[i], i + 1);
  ASSERT_INT_EQ(ust__tqueue_busy(&q), 10); /* 6 queued, 4 held */
  ust__tqueue_push(&q, 11);                /* a serving thread, while the batch is asked about */
  const int back[2] = {2, 4};              /* 1 and 3 were concluded */
  ASSERT_INT_EQ(ust__tqueue_settle(&q, 4, back, 2), 9);
  ASSERT_INT_EQ(ust__tqueue_busy(&q), 9);
  ASSERT_INT_EQ(ust__tqueue_take(&q, out, 16, 1), 9); /* nothing held: no wait */
  const int want[9] = {2, 4, 5, 6, 7, 8, 9, 10, 11};
  for (int i = 0; i < 9; i++)
    ASSERT_INT_EQ(out[i], want[i]);
  ASSERT_INT_EQ(ust__tqueue_settle(&q, 9, NULL, 0), 0);
  ASSERT_INT_EQ(ust__tqueue_busy(&q), 0);
  ust__tqueue_free(&q);
}

typedef struct {
  ust__tqueue *q;
  atomic_int settled; /* set by the harvest just before it settles its batch */
  int seen_settled, got, item;
} flush_arg;

static void *flush_thread(void *p) {
  flush_arg *a = p;
  int out[8];
  a->got = ust__tqueue_take(a->q, out, 8, 1);
  a->seen_settled = atomic_load(&a->settled);
  a->item = a->got > 0 ? out[0] : -1;
  ust__tqueue_settle(a->q, a->got, NULL, 0);
  return NULL;
}

TEST(timer_queue_flush_waits_for_a_batch_another_harvest_holds) {
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  ust__tqueue q;
  ASSERT_INT_EQ(ust__tqueue_init(&q, &lock, 8), 0);
  for (int i = 1; i <= 3; i++)
    ust__tqueue_push(&q, i);
  int batch[8];
  ASSERT_INT_EQ(ust__tqueue_take(&q, batch, 8, 0), 3); /* the worker's, asking the device */
  ASSERT_INT_EQ(ust__tqueue_take(&q, batch + 3, 8, 0), 0); /* a worker's poll does not wait */
  flush_arg a = {.q = &q};
  pthread_t th;
  ASSERT_INT_EQ(pthread_create(&th, NULL, flush_thread, &a), 0);
  struct timespec nap = {0, 50 * 1000 * 1000};
  nanosleep(&nap, NULL); /* the flush is waiting by now (had it not waited, it found nothing) */
  atomic_store(&a.settled, 1);
  const int back[1] = {3}; /* 3's stop event was not ready */
  ust__tqueue_settle(&q, 3, back, 1);
  pthread_join(th, NULL);
  ASSERT_INT_EQ(a.seen_settled, 1); /* it returned only after the batch was settled */
  ASSERT_INT_EQ(a.got, 1);          /* and took what was put back */
  ASSERT_INT_EQ(a.item, 3);
  ASSERT_INT_EQ(ust__tqueue_busy(&q), 0);
  ust__tqueue_free(&q);
}
