/*
 * The device side of the shadow slots (guard/shadow.c): what a slot of a
 * GPU call asks of the runtime, so that shadow.c is one source in every
 * build. guard/shadow_gpu.c implements it for CUDA, and for HIP through
 * base/gpu_runtime.h; guard/shadow_host.c, in a build without a GPU, says
 * there is no device (ust__shadow_dev_available is 0), so every call takes
 * the host path and no other function here is reached.
 *
 * The device part of a pool holds, per device, the result buffers of every
 * slot (an arena in device memory and its pinned host twin), and per slot
 * the events of its current use. A slot is named by its index in the pool.
 * Everything enqueued goes on the caller's stream; nothing here synchronises
 * but ust__shadow_dev_stream_sync, which says so. Each function of one slot
 * is called by the one thread that holds the slot at the time.
 *
 * Internal header of guard/shadow*.c: never installed.
 */
#ifndef UST_GUARD_SHADOW_DEV_H
#define UST_GUARD_SHADOW_DEV_H

#include <pthread.h>

#include "base/base.h"
#include "guard/compare.h"

typedef struct ust__shadow_dev ust__shadow_dev;

/* 1 when this build has a GPU backend: the rest of this header does work. */
int ust__shadow_dev_available(void);

/* The device part of a pool of n_slots slots, into *out (NULL in a build
 * without a GPU). log is borrowed for its life; lock is the pool's,
 * borrowed: a device's arena is allocated under it. Allocates no device
 * memory yet. Returns 0, or UST_ENOMEM (the caller reports it). */
int ust__shadow_dev_create(int n_slots, ust__log_sink *log, pthread_mutex_t *lock, ust__shadow_dev **out);
/* Frees the arenas; the device must be done with them (the pool harvested
 * every slot). NULL: no-op. */
void ust__shadow_dev_destroy(ust__shadow_dev *d);

/* A slot taken for a new use: not yet on a device, no events. */
void ust__shadow_dev_slot_reset(ust__shadow_dev *d, int slot);
/* Bind the slot to the current device at its use's first mark: that
 * device's arena (allocated at the first call there) and the slot's part of
 * it. A slot bound already stays. 0, or -1 (logged). */
int ust__shadow_dev_bind(ust__shadow_dev *d, int slot);
/* Record the slot's event i (0 .. UST__MARK_COUNT: a mark, then the last
 * event that fences the use's device work) on stream, creating it first.
 * 0, or -1 (logged). */
int ust__shadow_dev_record(ust__shadow_dev *d, int slot, int i, void *stream);
/* Destroy the events of the slot's use, when it goes back to the pool. */
void ust__shadow_dev_events_free(ust__shadow_dev *d, int slot);
/* The time between the slot's events from and to, in ns; 0 when either
 * was not recorded or the time cannot be read. */
double ust__shadow_dev_elapsed_ns(ust__shadow_dev *d, int slot, int from, int to);
/* Whether the slot's last event completed: 0 done, 1 not yet, -1 failed
 * (logged). Never blocks. */
int ust__shadow_dev_query(ust__shadow_dev *d, int slot);

/* The bound slot's statistics in device memory (UST__MAX_PAIRS of them),
 * where its comparisons reduce; NULL when not bound. */
ust__cmp_stats *ust__shadow_dev_stats(ust__shadow_dev *d, int slot);
/* Where they land on the host (pinned memory), readable once the last
 * event completed; NULL when not bound. */
const ust__cmp_stats *ust__shadow_dev_results(ust__shadow_dev *d, int slot);
/* Enqueue on stream the zeroing of n_pairs statistics in device memory. 0,
 * or the runtime's error (logged). */
int ust__shadow_dev_zero(ust__shadow_dev *d, ust__cmp_stats *dev_stats, int n_pairs, void *stream);
/* Enqueue on stream the copy of the slot's first n_pairs statistics from the
 * device to its pinned results. 0, or the runtime's error (logged). */
int ust__shadow_dev_fetch(ust__shadow_dev *d, int slot, int n_pairs, void *stream);

/* Wait until stream completed (synchronises), in the relaxed capture mode,
 * so that a capture in another thread stays valid. A failure is logged. */
void ust__shadow_dev_stream_sync(ust__shadow_dev *d, void *stream);
/* The calling thread into the relaxed stream-capture mode, returning the
 * mode it had, for ust__shadow_dev_relaxed_end to restore: runtime calls
 * that are not capture-safe then leave another thread's capture valid. */
int ust__shadow_dev_relaxed_begin(void);
void ust__shadow_dev_relaxed_end(int mode);

#endif /* UST_GUARD_SHADOW_DEV_H */
