/*
 * Shadow calls: the slots that carry one shadowed (or verified) call from the
 * router to its verdict, and the comparison of its outputs.
 *
 * A slot holds the call's timestamps (host clock or device events), the
 * description of each output pair and room for the comparison results. On
 * the host everything concludes inside ust__shadow_finish. On a GPU the
 * compare kernel reduces into the slot's device buffer, an async copy moves
 * the results to the slot's pinned host buffer, a last event marks the end,
 * and whoever harvests next (the worker, or a serving thread waiting for its
 * verdict) concludes the slot once that event has completed. The number of
 * slots bounds the shadow work in flight. What a GPU slot asks of the
 * runtime goes through guard/shadow_dev.h, so that this file is the same in
 * every build.
 *
 * A slot writes the route's ust__verify counters (the guard's part); what the
 * route makes of a verdict (times, rollbacks, promotions) goes to the pool's
 * sink.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guard/gate.h"
#include "guard/guard.h"
#include "guard/procrun.h"
#include "guard/ring.h"
#include "guard/shadow_dev.h"

#define MAX_SLOT_PAIRS UST__MAX_PAIRS
/* pending comparisons a serving thread queries before it takes a slot */
#define UST__ACQUIRE_QUERIES 4

typedef struct pair_meta {
  const char *name;
  int aa;
  int input; /* a read-only argument checked for writes */
  int dtype;
  int ndim;
  int64_t shape[8];
  const char *fail; /* a metadata failure (shape, dtype, ...), or NULL */
  char detail[160];
  int compared;     /* 1 when stats hold its comparison */
  int kind;         /* ust__cmp_kind, when compared */
  double atol, rtol;
} pair_meta;

enum slot_state { SLOT_FREE = 0, SLOT_IN_CALL, SLOT_PENDING, SLOT_CONCLUDING };

typedef struct shadow_slot {
  ust__shadow_pool *pool;
  ust__slot_route r;
  int on_gpu;  /* this use enqueued device work */
  int aborted; /* concluded as skipped */
  uint64_t t[UST__MARK_COUNT];
  int n_pairs;
  pair_meta meta[MAX_SLOT_PAIRS];
  ust__cmp_stats host[MAX_SLOT_PAIRS];
  int fail;
  char msg[256];
  uint64_t call_no;  /* 1-based number of this shadow call on its route */
  int arms;          /* the call's arms (UST__DF_ARMS, UST__DF_CAND_FIRST, UST__DF_AA), drawn at acquire */
  uint64_t copied;   /* bytes understudy copied for this call (snapshots, the candidate's inputs) */
  int *verdict_out;  /* the waiting caller's verdict (1 failed, 0 not), written when concluded */
  int failed;        /* this use's verdict: 1 when it failed */
  /* the caller's keeper of the call (ust__shadow_keep) and why the call failed */
  void *keeper_ctx;
  void (*keeper)(void *ctx, void *cookie, const ust__keep_verdict *v);
  ust__keep_verdict why;
  atomic_int state;  /* slot_state */
  atomic_uint_fast64_t uses; /* incremented at each release: a flush waits for it to move */
} shadow_slot;

/* A shadowed call captured into a CUDA graph: its route and its pairs'
 * metadata, to judge each replay's statistics from the ring. */
typedef struct graph_site {
  ust__slot_route r;
  int n_pairs;
  pair_meta meta[MAX_SLOT_PAIRS];
} graph_site;

/* A site's id: its pool's generation above its index (from 1), so that a
 * ring entry an earlier pool's site wrote (a replay still running when
 * understudy was disabled, harvested by the next enable's pool) is never
 * taken for a later pool's site. */
#define SITE_INDEX_BITS 17 /* UST__MAX_SITES fits */
#define SITE_INDEX_MASK ((1u << SITE_INDEX_BITS) - 1u)
static _Atomic uint32_t g_pool_generations;

struct ust__shadow_pool {
  pthread_mutex_t lock; /* the free list, the pending list, the sites, dev's arenas */
  graph_site **sites;   /* sites[i] is index i + 1; never moved once added */
  uint32_t n_sites, cap_sites;
  uint32_t site_base;   /* this pool's generation, above SITE_INDEX_BITS */
  ust__log_sink *log;
  const ust__verdict_sink_i *sink;
  void *sink_ctx;
  shadow_slot *slots;
  int n_slots;
  int *free_list;
  int n_free;
  int *pending; /* GPU slots whose results are in flight */
  int n_pending;
  ust__shadow_dev *dev; /* the slots' device parts: arenas, events (NULL without a GPU) */
};

static void atomic_max_u64(atomic_uint_fast64_t *a, uint64_t v) {
  uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
  while (v > cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed, memory_order_relaxed))
    ;
}

/* A slot's index in its pool: how the device part names it. */
static int slot_index(const shadow_slot *s) { return (int)(s - s->pool->slots); }

int ust__shadow_pool_create(int max_inflight, ust__log_sink *log, const ust__verdict_sink_i *sink, void *sink_ctx,
                            ust__shadow_pool **out) {
  *out = NULL;
  ust__shadow_pool *p = calloc(1, sizeof *p);
  if (p == NULL || max_inflight <= 0)
    goto oom;
  pthread_mutex_init(&p->lock, NULL);
  p->log = log;
  p->sink = sink;
  p->sink_ctx = sink_ctx;
  p->slots = calloc((size_t)max_inflight, sizeof *p->slots);
  p->free_list = calloc((size_t)max_inflight, sizeof *p->free_list);
  p->pending = calloc((size_t)max_inflight, sizeof *p->pending);
  if (p->slots == NULL || p->free_list == NULL || p->pending == NULL ||
      ust__shadow_dev_create(max_inflight, log, &p->lock, &p->dev) != 0)
    goto oom;
  /* generations 1 .. 2^15 - 1, then again from 1 */
  p->site_base = (atomic_fetch_add(&g_pool_generations, 1) % ((1u << (32 - SITE_INDEX_BITS)) - 1u) + 1u)
                 << SITE_INDEX_BITS;
  p->n_slots = p->n_free = max_inflight;
  for (int i = 0; i < max_inflight; i++) {
    p->free_list[i] = max_inflight - 1 - i;
    p->slots[i].pool = p;
  }
  *out = p;
  return 0;
oom:
  if (p != NULL) {
    free(p->slots);
    free(p->free_list);
    free(p->pending);
    pthread_mutex_destroy(&p->lock);
    free(p);
  }
  return ust__error(UST_ENOMEM, "out of memory for %d shadow slots", max_inflight);
}

/* Tell a caller waiting for this use's verdict (ust__shadow_verdict). */
static void tell(shadow_slot *s) {
  if (s->verdict_out != NULL)
    __atomic_store_n(s->verdict_out, s->failed, __ATOMIC_RELEASE);
  s->verdict_out = NULL;
}

/* The keeper told, once: the call failed (s->why) or not. */
static void tell_keeper(shadow_slot *s) {
  if (s->keeper == NULL)
    return;
  void (*done)(void *, void *, const ust__keep_verdict *) = s->keeper;
  ust__keep_verdict v = s->why;
  v.failed = s->failed;
  if (!v.failed)
    v.reason = v.output = NULL, v.first_mismatch = -1;
  else if (v.reason == NULL)
    v.reason = ust__fail_name(s->fail);
  s->keeper = NULL;
  done(s->keeper_ctx, s->r.cookie, &v);
  s->keeper_ctx = NULL;
}

static void release(shadow_slot *s) {
  tell(s);
  tell_keeper(s);
  ust__shadow_pool *p = s->pool;
  ust__shadow_dev_events_free(p->dev, slot_index(s));
  atomic_store(&s->state, SLOT_FREE);
  atomic_fetch_add(&s->uses, 1);
  pthread_mutex_lock(&p->lock);
  p->free_list[p->n_free++] = (int)(s - p->slots);
  pthread_mutex_unlock(&p->lock);
}

static void enqueue_pending(shadow_slot *s) {
  ust__shadow_pool *p = s->pool;
  pthread_mutex_lock(&p->lock);
  atomic_store(&s->state, SLOT_PENDING);
  p->pending[p->n_pending] = (int)(s - p->slots);
  __atomic_store_n(&p->n_pending, p->n_pending + 1, __ATOMIC_RELAXED); /* read unlocked by acquire */
  pthread_mutex_unlock(&p->lock);
}

/* Device work of this slot was queued but no event fences it: the slot's
 * buffers may still be written, so it never goes back to the pool. */
static void retire_unfenced(shadow_slot *s) {
  tell(s);
  s->failed = 0;
  tell_keeper(s);
  ust__verify_skipped(s->r.verify, UST__SKIP_ERROR);
  ust__verdict v = {UST__VERDICT_SKIPPED, s->r.serving, 0, 0, 0, s->r.tsol_ps, s->r.stage, s->r.remote, NAN,
                    s->r.timed_kind, 0, 0, s->r.floor_tag1};
  s->pool->sink->concluded(s->pool->sink_ctx, s->r.cookie, &v);
  ust__log(s->pool->log, UST_LOG_WARN, "shadow: a slot's device work could not be fenced; the slot is retired");
}

static int harvest_some(ust__shadow_pool *p, int max_queries);

/* A fair coin for the call_no-th slot of a route (splitmix64 of the two):
 * which arm runs first. Drawn afresh for every call, so that whatever came
 * before, each sample's order is even odds and position cannot favour an
 * arm, whatever the pattern of the traffic. */
static int coin(const void *route, uint64_t call_no) {
  uint64_t z = (uint64_t)(uintptr_t)route ^ (call_no * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (int)((z ^ (z >> 31)) >> 63);
}

/* The arms of the call_no-th slot of route r: armed as r allows, the
 * candidate first on a coin, A/A on the candidate's share of the slots. A
 * call without arms (a captured or remote shadow) has neither. */
static int draw_arms(const ust__slot_route *r, uint64_t call_no) {
  const int armed = r->serving || (r->arms & UST__DF_ARMS);
  if (!armed || r->remote)
    return 0;
  int arms = (r->arms & UST__DF_ARMS) | (coin(r->cookie, call_no) ? UST__DF_CAND_FIRST : 0);
  if ((r->arms & UST__DF_AA) && r->cand != NULL && r->cand->aa_sample > 0 && ust__sampled(call_no, r->cand->aa_q32))
    arms |= UST__DF_AA;
  return arms;
}

/* A serving thread that takes a slot first concludes the oldest pending
 * comparisons whose last event has completed (a few non-blocking queries),
 * so slots come back at the pace of the calls, not of the worker's polls. */
void *ust__shadow_acquire(ust__shadow_pool *p, const ust__slot_route *r) {
  if (__atomic_load_n(&p->n_pending, __ATOMIC_RELAXED) > 0)
    harvest_some(p, UST__ACQUIRE_QUERIES);
  pthread_mutex_lock(&p->lock);
  int idx = p->n_free > 0 ? p->free_list[--p->n_free] : -1;
  pthread_mutex_unlock(&p->lock);
  if (idx < 0) {
    ust__verify_skipped(r->verify, UST__SKIP_NO_SLOT);
    return NULL;
  }
  shadow_slot *s = &p->slots[idx];
  s->r = *r;
  s->on_gpu = 0;
  s->aborted = 0;
  s->n_pairs = 0;
  s->fail = UST__FAIL_NONE;
  s->msg[0] = '\0';
  memset(s->t, 0, sizeof s->t);
  ust__shadow_dev_slot_reset(p->dev, idx);
  s->verdict_out = NULL;
  s->failed = 0;
  s->keeper_ctx = NULL;
  s->keeper = NULL;
  s->why = (ust__keep_verdict){0, NULL, NULL, -1};
  s->copied = 0;
  s->call_no = atomic_fetch_add_explicit(&r->verify->calls, 1, memory_order_relaxed) + 1;
  s->arms = draw_arms(r, s->call_no);
  atomic_store(&s->state, SLOT_IN_CALL);
  return s;
}

int ust__shadow_arms(const void *slot) { return slot != NULL ? ((const shadow_slot *)slot)->arms : 0; }

int ust__shadow_aa(const void *slot) { return (ust__shadow_arms(slot) & UST__DF_AA) != 0; }

void ust__shadow_mark(void *slot, int mark, int device, void *stream) {
  shadow_slot *s = slot;
  if (s == NULL || mark < 0 || mark >= UST__MARK_COUNT)
    return;
  /* The stream may be NULL: CUDA's legacy default stream. */
  if (device == UST__DEV_CUDA && ust__shadow_dev_available()) {
    if (s->aborted)
      return;
    ust__shadow_dev *d = s->pool->dev;
    if (ust__shadow_dev_bind(d, slot_index(s)) != 0 || ust__shadow_dev_record(d, slot_index(s), mark, stream) != 0) {
      s->aborted = 1;
      return;
    }
    s->on_gpu = 1;
    return;
  }
  s->t[mark] = ust__now_ns();
}

void ust__shadow_note_copied(void *slot, uint64_t bytes) {
  shadow_slot *s = slot;
  if (s != NULL)
    s->copied += bytes;
}

void ust__shadow_set_floor(void *slot, uint64_t tsol_ps) {
  shadow_slot *s = slot;
  if (s != NULL) {
    s->r.tsol_ps = tsol_ps;
    s->r.floor_tag1 = 0;
  }
}

int ust__shadow_alive(const void *slot) {
  const shadow_slot *s = slot;
  return s != NULL && !s->aborted;
}

/* Metadata checks: what makes a comparison meaningless fails on its own. A
 * written argument keeps the caller's layout whatever the candidate does:
 * only its values are judged. */
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
  if (p->written_arg || p->input_arg)
    return NULL;
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

static void tolerances(const ust__cand *c, int dtype, double *atol, double *rtol) {
  ust__cmp_default_tol(dtype, atol, rtol);
  if (c->atol >= 0)
    *atol = c->atol;
  if (c->rtol >= 0)
    *rtol = c->rtol;
}

static void conclude(shadow_slot *s);

/* A slot that queued device work goes back only when the device is done with
 * its buffers: its last event is recorded and a harvest concludes it; if
 * that event cannot be recorded the slot is retired. Host slots conclude now. */
static void release_after_device(shadow_slot *s, void *stream) {
  if (s->on_gpu) {
    if (ust__shadow_dev_record(s->pool->dev, slot_index(s), UST__MARK_COUNT, stream) == 0)
      enqueue_pending(s);
    else
      retire_unfenced(s);
    return;
  }
  conclude(s);
}

const char *ust__fail_name(int fail) {
  static const char *names[] = {"", "error", "raised", "schema", "overdue"};
  return names[fail >= 0 && fail <= UST__FAIL_OVERDUE ? fail : 0];
}

static void unravel(int64_t flat, const pair_meta *m, int64_t *idx) {
  for (int d = m->ndim - 1; d >= 0; d--) {
    int64_t extent = m->shape[d] > 0 ? m->shape[d] : 1;
    idx[d] = flat % extent;
    flat /= extent;
  }
}

/* The evidence of a failing call, handed to the sink (which rolls the
 * route back at its first failure). Out of memory: the rollback goes ahead
 * without evidence. */
static void report_failure(ust__shadow_pool *p, const ust__slot_route *r, uint64_t call_no, const char *reason,
                           const pair_meta *m, const ust__cmp_stats *st, const char *message) {
  ust__evidence *e = calloc(1, sizeof *e);
  if (e != NULL) {
    e->shadow_call = call_no;
    e->serving = r->serving;
    e->served_at = r->served_at;
    e->unix_ms = ust__unix_ms();
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
  }
  if (r->remote && r->cand != NULL && r->cand->proc != NULL) {
    /* a verification of a call run in the qualifying process failed: the
     * candidate is refused for good, never loaded here */
    char why[640];
    snprintf(why, sizeof why, "a call it ran in its qualifying process failed verification (%s): %s", reason,
             message != NULL && message[0] != '\0' ? message : m != NULL && m->name != NULL ? m->name : "");
    ust__procrun_refuse(r->cand->proc, why);
  }
  p->sink->failed(p->sink_ctx, r->cookie, e);
}

/* A pair's metadata into m, and whether it is compared (then with kind):
 * not when the call failed already (but A/A pairs), nor an output
 * understudy cannot read (an unsupported dtype, or production's own output
 * on another device than the call, such as a CPU RNG seed of a GPU kernel),
 * which leaves the call unverifiable rather than judged, nor one whose
 * metadata fails on its own. */
static int meta_of(const ust__cand *c, const ust__pair *p, int device, int failed, pair_meta *m, int *kind) {
  memset(m, 0, sizeof *m);
  m->name = p->name;
  m->aa = p->aa;
  m->input = p->input_arg;
  m->dtype = p->prod_dtype;
  m->ndim = p->prod.ndim < 8 ? p->prod.ndim : 8;
  for (int d = 0; d < m->ndim; d++)
    m->shape[d] = p->prod.shape[d];
  if (failed && !p->aa)
    return 0;
  if (!ust__cmp_dtype_supported(p->prod_dtype) || (p->prod.device.device_type == kDLCPU) != (device == UST__DEV_CPU))
    return 0;
  if ((m->fail = meta_check(p, m->detail, sizeof m->detail)) != NULL)
    return 0;
  tolerances(c, p->prod_dtype, &m->atol, &m->rtol);
  *kind = c->compare == UST__CMP_EXACT || p->input_arg ? UST__CMP_EXACT : UST__CMP_ALLCLOSE;
  if (p->input_arg)
    m->atol = m->rtol = 0;
  m->compared = 1;
  m->kind = *kind;
  return 1;
}

void ust__shadow_finish(void *slot, int device, void *stream, const ust__pair *pairs, int n_pairs, int fail,
                        const char *msg) {
  shadow_slot *s = slot;
  if (s == NULL)
    return;
  const ust__cand *c = s->r.cand;
  s->fail = fail;
  if (msg != NULL)
    snprintf(s->msg, sizeof s->msg, "%s", msg);
  /* A failure known on the host (an error, a raise) rolls back at once;
   * the slot still waits for the device before it is concluded. */
  if (fail != UST__FAIL_NONE)
    report_failure(s->pool, &s->r, s->call_no, ust__fail_name(fail), NULL, NULL, s->msg);
  if (n_pairs > MAX_SLOT_PAIRS)
    n_pairs = MAX_SLOT_PAIRS;
  s->n_pairs = n_pairs;
  /* on_gpu: only a build with a GPU backend records device marks */
  const int gpu = device == UST__DEV_CUDA && s->on_gpu && !s->aborted;
  ust__shadow_dev *d = s->pool->dev;
  ust__cmp_stats *dev_stats = gpu ? ust__shadow_dev_stats(d, slot_index(s)) : NULL;
  if (gpu && ust__shadow_dev_zero(d, dev_stats, n_pairs, stream) != 0)
    s->aborted = 1;
  if (device != UST__DEV_CPU && !gpu)
    s->aborted = 1; /* device memory is never read on the host */
  for (int i = 0; i < n_pairs && !s->aborted; i++) {
    const ust__pair *p = &pairs[i];
    pair_meta *m = &s->meta[i];
    int kind = 0;
    if (!meta_of(c, p, device, s->fail != UST__FAIL_NONE, m, &kind))
      continue;
    int64_t n = ust__dl_numel(&p->prod);
    if (!gpu) {
      ust__compare_host(p->prod_dense, p->cand_dense, p->prod_dtype, n, kind, m->atol, m->rtol, &s->host[i]);
      continue;
    }
    if (ust__compare_launch(p->prod_dense, p->cand_dense, p->prod_dtype, n, kind, m->atol, m->rtol, &dev_stats[i],
                            stream) != 0) {
      ust__log(s->pool->log, UST_LOG_WARN, "shadow: %s", ust_last_error());
      s->aborted = 1;
    }
  }
  if (s->on_gpu && !s->aborted && ust__shadow_dev_fetch(d, slot_index(s), n_pairs, stream) != 0)
    s->aborted = 1;
  release_after_device(s, stream);
}

void ust__shadow_abandon(void *slot, int device, void *stream) {
  shadow_slot *s = slot;
  if (s == NULL)
    return;
  (void)device;
  s->aborted = 1;
  s->n_pairs = 0;
  release_after_device(s, stream);
}

static int harvest_once(ust__shadow_pool *p);

void ust__shadow_keep(void *slot, void *ctx, void (*done)(void *ctx, void *cookie, const ust__keep_verdict *v)) {
  shadow_slot *s = slot;
  if (s == NULL)
    return;
  s->keeper_ctx = ctx;
  s->keeper = done;
}

void ust__shadow_want_verdict(void *slot, int *out) {
  shadow_slot *s = slot;
  *out = -1;
  if (s != NULL)
    s->verdict_out = out;
}

int ust__shadow_verdict(ust__shadow_pool *p, int *out, int device, void *stream, int wait) {
  if (wait && device == UST__DEV_CUDA && ust__shadow_dev_available() && __atomic_load_n(out, __ATOMIC_ACQUIRE) < 0) {
    /* the call's stream done, its slot is concluded by whoever harvests first */
    ust__shadow_dev_stream_sync(p->dev, stream);
    while (__atomic_load_n(out, __ATOMIC_ACQUIRE) < 0) {
      harvest_once(p);
      if (__atomic_load_n(out, __ATOMIC_ACQUIRE) < 0)
        usleep(20);
    }
  }
  return __atomic_load_n(out, __ATOMIC_ACQUIRE);
}

/* What a verdict is judged from: an eager call's slot, or one replay of a
 * call captured into a graph (a site). */
typedef struct judged {
  ust__shadow_pool *pool;
  const ust__slot_route *r;
  uint64_t call_no;
  int reruns; /* production's runs again whose values the A/A pairs hold (1 when not known) */
  int n_pairs;
  const pair_meta *meta;
  const ust__cmp_stats *stats;
  int fail;        /* a failure known on the host (reported already) */
  const char *msg; /* its message */
  ust__keep_verdict *why; /* filled when the call failed (NULL: not asked) */
} judged;

/* Judge the pairs into vd->kind, counting into the route's figures and
 * reporting a failure's evidence; 1 when the call failed. */
static int judge(const judged *j, ust__verdict *vd) {
  ust__verify *v = j->r->verify;
  /* A/A: production's own spread on this call. */
  int aa_seen = 0, aa_bad = 0;
  for (int i = 0; i < j->n_pairs; i++) {
    const pair_meta *m = &j->meta[i];
    if (!m->aa || m->input)
      continue;
    aa_seen = 1;
    if (m->compared) {
      atomic_max_u64(&v->aa_max_abs_bits, j->stats[i].max_abs_bits);
      atomic_max_u64(&v->aa_max_rel_bits, j->stats[i].max_rel_bits);
      aa_bad |= j->stats[i].mismatches > 0;
    }
  }
  if (aa_seen) {
    atomic_fetch_add_explicit(&v->aa_runs, (uint64_t)j->reruns, memory_order_relaxed);
    if (aa_bad)
      atomic_fetch_add_explicit(&v->aa_mismatching, 1, memory_order_relaxed);
  }

  const char *reason = NULL;
  const pair_meta *bad = NULL;
  const ust__cmp_stats *bad_stats = NULL;
  const char *message = j->msg;
  char input_msg[160];
  int unverifiable = 0;
  if (j->fail != UST__FAIL_NONE) {
    reason = ust__fail_name(j->fail);
  } else {
    for (int i = 0; i < j->n_pairs && reason == NULL; i++) {
      const pair_meta *m = &j->meta[i];
      if (m->aa)
        continue;
      if (m->fail != NULL) {
        reason = m->fail;
        bad = m;
        message = m->detail;
      } else if (!m->compared) {
        unverifiable |= !m->input; /* an input that cannot be read leaves the verdict to the outputs */
      } else if (j->stats[i].mismatches > 0) {
        reason = m->input ? "wrote input" : j->stats[i].nonfinite_bad > 0 ? "nonfinite" : "mismatch";
        bad = m;
        bad_stats = &j->stats[i];
        if (m->input) {
          snprintf(input_msg, sizeof input_msg, "the candidate wrote input '%s' (%llu of %llu elements changed)",
                   m->name != NULL ? m->name : "?", j->stats[i].mismatches, j->stats[i].n);
          message = input_msg;
        }
      }
    }
  }
  if (reason != NULL) {
    if (j->why != NULL) {
      j->why->reason = reason;
      j->why->output = bad != NULL ? bad->name : NULL;
      j->why->first_mismatch = bad_stats != NULL ? ust__cmp_first_mismatch(bad_stats) : -1;
    }
    vd->kind = UST__VERDICT_FAILED;
    atomic_fetch_add_explicit(&v->verified, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&v->failed, 1, memory_order_relaxed);
    if (j->fail == UST__FAIL_NONE) /* a host-known failure went to the sink at finish */
      report_failure(j->pool, j->r, j->call_no, reason, bad, bad_stats, message);
  } else if (unverifiable) {
    vd->kind = UST__VERDICT_UNVERIFIABLE;
    atomic_fetch_add_explicit(&v->unverifiable, 1, memory_order_relaxed);
  } else {
    vd->kind = UST__VERDICT_PASSED;
    atomic_fetch_add_explicit(&v->verified, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&v->passed, 1, memory_order_relaxed);
    if (j->r->remote && j->r->cand != NULL && (j->r->cand->proc != NULL || j->r->cand->torch_qualify)) {
      const uint64_t n = atomic_fetch_add_explicit(&v->proc_passed, 1, memory_order_relaxed) + 1;
      if (j->r->cand->proc != NULL)
        ust__procrun_note_passed(j->r->cand->proc, n == j->r->cand->qualify_calls);
    }
    for (int i = 0; i < j->n_pairs; i++)
      if (!j->meta[i].aa && !j->meta[i].input && j->meta[i].compared) {
        atomic_max_u64(&v->max_abs_bits, j->stats[i].max_abs_bits);
        atomic_max_u64(&v->max_rel_bits, j->stats[i].max_rel_bits);
      }
  }
  return vd->kind == UST__VERDICT_FAILED;
}

static void conclude(shadow_slot *s) {
  ust__verify *v = s->r.verify;
  atomic_fetch_add_explicit(&v->bytes_copied, s->copied, memory_order_relaxed);
  ust__verdict vd = {UST__VERDICT_SKIPPED, s->r.serving, 0, 0, 0, s->r.tsol_ps, s->r.stage, s->r.remote, NAN,
                     s->r.timed_kind, 0, 0, s->r.floor_tag1};
  const ust__cmp_stats *stats = s->host;
  const ust__cmp_stats *pinned = s->on_gpu ? ust__shadow_dev_results(s->pool->dev, slot_index(s)) : NULL;
  if (pinned != NULL)
    stats = pinned;
  if (s->aborted) {
    if (s->fail != UST__FAIL_NONE) {
      /* failed already, on the host-known failure */
      s->failed = 1;
      vd.kind = UST__VERDICT_FAILED;
      atomic_fetch_add_explicit(&v->verified, 1, memory_order_relaxed);
      atomic_fetch_add_explicit(&v->failed, 1, memory_order_relaxed);
    } else {
      ust__verify_skipped(v, UST__SKIP_ERROR);
    }
    void *cookie = s->r.cookie;
    ust__shadow_pool *p = s->pool;
    release(s);
    p->sink->concluded(p->sink_ctx, cookie, &vd);
    return;
  }
  /* each run's span in ns, 0 where it was not timed (a run that raised, a
   * call whose order was forced) */
  double span[UST__MARK_COUNT / 2] = {0, 0, 0};
  for (int k = 0; k < UST__MARK_COUNT / 2; k++)
    if (s->on_gpu)
      span[k] = ust__shadow_dev_elapsed_ns(s->pool->dev, slot_index(s), 2 * k, 2 * k + 1);
    else if (s->t[2 * k] > 0 && s->t[2 * k + 1] > s->t[2 * k])
      span[k] = (double)(s->t[2 * k + 1] - s->t[2 * k]);
  const double prod = span[UST__MARK_PROD_BEGIN / 2], cand = span[UST__MARK_CAND_BEGIN / 2],
               again = span[UST__MARK_AA_BEGIN / 2];
  vd.have_times = prod > 0 && cand > 0;
  if (vd.have_times) {
    vd.prod_ns = (uint64_t)(prod + 0.5);
    vd.cand_ns = (uint64_t)(cand + 0.5);
    vd.paired = s->arms != 0;
  }
  /* the A/A pair, second run over first: the candidate first, production's
   * arm ran before the A/A run; else after it */
  if (prod > 0 && again > 0)
    vd.aa_log_ratio = (s->arms & UST__DF_CAND_FIRST) ? log(again / prod) : log(prod / again);

  const int reruns = ((s->arms & UST__DF_ARMS) != 0) + ((s->arms & UST__DF_AA) != 0);
  const judged j = {s->pool, &s->r, s->call_no, reruns > 0 ? reruns : 1, s->n_pairs, s->meta, stats, s->fail, s->msg,
                    &s->why};
  s->failed = judge(&j, &vd);
  void *cookie = s->r.cookie;
  ust__shadow_pool *p = s->pool;
  release(s);
  p->sink->concluded(p->sink_ctx, cookie, &vd);
}

/* Take the completed slots off the pending list under the lock, then
 * conclude them outside it. Never blocks. Events are queried while other
 * threads may capture graphs: in the relaxed capture mode, which keeps their
 * captures valid; the calling thread's own mode is restored after. */
static int harvest_some(ust__shadow_pool *p, int max_queries) {
  const int mode = ust__shadow_dev_relaxed_begin();
  int done[64], n_done = 0, kept = 0;
  pthread_mutex_lock(&p->lock);
  for (int i = 0; i < p->n_pending; i++) {
    shadow_slot *s = &p->slots[p->pending[i]];
    const int q = n_done < 64 && i < max_queries ? ust__shadow_dev_query(p->dev, p->pending[i]) : 1;
    if (q > 0) {
      p->pending[kept++] = p->pending[i];
      continue;
    }
    if (q < 0)
      s->aborted = 1;
    atomic_store(&s->state, SLOT_CONCLUDING);
    done[n_done++] = p->pending[i];
  }
  __atomic_store_n(&p->n_pending, kept, __ATOMIC_RELAXED);
  int left = kept;
  pthread_mutex_unlock(&p->lock);
  for (int i = 0; i < n_done; i++)
    conclude(&p->slots[done[i]]);
  ust__shadow_dev_relaxed_end(mode);
  return left + n_done;
}

static int harvest_once(ust__shadow_pool *p) { return harvest_some(p, INT_MAX); }

/* Without a GPU every slot concludes in its call: nothing is ever pending. */
int ust__shadow_harvest(ust__shadow_pool *p) { return ust__shadow_dev_available() ? harvest_once(p) : 0; }

/* Waits for the comparisons pending or being concluded when it starts, by
 * polling: no lock is held while the device works, so serving threads keep
 * taking and returning slots meanwhile. */
void ust__shadow_harvest_all_sync(ust__shadow_pool *p) {
  for (int i = 0; i < p->n_slots; i++) {
    shadow_slot *s = &p->slots[i];
    int st = atomic_load(&s->state);
    if (st != SLOT_PENDING && st != SLOT_CONCLUDING)
      continue;
    uint64_t use = atomic_load(&s->uses);
    while (atomic_load(&s->uses) == use) {
      harvest_once(p);
      if (atomic_load(&s->uses) == use)
        usleep(50);
    }
  }
}

/* ---- calls captured into CUDA graphs ------------------------------------------------ */

int ust__shadow_site_add(ust__shadow_pool *p, const ust__slot_route *r, const ust__pair *pairs, int n_pairs,
                         int device, uint32_t *site) {
  if (n_pairs < 0 || n_pairs > MAX_SLOT_PAIRS)
    return ust__error(UST_EINVAL, "shadow: a captured call of %d pairs (at most %d)", n_pairs, MAX_SLOT_PAIRS);
  graph_site *g = calloc(1, sizeof *g);
  if (g == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  g->r = *r;
  g->n_pairs = n_pairs;
  for (int i = 0; i < n_pairs; i++) {
    int kind = 0;
    meta_of(r->cand, &pairs[i], device, 0, &g->meta[i], &kind);
  }
  pthread_mutex_lock(&p->lock);
  if (p->n_sites == p->cap_sites) {
    const uint32_t cap = p->cap_sites ? p->cap_sites * 2 : 16;
    graph_site **grown = cap <= UST__MAX_SITES ? realloc(p->sites, cap * sizeof *grown) : NULL;
    if (grown == NULL) {
      pthread_mutex_unlock(&p->lock);
      free(g);
      return ust__error(UST_ENOMEM, "shadow: no room for another captured call (%u kept)", (unsigned)p->n_sites);
    }
    p->sites = grown;
    p->cap_sites = cap;
  }
  p->sites[p->n_sites++] = g;
  *site = p->site_base | p->n_sites;
  pthread_mutex_unlock(&p->lock);
  return 0;
}

int ust__shadow_site_capture(ust__shadow_pool *p, const ust__slot_route *r, const ust__pair *pairs, int n_pairs,
                             void *stream, ust__cmp_stats *dev_stats, const ust__ring_dev *ring,
                             const unsigned long long *when, uint32_t *site) {
  *site = 0;
  if (!ust__shadow_dev_available())
    return ust__error(UST_EGPU, "shadow: this build has no GPU backend");
  uint32_t id = 0;
  int rc = ust__shadow_site_add(p, r, pairs, n_pairs, UST__DEV_CUDA, &id);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&p->lock);
  const graph_site *g = p->sites[(id & SITE_INDEX_MASK) - 1];
  pthread_mutex_unlock(&p->lock);
  rc = ust__shadow_dev_zero(p->dev, dev_stats, n_pairs, stream);
  for (int i = 0; i < n_pairs && rc == 0; i++)
    if (g->meta[i].compared)
      rc = ust__compare_launch(pairs[i].prod_dense, pairs[i].cand_dense, pairs[i].prod_dtype, ust__dl_numel(&pairs[i].prod),
                               g->meta[i].kind, g->meta[i].atol, g->meta[i].rtol, &dev_stats[i], stream);
  if (rc == 0)
    rc = ust__ring_publish_launch(ring, id, dev_stats, (unsigned)n_pairs, when, stream);
  if (rc == 0)
    *site = id;
  return rc;
}

typedef struct site_harvest {
  ust__shadow_pool *pool;
  uint64_t judged, unknown;
} site_harvest;

/* One replay's statistics, judged as an eager call's: counted on its route,
 * a failure's evidence to the sink (which rolls the route back), the
 * verdict to the sink. No times: a replay's come from the kernel tracer. */
static void judge_replay(void *ctx, const ust__ring_entry *e) {
  site_harvest *h = ctx;
  ust__shadow_pool *p = h->pool;
  pthread_mutex_lock(&p->lock);
  const uint32_t index = e->site & SITE_INDEX_MASK;
  const graph_site *g =
      (e->site & ~SITE_INDEX_MASK) == p->site_base && index >= 1 && index <= p->n_sites ? p->sites[index - 1] : NULL;
  pthread_mutex_unlock(&p->lock);
  if (g == NULL || (int)e->n_pairs != g->n_pairs) {
    h->unknown++; /* not a publication of this pool's sites */
    return;
  }
  /* a replay of a route changed in place since its capture: what it
   * compared may not be what production's changed nodes read and wrote */
  if (p->sink->replays_stale != NULL && p->sink->replays_stale(p->sink_ctx, g->r.cookie)) {
    atomic_fetch_add_explicit(&g->r.verify->graph_dropped, 1, memory_order_relaxed);
    return;
  }
  /* the replay's own: whether the candidate's results served it */
  ust__slot_route r = g->r;
  r.serving = (e->runs & UST__GATE_RUN_SERVE) != 0;
  ust__verify *v = r.verify;
  const uint64_t call_no = atomic_fetch_add_explicit(&v->calls, 1, memory_order_relaxed) + 1;
  ust__verdict vd = {UST__VERDICT_SKIPPED, r.serving, 0, 0, 0, r.tsol_ps, r.stage, r.remote, NAN, r.timed_kind, 0, 1};
  const judged j = {p, &r, call_no, 1, g->n_pairs, g->meta, e->stats, UST__FAIL_NONE, ""};
  judge(&j, &vd);
  p->sink->concluded(p->sink_ctx, g->r.cookie, &vd);
  h->judged++;
}

uint64_t ust__shadow_sites_harvest(ust__shadow_pool *p, ust__ring *ring, uint64_t *unknown) {
  site_harvest h = {p, 0, 0};
  ust__ring_harvest(ring, judge_replay, &h);
  if (unknown != NULL)
    *unknown = h.unknown;
  return h.judged;
}

void ust__shadow_pool_destroy(ust__shadow_pool *p) {
  if (p == NULL)
    return;
  ust__shadow_harvest_all_sync(p);
  ust__shadow_dev_destroy(p->dev);
  for (uint32_t i = 0; i < p->n_sites; i++)
    free(p->sites[i]);
  free(p->sites);
  free(p->slots);
  free(p->free_list);
  free(p->pending);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
