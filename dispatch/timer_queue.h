/* The event timer's queue of pending timings (dispatch/timer_gpu.c): host
 * logic apart from the device, so that it is tested without one. Serving
 * threads add timings; a harvest takes a batch of the oldest out, asks the
 * device about it outside the lock, and puts back (ahead of what was added
 * meanwhile) the ones not ready; a flush first waits for a batch another
 * harvest holds, so that it sees every timing added before it. The lock is
 * the caller's (the timer pool's); each function takes it itself. */
#ifndef UST_DISPATCH_TIMER_QUEUE_H
#define UST_DISPATCH_TIMER_QUEUE_H

#include <pthread.h>

typedef struct ust__tqueue {
  pthread_mutex_t *lock; /* borrowed */
  pthread_cond_t settled; /* a held batch was settled */
  int *items;            /* owned; oldest first */
  int n, cap;
  int held; /* items taken out by harvests, not yet settled */
} ust__tqueue;

/* cap: the most items ever queued (each token once). 0, or UST_ENOMEM. */
int ust__tqueue_init(ust__tqueue *q, pthread_mutex_t *lock, int cap);
void ust__tqueue_free(ust__tqueue *q);
void ust__tqueue_push(ust__tqueue *q, int item);
/* Items queued or held. */
int ust__tqueue_busy(ust__tqueue *q);
/* Up to max of the oldest items into out, held until ust__tqueue_settle;
 * after_held: first wait until no other harvest holds a batch. Returns how
 * many. */
int ust__tqueue_take(ust__tqueue *q, int *out, int max, int after_held);
/* Settle a batch of taken items: back[0..kept) return to the queue's head
 * (the others were concluded). Returns the items queued now. */
int ust__tqueue_settle(ust__tqueue *q, int taken, const int *back, int kept);

#endif
