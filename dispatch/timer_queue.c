#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "dispatch/timer_queue.h"

int ust__tqueue_init(ust__tqueue *q, pthread_mutex_t *lock, int cap) {
  memset(q, 0, sizeof *q);
  if ((q->items = calloc((size_t)cap, sizeof *q->items)) == NULL)
    return ust__error(UST_ENOMEM, "out of memory for %d pending timings", cap);
  q->lock = lock;
  q->cap = cap;
  pthread_cond_init(&q->settled, NULL);
  return 0;
}

void ust__tqueue_free(ust__tqueue *q) {
  if (q->items == NULL)
    return;
  pthread_cond_destroy(&q->settled);
  free(q->items);
  q->items = NULL;
}

void ust__tqueue_push(ust__tqueue *q, int item) {
  pthread_mutex_lock(q->lock);
  if (q->n + q->held < q->cap) /* each token is queued once: never full */
    q->items[q->n++] = item;
  pthread_mutex_unlock(q->lock);
}

int ust__tqueue_busy(ust__tqueue *q) {
  pthread_mutex_lock(q->lock);
  const int n = q->n + q->held;
  pthread_mutex_unlock(q->lock);
  return n;
}

int ust__tqueue_take(ust__tqueue *q, int *out, int max, int after_held) {
  pthread_mutex_lock(q->lock);
  while (after_held && q->held > 0)
    pthread_cond_wait(&q->settled, q->lock);
  const int n = q->n < max ? q->n : max;
  memcpy(out, q->items, (size_t)n * sizeof *out);
  memmove(q->items, q->items + n, (size_t)(q->n - n) * sizeof *q->items);
  q->n -= n;
  q->held += n;
  pthread_mutex_unlock(q->lock);
  return n;
}

int ust__tqueue_settle(ust__tqueue *q, int taken, const int *back, int kept) {
  pthread_mutex_lock(q->lock);
  if (kept > 0) {
    memmove(q->items + kept, q->items, (size_t)q->n * sizeof *q->items);
    memcpy(q->items, back, (size_t)kept * sizeof *back);
  }
  q->n += kept;
  q->held -= taken;
  if (taken > 0)
    pthread_cond_broadcast(&q->settled);
  const int n = q->n;
  pthread_mutex_unlock(q->lock);
  return n;
}
