/*
 * The device side of the shadow slots on a GPU (guard/shadow_dev.h): CUDA,
 * or HIP through base/gpu_runtime.h.
 *
 * Runtime calls that are not capture-safe run in the relaxed stream-capture
 * mode, so a capture running in another thread stays valid; the calling
 * thread's own mode is restored after each.
 */
#include <stdlib.h>

#include "base/gpu_runtime.h"
#include "guard/guard.h"
#include "guard/shadow_dev.h"

#define MAX_DEVICES 64

/* Per device, the result buffers of every slot, allocated at the first
 * shadowed call on that device: allocation may synchronise the device, so
 * it happens once there and never again on the serving path. */
typedef struct gpu_arena {
  ust__cmp_stats *dev;
  ust__cmp_stats *pinned;
} gpu_arena;

/* A slot's device part, for one use. */
typedef struct dev_slot {
  int device;                 /* of this use; -1 until bound */
  unsigned ev_made;           /* bit i: ev[i] exists (events live for one use) */
  cudaEvent_t ev[UST__MARK_COUNT + 1];
  ust__cmp_stats *dev_stats;  /* this slot's part of the device's arena */
  ust__cmp_stats *pinned;     /* and of its pinned host arena */
} dev_slot;

struct ust__shadow_dev {
  ust__log_sink *log;
  pthread_mutex_t *lock; /* the pool's: the arenas */
  int n_slots;
  dev_slot *slots;
  gpu_arena arenas[MAX_DEVICES];
};

int ust__shadow_dev_available(void) { return 1; }

int ust__shadow_dev_create(int n_slots, ust__log_sink *log, pthread_mutex_t *lock, ust__shadow_dev **out) {
  *out = NULL;
  ust__shadow_dev *d = calloc(1, sizeof *d);
  if (d == NULL)
    return UST_ENOMEM;
  d->slots = calloc((size_t)n_slots, sizeof *d->slots);
  if (d->slots == NULL) {
    free(d);
    return UST_ENOMEM;
  }
  d->log = log;
  d->lock = lock;
  d->n_slots = n_slots;
  *out = d;
  return 0;
}

void ust__shadow_dev_destroy(ust__shadow_dev *d) {
  if (d == NULL)
    return;
  for (int i = 0; i < MAX_DEVICES; i++) {
    if (d->arenas[i].dev != NULL) {
      cudaFree(d->arenas[i].dev);
      cudaFreeHost(d->arenas[i].pinned);
    }
  }
  free(d->slots);
  free(d);
}

void ust__shadow_dev_slot_reset(ust__shadow_dev *d, int slot) {
  dev_slot *s = &d->slots[slot];
  s->device = -1;
  s->ev_made = 0;
  s->dev_stats = s->pinned = NULL;
}

static int arena_get(ust__shadow_dev *d, int device, gpu_arena *out) {
  if (device < 0 || device >= MAX_DEVICES)
    return -1;
  pthread_mutex_lock(d->lock);
  gpu_arena *a = &d->arenas[device];
  int rc = 0;
  if (a->dev == NULL) {
    size_t bytes = sizeof(ust__cmp_stats) * UST__MAX_PAIRS * (size_t)d->n_slots;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (UST__GPU_CHECK(d->log, cudaMalloc((void **)&a->dev, bytes)) != 0) {
      a->dev = NULL;
      rc = -1;
    } else if (UST__GPU_CHECK(d->log, cudaHostAlloc((void **)&a->pinned, bytes, cudaHostAllocDefault)) != 0) {
      cudaFree(a->dev);
      a->dev = NULL;
      a->pinned = NULL;
      rc = -1;
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
  }
  *out = *a;
  pthread_mutex_unlock(d->lock);
  return rc;
}

int ust__shadow_dev_bind(ust__shadow_dev *d, int slot) {
  dev_slot *s = &d->slots[slot];
  if (s->device >= 0)
    return 0;
  gpu_arena a;
  if (UST__GPU_CHECK(d->log, cudaGetDevice(&s->device)) != 0 || arena_get(d, s->device, &a) != 0)
    return -1;
  s->dev_stats = a.dev + (size_t)slot * UST__MAX_PAIRS;
  s->pinned = a.pinned + (size_t)slot * UST__MAX_PAIRS;
  return 0;
}

/* Events are cheap and made per use, so a slot serves any device. */
int ust__shadow_dev_record(ust__shadow_dev *d, int slot, int i, void *on) {
  dev_slot *s = &d->slots[slot];
  cudaStream_t stream = on;
  if (!(s->ev_made & (1u << i))) {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    int rc = UST__GPU_CHECK(d->log, cudaEventCreateWithFlags(&s->ev[i], cudaEventDefault));
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (rc != 0)
      return -1;
    s->ev_made |= 1u << i;
  }
  return UST__GPU_CHECK(d->log, cudaEventRecord(s->ev[i], stream)) == 0 ? 0 : -1;
}

void ust__shadow_dev_events_free(ust__shadow_dev *d, int slot) {
  dev_slot *s = &d->slots[slot];
  for (int i = 0; i < UST__MARK_COUNT + 1; i++)
    if (s->ev_made & (1u << i))
      cudaEventDestroy(s->ev[i]);
  s->ev_made = 0;
}

double ust__shadow_dev_elapsed_ns(ust__shadow_dev *d, int slot, int from, int to) {
  const dev_slot *s = &d->slots[slot];
  const unsigned both = (1u << from) | (1u << to);
  float ms = 0;
  if ((s->ev_made & both) == both && UST__GPU_CHECK(d->log, cudaEventElapsedTime(&ms, s->ev[from], s->ev[to])) == 0 &&
      ms > 0)
    return (double)ms * 1e6;
  return 0;
}

int ust__shadow_dev_query(ust__shadow_dev *d, int slot) {
  cudaError_t q = cudaEventQuery(d->slots[slot].ev[UST__MARK_COUNT]);
  if (q == cudaErrorNotReady)
    return 1;
  if (q != cudaSuccess) {
    UST__GPU_CHECK(d->log, q);
    return -1;
  }
  return 0;
}

ust__cmp_stats *ust__shadow_dev_stats(ust__shadow_dev *d, int slot) { return d->slots[slot].dev_stats; }

const ust__cmp_stats *ust__shadow_dev_results(ust__shadow_dev *d, int slot) { return d->slots[slot].pinned; }

int ust__shadow_dev_zero(ust__shadow_dev *d, ust__cmp_stats *dev_stats, int n_pairs, void *stream) {
  return UST__GPU_CHECK(d->log, cudaMemsetAsync(dev_stats, 0, sizeof(ust__cmp_stats) * (size_t)n_pairs,
                                                (cudaStream_t)stream));
}

int ust__shadow_dev_fetch(ust__shadow_dev *d, int slot, int n_pairs, void *stream) {
  const dev_slot *s = &d->slots[slot];
  return UST__GPU_CHECK(d->log, cudaMemcpyAsync(s->pinned, s->dev_stats, sizeof(ust__cmp_stats) * (size_t)n_pairs,
                                                cudaMemcpyDeviceToHost, (cudaStream_t)stream));
}

void ust__shadow_dev_stream_sync(ust__shadow_dev *d, void *stream) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  UST__GPU_CHECK(d->log, cudaStreamSynchronize((cudaStream_t)stream));
  cudaThreadExchangeStreamCaptureMode(&mode);
}

int ust__shadow_dev_relaxed_begin(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  return (int)mode;
}

void ust__shadow_dev_relaxed_end(int mode) {
  enum cudaStreamCaptureMode m = (enum cudaStreamCaptureMode)mode;
  cudaThreadExchangeStreamCaptureMode(&m);
}
