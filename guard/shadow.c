/*
 * Shadow calls: the slots that carry one shadowed call from the router to its
 * verdict, the comparison of its outputs, and the rollback at the first
 * verified failure.
 *
 * A slot holds the call's timestamps (host clock or device events), the
 * description of each output pair and room for the comparison results. On
 * the host everything concludes inside ust__shadow_finish. On a GPU the
 * compare kernel reduces into the slot's device buffer, an async copy moves
 * the results to the slot's pinned host buffer, a last event marks the end,
 * and the worker thread concludes the slot once that event has completed.
 * The number of slots bounds the shadow work in flight.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "dispatch/backend.h"
#include "dispatch/dispatch.h"
#include "guard/guard.h"

#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
#define UST__SHADOW_GPU 1
#include "dispatch/gpu_runtime.h"
#endif

#define MAX_SLOT_PAIRS (2 * UST__SHADOW_MAX_PAIRS)

typedef struct pair_meta {
  const char *name;
  int aa;
  int dtype;
  int ndim;
  int64_t shape[8];
  const char *fail; /* a metadata failure (shape, dtype, ...), or NULL */
  char detail[160];
  int compared;     /* 1 when stats hold its comparison */
  double atol, rtol;
} pair_meta;

enum slot_state { SLOT_FREE = 0, SLOT_IN_CALL, SLOT_PENDING, SLOT_CONCLUDING };

typedef struct shadow_slot {
  ust__route *route;
  int on_gpu;  /* this use enqueued device work */
  int aborted; /* concluded as skipped */
  uint64_t t[UST__MARK_COUNT];
  int n_pairs;
  pair_meta meta[MAX_SLOT_PAIRS];
  ust__cmp_stats host[MAX_SLOT_PAIRS];
  int fail;
  char msg[256];
  uint64_t call_no; /* 1-based number of this shadow call on its route */
  int serving;        /* verifies a call the candidate served (canary, live) */
  uint64_t served_at; /* the route's served_cand when this call started */
  uint64_t stage;     /* the route's transitions when this call started: a pass counts for that stage only */
  int *verdict_out;   /* the waiting caller's verdict (1 failed, 0 not), written when concluded */
  int failed;         /* this use's verdict: 1 when it failed */
  uint64_t tsol_ps; /* the call's roofline floor; 0 unknown */
  atomic_int state;         /* slot_state */
  atomic_uint_fast64_t uses; /* incremented at each release: a flush waits for it to move */
#ifdef UST__SHADOW_GPU
  int device;                 /* of this use */
  unsigned ev_made;           /* bit i: ev[i] exists (events live for one use) */
  cudaEvent_t ev[UST__MARK_COUNT + 1];
  ust__cmp_stats *dev_stats;  /* this slot's part of the device's arena */
  ust__cmp_stats *pinned;     /* and of its pinned host arena */
#endif
} shadow_slot;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static shadow_slot *slots;
static int n_slots;
static int *free_list;
static int n_free;
static int *pending; /* GPU slots whose results are in flight */
static int n_pending;

static uint64_t unix_ms(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

static void atomic_max_u64(atomic_uint_fast64_t *a, uint64_t v) {
  uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
  while (v > cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed, memory_order_relaxed))
    ;
}

#ifdef UST__SHADOW_GPU
#define MAX_DEVICES 64

/* Per device, the result buffers of every slot, allocated at the first
 * shadowed call on that device: allocation may synchronise the device, so
 * it happens once there and never again on the serving path. */
typedef struct gpu_arena {
  ust__cmp_stats *dev;
  ust__cmp_stats *pinned;
} gpu_arena;
static gpu_arena arenas[MAX_DEVICES]; /* guarded by pool_lock */

/* Not capture-safe calls run in the relaxed mode, so a capture running in
 * another thread stays valid. */
static int arena_get(int device, gpu_arena *out) {
  if (device < 0 || device >= MAX_DEVICES)
    return -1;
  pthread_mutex_lock(&pool_lock);
  gpu_arena *a = &arenas[device];
  int rc = 0;
  if (a->dev == NULL) {
    size_t bytes = sizeof(ust__cmp_stats) * MAX_SLOT_PAIRS * (size_t)n_slots;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (UST__GPU_CHECK(cudaMalloc((void **)&a->dev, bytes)) != 0) {
      a->dev = NULL;
      rc = -1;
    } else if (UST__GPU_CHECK(cudaHostAlloc((void **)&a->pinned, bytes, cudaHostAllocDefault)) != 0) {
      cudaFree(a->dev);
      a->dev = NULL;
      a->pinned = NULL;
      rc = -1;
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
  }
  *out = *a;
  pthread_mutex_unlock(&pool_lock);
  return rc;
}

static void slot_events_free(shadow_slot *s) {
  for (int i = 0; i < UST__MARK_COUNT + 1; i++)
    if (s->ev_made & (1u << i))
      cudaEventDestroy(s->ev[i]);
  s->ev_made = 0;
}

/* Record event i of this use on stream (creating it: events are cheap and
 * per use, so a slot serves any device). */
static int slot_record(shadow_slot *s, int i, cudaStream_t stream) {
  if (!(s->ev_made & (1u << i))) {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    int rc = UST__GPU_CHECK(cudaEventCreateWithFlags(&s->ev[i], cudaEventDefault));
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (rc != 0)
      return -1;
    s->ev_made |= 1u << i;
  }
  return UST__GPU_CHECK(cudaEventRecord(s->ev[i], stream)) == 0 ? 0 : -1;
}
#endif

int ust__shadow_init(int max_inflight) {
  pthread_mutex_lock(&pool_lock);
  slots = calloc((size_t)max_inflight, sizeof *slots);
  free_list = calloc((size_t)max_inflight, sizeof *free_list);
  pending = calloc((size_t)max_inflight, sizeof *pending);
  int rc = 0;
  if (slots == NULL || free_list == NULL || pending == NULL) {
    free(slots);
    free(free_list);
    free(pending);
    slots = NULL;
    free_list = pending = NULL;
    rc = ust__error(UST_ENOMEM, "out of memory for %d shadow slots", max_inflight);
  } else {
    n_slots = n_free = max_inflight;
    n_pending = 0;
    for (int i = 0; i < max_inflight; i++)
      free_list[i] = max_inflight - 1 - i;
  }
  pthread_mutex_unlock(&pool_lock);
  return rc;
}

/* Tell a caller waiting for this use's verdict (ust__shadow_verdict). */
static void tell(shadow_slot *s) {
  if (s->verdict_out != NULL)
    __atomic_store_n(s->verdict_out, s->failed, __ATOMIC_RELEASE);
  s->verdict_out = NULL;
}

static void release(shadow_slot *s) {
  tell(s);
  s->route = NULL;
#ifdef UST__SHADOW_GPU
  slot_events_free(s);
#endif
  atomic_store(&s->state, SLOT_FREE);
  atomic_fetch_add(&s->uses, 1);
  pthread_mutex_lock(&pool_lock);
  free_list[n_free++] = (int)(s - slots);
  pthread_mutex_unlock(&pool_lock);
}

#ifdef UST__SHADOW_GPU
static void enqueue_pending(shadow_slot *s) {
  pthread_mutex_lock(&pool_lock);
  atomic_store(&s->state, SLOT_PENDING);
  pending[n_pending++] = (int)(s - slots);
  pthread_mutex_unlock(&pool_lock);
}

/* Device work of this slot was queued but no event fences it: the slot's
 * buffers may still be written, so it never goes back to the pool. */
static void retire_unfenced(shadow_slot *s) {
  tell(s);
  atomic_fetch_add_explicit(&s->route->skipped, 1, memory_order_relaxed);
  ust__log(UST_LOG_WARN, "shadow: a slot's device work could not be fenced; the slot is retired");
}
#endif

void *ust__shadow_acquire(ust__route *route) {
  pthread_mutex_lock(&pool_lock);
  int idx = n_free > 0 ? free_list[--n_free] : -1;
  pthread_mutex_unlock(&pool_lock);
  if (idx < 0)
    return NULL;
  shadow_slot *s = &slots[idx];
  s->route = route;
  s->on_gpu = 0;
  s->aborted = 0;
  s->n_pairs = 0;
  s->fail = UST__FAIL_NONE;
  s->msg[0] = '\0';
  memset(s->t, 0, sizeof s->t);
#ifdef UST__SHADOW_GPU
  s->device = -1;
  s->ev_made = 0;
  s->dev_stats = s->pinned = NULL;
#endif
  s->tsol_ps = 0;
  s->serving = 0;
  s->served_at = atomic_load_explicit(&route->served_cand, memory_order_relaxed);
  s->stage = atomic_load_explicit(&route->transitions, memory_order_relaxed);
  s->verdict_out = NULL;
  s->failed = 0;
  s->call_no = atomic_fetch_add_explicit(&route->shadow_calls, 1, memory_order_relaxed) + 1;
  atomic_store(&s->state, SLOT_IN_CALL);
  return s;
}

void ust__shadow_info_get(const ust__call_state *st, ust__shadow_info *out) {
  const ust__binding *b = st->route->binding;
  const ust__candidate *c = b->cand;
  memset(out, 0, sizeof *out);
  out->kind = c->kind;
  out->native = c->desc;
  out->torch_op = c->torch_op;
  out->torch_overload = c->torch_overload;
  out->compare = c->compare;
  out->writes_mask = b->writes_mask;
  out->compared_returns = b->def->compared_returns;
  const shadow_slot *slot = st->shadow;
  if (c->aa_sample > 0 && slot != NULL && !slot->serving) {
    /* Every A/A check is an extra production run: the same exact sampling
     * as the timing decision, over this route's shadow calls (shadow mode
     * only: a call the candidate serves has no A/A run). */
    uint64_t n = slot->call_no;
    unsigned __int128 a = (unsigned __int128)n * c->aa_q32, p = (unsigned __int128)(n - 1) * c->aa_q32;
    out->aa = c->aa_sample >= 1.0 || (uint64_t)(a >> 32) != (uint64_t)(p >> 32);
  }
}

void ust__shadow_mark(ust__call_state *st, int mark, const ust__call *call) {
  shadow_slot *s = st->shadow;
  if (s == NULL || mark < 0 || mark >= UST__MARK_COUNT)
    return;
#ifdef UST__SHADOW_GPU
  /* The stream may be NULL: CUDA's legacy default stream. */
  void *stream = call->stream;
  if (call->device == UST__DEV_CUDA) {
    if (s->aborted)
      return;
    if (s->device < 0) {
      gpu_arena a;
      size_t idx = (size_t)(s - slots);
      if (UST__GPU_CHECK(cudaGetDevice(&s->device)) != 0 || arena_get(s->device, &a) != 0) {
        s->aborted = 1;
        return;
      }
      s->dev_stats = a.dev + idx * MAX_SLOT_PAIRS;
      s->pinned = a.pinned + idx * MAX_SLOT_PAIRS;
    }
    if (slot_record(s, mark, (cudaStream_t)stream) != 0) {
      s->aborted = 1;
      return;
    }
    s->on_gpu = 1;
    return;
  }
#endif
  s->t[mark] = ust__now_ns();
}

void ust__shadow_note_tsol(void *slot, uint64_t tsol_ps) {
  if (slot != NULL)
    ((shadow_slot *)slot)->tsol_ps = tsol_ps;
}

int ust__shadow_alive(const ust__call_state *st) {
  const shadow_slot *s = st->shadow;
  return s != NULL && !s->aborted;
}

static int64_t numel_of(const DLTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    n *= t->shape[i];
  return n;
}

/* Metadata checks: what makes a comparison meaningless fails on its own. */
static const char *meta_check(const ust__pair *p, char *detail, size_t cap) {
  const DLTensor *a = &p->prod, *b = &p->cand;
  if (a->device.device_type != b->device.device_type || a->device.device_id != b->device.device_id) {
    snprintf(detail, cap, "on device %d:%d, production's on %d:%d", (int)b->device.device_type,
             (int)b->device.device_id, (int)a->device.device_type, (int)a->device.device_id);
    return "device";
  }
  if (p->prod_dtype != p->cand_dtype) {
    snprintf(detail, cap, "dtype %s, production's %s", ust__dtype_name(p->cand_dtype),
             ust__dtype_name(p->prod_dtype));
    return "dtype";
  }
  int same = a->ndim == b->ndim;
  for (int i = 0; same && i < a->ndim; i++)
    same = a->shape[i] == b->shape[i];
  if (!same) {
    size_t n = (size_t)snprintf(detail, cap, "shape [");
    for (int i = 0; i < b->ndim && n < cap; i++)
      n += (size_t)snprintf(detail + n, cap - n, "%s%lld", i ? "," : "", (long long)b->shape[i]);
    if (n < cap)
      n += (size_t)snprintf(detail + n, cap - n, "], production's [");
    for (int i = 0; i < a->ndim && n < cap; i++)
      n += (size_t)snprintf(detail + n, cap - n, "%s%lld", i ? "," : "", (long long)a->shape[i]);
    if (n < cap)
      snprintf(detail + n, cap - n, "]");
    return "shape";
  }
  /* Strides matter where a dimension has more than one element. */
  for (int i = 0; i < a->ndim; i++) {
    int64_t sa = a->strides != NULL ? a->strides[i] : 0, sb = b->strides != NULL ? b->strides[i] : 0;
    if (a->shape[i] > 1 && a->strides != NULL && b->strides != NULL && sa != sb) {
      snprintf(detail, cap, "stride %lld in dimension %d, production's %lld", (long long)sb, i, (long long)sa);
      return "stride";
    }
  }
  return NULL;
}

static void tolerances(const ust__candidate *c, int dtype, double *atol, double *rtol) {
  ust__cmp_default_tol(dtype, atol, rtol);
  if (c->atol >= 0)
    *atol = c->atol;
  if (c->rtol >= 0)
    *rtol = c->rtol;
}

static void conclude(shadow_slot *s);

/* A slot that queued device work goes back only when the device is done with
 * its buffers: its last event is recorded and the worker concludes it; if
 * that event cannot be recorded the slot is retired. Host slots conclude now. */
static void release_after_device(shadow_slot *s, const ust__call *call) {
#ifdef UST__SHADOW_GPU
  if (s->on_gpu) {
    if (slot_record(s, UST__MARK_COUNT, (cudaStream_t)call->stream) == 0)
      enqueue_pending(s);
    else
      retire_unfenced(s);
    return;
  }
#endif
  (void)call;
  conclude(s);
}

static void roll_back(const shadow_slot *s, const char *reason, const pair_meta *m, const ust__cmp_stats *st,
                      const char *message);

static const char *fail_reason(int fail) {
  static const char *names[] = {"", "error", "raised", "schema"};
  return names[fail >= 0 && fail <= UST__FAIL_SCHEMA ? fail : 0];
}

void ust__shadow_finish(const ust__call *call, ust__call_state *st, const ust__pair *pairs, int n_pairs, int fail,
                        const char *msg) {
  shadow_slot *s = st->shadow;
  st->shadow = NULL;
  if (s == NULL)
    return;
  const ust__candidate *c = s->route->binding->cand;
  s->fail = fail;
  if (msg != NULL)
    snprintf(s->msg, sizeof s->msg, "%s", msg);
  /* A failure known on the host (an error, a raise) rolls back at once;
   * the slot still waits for the device before it is concluded. */
  if (fail != UST__FAIL_NONE)
    roll_back(s, fail_reason(fail), NULL, NULL, s->msg);
  if (n_pairs > MAX_SLOT_PAIRS)
    n_pairs = MAX_SLOT_PAIRS;
  s->n_pairs = n_pairs;
#ifdef UST__SHADOW_GPU
  const int gpu = call->device == UST__DEV_CUDA && s->on_gpu && !s->aborted;
  if (gpu && UST__GPU_CHECK(cudaMemsetAsync(s->dev_stats, 0, sizeof(ust__cmp_stats) * (size_t)n_pairs,
                                            (cudaStream_t)call->stream)) != 0)
    s->aborted = 1;
#else
  const int gpu = 0;
#endif
  if (call->device != UST__DEV_CPU && !gpu)
    s->aborted = 1; /* device memory is never read on the host */
  for (int i = 0; i < n_pairs && !s->aborted; i++) {
    const ust__pair *p = &pairs[i];
    pair_meta *m = &s->meta[i];
    memset(m, 0, sizeof *m);
    m->name = p->name;
    m->aa = p->aa;
    m->dtype = p->prod_dtype;
    m->ndim = p->prod.ndim < 8 ? p->prod.ndim : 8;
    for (int d = 0; d < m->ndim; d++)
      m->shape[d] = p->prod.shape[d];
    if (s->fail != UST__FAIL_NONE && !p->aa)
      continue;
    /* Outputs understudy cannot read (an unsupported dtype, or production's
     * own output on another device than the call, such as a CPU RNG seed of
     * a GPU kernel) leave the call unverifiable rather than judged. */
    if (!ust__cmp_dtype_supported(p->prod_dtype) ||
        (p->prod.device.device_type == kDLCPU) != (call->device == UST__DEV_CPU))
      continue;
    if ((m->fail = meta_check(p, m->detail, sizeof m->detail)) != NULL)
      continue;
    tolerances(c, p->prod_dtype, &m->atol, &m->rtol);
    int kind = c->compare == UST__CMP_EXACT ? UST__CMP_EXACT : UST__CMP_ALLCLOSE;
    int64_t n = numel_of(&p->prod);
    m->compared = 1;
    if (!gpu) {
      ust__compare_host(p->prod_dense, p->cand_dense, p->prod_dtype, n, kind, m->atol, m->rtol, &s->host[i]);
      continue;
    }
#ifdef UST__SHADOW_GPU
    if (ust__compare_launch(p->prod_dense, p->cand_dense, p->prod_dtype, n, kind, m->atol, m->rtol,
                            &s->dev_stats[i], call->stream) != 0) {
      ust__log(UST_LOG_WARN, "shadow: %s", ust_last_error());
      s->aborted = 1;
    }
#endif
  }
#ifdef UST__SHADOW_GPU
  if (s->on_gpu && !s->aborted &&
      UST__GPU_CHECK(cudaMemcpyAsync(s->pinned, s->dev_stats, sizeof(ust__cmp_stats) * (size_t)n_pairs,
                                     cudaMemcpyDeviceToHost, (cudaStream_t)call->stream)) != 0)
    s->aborted = 1;
#endif
  release_after_device(s, call);
}

void ust__shadow_abandon(const ust__call *call, ust__call_state *st) {
  shadow_slot *s = st->shadow;
  st->shadow = NULL;
  if (s == NULL)
    return;
  s->aborted = 1;
  s->n_pairs = 0;
  release_after_device(s, call);
}

static void unravel(int64_t flat, const pair_meta *m, int64_t *idx) {
  for (int d = m->ndim - 1; d >= 0; d--) {
    int64_t extent = m->shape[d] > 0 ? m->shape[d] : 1;
    idx[d] = flat % extent;
    flat /= extent;
  }
}

/* The first failure of a route publishes its evidence, then flips the route
 * (so a report never shows a rolled-back route without its evidence, save
 * when memory ran out). Later failures only count. */
static void roll_back_route(ust__route *r, uint64_t call_no, int serving, uint64_t served_at, const char *reason,
                            const pair_meta *m, const ust__cmp_stats *st, const char *message) {
  static pthread_mutex_t first_lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&first_lock);
  if (atomic_load(&r->rolled_back)) {
    pthread_mutex_unlock(&first_lock);
    return;
  }
  ust__evidence *e = calloc(1, sizeof *e);
  char key[512];
  ust__route_key_str(r, key, sizeof key);
  if (e != NULL) {
    e->prev = atomic_load(&r->evidence);
    e->shadow_call = call_no;
    e->serving = serving;
    if (serving)
      e->served_before_verdict = atomic_load(&r->served_cand) - served_at;
    e->unix_ms = unix_ms();
    snprintf(e->reason, sizeof e->reason, "%s", reason);
    snprintf(e->message, sizeof e->message, "%s", message != NULL ? message : "");
    if (m != NULL) {
      snprintf(e->output, sizeof e->output, "%s", m->name != NULL ? m->name : "?");
      e->ndim = m->ndim;
      memcpy(e->shape, m->shape, sizeof e->shape);
      e->atol = m->atol;
      e->rtol = m->rtol;
    }
    if (st != NULL && m != NULL) {
      e->has_stats = 1;
      e->stats = *st;
      int64_t first = ust__cmp_first_mismatch(st);
      if (first >= 0)
        unravel(first, m, e->first_index);
    }
    atomic_store(&r->evidence, e);
  }
  atomic_store(&r->rolled_back, 1);
  pthread_mutex_unlock(&first_lock);
  char why[160];
  snprintf(why, sizeof why, "%s%s%s%s%s", reason, m != NULL ? " in " : "", m != NULL && m->name != NULL ? m->name : "",
           message != NULL && message[0] ? ": " : "", message != NULL ? message : "");
  ust__rollout_rolled_back(r, why);
  ust__log(UST_LOG_WARN, "rolled back %s: %s", key, why);
}

static void roll_back(const shadow_slot *s, const char *reason, const pair_meta *m, const ust__cmp_stats *st,
                      const char *message) {
  roll_back_route(s->route, s->call_no, s->serving, s->served_at, reason, m, st, message);
}

void ust__serve_failed(ust__route *r, int fail, const char *msg) {
  roll_back_route(r, 0, 1, atomic_load(&r->served_cand), fail_reason(fail), NULL, NULL, msg);
}

#ifdef UST__SHADOW_GPU
static int harvest_once(void);
#endif

void ust__shadow_want_verdict(ust__call_state *st) {
  shadow_slot *s = st->shadow;
  st->verdict = -1;
  if (s != NULL)
    s->verdict_out = &st->verdict;
}

int ust__shadow_verdict(const ust__call *call, ust__call_state *st, int wait) {
#ifdef UST__SHADOW_GPU
  if (wait && __atomic_load_n(&st->verdict, __ATOMIC_ACQUIRE) < 0) {
    /* the call's stream done, its slot is concluded by whoever harvests first */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    UST__GPU_CHECK(cudaStreamSynchronize((cudaStream_t)call->stream));
    cudaThreadExchangeStreamCaptureMode(&mode);
    while (__atomic_load_n(&st->verdict, __ATOMIC_ACQUIRE) < 0) {
      harvest_once();
      if (__atomic_load_n(&st->verdict, __ATOMIC_ACQUIRE) < 0)
        usleep(20);
    }
  }
#else
  (void)call;
  (void)wait;
#endif
  return __atomic_load_n(&st->verdict, __ATOMIC_ACQUIRE);
}

uint64_t ust__shadow_call_no(const ust__call_state *st) {
  return st->shadow != NULL ? ((const shadow_slot *)st->shadow)->call_no : 0;
}

void ust__shadow_set_serving(void *slot) {
  if (slot != NULL)
    ((shadow_slot *)slot)->serving = 1;
}

static void conclude(shadow_slot *s) {
  ust__route *r = s->route;
  const ust__cmp_stats *stats = s->host;
#ifdef UST__SHADOW_GPU
  if (s->on_gpu && s->pinned != NULL)
    stats = s->pinned;
#endif
  if (s->aborted) {
    if (s->fail != UST__FAIL_NONE) {
      /* rolled back already, on the host-known failure */
      s->failed = 1;
      atomic_fetch_add_explicit(&r->verified, 1, memory_order_relaxed);
      atomic_fetch_add_explicit(&r->failed, 1, memory_order_relaxed);
    } else {
      atomic_fetch_add_explicit(&r->skipped, 1, memory_order_relaxed);
    }
    release(s);
    return;
  }
  uint64_t t_prod = 0, t_cand = 0;
  int have_times = 0;
#ifdef UST__SHADOW_GPU
  if (s->on_gpu) {
    float ms_p = 0, ms_c = 0;
    const unsigned need = (1u << UST__MARK_COUNT) - 1;
    have_times = (s->ev_made & need) == need &&
                 UST__GPU_CHECK(cudaEventElapsedTime(&ms_p, s->ev[UST__MARK_PROD_BEGIN], s->ev[UST__MARK_PROD_END])) == 0 &&
                 UST__GPU_CHECK(cudaEventElapsedTime(&ms_c, s->ev[UST__MARK_CAND_BEGIN], s->ev[UST__MARK_CAND_END])) == 0;
    t_prod = (uint64_t)((double)ms_p * 1e6 + 0.5);
    t_cand = (uint64_t)((double)ms_c * 1e6 + 0.5);
  } else
#endif
  {
    have_times = 1;
    t_prod = s->t[UST__MARK_PROD_END] - s->t[UST__MARK_PROD_BEGIN];
    t_cand = s->t[UST__MARK_CAND_END] - s->t[UST__MARK_CAND_BEGIN];
  }
  if (have_times) {
    ust__hist_record(&r->hist, t_prod);
    atomic_fetch_add_explicit(&r->timed, 1, memory_order_relaxed);
    ust__hist_record(&r->cand_hist, t_cand);
    ust__route_roof_add(r, s->tsol_ps, t_prod, 0);
  }

  /* A/A: production's own spread on this call. */
  int aa_seen = 0, aa_bad = 0;
  for (int i = 0; i < s->n_pairs; i++) {
    const pair_meta *m = &s->meta[i];
    if (!m->aa)
      continue;
    aa_seen = 1;
    if (m->compared) {
      atomic_max_u64(&r->aa_max_abs_bits, stats[i].max_abs_bits);
      atomic_max_u64(&r->aa_max_rel_bits, stats[i].max_rel_bits);
      aa_bad |= stats[i].mismatches > 0;
    }
  }
  if (aa_seen) {
    atomic_fetch_add_explicit(&r->aa_runs, 1, memory_order_relaxed);
    if (aa_bad)
      atomic_fetch_add_explicit(&r->aa_mismatching, 1, memory_order_relaxed);
  }

  const char *reason = NULL;
  const pair_meta *bad = NULL;
  const ust__cmp_stats *bad_stats = NULL;
  const char *message = s->msg;
  int unverifiable = 0;
  if (s->fail != UST__FAIL_NONE) {
    reason = fail_reason(s->fail);
  } else {
    for (int i = 0; i < s->n_pairs && reason == NULL; i++) {
      const pair_meta *m = &s->meta[i];
      if (m->aa)
        continue;
      if (m->fail != NULL) {
        reason = m->fail;
        bad = m;
        message = m->detail;
      } else if (!m->compared) {
        unverifiable = 1;
      } else if (stats[i].mismatches > 0) {
        reason = stats[i].nonfinite_bad > 0 ? "nonfinite" : "mismatch";
        bad = m;
        bad_stats = &stats[i];
      }
    }
  }
  if (reason != NULL) {
    s->failed = 1;
    atomic_fetch_add_explicit(&r->verified, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->failed, 1, memory_order_relaxed);
    roll_back(s, reason, bad, bad_stats, message);
  } else if (unverifiable) {
    atomic_fetch_add_explicit(&r->unverifiable, 1, memory_order_relaxed);
  } else {
    atomic_fetch_add_explicit(&r->verified, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->passed, 1, memory_order_relaxed);
    if (have_times)
      ust__route_roof_add(r, s->tsol_ps, t_cand, 1);
    for (int i = 0; i < s->n_pairs; i++)
      if (!s->meta[i].aa && s->meta[i].compared) {
        atomic_max_u64(&r->max_abs_bits, stats[i].max_abs_bits);
        atomic_max_u64(&r->max_rel_bits, stats[i].max_rel_bits);
      }
    if (have_times)
      ust__rollout_passed(r, s->stage);
  }
  release(s);
}

#ifdef UST__SHADOW_GPU
/* Take the completed slots off the pending list under the lock, then
 * conclude them outside it. Never blocks. Events are queried while other
 * threads may capture graphs: in the relaxed capture mode, which keeps their
 * captures valid; the calling thread's own mode is restored after. */
static int harvest_once(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  int done[64], n_done = 0, kept = 0;
  pthread_mutex_lock(&pool_lock);
  for (int i = 0; i < n_pending; i++) {
    shadow_slot *s = &slots[pending[i]];
    cudaError_t q = n_done < 64 ? cudaEventQuery(s->ev[UST__MARK_COUNT]) : cudaErrorNotReady;
    if (q == cudaErrorNotReady) {
      pending[kept++] = pending[i];
      continue;
    }
    if (q != cudaSuccess) {
      UST__GPU_CHECK(q);
      s->aborted = 1;
    }
    atomic_store(&s->state, SLOT_CONCLUDING);
    done[n_done++] = pending[i];
  }
  n_pending = kept;
  int left = n_pending;
  pthread_mutex_unlock(&pool_lock);
  for (int i = 0; i < n_done; i++)
    conclude(&slots[done[i]]);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return left + n_done;
}
#endif

int ust__shadow_harvest(void) {
#ifdef UST__SHADOW_GPU
  return harvest_once();
#else
  return 0;
#endif
}

/* Waits for the comparisons pending or being concluded when it starts, by
 * polling: no lock is held while the device works, so serving threads keep
 * taking and returning slots meanwhile. */
void ust__shadow_harvest_all_sync(void) {
#ifdef UST__SHADOW_GPU
  for (int i = 0; i < n_slots; i++) {
    shadow_slot *s = &slots[i];
    int st = atomic_load(&s->state);
    if (st != SLOT_PENDING && st != SLOT_CONCLUDING)
      continue;
    uint64_t use = atomic_load(&s->uses);
    while (atomic_load(&s->uses) == use) {
      harvest_once();
      if (atomic_load(&s->uses) == use)
        usleep(50);
    }
  }
#endif
}

void ust__shadow_shutdown(void) {
  ust__shadow_harvest_all_sync();
  pthread_mutex_lock(&pool_lock);
#ifdef UST__SHADOW_GPU
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (arenas[d].dev != NULL) {
      cudaFree(arenas[d].dev);
      cudaFreeHost(arenas[d].pinned);
    }
    arenas[d].dev = arenas[d].pinned = NULL;
  }
#endif
  free(slots);
  free(free_list);
  free(pending);
  slots = NULL;
  free_list = pending = NULL;
  n_slots = n_free = n_pending = 0;
  pthread_mutex_unlock(&pool_lock);
}
