/*
 * The GPU timing backend (CUDA or HIP): a pool of event pairs per device.
 *
 * On the call path: the start event is recorded on the caller's stream
 * before production, the stop event after, and the slot is queued. The
 * worker thread polls the stop events (cudaEventQuery never blocks) and
 * moves elapsed times into the route's histogram. Nothing here synchronises
 * the serving stream.
 *
 * The worker runs in the relaxed stream-capture mode, so its event queries
 * cannot invalidate a graph capture running in another thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/backend.h"
#include "dispatch/dispatch.h"
#include "dispatch/gpu_runtime.h"

#define MAX_DEVICES 64

int ust__gpu_check(int err, const char *stmt, const char *fn, const char *file, int line) {
  if (err != (int)cudaSuccess)
    ust__log(UST_LOG_WARN, "GPU call failed: %s: %s (in %s, %s:%d)", stmt, cudaGetErrorString((cudaError_t)err), fn,
             file, line);
  return err;
}

typedef struct slot {
  cudaEvent_t start, stop;
  int device; /* -1 until its events exist */
  ust__route *route;
  uint64_t tsol_ps;
} slot;

typedef struct device_pool {
  slot *slots;
  int *free_list; /* stack of free slot indices */
  int n_free;
} device_pool;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static device_pool pools[MAX_DEVICES];
static int pool_size;
/* Pending slots as (device << 20 | index). */
static int *pending;
static int n_pending;
static _Thread_local int relaxed_capture;

static atomic_int used;

int ust__gpu_available(void) { return atomic_load_explicit(&used, memory_order_relaxed); }

int ust__gpu_init(int max_pending) {
  pthread_mutex_lock(&pool_lock);
  pool_size = max_pending;
  free(pending);
  pending = calloc((size_t)max_pending * MAX_DEVICES, sizeof *pending);
  n_pending = 0;
  pthread_mutex_unlock(&pool_lock);
  return pending == NULL ? ust__error(UST_ENOMEM, "out of memory for GPU timing slots") : 0;
}

static void set_relaxed_capture(void) {
  if (relaxed_capture)
    return;
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  UST__GPU_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  relaxed_capture = 1;
}

/* Called with pool_lock held, on the caller's thread. */
static device_pool *pool_get(int device) {
  if (device < 0 || device >= MAX_DEVICES)
    return NULL;
  device_pool *p = &pools[device];
  if (p->slots != NULL)
    return p;
  atomic_store(&used, 1);
  p->slots = calloc((size_t)pool_size, sizeof *p->slots);
  p->free_list = calloc((size_t)pool_size, sizeof *p->free_list);
  if (p->slots == NULL || p->free_list == NULL) {
    free(p->slots);
    free(p->free_list);
    p->slots = NULL;
    p->free_list = NULL;
    return NULL;
  }
  for (int i = 0; i < pool_size; i++) {
    p->slots[i].device = -1;
    p->free_list[i] = pool_size - 1 - i;
  }
  p->n_free = pool_size;
  return p;
}

/* Events are created on first use of a slot, on the slot's device; the
 * caller's current device is restored. */
static int slot_events(slot *s, int device) {
  if (s->device == device)
    return 0;
  int prev = 0;
  if (UST__GPU_CHECK(cudaGetDevice(&prev)) != 0)
    return -1;
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  int rc = 0;
  if (prev != device && UST__GPU_CHECK(cudaSetDevice(device)) != 0)
    rc = -1;
  if (rc == 0 && UST__GPU_CHECK(cudaEventCreateWithFlags(&s->start, cudaEventDefault)) != 0)
    rc = -1;
  if (rc == 0 && UST__GPU_CHECK(cudaEventCreateWithFlags(&s->stop, cudaEventDefault)) != 0) {
    cudaEventDestroy(s->start);
    rc = -1;
  }
  if (prev != device)
    cudaSetDevice(prev);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (rc == 0)
    s->device = device;
  return rc;
}

int ust__gpu_capturing(void *stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  /* An error here (e.g. the legacy stream while another thread captures)
   * means "do not touch this stream": treat it as capturing. */
  if (cudaStreamIsCapturing((cudaStream_t)stream, &st) != cudaSuccess)
    return 1;
  return st != cudaStreamCaptureStatusNone;
}

int ust__gpu_timer_begin(int device, void *stream) {
  pthread_mutex_lock(&pool_lock);
  device_pool *p = pool_get(device);
  int idx = p != NULL && p->n_free > 0 ? p->free_list[--p->n_free] : -1;
  pthread_mutex_unlock(&pool_lock);
  if (idx < 0)
    return -1;
  slot *s = &p->slots[idx];
  if (slot_events(s, device) != 0 || UST__GPU_CHECK(cudaEventRecord(s->start, (cudaStream_t)stream)) != 0) {
    pthread_mutex_lock(&pool_lock);
    p->free_list[p->n_free++] = idx;
    pthread_mutex_unlock(&pool_lock);
    return -1;
  }
  return device << 20 | idx;
}

void ust__gpu_timer_cancel(int token) {
  device_pool *p = &pools[token >> 20];
  pthread_mutex_lock(&pool_lock);
  p->free_list[p->n_free++] = token & 0xfffff;
  pthread_mutex_unlock(&pool_lock);
}

void ust__gpu_timer_end(int token, void *stream, ust__route *route, uint64_t tsol_ps) {
  slot *s = &pools[token >> 20].slots[token & 0xfffff];
  s->route = route;
  s->tsol_ps = tsol_ps;
  if (UST__GPU_CHECK(cudaEventRecord(s->stop, (cudaStream_t)stream)) != 0) {
    ust__gpu_timer_cancel(token);
    return;
  }
  pthread_mutex_lock(&pool_lock);
  pending[n_pending++] = token;
  pthread_mutex_unlock(&pool_lock);
}

/* Harvest with pool_lock held; wait_sync makes it block on each event. */
static int harvest_locked(int wait_sync) {
  int kept = 0;
  for (int i = 0; i < n_pending; i++) {
    int token = pending[i];
    device_pool *p = &pools[token >> 20];
    slot *s = &p->slots[token & 0xfffff];
    cudaError_t q = wait_sync ? cudaEventSynchronize(s->stop) : cudaEventQuery(s->stop);
    if (q == cudaErrorNotReady) {
      pending[kept++] = token;
      continue;
    }
    float ms = 0;
    if (q == cudaSuccess && UST__GPU_CHECK(cudaEventElapsedTime(&ms, s->start, s->stop)) == 0) {
      const uint64_t ns = (uint64_t)((double)ms * 1e6 + 0.5);
      ust__hist_record(&s->route->hist, ns);
      atomic_fetch_add_explicit(&s->route->timed, 1, memory_order_relaxed);
      ust__route_roof_add(s->route, s->tsol_ps, ns, 0);
    } else {
      atomic_fetch_add_explicit(&s->route->timing_dropped, 1, memory_order_relaxed);
    }
    s->route = NULL;
    p->free_list[p->n_free++] = token & 0xfffff;
  }
  n_pending = kept;
  return kept;
}

int ust__gpu_harvest(void) {
  if (!ust__gpu_available())
    return 0;
  set_relaxed_capture();
  pthread_mutex_lock(&pool_lock);
  int left = n_pending > 0 ? harvest_locked(0) : 0;
  pthread_mutex_unlock(&pool_lock);
  return left;
}

void ust__gpu_harvest_all_sync(void) {
  if (!ust__gpu_available())
    return;
  set_relaxed_capture();
  pthread_mutex_lock(&pool_lock);
  if (n_pending > 0)
    harvest_locked(1);
  pthread_mutex_unlock(&pool_lock);
}

int ust__gpu_device_name(int device, char *buf, size_t cap) {
  struct cudaDeviceProp prop;
  if (cap == 0 || UST__GPU_CHECK(cudaGetDeviceProperties(&prop, device)) != 0)
    return -1;
  snprintf(buf, cap, "%s", prop.name);
  return 0;
}

void ust__gpu_shutdown(void) {
  pthread_mutex_lock(&pool_lock);
  if (n_pending > 0)
    harvest_locked(1);
  for (int d = 0; d < MAX_DEVICES; d++) {
    device_pool *p = &pools[d];
    for (int i = 0; p->slots != NULL && i < pool_size; i++)
      if (p->slots[i].device >= 0) {
        cudaEventDestroy(p->slots[i].start);
        cudaEventDestroy(p->slots[i].stop);
      }
    free(p->slots);
    free(p->free_list);
    memset(p, 0, sizeof *p);
  }
  free(pending);
  pending = NULL;
  n_pending = 0;
  pthread_mutex_unlock(&pool_lock);
}
