/*
 * The router: shape key of a call, the route table, the sampling decision.
 *
 * The route table is an open-addressing array of atomic route pointers:
 * lookups and inserts are lock-free, so the per-call path takes no lock.
 * Routes are never removed while the engine lives, which is what makes the
 * lock-free read safe; they are freed at disable, after every interceptor is
 * gone and in-flight calls have drained.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/backend.h"
#include "dispatch/dispatch.h"
#include "guard/guard.h"

const char *ust__dtype_name(int dt) {
  static const char *names[UST__DT_COUNT] = {
      "other", "f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "bool",
      "f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "c64", "c128"};
  return dt >= 0 && dt < UST__DT_COUNT ? names[dt] : "other";
}

int ust__routes_init(ust__route_table *t, int max_routes) {
  uint32_t cap = 16;
  while (cap < (uint32_t)max_routes * 2u)
    cap <<= 1;
  t->cap = cap;
  t->max_routes = (uint32_t)max_routes;
  atomic_init(&t->count, 0);
  t->slots = calloc(cap, sizeof *t->slots);
  return t->slots == NULL ? ust__error(UST_ENOMEM, "out of memory for %u route slots", cap) : 0;
}

static void route_free(ust__route *r) {
  if (r == NULL)
    return;
  ust__hist_free(&r->hist);
  ust__hist_free(&r->cand_hist);
  for (ust__evidence *e = atomic_load(&r->evidence), *prev; e != NULL; e = prev) {
    prev = e->prev;
    free(e);
  }
  for (int i = 0; i < 8; i++)
    free(atomic_load(&r->layouts[i]));
  free(r);
}

void ust__routes_free(ust__route_table *t) {
  if (t == NULL || t->slots == NULL)
    return;
  for (uint32_t i = 0; i < t->cap; i++)
    route_free(atomic_load(&t->slots[i]));
  free(t->slots);
  t->slots = NULL;
}

/* Keys are zero-filled (padding included), so they hash and compare as
 * words; this runs on every observed call. */
static uint64_t key_hash(const ust__route_key *k) {
  _Static_assert(sizeof(ust__route_key) % 8 == 0, "route keys hash as whole words");
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < sizeof *k; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h ^ (h >> 29);
}

ust__route *ust__routes_get(ust__route_table *t, const ust__route_key *key, ust__binding *b) {
  uint64_t h = key_hash(key);
  uint32_t mask = t->cap - 1;
  ust__route *fresh = NULL;
  int seeded = 0;
  for (uint32_t probe = 0; probe < t->cap; probe++) {
    uint32_t i = (uint32_t)(h + probe) & mask;
    ust__route *r = atomic_load_explicit(&t->slots[i], memory_order_acquire);
    if (r == NULL) {
      if (fresh == NULL) {
        if (atomic_fetch_add(&t->count, 1) >= t->max_routes) {
          atomic_fetch_sub(&t->count, 1);
          return NULL;
        }
        fresh = calloc(1, sizeof *fresh);
        if (fresh == NULL || ust__hist_init(&fresh->hist) != 0 || ust__hist_init(&fresh->cand_hist) != 0) {
          route_free(fresh);
          atomic_fetch_sub(&t->count, 1);
          return NULL;
        }
        fresh->key = *key;
        fresh->hash = h;
        fresh->binding = b;
      }
      ust__route *expected = NULL;
      if (!seeded) {
        ust__rollout_route_created(fresh); /* before it is published: its first call sees its mode */
        seeded = 1;
      }
      if (atomic_compare_exchange_strong_explicit(&t->slots[i], &expected, fresh,
                                                  memory_order_acq_rel, memory_order_acquire)) {
        ust__rollout_route_published(fresh); /* a mode set for its key meanwhile */
        return fresh;
      }
      r = expected; /* another thread filled this slot first */
    }
    if (r->hash == h && memcmp(&r->key, key, sizeof *key) == 0) {
      if (fresh != NULL) {
        route_free(fresh);
        atomic_fetch_sub(&t->count, 1);
      }
      return r;
    }
  }
  if (fresh != NULL) {
    route_free(fresh);
    atomic_fetch_sub(&t->count, 1);
  }
  return NULL;
}

static _Thread_local int tl_phase;

int ust_set_phase(int phase) {
  if (phase < UST_PHASE_UNKNOWN || phase > UST_PHASE_DECODE)
    return ust__error(UST_EINVAL, "set_phase: %d is not a phase (0 unknown, 1 prefill, 2 decode)", phase);
  int prev = tl_phase;
  tl_phase = phase;
  return prev;
}

const char *ust__phase_name(int phase) {
  static const char *names[] = {"unknown", "prefill", "decode"};
  return phase >= 0 && phase <= UST_PHASE_DECODE ? names[phase] : "unknown";
}

int ust__route_key_make(const ust__binding *b, const ust__call *call, ust__route_key *key) {
  memset(key, 0, sizeof *key);
  key->binding = (uint16_t)b->index;
  key->phase = (uint8_t)tl_phase;
  key->device = (uint8_t)call->device;
  for (int i = 0; i < call->nargs && key->n_dtypes < UST__MAX_KEY_TENSORS; i++)
    if (call->args[i].kind == UST__ARG_TENSOR)
      key->dtypes[key->n_dtypes++] = (uint8_t)call->args[i].dtype;
  for (int d = 0; d < b->n_dims; d++)
    key->dims[d] = ust__dim_bucket(b->dims[d].bucket, ust__dim_eval(&b->dims[d], call));
  return 0;
}

void ust__route_key_str(const ust__route *r, char *buf, size_t cap) {
  const ust__binding *b = r->binding;
  size_t n = (size_t)snprintf(buf, cap, "%s|%s|", b->display,
                              r->key.device == UST__DEV_CUDA ? "cuda" : "cpu");
  for (int i = 0; i < r->key.n_dtypes && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "", ust__dtype_name(r->key.dtypes[i]));
  if (n < cap)
    n += (size_t)snprintf(buf + n, cap - n, "|");
  for (int d = 0; d < b->n_dims && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s=%lld", d ? "," : "", b->def->dims[d].name,
                          (long long)r->key.dims[d]);
  if (r->key.phase != UST_PHASE_UNKNOWN && n < cap)
    snprintf(buf + n, cap - n, "|%s", ust__phase_name(r->key.phase));
}

void ust__binding_resolve(ust__binding *b, int nargs, const char *const *names, uint32_t schema_writes) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&b->resolved, &expected, 1)) {
    while (atomic_load(&b->resolved) != 2)
      sched_yield();
    return;
  }
  b->n_arg_names = nargs < UST__MAX_ARGS ? nargs : UST__MAX_ARGS;
  for (int i = 0; i < b->n_arg_names; i++)
    ust__copy_name(b->arg_names[i], sizeof b->arg_names[i], names[i]);
  ust__roofline_resolve(&b->roofline, nargs, names, b->display);
  /* Schemas are not always truthful about what an op writes (custom ops
   * registered without alias annotations): the curated list adds to them. */
  b->writes_mask = schema_writes;
  for (int w = 0; w < b->def->n_writes; w++) {
    int i = ust__arg_lookup(b->def->writes[w], b->n_arg_names, names);
    if (i >= 0 && i < 32)
      b->writes_mask |= 1u << i;
  }
  for (int d = 0; d < b->n_dims; d++) {
    if (ust__dim_resolve(&b->dims[d], nargs, names) != 0)
      ust__log(UST_LOG_WARN, "%s: key dimension '%s' names argument '%s', which %s does not have",
               b->op->problem->path, b->def->dims[d].name, b->dims[d].arg, b->display);
  }
  atomic_store(&b->resolved, 2);
}

/* Exactly floor(n * sample) of the first n calls are timed, spread evenly. */
static int sampled(uint64_t n, uint32_t q32, double sample) {
  if (sample >= 1.0)
    return 1;
  unsigned __int128 a = (unsigned __int128)n * q32, p = (unsigned __int128)(n - 1) * q32;
  return (uint64_t)(a >> 32) != (uint64_t)(p >> 32);
}

/* Take a shadow slot for a sampled call (count is the route's sampling
 * counter); a skip is counted when none is free, and production serves. */
static void *take_slot(ust__binding *b, const ust__call *call, ust__route *r, atomic_uint_fast64_t *count) {
#if !defined(UST_GPU_CUDA) && !defined(UST_GPU_HIP)
  if (call->device != UST__DEV_CPU)
    return NULL;
#endif
  uint64_t n = atomic_fetch_add_explicit(count, 1, memory_order_relaxed) + 1;
  if (!sampled(n, b->op->sample_q32, b->op->sample))
    return NULL;
  void *slot = ust__shadow_acquire(r);
  if (slot == NULL)
    atomic_fetch_add_explicit(&r->skipped, 1, memory_order_relaxed);
  return slot;
}

/* The route's decision for one call (DESIGN.md, one call step by step):
 * - during graph capture nothing is timed or shadowed; a live candidate is
 *   captured, everything else is production;
 * - shadow: production serves; sampled calls also run the candidate;
 * - canary(p): the candidate serves a p share of the calls, live all of
 *   them; a sample of those is verified against production;
 * - otherwise production serves, a sample timed. */
void ust__call_begin(ust__binding *b, const ust__call *call, ust__call_state *st) {
  st->route = NULL;
  st->timing = 0;
  st->shadow = NULL;
  st->serve = 0;
  st->capturing = 0;
  st->tsol_ps = 0;
  if (call->device == UST__DEV_OTHER)
    return;
  ust__route_key key;
  ust__route_key_make(b, call, &key);
  ust__route *r = ust__routes_get(b->routes, &key, b);
  if (r == NULL) {
    atomic_fetch_add_explicit(&b->untracked, 1, memory_order_relaxed);
    return;
  }
  st->route = r;
  uint64_t n = atomic_fetch_add_explicit(&r->calls, 1, memory_order_relaxed) + 1;
  uint32_t canary_q32 = 0;
  const int mode = ust__route_mode(r, &canary_q32);
  if (call->device == UST__DEV_CUDA && ust__gpu_capturing(call->stream)) {
    /* Replays do not come back here: what is captured is what they run. */
    st->capturing = 1;
    atomic_fetch_add_explicit(&r->captured, 1, memory_order_relaxed);
    st->serve = mode == UST__MODE_LIVE;
    return;
  }
  if (mode == UST__MODE_OFF)
    return;
  if (mode == UST__MODE_CANARY || mode == UST__MODE_LIVE) {
    uint64_t c = atomic_fetch_add_explicit(&r->canary_seen, 1, memory_order_relaxed) + 1;
    if (mode == UST__MODE_LIVE || sampled(c, canary_q32, 0)) {
      st->serve = 1;
      st->shadow = take_slot(b, call, r, &r->verify_seen);
      if (st->shadow != NULL) {
        ust__shadow_set_serving(st->shadow);
        ust__shadow_note_tsol(st->shadow, ust__route_tsol_ps(r, call));
      }
      return;
    }
  } else if (mode == UST__MODE_SHADOW) {
    st->shadow = take_slot(b, call, r, &r->shadow_seen);
    if (st->shadow != NULL) {
      /* a shadowed call times production itself */
      ust__shadow_note_tsol(st->shadow, ust__route_tsol_ps(r, call));
      return;
    }
  }
  if (!sampled(n, b->op->sample_q32, b->op->sample))
    return;
  st->tsol_ps = ust__route_tsol_ps(r, call);
  if (call->device == UST__DEV_CPU) {
    st->timing = 1;
    st->t0_ns = ust__now_ns();
  } else {
    st->gpu_slot = ust__gpu_timer_begin(call->device_id, call->stream);
    if (st->gpu_slot >= 0)
      st->timing = 2;
    else
      atomic_fetch_add_explicit(&r->timing_dropped, 1, memory_order_relaxed);
  }
}

void ust__call_served_by_candidate(ust__call_state *st) {
  if (st->route == NULL)
    return;
  /* a capture serves nothing itself: its replays do, with the arm captured */
  atomic_fetch_add_explicit(st->capturing ? &st->route->captured_cand : &st->route->served_cand, 1,
                            memory_order_relaxed);
}

int ust__call_strict(const ust__call_state *st) {
  return st->route != NULL && atomic_load_explicit(&st->route->binding->op->strict, memory_order_relaxed);
}

void ust__call_unlearned(ust__call_state *st) {
  if (st->route != NULL)
    atomic_fetch_add_explicit(&st->route->served_unlearned, 1, memory_order_relaxed);
}

void ust__call_verified_serving(ust__call_state *st) {
  if (st->route != NULL)
    atomic_fetch_add_explicit(&st->route->served_cand_verified, 1, memory_order_relaxed);
}

void ust__call_serve_failed(ust__call_state *st, int fail, const char *msg) {
  if (st->route != NULL)
    ust__serve_failed(st->route, fail, msg);
}

/* ---- learned output layouts ------------------------------------------------ */

uint64_t ust__call_signature(const ust__call *call) {
  uint64_t h = 0xcbf29ce484222325ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 0x100000001b3ull)
  MIX(call->device);
  MIX(call->device_id); /* a layout names the device its outputs live on */
  for (int i = 0; i < call->nargs; i++) {
    const ust__arg *a = &call->args[i];
    MIX(a->kind);
    if (a->kind == UST__ARG_TENSOR) {
      MIX(a->dtype);
      MIX(a->t.ndim);
      for (int d = 0; d < a->t.ndim; d++) {
        MIX(a->t.shape[d]);
        MIX(a->t.strides != NULL ? a->t.strides[d] : 0);
      }
    } else if (a->kind == UST__ARG_INT || a->kind == UST__ARG_BOOL || a->kind == UST__ARG_INTLIST) {
      MIX(a->i);
    } else if (a->kind == UST__ARG_DOUBLE) {
      uint64_t bits;
      memcpy(&bits, &a->f, sizeof bits);
      MIX(bits);
    }
  }
#undef MIX
  return h;
}

const ust__layout *ust__route_layout_find(ust__route *r, uint64_t sig) {
  for (int i = 0; i < 8; i++) {
    const ust__layout *l = atomic_load_explicit(&r->layouts[i], memory_order_acquire);
    if (l == NULL)
      return NULL;
    if (l->sig == sig)
      return l;
  }
  return NULL;
}

void ust__route_layout_add(ust__route *r, uint64_t sig, const void *blob, size_t len) {
  if (ust__route_layout_find(r, sig) != NULL)
    return;
  ust__layout *l = malloc(sizeof *l + len);
  if (l == NULL)
    return;
  l->sig = sig;
  l->len = len;
  memcpy(l->blob, blob, len);
  for (int i = 0; i < 8; i++) {
    void *expected = NULL;
    if (atomic_compare_exchange_strong(&r->layouts[i], &expected, l))
      return;
    if (((const ust__layout *)expected)->sig == sig)
      break; /* another thread learned it first */
  }
  free(l);
}

const void *ust__call_layout(const ust__call_state *st, const ust__call *call, size_t *len) {
  if (st->route == NULL)
    return NULL;
  const ust__layout *l = ust__route_layout_find(st->route, ust__call_signature(call));
  if (l == NULL)
    return NULL;
  *len = l->len;
  return l->blob;
}

void ust__call_learn_layout(const ust__call_state *st, const ust__call *call, const void *blob, size_t len) {
  if (st->route != NULL)
    ust__route_layout_add(st->route, ust__call_signature(call), blob, len);
}

void ust__call_end(const ust__call *call, ust__call_state *st) {
  if (st->timing == 1) {
    uint64_t dt = ust__now_ns() - st->t0_ns;
    ust__hist_record(&st->route->hist, dt);
    atomic_fetch_add_explicit(&st->route->timed, 1, memory_order_relaxed);
    ust__route_roof_add(st->route, st->tsol_ps, dt, 0);
  } else if (st->timing == 2) {
    ust__gpu_timer_end(st->gpu_slot, call->stream, st->route, st->tsol_ps);
  }
}

void ust__call_cancel(const ust__call *call, ust__call_state *st) {
  if (st->shadow != NULL)
    ust__shadow_abandon(call, st);
  if (st->timing == 2)
    ust__gpu_timer_cancel(st->gpu_slot);
  st->timing = 0;
}

int ust__binding_is_off(const ust__binding *b) {
  return atomic_load_explicit(&b->op->mode, memory_order_relaxed) == UST__MODE_OFF;
}

int ust__binding_needs_names(const ust__binding *b) {
  return atomic_load_explicit(&b->resolved, memory_order_acquire) != 2;
}

const char *ust__binding_display(const ust__binding *b) { return b->display; }
const char *ust__binding_arg_name(const ust__binding *b, int i) {
  return i >= 0 && i < b->n_arg_names ? b->arg_names[i] : "?";
}
const char *ust__binding_qualname(const ust__binding *b) { return b->qualname; }
const char *ust__binding_overload(const ust__binding *b) { return b->overload; }
