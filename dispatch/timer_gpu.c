/*
 * The GPU timers (CUDA or HIP): a pool of event pairs per device.
 *
 * On the call path: the start event is recorded on the caller's stream
 * before production, the stop event after, and the timer is queued. A
 * harvest polls the stop events (cudaEventQuery never blocks) and moves
 * elapsed times into the route's figures. Nothing here synchronises the
 * serving stream; the lock guards the free and pending lists only and is
 * never held while the device is asked (queried or waited for).
 *
 * A timed call is held (dispatch/hold.h): a one-thread kernel holds the
 * stream before the start event and the host releases it after the stop
 * event, so the pair brackets the call's work run back to back; what a held
 * pair adds around its work is measured once per device (the harvest's
 * thread, on a private stream) and taken off at conclusion.
 *
 * A varlen call whose lengths are on the device (dispatch/roofcall.h) has
 * them copied, in stream order right after its stop event, into a pinned
 * area the timer holds; its floor is taken from them once they are in.
 *
 * A kernel tracer (timer_cupti.c on CUDA; timer_notrace.c, always off, on
 * HIP) takes over inside its windows:
 * a call begun while one is open is timed by its kernels (token with
 * CUPTI_TOKEN set), every other by events.
 *
 * Runtime calls that are not capture-safe run in the relaxed stream-capture
 * mode, so they cannot invalidate a graph capture running in another
 * thread; the calling thread's own mode is restored after each.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/gpu_runtime.h"
#include "dispatch/dispatch.h"
#include "dispatch/hold_gpu.h"
#include "dispatch/timer_queue.h"

#define MAX_DEVICES 64
#define CUPTI_TOKEN (1 << 30) /* a token of the kernel tracer's: its call slot below */

typedef struct timer {
  cudaEvent_t start, stop;
  int device; /* -1 until its events exist */
  int floor_tag1;  /* its floor's staged lengths (a tag, 0: none) */
  int floor_part;  /* whose floor they are (UST__FLOOR_*); 0: let go */
  ust__figs *figs;
  uint64_t tsol_ps;
  int kind; /* why it was timed (UST__TIMED_*) */
  uint32_t seq;         /* its hold's number; 0: not held */
  int struck;           /* its hold had given up when it was released */
  ust__hold_word *hold; /* its operator's standing with the hold; borrowed */
} timer;

/* A device's words the holds read and write: host memory mapped for the
 * device, a release word and an expired word per timer and one pair more for
 * the calibration; the calibration's own stream and events. */
typedef struct hold_words {
  unsigned *host, *dev; /* [2 * (pool_size + 1)]: release words, then expired words */
  double ticks_per_ns;
  cudaStream_t stream; /* the calibration's, made by the harvest's thread */
  cudaEvent_t start, stop;
} hold_words;

/* A device's areas for the lengths of varlen calls (pinned, written by
 * copies on the calls' streams) and the deferrals they are read for. */
#define STAGES 256 /* a tracer window holds an area per varlen call until it concludes */
typedef struct stage_pool {
  unsigned char *pinned; /* STAGES * UST__DEFER_BYTES */
  cudaEvent_t copied[STAGES]; /* recorded behind each area's copies */
  ust__floor_defer rec[STAGES];
  /* an area's copies: 0 none enqueued, 1 enqueued with its event behind
   * them, 2 the event behind copies that failed (waited for, not read), 3
   * copies with no event behind them (never given back) */
  unsigned char ok[STAGES];
  int free_list[STAGES]; /* under the timers' lock */
  int n_free;
  unsigned char draining[STAGES]; /* let go before its copies were done: given back once they are */
  int n_draining;                 /* under the timers' lock */
} stage_pool;

typedef struct device_pool {
  timer *timers;
  int *free_list; /* stack of free timer indices */
  int n_free;
} device_pool;

struct ust__timers {
  pthread_mutex_t lock;
  ust__log_sink *log;
  int pool_size;
  device_pool pools[MAX_DEVICES];
  ust__tqueue pending; /* queued timers as (device << 20 | index), under lock */
  atomic_int used;
  ust__hold hold;
  _Atomic(hold_words *) words[MAX_DEVICES];
  atomic_int words_made[MAX_DEVICES]; /* 0 not yet, 1 being made, 2 made (words NULL: none) */
  ust__cupti *cupti; /* the kernel tracer (timer_cupti.c; a HIP build's is always off, timer_notrace.c) */
  _Atomic(stage_pool *) stages[MAX_DEVICES];
  atomic_int stages_made[MAX_DEVICES]; /* 0 not yet, 1 being made, 2 made (stages NULL: none) */
};

/* The calling thread's capture mode, relaxed until restore_capture_mode. */
static enum cudaStreamCaptureMode relax_capture_mode(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  return mode;
}

static void restore_capture_mode(enum cudaStreamCaptureMode mode) { cudaThreadExchangeStreamCaptureMode(&mode); }

/* ---- the hold's device (dispatch/hold.h) ---------------------------------------- */

static stage_pool *device_stages(ust__timers *t, int device);

/* The device's hold words, made at its first held call (outside the timers'
 * lock: a host allocation may wait for the device); NULL when they could not
 * be made (its calls are then timed by the plain pair). Its staging areas
 * for varlen floors are made first, before any call on it can be held: made
 * later, inside a held call, their pinned allocation would wait for the
 * device, which waits for the hold until its deadline. */
static hold_words *device_words(ust__timers *t, int device) {
  hold_words *w = atomic_load_explicit(&t->words[device], memory_order_acquire);
  if (w != NULL || atomic_load_explicit(&t->words_made[device], memory_order_acquire) == 2)
    return w;
  int expected = 0;
  if (!atomic_compare_exchange_strong(&t->words_made[device], &expected, 1))
    return NULL; /* another thread makes them: this call goes unheld */
  w = calloc(1, sizeof *w);
  const size_t n = 2 * ((size_t)t->pool_size + 1);
  int prev = -1, ok = w != NULL && UST__GPU_CHECK(t->log, cudaGetDevice(&prev)) == 0;
  enum cudaStreamCaptureMode mode = relax_capture_mode();
  if (ok && prev != device)
    ok = UST__GPU_CHECK(t->log, cudaSetDevice(device)) == 0;
  ok = ok && (w->ticks_per_ns = ust__hold_ticks_per_ns(device)) > 0 &&
       UST__GPU_CHECK(t->log, cudaHostAlloc((void **)&w->host, n * sizeof *w->host, cudaHostAllocMapped)) == 0 &&
       UST__GPU_CHECK(t->log, cudaHostGetDevicePointer((void **)&w->dev, w->host, 0)) == 0 ;
  if (prev >= 0 && prev != device)
    cudaSetDevice(prev);
  restore_capture_mode(mode);
  if (ok) {
    memset(w->host, 0, n * sizeof *w->host);
    (void)device_stages(t, device); /* NULL: its varlen calls keep their bounds */
    atomic_store_explicit(&t->words[device], w, memory_order_release);
  } else if (w != NULL) {
    if (w->host != NULL)
      cudaFreeHost(w->host);
    free(w);
    w = NULL;
  }
  atomic_store_explicit(&t->words_made[device], 2, memory_order_release);
  return w;
}

static int gpu_hold(void *ctx, int device, void *stream, int slot, uint32_t seq, uint64_t deadline_ns) {
  ust__timers *t = ctx;
  hold_words *w = device_words(t, device);
  if (w == NULL)
    return -1;
  /* a launch goes to the current device's stream: the call's device made
   * current for it when the thread has another */
  int prev = device;
  if (cudaGetDevice(&prev) != cudaSuccess || (prev != device && cudaSetDevice(device) != cudaSuccess)) {
    (void)cudaGetLastError();
    return -1;
  }
  const int rc = ust__hold_launch(stream, &w->dev[slot], seq,
                                  (unsigned long long)((double)deadline_ns * w->ticks_per_ns) + 1,
                                  &w->dev[t->pool_size + 1 + slot]);
  if (prev != device)
    cudaSetDevice(prev);
  return UST__GPU_CHECK(t->log, rc) == 0 ? 0 : -1;
}

static void gpu_release(void *ctx, int device, int slot, uint32_t seq) {
  ust__timers *t = ctx;
  hold_words *w = atomic_load_explicit(&t->words[device], memory_order_acquire);
  __atomic_store_n(&w->host[slot], seq, __ATOMIC_RELEASE);
}

static int gpu_expired(void *ctx, int device, int slot, uint32_t seq) {
  ust__timers *t = ctx;
  hold_words *w = atomic_load_explicit(&t->words[device], memory_order_acquire);
  return __atomic_load_n(&w->host[t->pool_size + 1 + slot], __ATOMIC_ACQUIRE) == seq;
}

/* A held pair around n empty kernels on the calibration's stream, waited
 * for: its span in ns, or -1. The harvest's thread only. */
static double calibration_pair(ust__timers *t, hold_words *w, int n) {
  const int slot = t->pool_size; /* the calibration's own words */
  const uint32_t seq = w->host[slot] + 1;
  float ms = 0;
  if (UST__GPU_CHECK(t->log, ust__hold_launch(w->stream, &w->dev[slot], seq,
                                              (unsigned long long)(1e6 * w->ticks_per_ns),
                                              &w->dev[t->pool_size + 1 + slot])) != 0)
    return -1;
  const int enqueued = UST__GPU_CHECK(t->log, cudaEventRecord(w->start, w->stream)) == 0 &&
                       UST__GPU_CHECK(t->log, ust__hold_empty_launch(w->stream, n)) == 0 &&
                       UST__GPU_CHECK(t->log, cudaEventRecord(w->stop, w->stream)) == 0;
  __atomic_store_n(&w->host[slot], seq, __ATOMIC_RELEASE);
  if (enqueued && UST__GPU_CHECK(t->log, cudaEventSynchronize(w->stop)) == 0 &&
      UST__GPU_CHECK(t->log, cudaEventElapsedTime(&ms, w->start, w->stop)) == 0 &&
      __atomic_load_n(&w->host[t->pool_size + 1 + slot], __ATOMIC_ACQUIRE) != seq)
    return (double)ms * 1e6;
  return -1;
}

/* One calibration sample (dispatch/hold.h): a held pair around one empty
 * kernel, and one around a chain of 1 + CHAIN of them, on the device's
 * calibration stream (made here, non-blocking: it waits for no serving
 * stream). The chain's growth per kernel is what a kernel adds when it runs
 * behind another (its own time and the gap before it), so the first pair
 * less that is what the pair adds around its work. The harvest's thread only. */
#define CHAIN 16
static int gpu_calibrate(void *ctx, int device, double *pair_ns, double *inner_ns) {
  ust__timers *t = ctx;
  hold_words *w = atomic_load_explicit(&t->words[device], memory_order_acquire);
  if (w == NULL)
    return -1;
  int prev = -1, rc = -1;
  if (UST__GPU_CHECK(t->log, cudaGetDevice(&prev)) != 0 ||
      (prev != device && UST__GPU_CHECK(t->log, cudaSetDevice(device)) != 0))
    return -1;
  enum cudaStreamCaptureMode mode = relax_capture_mode();
  if (w->stream == NULL &&
      (UST__GPU_CHECK(t->log, cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking)) != 0 ||
       UST__GPU_CHECK(t->log, cudaEventCreateWithFlags(&w->start, cudaEventDefault)) != 0 ||
       UST__GPU_CHECK(t->log, cudaEventCreateWithFlags(&w->stop, cudaEventDefault)) != 0)) {
    w->stream = NULL;
    goto out;
  }
  const double one = calibration_pair(t, w, 1), chain = one < 0 ? -1 : calibration_pair(t, w, 1 + CHAIN);
  if (one >= 0 && chain >= one) {
    *pair_ns = one;
    *inner_ns = (chain - one) / CHAIN;
    rc = 0;
  }
out:
  restore_capture_mode(mode);
  if (prev != device)
    cudaSetDevice(prev);
  return rc;
}

/* ---- staged lengths of varlen calls (dispatch/roofcall.h) ------------------------ */

/* The device's staging areas, made at its first deferred floor or with its
 * hold words (outside the lock: a pinned allocation may wait for the
 * device); NULL when they could not be made (its calls keep their bounds). */
static stage_pool *device_stages(ust__timers *t, int device) {
  stage_pool *sp = atomic_load_explicit(&t->stages[device], memory_order_acquire);
  if (sp != NULL || atomic_load_explicit(&t->stages_made[device], memory_order_acquire) == 2)
    return sp;
  int expected = 0;
  if (!atomic_compare_exchange_strong(&t->stages_made[device], &expected, 1))
    return NULL; /* another thread makes them: this call keeps its bound */
  sp = calloc(1, sizeof *sp);
  int prev = -1, ok = sp != NULL && UST__GPU_CHECK(t->log, cudaGetDevice(&prev)) == 0;
  enum cudaStreamCaptureMode mode = relax_capture_mode();
  if (ok && prev != device)
    ok = UST__GPU_CHECK(t->log, cudaSetDevice(device)) == 0;
  ok = ok && UST__GPU_CHECK(t->log, cudaHostAlloc((void **)&sp->pinned, (size_t)STAGES * UST__DEFER_BYTES,
                                                  cudaHostAllocDefault)) == 0;
  int events = 0;
  while (ok && events < STAGES &&
         (ok = UST__GPU_CHECK(t->log, cudaEventCreateWithFlags(&sp->copied[events], cudaEventDisableTiming)) == 0))
    events++;
  if (!ok) {
    while (events > 0)
      cudaEventDestroy(sp->copied[--events]);
    if (sp != NULL && sp->pinned != NULL)
      cudaFreeHost(sp->pinned);
  }
  if (prev >= 0 && prev != device)
    cudaSetDevice(prev);
  restore_capture_mode(mode);
  if (ok) {
    for (int i = 0; i < STAGES; i++)
      sp->free_list[i] = STAGES - 1 - i;
    sp->n_free = STAGES;
    atomic_store_explicit(&t->stages[device], sp, memory_order_release);
  } else {
    free(sp);
    sp = NULL;
  }
  atomic_store_explicit(&t->stages_made[device], 2, memory_order_release);
  return sp;
}

/* An area for d's lengths (its record copied in), or -1 when none is free. */
static int stage_take(ust__timers *t, stage_pool *sp, const ust__floor_defer *d) {
  pthread_mutex_lock(&t->lock);
  const int i = sp->n_free > 0 ? sp->free_list[--sp->n_free] : -1;
  pthread_mutex_unlock(&t->lock);
  if (i >= 0) {
    sp->rec[i] = *d;
    sp->ok[i] = 0;
  }
  return i;
}

static void stage_release(ust__timers *t, stage_pool *sp, int i) {
  pthread_mutex_lock(&t->lock);
  sp->free_list[sp->n_free++] = i;
  pthread_mutex_unlock(&t->lock);
}

/* A floor with area i's lengths in place of its bounded part (tsol_ps as
 * given when they make none), the work noted corrected by as much. */
static uint64_t stage_apply(const stage_pool *sp, int i, uint64_t tsol_ps) {
  const ust__floor_defer *d = &sp->rec[i];
  double w[UST__N_PATHS], qr = 0, qw = 0, seconds = 0;
  if (tsol_ps < d->bound_tsol_ps || ust__floor_resolve(d, sp->pinned + (size_t)i * UST__DEFER_BYTES, w, &qr, &qw) != 0 ||
      ust__roofline_tsol_quiet(d->hw, w, qr + qw, &seconds) != 0)
    return tsol_ps;
  double flops = 0;
  for (int p = 0; p < UST__N_PATHS; p++)
    flops += w[p];
  if (d->work_noted)
    ust__figs_adjust_work(d->figs, flops - d->bound_flops, qr + qw - d->bound_bytes);
  return tsol_ps - d->bound_tsol_ps + (uint64_t)(seconds * 1e12 + 0.5);
}

/* Tags name an area: device << 12 | area, + 1 (0: none). */
static stage_pool *tag_pool(ust__timers *t, int tag1, int *i) {
  *i = (tag1 - 1) & 0xfff;
  return atomic_load_explicit(&t->stages[(tag1 - 1) >> 12], memory_order_acquire);
}

int ust__timers_stage(ust__timers *t, int device, const ust__floor_defer *d) {
  stage_pool *sp = device >= 0 && device < MAX_DEVICES ? device_stages(t, device) : NULL;
  const int i = sp != NULL ? stage_take(t, sp, d) : -1;
  return i < 0 ? 0 : (device << 12 | i) + 1;
}

/* The tagged area's lengths copied into it on stream (on its device, made
 * current for the copies when it is not), its event recorded behind them. */
void ust__timers_stage_copy(ust__timers *t, int tag1, void *stream) {
  if (tag1 <= 0)
    return;
  int i;
  stage_pool *sp = tag_pool(t, tag1, &i);
  const int device = (tag1 - 1) >> 12;
  const ust__floor_defer *d = &sp->rec[i];
  unsigned char *area = sp->pinned + (size_t)i * UST__DEFER_BYTES;
  int prev = device;
  if (cudaGetDevice(&prev) != cudaSuccess || (prev != device && cudaSetDevice(device) != cudaSuccess)) {
    (void)cudaGetLastError();
    return;
  }
  int ok = 1, enqueued = 0;
  for (int k = 0; k < d->n_src && ok; k++)
    enqueued += ok = UST__GPU_CHECK(t->log, cudaMemcpyAsync(area + d->srcs[k].at, d->srcs[k].dev, d->srcs[k].bytes,
                                                            cudaMemcpyDeviceToHost, (cudaStream_t)stream)) == 0;
  /* the event even behind a failed copy: the area is given back only once
   * whatever was enqueued into it is done */
  const int recorded = UST__GPU_CHECK(t->log, cudaEventRecord(sp->copied[i], (cudaStream_t)stream)) == 0;
  sp->ok[i] = (unsigned char)(recorded ? (ok ? 1 : 2) : enqueued > 0 ? 3 : 0);
  if (prev != device)
    cudaSetDevice(prev);
}

/* Whether the tagged area's copies are done (sync: wait for them): 1, or 0
 * not yet. An area whose copies were not enqueued is done. */
static int stage_ready(ust__timers *t, int tag1, int sync) {
  int i;
  stage_pool *sp = tag1 > 0 ? tag_pool(t, tag1, &i) : NULL;
  if (sp == NULL || sp->ok[i] == 0)
    return 1;
  const cudaError_t q = sync ? cudaEventSynchronize(sp->copied[i]) : cudaEventQuery(sp->copied[i]);
  if (q == cudaErrorNotReady)
    return 0;
  if (q != cudaSuccess) {
    (void)cudaGetLastError();
    sp->ok[i] = 0; /* not read */
  }
  return 1;
}

uint64_t ust__timers_stage_floor(ust__timers *t, int tag1, uint64_t tsol_ps) {
  if (tag1 <= 0 || t == NULL) /* NULL: the timers went first, with their areas (an engine freed) */
    return tsol_ps;
  int i;
  stage_pool *sp = tag_pool(t, tag1, &i);
  if (sp->ok[i] == 3) /* copies that may still land: the area is never given back */
    return tsol_ps;
  /* never waits (a serving thread, the tracer's lock, another thread's
   * capture): copies not done yet leave the bound, and their area drains */
  int done = 1;
  if (sp->ok[i] != 0) {
    enum cudaStreamCaptureMode mode = relax_capture_mode();
    done = stage_ready(t, tag1, 0);
    restore_capture_mode(mode);
  }
  if (done && sp->ok[i] == 1 && tsol_ps > 0)
    tsol_ps = stage_apply(sp, i, tsol_ps);
  if (done) {
    stage_release(t, sp, i);
  } else {
    pthread_mutex_lock(&t->lock);
    sp->draining[i] = 1;
    __atomic_fetch_add(&sp->n_draining, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&t->lock);
  }
  return tsol_ps;
}

/* The worker's turn: draining areas whose copies are done given back
 * (sync: waited for), in the relaxed capture mode while it asks. */
static void stages_drain(ust__timers *t, int sync) {
  int relaxed = 0;
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed; /* set when relaxed */
  for (int d = 0; d < MAX_DEVICES; d++) {
    stage_pool *sp = atomic_load_explicit(&t->stages[d], memory_order_acquire);
    if (sp == NULL || __atomic_load_n(&sp->n_draining, __ATOMIC_RELAXED) == 0)
      continue;
    if (!relaxed) {
      mode = relax_capture_mode();
      relaxed = 1;
    }
    for (int i = 0; i < STAGES; i++) {
      pthread_mutex_lock(&t->lock);
      const int draining = sp->draining[i];
      pthread_mutex_unlock(&t->lock);
      if (!draining || !stage_ready(t, (d << 12 | i) + 1, sync))
        continue;
      pthread_mutex_lock(&t->lock);
      sp->draining[i] = 0;
      __atomic_fetch_sub(&sp->n_draining, 1, __ATOMIC_RELAXED);
      pthread_mutex_unlock(&t->lock);
      stage_release(t, sp, i);
    }
  }
  if (relaxed)
    restore_capture_mode(mode);
}

/* The kernel tracer's calls: their floors at the window's conclusion. */
static uint64_t kt_floor(void *ctx, int tag1, uint64_t tsol_ps) { return ust__timers_stage_floor(ctx, tag1, tsol_ps); }

/* A timer's floor with its staged lengths' part in place of the bound
 * (tsol_ps as given when they did not come or were let go); the area given
 * back. */
static uint64_t timer_floor(ust__timers *t, timer *s, uint64_t tsol_ps) {
  const uint64_t floor = ust__timers_stage_floor(t, s->floor_tag1, s->floor_part != 0 ? tsol_ps : 0);
  s->floor_tag1 = 0;
  return s->floor_part != 0 ? floor : tsol_ps;
}

int ust__timers_defer_floor(ust__timers *t, int token, const ust__floor_defer *d, int part) {
  if (token < 0)
    return -1;
  /* a tracer's token (CUPTI_TOKEN) is a call slot of its windows */
  ust__kt *kt = token & CUPTI_TOKEN ? ust__cupti_kt(t->cupti) : NULL;
  timer *s = kt != NULL ? NULL : &t->pools[token >> 20].timers[token & 0xfffff];
  if (kt != NULL ? ust__kt_floor_tag(kt, token & ~CUPTI_TOKEN, 0) > 0 : s->floor_tag1 > 0)
    return -1; /* one deferral a call */
  const int tag1 = ust__timers_stage(t, d->device, d);
  if (tag1 == 0)
    return -1;
  if (kt != NULL) {
    ust__kt_defer_floor(kt, token & ~CUPTI_TOKEN, tag1, part);
  } else {
    s->floor_tag1 = tag1;
    s->floor_part = part;
  }
  return 0;
}

void ust__timers_floor_settled(ust__timers *t, int token, int part) {
  if (token < 0)
    return;
  if (token & CUPTI_TOKEN) {
    ust__kt_floor_settled(ust__cupti_kt(t->cupti), token & ~CUPTI_TOKEN, part);
    return;
  }
  timer *s = &t->pools[token >> 20].timers[token & 0xfffff];
  if (s->floor_tag1 > 0 && s->floor_part != part)
    s->floor_part = 0;
}

static const ust__hold_dev_i gpu_hold_dev = {gpu_hold, gpu_release, gpu_expired, gpu_calibrate};

int ust__timers_create(int max_pending, const ust__timer_opts *opts, ust__log_sink *log, ust__timers **out) {
  ust__timers *t = calloc(1, sizeof *t);
  *out = t;
  if (t == NULL)
    return ust__error(UST_ENOMEM, "out of memory for GPU timers");
  pthread_mutex_init(&t->lock, NULL);
  if (ust__tqueue_init(&t->pending, &t->lock, max_pending * MAX_DEVICES) != 0) {
    pthread_mutex_destroy(&t->lock);
    free(t);
    *out = NULL;
    return UST_ENOMEM;
  }
  t->log = log;
  t->pool_size = max_pending;
  ust__hold_init(&t->hold, &gpu_hold_dev, t, opts != NULL ? opts->hold_deadline_ns : 0);
  const ust__timer_opts events = {.kind = UST__TIMER_EVENTS};
  int rc = ust__cupti_create(opts != NULL ? opts : &events, log, &t->cupti);
  if (rc != 0) {
    ust__timers_destroy(t);
    *out = NULL;
    return rc;
  }
  ust__kt *kt = ust__cupti_kt(t->cupti);
  if (kt != NULL)
    ust__kt_floor_fn_set(kt, kt_floor, t);
  return 0;
}

int ust__timers_used(const ust__timers *t) { return atomic_load_explicit(&((ust__timers *)t)->used, memory_order_relaxed); }

/* Called with the lock held. */
static device_pool *pool_get(ust__timers *t, int device) {
  if (device < 0 || device >= MAX_DEVICES)
    return NULL;
  device_pool *p = &t->pools[device];
  if (p->timers != NULL)
    return p;
  atomic_store(&t->used, 1);
  p->timers = calloc((size_t)t->pool_size, sizeof *p->timers);
  p->free_list = calloc((size_t)t->pool_size, sizeof *p->free_list);
  if (p->timers == NULL || p->free_list == NULL) {
    free(p->timers);
    free(p->free_list);
    p->timers = NULL;
    p->free_list = NULL;
    return NULL;
  }
  for (int i = 0; i < t->pool_size; i++) {
    p->timers[i].device = -1;
    p->free_list[i] = t->pool_size - 1 - i;
  }
  p->n_free = t->pool_size;
  return p;
}

/* Events are created at a timer's first use, on its device; the caller's
 * current device is restored. */
static int timer_events(ust__timers *t, timer *s, int device) {
  if (s->device == device)
    return 0;
  int prev = 0;
  if (UST__GPU_CHECK(t->log, cudaGetDevice(&prev)) != 0)
    return -1;
  enum cudaStreamCaptureMode mode = relax_capture_mode();
  int rc = 0;
  if (prev != device && UST__GPU_CHECK(t->log, cudaSetDevice(device)) != 0)
    rc = -1;
  if (rc == 0 && UST__GPU_CHECK(t->log, cudaEventCreateWithFlags(&s->start, cudaEventDefault)) != 0)
    rc = -1;
  if (rc == 0 && UST__GPU_CHECK(t->log, cudaEventCreateWithFlags(&s->stop, cudaEventDefault)) != 0) {
    cudaEventDestroy(s->start);
    rc = -1;
  }
  if (prev != device)
    cudaSetDevice(prev);
  restore_capture_mode(mode);
  if (rc == 0)
    s->device = device;
  return rc;
}

int ust__gpu_capturing(void *stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  /* An error here (e.g. the legacy stream while another thread captures)
   * means "do not touch this stream": treat it as capturing. */
  if (cudaStreamIsCapturing((cudaStream_t)stream, &st) != cudaSuccess) {
    (void)cudaGetLastError(); /* not left for torch's next launch check */
    return 1;
  }
  return st != cudaStreamCaptureStatusNone;
}

static void give_back(ust__timers *t, int token) {
  device_pool *p = &t->pools[token >> 20];
  pthread_mutex_lock(&t->lock);
  p->free_list[p->n_free++] = token & 0xfffff;
  pthread_mutex_unlock(&t->lock);
}

UST__HOT int ust__timers_tracing(const ust__timers *t) { return ust__cupti_tracing(t->cupti); }

int ust__timers_may_trace(const ust__timers *t) { return ust__cupti_present(t->cupti); }

void ust__timers_status(ust__timers *t, ust__timer_status *out) { ust__cupti_status(t->cupti, out); }

int ust__timers_begin(ust__timers *t, int device, void *stream, ust__hold_word *hold) {
  if (ust__cupti_tracing(t->cupti) == UST__TRACING_WINDOW) {
    const int slot = ust__cupti_begin(t->cupti);
    if (slot >= 0)
      return CUPTI_TOKEN | slot;
  }
  pthread_mutex_lock(&t->lock);
  device_pool *p = pool_get(t, device);
  int idx = p != NULL && p->n_free > 0 ? p->free_list[--p->n_free] : -1;
  pthread_mutex_unlock(&t->lock);
  if (idx < 0)
    return -1;
  timer *s = &p->timers[idx];
  s->seq = 0;
  s->hold = hold;
  s->floor_tag1 = 0;
  if (timer_events(t, s, device) != 0) {
    give_back(t, device << 20 | idx);
    return -1;
  }
  ust__hold_begin(&t->hold, hold, device, stream, idx, &s->seq);
  if (UST__GPU_CHECK(t->log, cudaEventRecord(s->start, (cudaStream_t)stream)) != 0) {
    ust__hold_end(&t->hold, NULL, device, idx, s->seq);
    give_back(t, device << 20 | idx);
    return -1;
  }
  return device << 20 | idx;
}

int ust__timers_capture_mark(ust__timers *t, void *stream, uint32_t *from) {
  return ust__cupti_capture_mark(t->cupti, t->log, stream, from);
}

void ust__timers_captured(ust__timers *t, void *stream, uint32_t from, ust__figs *figs, uint64_t tsol_ps) {
  ust__cupti_captured(t->cupti, t->log, stream, from, figs, tsol_ps);
}

void ust__timers_graph_made(ust__timers *t, void *stream) { ust__cupti_capture_made(t->cupti, t->log, stream); }

int ust__timers_span_begin(ust__timers *t) {
  if (!atomic_load_explicit(&t->used, memory_order_relaxed)) /* GPU work the tracer's windows can see */
    atomic_store_explicit(&t->used, 1, memory_order_relaxed);
  return ust__cupti_tracing(t->cupti) == UST__TRACING_WINDOW ? ust__cupti_begin(t->cupti) : -1;
}

void ust__timers_span_end(ust__timers *t, int token, ust__kt_sink *sink, int role) {
  if (token >= 0)
    ust__cupti_end_span(t->cupti, token, sink, role);
}

void ust__timers_cancel(ust__timers *t, int token) {
  if (token & CUPTI_TOKEN) {
    ust__cupti_end(t->cupti, token & ~CUPTI_TOKEN, NULL, 0, 0);
    return;
  }
  /* a call that raised, or was served by a candidate: its hold released, no strike */
  timer *s = &t->pools[token >> 20].timers[token & 0xfffff];
  ust__hold_end(&t->hold, NULL, token >> 20, token & 0xfffff, s->seq);
  timer_floor(t, s, 0); /* no copies were made: the area goes back */
  give_back(t, token);
}

void ust__timers_end(ust__timers *t, int token, void *stream, ust__figs *figs, uint64_t tsol_ps, int kind) {
  if (token & CUPTI_TOKEN) {
    /* the lengths copied behind the call's kernels */
    ust__timers_stage_copy(t, ust__kt_floor_tag(ust__cupti_kt(t->cupti), token & ~CUPTI_TOKEN, 1), stream);
    ust__cupti_end(t->cupti, token & ~CUPTI_TOKEN, figs, tsol_ps, kind);
    return;
  }
  timer *s = &t->pools[token >> 20].timers[token & 0xfffff];
  s->figs = figs;
  s->tsol_ps = tsol_ps;
  s->kind = kind;
  const int recorded = UST__GPU_CHECK(t->log, cudaEventRecord(s->stop, (cudaStream_t)stream)) == 0;
  s->struck = ust__hold_end(&t->hold, s->hold, token >> 20, token & 0xfffff, s->seq); /* released whatever happened */
  if (!recorded) {
    timer_floor(t, s, 0);
    give_back(t, token);
    return;
  }
  if (s->floor_part != 0)
    ust__timers_stage_copy(t, s->floor_tag1, stream);
  ust__tqueue_push(&t->pending, token);
}

/* A completed (or failed) timer into its figures, and back to its pool: 1;
 * 0 for a held one whose device is not calibrated yet, or one whose staged
 * lengths are not in yet (sync: waited for), which waits. */
static int conclude(ust__timers *t, int token, cudaError_t q, int sync) {
  timer *s = &t->pools[token >> 20].timers[token & 0xfffff];
  float ms = 0;
  if (q == cudaSuccess && !stage_ready(t, s->floor_tag1, sync))
    return 0;
  if (q == cudaSuccess && UST__GPU_CHECK(t->log, cudaEventElapsedTime(&ms, s->start, s->stop)) == 0) {
    double ns = 0;
    const int held =
        ust__hold_conclude(&t->hold, s->hold, token >> 20, token & 0xfffff, s->seq, s->struck, (double)ms * 1e6, &ns);
    if (held < 0)
      return 0;
    const uint64_t tsol_ps = timer_floor(t, s, s->tsol_ps);
    if (held == 0) {
      ust__figs_hold_expired(s->figs);
    } else {
      ust__figs_timed(s->figs, (uint64_t)(ns + 0.5), tsol_ps, s->kind);
      if (s->seq != 0)
        ust__figs_held(s->figs);
    }
  } else {
    timer_floor(t, s, 0);
    ust__figs_pair_failed(s->figs);
  }
  s->figs = NULL;
  give_back(t, token);
  return 1;
}

/* The harvest's thread: every device a held call ran on is calibrated
 * first (once), so that its held samples can conclude. */
static void calibrate_devices(ust__timers *t) {
  for (int d = 0; d < MAX_DEVICES; d++)
    if (atomic_load_explicit(&t->words[d], memory_order_acquire) != NULL &&
        ust__hold_state(&t->hold, d) == UST__HOLD_UNCALIBRATED &&
        ust__hold_calibrate(&t->hold, d) == UST__HOLD_UNAVAILABLE)
      ust__log(t->log, UST_LOG_WARN, "timer: holds cannot be calibrated on GPU %d (%s): its calls are timed by the "
               "plain event pair", d, ust_last_error());
}

/* Take a batch of the pending timers (the oldest) out of the queue, ask the
 * device about them outside the lock (sync: wait for each; else query),
 * conclude the completed ones and put the others back (dispatch/timer_queue.h).
 * A serving thread that times a call takes the same lock (a free timer, a
 * queued one): it never waits for a driver call. A sync harvest (a flush)
 * first waits for a batch another harvest holds. */
static int harvest(ust__timers *t, int sync) {
  if (!ust__timers_used(t))
    return 0;
  stages_drain(t, sync);
  if (ust__tqueue_busy(&t->pending) == 0)
    return 0;
  calibrate_devices(t);
  enum cudaStreamCaptureMode mode = relax_capture_mode();
  int taken[256], back[256];
  int left = 0;
  for (;;) {
    const int n = ust__tqueue_take(&t->pending, taken, 256, sync);
    int kept = 0;
    for (int i = 0; i < n; i++) {
      cudaEvent_t stop = t->pools[taken[i] >> 20].timers[taken[i] & 0xfffff].stop;
      const cudaError_t q = sync ? cudaEventSynchronize(stop) : cudaEventQuery(stop);
      if (q == cudaErrorNotReady || !conclude(t, taken[i], q, sync))
        back[kept++] = taken[i];
    }
    left = ust__tqueue_settle(&t->pending, n, back, kept);
    if (!sync || n < 256)
      break;
  }
  restore_capture_mode(mode);
  return left;
}

int ust__timers_harvest(ust__timers *t) {
  return harvest(t, 0) + ust__cupti_poll(t->cupti, ust__timers_used(t), 0);
}

void ust__timers_harvest_all_sync(ust__timers *t) {
  harvest(t, 1);
  ust__cupti_poll(t->cupti, ust__timers_used(t), 1);
}

int ust__gpu_device_name(int device, char *buf, size_t cap) {
  struct cudaDeviceProp prop;
  if (cap == 0 || cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return -1;
  snprintf(buf, cap, "%s", prop.name);
  return 0;
}

void ust__timers_destroy(ust__timers *t) {
  if (t == NULL)
    return;
  ust__cupti_destroy(t->cupti);
  harvest(t, 1);
  for (int d = 0; d < MAX_DEVICES; d++) {
    device_pool *p = &t->pools[d];
    for (int i = 0; p->timers != NULL && i < t->pool_size; i++)
      if (p->timers[i].device >= 0) {
        cudaEventDestroy(p->timers[i].start);
        cudaEventDestroy(p->timers[i].stop);
      }
    free(p->timers);
    free(p->free_list);
  }
  for (int d = 0; d < MAX_DEVICES; d++) {
    hold_words *w = atomic_load(&t->words[d]);
    if (w == NULL)
      continue;
    if (w->stream != NULL) {
      cudaEventDestroy(w->start);
      cudaEventDestroy(w->stop);
      cudaStreamDestroy(w->stream);
    }
    cudaFreeHost(w->host);
    free(w);
  }
  for (int d = 0; d < MAX_DEVICES; d++) {
    stage_pool *sp = atomic_load(&t->stages[d]);
    if (sp == NULL)
      continue;
    for (int i = 0; i < STAGES; i++)
      cudaEventDestroy(sp->copied[i]);
    cudaFreeHost(sp->pinned);
    free(sp);
  }
  ust__tqueue_free(&t->pending);
  pthread_mutex_destroy(&t->lock);
  free(t);
}

void ust__timers_hold_status(ust__timers *t, ust__hold_status *out) {
  memset(out, 0, sizeof *out);
  out->deadline_ns = t->hold.deadline_ns;
  out->held = atomic_load(&t->hold.held);
  out->expired = atomic_load(&t->hold.expired);
  out->released_late = atomic_load(&t->hold.released_late);
  out->excluded = atomic_load(&t->hold.excluded);
  for (int d = 0; d < MAX_DEVICES && out->n_devices < 8; d++) {
    const int state = ust__hold_state(&t->hold, d);
    if (atomic_load(&t->words_made[d]) == 0)
      continue;
    out->devices[out->n_devices].device = d;
    out->devices[out->n_devices].state = state;
    out->devices[out->n_devices].offset_ns = state == UST__HOLD_CALIBRATED ? t->hold.offset_ns[d] : 0;
    out->devices[out->n_devices].spread_ns = state == UST__HOLD_CALIBRATED ? t->hold.offset_spread_ns[d] : 0;
    out->n_devices++;
  }
}
