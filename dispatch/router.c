/*
 * The router: shape key of a call, the route table, the per-call plan, the
 * steps of the serving decision the C core performs, and the sink through
 * which verdicts reach routes.
 *
 * The route table is an open-addressing array of atomic route pointers:
 * lookups and inserts are lock-free, so the per-call path takes no lock.
 * Routes are never removed while the engine lives, which is what makes the
 * lock-free read safe; they are freed with the engine, after every call that
 * could see them has left (their hooks drained).
 */
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"
#include "guard/gate.h"
#include "guard/procrun.h"

int ust__router_init(ust__router *r, int max_routes) {
  ust__route_table *t = &r->routes;
  uint32_t cap = 16;
  while (cap < (uint32_t)max_routes * 2u)
    cap <<= 1;
  t->cap = cap;
  t->max_routes = (uint32_t)max_routes;
  atomic_init(&t->count, 0);
  atomic_init(&r->internal_errors, 0);
  t->slots = calloc(cap, sizeof *t->slots);
  return t->slots == NULL ? ust__error(UST_ENOMEM, "out of memory for %u route slots", cap) : 0;
}

static void route_free(ust__route *r) {
  if (r == NULL)
    return;
  ust__figs_free(&r->figs);
  ust__rollout_route_free(&r->rollout);
  for (int i = 0; i < UST__MAX_LAYOUTS; i++)
    free(atomic_load(&r->layouts[i]));
  free(r);
}

void ust__router_free(ust__router *r) {
  ust__route_table *t = &r->routes;
  if (t->slots == NULL)
    return;
  for (uint32_t i = 0; i < t->cap; i++)
    route_free(atomic_load(&t->slots[i]));
  free(t->slots);
  t->slots = NULL;
}

/* Keys hash and compare as words (their head's padding zero); this runs on
 * every observed call. A binding's keys differ only in their head and its
 * own dimensions, and keys of two bindings differ in the head: those words
 * are the key (a route keeps the others zero). */
static inline size_t key_words(const ust__binding *b) {
  _Static_assert(sizeof(ust__route_key) % 8 == 0 && offsetof(ust__route_key, dims) % 8 == 0,
                 "route keys hash as whole words");
  return offsetof(ust__route_key, dims) / 8 + (size_t)b->n_dims;
}

#define KEY_SEED 0x9e3779b97f4a7c15ull

static inline uint64_t key_mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 32);
}

static uint64_t key_hash(const ust__route_key *k, size_t words) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = KEY_SEED;
  for (size_t i = 0; i < words; i++) {
    uint64_t w;
    memcpy(&w, p + 8 * i, 8);
    h = key_mix(h, w);
  }
  return h ^ (h >> 29);
}

static ust__route *route_new(ust__router *router, const ust__route_key *key, uint64_t h, ust__binding *b) {
  ust__route *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  if (ust__figs_init(&r->figs) != 0) {
    free(r);
    return NULL;
  }
  memcpy(&r->key, key, key_words(b) * 8); /* the rest stays zero */
  r->hash = h;
  r->binding = b;
  ust__route_key_format(b, key, r->key_str, sizeof r->key_str);
  /* before it is published: its first call sees its mode */
  ust__rollout_route_init(&r->rollout, router->rollout, r->key_str, b->cand, &b->op->policy, &r->figs);
  return r;
}

static UST__INLINE int key_equal(const ust__route_key *a, const ust__route_key *b, size_t words) {
  const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
  uint64_t diff = 0;
  for (size_t i = 0; i < words; i++) {
    uint64_t x, y;
    memcpy(&x, p + 8 * i, 8);
    memcpy(&y, q + 8 * i, 8);
    diff |= x ^ y;
  }
  return diff == 0;
}

/* A key not in the table at probe: its route made and published there, or
 * the one another thread published first (then the probe goes on). */
static UST__NOINLINE ust__route *routes_add(ust__router *router, const ust__route_key *key, uint64_t h,
                                            ust__binding *b, uint32_t probe) {
  ust__route_table *t = &router->routes;
  const uint32_t mask = t->cap - 1;
  ust__route *fresh = NULL;
  for (; probe < t->cap; probe++) {
    uint32_t i = (uint32_t)(h + probe) & mask;
    ust__route *r = atomic_load_explicit(&t->slots[i], memory_order_acquire);
    if (r == NULL) {
      if (fresh == NULL) {
        if (atomic_fetch_add(&t->count, 1) >= t->max_routes) {
          atomic_fetch_sub(&t->count, 1);
          return NULL;
        }
        if ((fresh = route_new(router, key, h, b)) == NULL) {
          atomic_fetch_sub(&t->count, 1);
          return NULL;
        }
      }
      ust__route *expected = NULL;
      if (atomic_compare_exchange_strong_explicit(&t->slots[i], &expected, fresh, memory_order_acq_rel,
                                                  memory_order_acquire)) {
        ust__rollout_route_published(&fresh->rollout);
        return fresh;
      }
      r = expected; /* another thread filled this slot first */
    }
    if (r->hash == h && key_equal(&r->key, key, key_words(b))) {
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

/* The route of key, whose hash is h: found by probing from h (every call
 * but a key's first), else added. */
static UST__INLINE ust__route *routes_find(ust__router *router, const ust__route_key *key, uint64_t h, ust__binding *b) {
  ust__route_table *t = &router->routes;
  const size_t words = key_words(b);
  const uint32_t mask = t->cap - 1;
  for (uint32_t probe = 0; probe < t->cap; probe++) {
    ust__route *r = atomic_load_explicit(&t->slots[(uint32_t)(h + probe) & mask], memory_order_acquire);
    if (r == NULL)
      return routes_add(router, key, h, b, probe);
    if (r->hash == h && key_equal(&r->key, key, words))
      return r;
  }
  return NULL;
}

ust__route *ust__routes_get(ust__router *router, const ust__route_key *key, ust__binding *b) {
  return routes_find(router, key, key_hash(key, key_words(b)), b);
}

/* The calling thread's block (dispatch/callview.h): one thread-local
 * variable, so that a call reads the dynamic loader's table once. */
__thread ust__thread ust__thread_block;
#define tl_thread ust__thread_block

ust__thread *ust__thread_state(void) { return &tl_thread; }

int ust_set_phase(int phase) {
  if (phase < UST_PHASE_UNKNOWN || phase > UST_PHASE_DECODE)
    return ust__error(UST_EINVAL, "set_phase: %d is not a phase (0 unknown, 1 prefill, 2 decode)", phase);
  int prev = tl_thread.phase;
  tl_thread.phase = phase;
  return prev;
}

int ust__thread_phase(void) { return tl_thread.phase; }

int ust_graph_capture_begun(void) { return ++tl_thread.captures; }

int ust_graph_capture_ended(void) {
  if (tl_thread.captures > 0)
    tl_thread.captures--;
  return tl_thread.captures;
}

const char *ust__phase_name(int phase) {
  static const char *names[] = {"unknown", "prefill", "decode"};
  return phase >= 0 && phase <= UST_PHASE_DECODE ? names[phase] : "unknown";
}

/* The key of a call (its head and b->n_dims dims: the words hashed and
 * compared, key_words; those past them are never read), and its hash, as
 * key_hash finds it. The head's two words are made in registers, as the
 * struct lays them out, and stored whole. */
_Static_assert(offsetof(ust__route_key, binding) == 0 && offsetof(ust__route_key, device) == 2 &&
                   offsetof(ust__route_key, n_dtypes) == 3 && offsetof(ust__route_key, dtypes) == 4 &&
                   UST__MAX_KEY_TENSORS == 8 && offsetof(ust__route_key, phase) == 12 &&
                   offsetof(ust__route_key, dims) == 16,
               "the key's head is two words: binding, device, n_dtypes, dtypes[0..3] | dtypes[4..7], phase");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the key's head is made little-endian");
static UST__INLINE uint64_t key_build(const ust__binding *b, const ust__call *call, ust__route_key *key) {
  uint64_t dtypes = 0; /* a byte each, the first lowest */
  unsigned n = 0;
  for (int i = 0; i < call->nargs && n < UST__MAX_KEY_TENSORS; i++)
    if (call->args[i].kind == UST__ARG_TENSOR || call->args[i].kind == UST__ARG_TENSORLIST)
      dtypes |= (uint64_t)(uint8_t)call->args[i].dtype << (8 * n++);
  const uint64_t w0 = (uint64_t)(uint16_t)b->index | (uint64_t)(uint8_t)call->device << 16 | (uint64_t)n << 24 |
                      (dtypes & 0xffffffffull) << 32;
  const uint64_t w1 = dtypes >> 32 | (uint64_t)(uint8_t)call->phase << 32;
  memcpy((unsigned char *)key, &w0, 8);
  memcpy((unsigned char *)key + 8, &w1, 8);
  uint64_t h = key_mix(key_mix(KEY_SEED, w0), w1);
  for (int d = 0; d < b->n_dims; d++) {
    const ust__dim_key k = b->keys[d];
    const ust__arg *a = k.arg_index >= 0 && k.arg_index < call->nargs ? &call->args[k.arg_index] : NULL;
    /* most dimensions are a tensor's size: read in place, without the evaluator's call */
    const int64_t v = k.kind == UST__DIM_SIZE && a != NULL && a->kind == UST__ARG_TENSOR
                          ? ust__dim_size(a, k.dim)
                          : ust__dim_eval(&b->dims[d], call);
    key->dims[d] = ust__dim_bucket(k.bucket, v);
    h = key_mix(h, (uint64_t)key->dims[d]);
  }
  return h ^ (h >> 29);
}

void ust__route_key_make(const ust__binding *b, const ust__call *call, ust__route_key *key) {
  (void)key_build(b, call, key);
}

void ust__binding_keys_set(ust__binding *b) {
  for (int d = 0; d < b->n_dims; d++) {
    const ust__dim_prog *p = &b->dims[d];
    /* a size of an argument past the word's range reads through the evaluator */
    const int sized = p->kind == UST__DIM_SIZE && p->arg_index <= INT8_MAX;
    b->keys[d] = (ust__dim_key){(int8_t)(sized ? UST__DIM_SIZE : -1), (int8_t)p->dim,
                                (int8_t)(sized ? p->arg_index : -1), (int8_t)p->bucket};
  }
}

void ust__route_key_format(const ust__binding *b, const ust__route_key *k, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "%s|%s|", b->display, k->device == UST__DEV_CUDA ? "cuda" : "cpu");
  for (int i = 0; i < k->n_dtypes && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "", ust__dtype_name(k->dtypes[i]));
  if (n < cap)
    n += (size_t)snprintf(buf + n, cap - n, "|");
  for (int d = 0; d < b->n_dims && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s=%lld", d ? "," : "", b->def->dims[d].name, (long long)k->dims[d]);
  if (k->phase != UST_PHASE_UNKNOWN && n < cap)
    snprintf(buf + n, cap - n, "|%s", ust__phase_name(k->phase));
}

void ust__binding_resolve(ust__binding *b, int nargs, const char *const *names, uint32_t schema_writes,
                          uint32_t schema_outs) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&b->resolved, &expected, 1)) {
    while (atomic_load(&b->resolved) != 2)
      sched_yield();
    return;
  }
  b->n_arg_names = nargs < UST__MAX_ARGS ? nargs : UST__MAX_ARGS;
  for (int i = 0; i < b->n_arg_names; i++)
    ust__copy_name(b->arg_names[i], sizeof b->arg_names[i], names[i]);
  ust__roofline_resolve(&b->roofline, nargs, names, b->display, b->router->log);
  /* Schemas are not always truthful about what an op writes (custom ops
   * registered without alias annotations): the curated list adds to them. */
  b->writes_mask = schema_writes;
  for (int w = 0; w < b->def->n_writes; w++) {
    int i = ust__arg_lookup(b->def->writes[w], b->n_arg_names, names);
    if (i >= 0 && i < 32)
      b->writes_mask |= 1u << i;
  }
  /* out= arguments, and those the definition says the op writes whole
   * without reading */
  b->overwrites_mask = schema_outs & b->writes_mask;
  for (int w = 0; w < b->def->n_overwrites; w++) {
    int i = ust__arg_lookup(b->def->overwrites[w], b->n_arg_names, names);
    if (i >= 0 && i < 32)
      b->overwrites_mask |= 1u << i;
  }
  b->overwrites_mask &= b->writes_mask;
  for (int d = 0; d < b->n_dims; d++) {
    if (ust__dim_resolve(&b->dims[d], nargs, names) != 0)
      ust__log(b->router->log, UST_LOG_WARN, "%s: key dimension '%s' names argument '%s', which %s does not have",
               b->op->def_path, b->def->dims[d].name, b->dims[d].arg, b->display);
  }
  ust__binding_keys_set(b);
  /* its calls may be floored by the bound ops they call: its own roofline
   * is absent (or was dropped just now for a missing argument) or an estimate */
  b->nested_ok = !b->roofline.present || b->def->roofline.estimate[0] != '\0';
  atomic_store(&b->resolved, 2);
}

/* T_SOL of a call in picoseconds (0 when unknown); the route's profile is
 * noted. Called only for calls that are timed. */
/* A binding's floor for one call: 0 with seconds, W (FLOPs, every path)
 * and Q (bytes), and the profile; -1 when it has no roofline, no profile
 * matches, or a dimension is missing. */
static int binding_floor(const ust__binding *b, const ust__call *call, const ust__hw_profile **hw_out,
                         double *seconds, double *flops, double *bytes) {
  if (!b->roofline.present)
    return -1;
  const ust__hw_profile *hw = ust__hw_for_call(b->router->hw, call);
  if (hw == NULL)
    return -1;
  double w[UST__N_PATHS], qr, qw;
  const ust__seam_i *seam = b->router->seam;
  /* TF32 where torch allows it and the profile has its peak */
  const int tf32 = b->roofline.w_tf32 && hw->p_peak[UST__PATH_TF32] > 0 && seam != NULL &&
                   seam->tf32_matmul != NULL && seam->tf32_matmul(call->device);
  if (ust__roofline_eval(&b->roofline, call, tf32, w, &qr, &qw) != 0 ||
      ust__roofline_tsol_quiet(hw, w, qr + qw, seconds) != 0)
    return -1;
  *flops = 0;
  for (int p = 0; p < UST__N_PATHS; p++)
    *flops += w[p];
  *bytes = qr + qw;
  *hw_out = hw;
  return 0;
}


/* The call's own floor in ps (0: unknown). Its work is noted now, or, for a
 * call whose floor may still come from its nested ops, kept in st for
 * ust__call_nested_done. */
static uint64_t call_tsol_ps(ust__route *r, const ust__call *call, ust__call_state *st) {
  const ust__binding *b = r->binding;
  const ust__hw_profile *hw = NULL;
  double seconds = 0, flops = 0, bytes = 0;
  const int ok = binding_floor(b, call, &hw, &seconds, &flops, &bytes) == 0;
  if (st->nested_ok) {
    st->own_flops = ok ? flops : 0;
    st->own_bytes = ok ? bytes : 0;
    if (ok)
      ust__figs_note_hw(&r->figs, hw);
    return ok ? (uint64_t)(seconds * 1e12 + 0.5) : 0;
  }
  if (!b->roofline.present)
    return 0;
  if (!ok) {
    atomic_fetch_add_explicit(&r->figs.unscored, 1, memory_order_relaxed);
    return 0;
  }
  ust__figs_note_hw(&r->figs, hw);
  ust__figs_note_work(&r->figs, flops, bytes);
  return (uint64_t)(seconds * 1e12 + 0.5);
}

int ust__call_wants_nested(const ust__call_state *st) {
  return st->route != NULL && st->nested_ok && (st->timing != 0 || st->slot != NULL);
}

void ust__binding_nested_floor(ust__binding *b, const ust__call *call, ust__nested *acc) {
  const ust__hw_profile *hw = NULL;
  double seconds = 0, flops = 0, bytes = 0;
  acc->n++;
  if (binding_floor(b, call, &hw, &seconds, &flops, &bytes) != 0) {
    acc->unscored++;
    return;
  }
  acc->tsol_ps += (uint64_t)(seconds * 1e12 + 0.5);
  acc->flops += flops;
  acc->bytes += bytes;
}

void ust__call_nested_done(ust__call_state *st, const ust__nested *acc) {
  ust__route *r = st->route;
  if (r == NULL || !st->nested_ok)
    return;
  if (acc->n > 0 && acc->unscored == 0 && acc->tsol_ps > 0) {
    st->tsol_ps = acc->tsol_ps;
    if (st->slot != NULL)
      ust__shadow_set_floor(st->slot, acc->tsol_ps);
    atomic_fetch_add_explicit(&r->figs.nested_scored, 1, memory_order_relaxed);
    ust__figs_note_work(&r->figs, acc->flops, acc->bytes);
  } else if (st->tsol_ps > 0) {
    ust__figs_note_work(&r->figs, st->own_flops, st->own_bytes);
  } else if (r->binding->roofline.present) {
    atomic_fetch_add_explicit(&r->figs.unscored, 1, memory_order_relaxed);
  }
  st->nested_ok = 0; /* settled */
}

/* 1 when the candidate may run in this process for route r: always, but
 * for one qualifying in its own process, until the route qualified there
 * and the engine loaded it here. */
static int ready_here(ust__cand *c, const ust__route *r) {
  if (c == NULL || c->proc == NULL)
    return 1;
  return atomic_load_explicit(&c->loaded, memory_order_acquire) != NULL &&
         atomic_load_explicit(&((ust__route *)r)->verify.proc_passed, memory_order_relaxed) >= c->qualify_calls;
}

/* The candidate as the bridge runs it for a call of route r (serving: the
 * candidate would serve it); 0, or -1 when it cannot run now: a torch op not
 * defined in this process yet, or a candidate qualifying in its own process
 * that may not run here yet (or was refused there). */
static int cand_view(ust__binding *b, const ust__route *r, const ust__call *call, int serving, ust__cand_view *v) {
  ust__cand *c = b->cand;
  memset(v, 0, sizeof *v);
  v->kind = c->kind;
  v->native = c->native;
  if (c->kind == UST__CAND_NATIVE && c->proc != NULL) {
    if (ust__procrun_lost(c->proc, NULL, 0))
      return -1;
    if (ready_here(c, r)) {
      v->native = atomic_load_explicit(&c->loaded, memory_order_acquire);
    } else if (serving || (call->device != UST__DEV_CPU && !ust__procrun_gpu())) {
      return -1; /* qualifies first, on copies of the calls it sees in shadow */
    } else {
      v->proc = c->proc;
    }
  }
  v->abi = c->abi;
  v->compare = c->compare;
  v->writes_mask = b->writes_mask;
  v->overwrites_mask = b->overwrites_mask;
  v->compared_returns = b->def->compared_returns;
  v->deadline_ns = c->deadline_ns;
  v->torch_op_name = c->torch_op;
  if (c->kind != UST__CAND_TORCH_OP)
    return 0;
  /* the op may be defined after enable: resolved at its first call then */
  void *h = atomic_load_explicit(&c->seam_op, memory_order_acquire);
  if (h == NULL && b->router->seam != NULL && b->router->seam->resolve_op != NULL &&
      (h = b->router->seam->resolve_op(c->torch_op, c->torch_overload)) != NULL)
    atomic_store_explicit(&c->seam_op, h, memory_order_release);
  if (h == NULL)
    atomic_fetch_add_explicit(&c->waiting, 1, memory_order_relaxed);
  v->torch_op = h;
  return h != NULL ? 0 : -1;
}

/* A slot for a sampled call (count: the route's sampling counter; pol NULL:
 * every call is); NULL when not sampled or none is free (the skip is
 * counted). */
static void *take_slot(ust__binding *b, const ust__call *call, ust__route *r, atomic_uint_fast64_t *count,
                       const ust__policy *pol, int serving, int remote, ust__call_state *st) {
#if !defined(UST_GPU_CUDA) && !defined(UST_GPU_HIP)
  if (call->device != UST__DEV_CPU)
    return NULL;
#endif
  uint64_t n = atomic_fetch_add_explicit(count, 1, memory_order_relaxed) + 1;
  if (pol != NULL && !ust__sampled(n, pol->sample_q32))
    return NULL;
  ust__slot_route sr = {r, &r->verify, b->cand, serving, remote,
                        atomic_load_explicit(&r->rollout.served_cand, memory_order_relaxed),
                        atomic_load_explicit(&r->rollout.transitions, memory_order_relaxed), call_tsol_ps(r, call, st),
                        st->timed_kind};
  return ust__shadow_acquire(b->router->shadow, &sr);
}

/* A call the route's sampling would have verified, but that goes without:
 * counted as skipped for reason. */
static void skip_sampled(ust__route *r, int mode, const ust__policy *pol, int reason) {
  atomic_uint_fast64_t *count = mode == UST__MODE_SHADOW ? &r->shadow_seen : &r->verify_seen;
  if (mode != UST__MODE_SHADOW && mode != UST__MODE_CANARY && mode != UST__MODE_LIVE)
    return;
  uint64_t n = atomic_fetch_add_explicit(count, 1, memory_order_relaxed) + 1;
  if (ust__sampled(n, pol->sample_q32))
    ust__verify_skipped(&r->verify, reason);
}

/* The evidence of a candidate's failure known on the host (fail: ust__fail;
 * the message after prefix), or NULL out of memory. */
static ust__evidence *failure_evidence(int fail, const char *prefix, const char *msg) {
  ust__evidence *e = calloc(1, sizeof *e);
  if (e != NULL) {
    e->unix_ms = ust__unix_ms();
    snprintf(e->reason, sizeof e->reason, "%s", ust__fail_name(fail > 0 ? fail : UST__FAIL_ERROR));
    snprintf(e->message, sizeof e->message, "%s%s", prefix, msg != NULL ? msg : "");
  }
  return e;
}

/* A captured call holds production alone for why: counted; said in the log
 * when the route's reason changes (a capture holds thousands of calls). */
static void graph_plain(ust__route *r, int why, const char *detail) {
  const int before = atomic_load_explicit(&r->verify.graph_why, memory_order_relaxed);
  ust__verify_graph_plain(&r->verify, why);
  if (before != why && detail != NULL && detail[0] != '\0')
    ust__log(r->binding->router->log, UST_LOG_WARN, "%s: captured without its shadow: %s", r->key_str, detail);
}

/* A call of a shadow, canary or live route being captured into a CUDA
 * graph: the candidate's side is captured with production (guard/graph.c),
 * when its candidate can be: the gate then decides at each replay whether
 * it runs, is verified, serves. Else the call holds production alone,
 * counted with the reason. 0 when the plan is the captured shadow. */
static int graph_shadow_begin(ust__binding *b, ust__route *r, int mode, const ust__call *call,
                              const ust__policy *pol, ust__call_state *st) {
  ust__graphs *g = b->router->graphs;
  if (g == NULL || b->cand == NULL)
    return -1;
  if (mode == UST__MODE_SHADOW ? pol->sample_q32 == 0 || atomic_load_explicit(&r->verify.paused, memory_order_relaxed)
                               : b->cand->kind != UST__CAND_NATIVE || b->cand->proc != NULL)
    return -1; /* nothing to verify; or canary, live: the candidate is captured alone (below) */
  if (cand_view(b, r, call, 0, &st->cand) != 0) {
    if (b->cand->kind == UST__CAND_NATIVE && b->cand->proc != NULL)
      ust__verify_graph_plain(&r->verify, UST__GW_REMOTE);
    return -1;
  }
  if (st->cand.kind != UST__CAND_NATIVE || st->cand.proc != NULL) {
    ust__verify_graph_plain(&r->verify, st->cand.proc != NULL ? UST__GW_REMOTE : UST__GW_TORCH_OP);
    memset(&st->cand, 0, sizeof st->cand);
    return -1;
  }
  ust__graph_call *c = malloc(sizeof *c);
  const ust__slot_route sr = {r, &r->verify, b->cand, 0, 0,
                              atomic_load_explicit(&r->rollout.served_cand, memory_order_relaxed),
                              atomic_load_explicit(&r->rollout.transitions, memory_order_relaxed),
                              call_tsol_ps(r, call, st)};
  if (c == NULL || ust__graph_call_begin(g, &sr, call->device_id, call->stream, c) != 0) {
#if defined(UST_GPU_CUDA)
    graph_plain(r, UST__GW_CAPTURE, c == NULL ? "out of memory" : ust_last_error());
#else
    graph_plain(r, UST__GW_UNSUPPORTED, ust_last_error());
#endif
    free(c);
    memset(&st->cand, 0, sizeof st->cand);
    return -1;
  }
  /* shadow's replays only verify: beside the chain, when it fits */
  c->beside = mode == UST__MODE_SHADOW && b->router->graph_beside_max > 0;
  c->kept_max = b->router->graph_beside_max;
  c->launch = b->router->graph_beside_launch;
  c->start_kernel = b->router->graph_start_kernel;
  st->graph = c;
  st->plan = UST__PLAN_SHADOW;
  st->flags = UST__DF_CAPTURED;
  st->tsol_ps = sr.tsol_ps;
  return 0;
}

/* The call's captured shadow, dropped (ok 0) or whole in its graph. */
static void graph_shadow_end(ust__call_state *st, int ok, int why) {
  ust__graph_call *c = st->graph;
  if (c == NULL)
    return;
  st->graph = NULL;
  ust__route *r = st->route;
  if (c->open)
    ust__graph_part_end(c, 0);
  if (ok) {
    atomic_fetch_add_explicit(&r->verify.graph_shadowed, 1, memory_order_relaxed);
    if (c->beside)
      atomic_fetch_add_explicit(&r->verify.graph_beside, 1, memory_order_relaxed);
  } else
    graph_plain(r, why, c->why);
  ust__graph_call_end(c, ok);
  /* its parts took graph ids: the tracer's map of the capture's replays */
  ust__timers_graph_made(r->binding->router->timers, c->stream);
  free(c);
}

int ust__call_graph_part_begin(ust__call_state *st, void **side) {
  *side = NULL;
  if (st->graph == NULL)
    return -1;
  ust__graph_call *c = st->graph;
  if (ust__graph_part_begin(c, side) != 0) {
    snprintf(c->why, sizeof c->why, "%s", ust_last_error());
    graph_shadow_end(st, 0, UST__GW_CAPTURE);
    return -1;
  }
  return 0;
}

int ust__call_graph_part_end(ust__call_state *st, int keep, int why) {
  ust__graph_call *c = st->graph;
  if (c == NULL)
    return -1;
  if (ust__graph_part_end(c, keep) != 0 || !keep) {
    graph_shadow_end(st, 0, keep ? c->why_code : why);
    return -1;
  }
  return 0;
}

int ust__call_graph_beside(const ust__call_state *st) {
  const ust__graph_call *c = st->graph;
  return c != NULL && c->beside;
}

void ust__call_graph_beside_plan(ust__call_state *st, uint64_t bytes) {
  ust__graph_call *c = st->graph;
  if (c != NULL && c->parts == 0 && !c->open && bytes > c->kept_max)
    c->beside = 0;
}

void *ust__call_graph_alloc(ust__call_state *st, uint64_t bytes) {
  ust__graph_call *c = st->graph;
  if (c == NULL || !c->beside)
    return NULL;
  if (c->kept + bytes > c->kept_max) {
    ust__error(UST_EINVAL, "its copies beside the chain would keep more than %llu bytes (shadow.graph_beside_max_mb)",
               (unsigned long long)c->kept_max);
    return NULL;
  }
  void *p = ust__graph_keep(c, (size_t)bytes); /* NULL: the error says why */
  c->kept += p != NULL ? bytes : 0;
  return p;
}

void ust__call_graph_drop(ust__call_state *st, int why, const char *detail) {
  ust__graph_call *c = st->graph;
  if (c != NULL && detail != NULL && detail[0] != '\0')
    snprintf(c->why, sizeof c->why, "%s", detail);
  graph_shadow_end(st, 0, why);
}

/* rc of a step of the call's open part: on failure its shadow is dropped. */
static int graph_step(ust__call_state *st, int rc) {
  if (rc != 0)
    graph_shadow_end(st, 0, UST__GW_CAPTURE);
  return rc != 0 ? -1 : 0;
}

int ust__call_graph_copy(ust__call_state *st, void *dst, const void *src, size_t bytes) {
  return st->graph == NULL ? -1 : graph_step(st, ust__graph_copy(st->graph, dst, src, bytes));
}

int ust__call_graph_fill(ust__call_state *st, void *dst, int byte, size_t bytes) {
  return st->graph == NULL ? -1 : graph_step(st, ust__graph_fill(st->graph, dst, byte, bytes));
}

int ust__call_graph_compare(ust__call_state *st, const ust__pair *pairs, int n_pairs, void *dev_stats, int servable) {
  ust__graph_call *c = st->graph;
  if (c == NULL)
    return -1;
  if (graph_step(st, ust__graph_call_finish(c, pairs, n_pairs, dev_stats, servable)) != 0 ||
      ust__call_graph_part_end(st, 1, UST__GW_CAPTURE) != 0)
    return -1;
  graph_shadow_end(st, 1, UST__GW_NONE);
  return 0;
}

void ust__call_graph_prod(ust__call_state *st, const ust__call *call, int end) {
  ust__route *r = st->route;
  if (r == NULL || !(st->flags & UST__DF_CAPTURED))
    return;
  ust__timers *t = r->binding->router->timers;
  if (!end) {
    st->capture_marked = ust__timers_capture_mark(t, call->stream, &st->capture_from) == 0;
  } else if (st->capture_marked) {
    /* now, before the shadow's second part: production's nodes alone */
    ust__timers_captured(t, call->stream, st->capture_from, &r->figs, st->tsol_ps);
    st->capture_marked = 0;
  }
}

int ust__call_graph_active(const ust__call_state *st) {
  return st->graph != NULL && ust__graph_part_active(st->graph);
}

void ust__call_graph_failed(ust__call_state *st, int fail, const char *msg) {
  ust__route *r = st->route;
  if (r == NULL)
    return;
  /* a shadow call that failed: its own verdict, as an eager call's failure */
  const uint64_t n = atomic_fetch_add_explicit(&r->verify.calls, 1, memory_order_relaxed) + 1;
  atomic_fetch_add_explicit(&r->verify.verified, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->verify.failed, 1, memory_order_relaxed);
  ust__evidence *e = failure_evidence(fail, "while captured into a CUDA graph: ", msg);
  if (e != NULL)
    e->shadow_call = n;
  ust__rollout_roll_back(&r->rollout, e);
}

/* The parts of a call's plan that an observed call does not run, each
 * out of its body so that the observed path stays a few lines of code: */

/* a call made while its stream captures a graph. Replays do not come back
 * here: what is captured is what they run. */
static UST__NOINLINE void begin_captured(ust__binding *b, ust__route *r, int mode, const ust__call *call,
                                         const ust__policy *pol, ust__call_state *st) {
  st->capturing = 1;
  atomic_fetch_add_explicit(&r->figs.captured, 1, memory_order_relaxed);
  if (st->timed_kind == UST__TIMED_STEADY)
    atomic_fetch_add_explicit(&r->figs.late_captured, 1, memory_order_relaxed);
  if ((mode == UST__MODE_SHADOW || mode == UST__MODE_CANARY || mode == UST__MODE_LIVE) &&
      graph_shadow_begin(b, r, mode, call, pol, st) == 0)
    return; /* both arms captured, the gate choosing at each replay */
  if (b->cand != NULL)
    skip_sampled(r, mode, pol, UST__SKIP_CAPTURE);
  if (mode == UST__MODE_LIVE && ust__rollout_qualified(&r->rollout) && cand_view(b, r, call, 1, &st->cand) == 0) {
    st->plan = UST__PLAN_SERVE;
    st->flags = UST__DF_NO_SNAPSHOTS;
  } else if (mode != UST__MODE_OFF && ust__timers_capture_mark(b->router->timers, call->stream, &st->capture_from) == 0) {
    /* production's nodes: their replays are this route's calls */
    st->capture_marked = 1;
    st->tsol_ps = call_tsol_ps(r, call, st);
  }
}

/* a route with a candidate (shadow, canary, live): 1 when the call's plan
 * is set, 0 when it is observed as any other (sampled for timing) */
static UST__NOINLINE int begin_candidate(ust__binding *b, ust__route *r, int mode, uint32_t canary_q32,
                                         const ust__call *call, const ust__policy *pol, ust__call_state *st) {
  if ((mode == UST__MODE_CANARY || mode == UST__MODE_LIVE) &&
      (!ust__rollout_qualified(&r->rollout) || !ready_here(b->cand, r))) {
    /* Before its first served call the candidate qualifies on copies of the
     * arguments, as in shadow: every call is shadowed until one passes. */
    if (atomic_load_explicit(&r->verify.paused, memory_order_relaxed))
      ust__verify_skipped(&r->verify, UST__SKIP_BUDGET);
    else if (cand_view(b, r, call, 0, &st->cand) == 0 &&
             (st->slot = take_slot(b, call, r, &r->shadow_seen, NULL, 0, st->cand.proc != NULL, st)) != NULL) {
      st->plan = UST__PLAN_SHADOW;
      return 1;
    }
  } else if (mode == UST__MODE_CANARY || mode == UST__MODE_LIVE) {
    uint64_t c = atomic_fetch_add_explicit(&r->canary_seen, 1, memory_order_relaxed) + 1;
    if ((mode == UST__MODE_LIVE || ust__sampled(c, canary_q32)) && cand_view(b, r, call, 1, &st->cand) == 0) {
      st->slot = take_slot(b, call, r, &r->verify_seen, pol, 1, 0, st);
      st->plan = st->slot != NULL ? UST__PLAN_SERVE_VERIFIED : UST__PLAN_SERVE;
      /* a host comparison concludes at once; a device one waits only when strict */
      if (st->slot != NULL && (call->device != UST__DEV_CUDA || pol->strict))
        st->flags = UST__DF_WAIT_VERDICT;
      return 1;
    }
  } else if (mode == UST__MODE_SHADOW && atomic_load_explicit(&r->verify.paused, memory_order_relaxed)) {
    skip_sampled(r, mode, pol, UST__SKIP_BUDGET);
  } else if (mode == UST__MODE_SHADOW && cand_view(b, r, call, 0, &st->cand) == 0) {
    if ((st->slot = take_slot(b, call, r, &r->shadow_seen, pol, 0, st->cand.proc != NULL, st)) != NULL) {
      st->plan = UST__PLAN_SHADOW; /* a shadowed call times production itself */
      return 1;
    }
  }
  return 0;
}

/* a call chosen to be timed: its floor, and its timer started */
static UST__NOINLINE void begin_timing(ust__binding *b, ust__route *r, const ust__call *call, int legacy,
                                       ust__call_state *st) {
  st->tsol_ps = call_tsol_ps(r, call, st);
  if (call->device == UST__DEV_CPU) {
    st->timing = 1;
    st->t0_ns = ust__now_ns();
  } else if (!legacy || !ust__gpu_capturing(NULL)) { /* an error there: another thread captures */
    st->gpu_slot = ust__timers_begin(b->router->timers, call->device_id, call->stream);
    if (st->gpu_slot >= 0)
      st->timing = 2;
    else
      atomic_fetch_add_explicit(&r->figs.timing_dropped, 1, memory_order_relaxed);
  }
}

/* Whether the n-th call of a route that only observes (standing for w
 * calls) is timed: -1 when it is not, else the stratum it is timed in (UST__TIMED_*). Timed are a sample
 * (the steady share past the key's first steady_after calls) and the first
 * UST__FIRST_TIMED calls of every key, so that no key seen is without a
 * latency, whatever the sampling (sample 0 times none); inside a
 * kernel-tracing window every CUDA call is timed by its kernels; between
 * windows, while the tracer is the timer, only the key's first calls are (by
 * events, kept apart), so that the sampled figures are all kernel time. */
static UST__INLINE int timed_kind(const ust__binding *b, const ust__policy *pol, uint64_t n, unsigned w,
                                  const ust__call *call) {
  if (pol->sample_q32 == 0)
    return -1;
  const int late = n > pol->steady_after;
  /* a call that stands for w calls (n - w + 1 .. n) is sampled when one of them would be */
  const uint32_t q = late ? pol->steady_q32 : pol->sample_q32;
  const int sampled = q == UINT32_MAX || ust__share_floor(n, q) != ust__share_floor(n - w, q);
  const int early = n - w < UST__FIRST_TIMED;
  const int tracing = call->device == UST__DEV_CUDA && b->router->tracer ? ust__timers_tracing(b->router->timers)
                                                                         : UST__TRACING_OFF;
  if (tracing != UST__TRACING_WINDOW && !early && (!sampled || tracing == UST__TRACING_BETWEEN))
    return -1;
  if (early && (!sampled || tracing == UST__TRACING_BETWEEN))
    return UST__TIMED_FIRST; /* timed for being one of the key's first calls */
  return late ? UST__TIMED_STEADY : UST__TIMED_SAMPLED;
}

/* Whether a call in mode asks if its stream captures a graph: a CUDA call.
 * CUDA refuses to capture torch's default stream (the legacy one, NULL): a
 * call on it that only observes skips the question (a driver call, cold on
 * every call of a model); the timer asks before it records there. */
static UST__INLINE int asks_capture(const ust__call *call, int mode) {
  return call->device == UST__DEV_CUDA &&
         (call->stream != NULL || (mode != UST__MODE_OBSERVE && mode != UST__MODE_OFF));
}

/* The plan of the n-th call of route r (DESIGN.md, one call step by step):
 * - during graph capture nothing is timed; a shadow, canary or live route
 *   whose candidate the graph can hold captures both arms behind a gate
 *   (guard/graph.c); else a live candidate is captured alone, everything
 *   else is production;
 * - shadow: production serves; sampled calls also run the candidate;
 * - canary(p): the candidate serves a p share of the calls, live all of
 *   them; a sample of those is verified against production;
 * - otherwise production serves, timed as timed_kind says. */
static UST__NOINLINE void begin_route(ust__binding *b, ust__route *r, uint64_t n, unsigned w, int mode,
                                      uint32_t canary_q32, const ust__call *call, ust__call_state *st) {
  memset(st, 0, sizeof *st);
  st->plan = UST__PLAN_PASS;
  st->route = r;
  st->nested_ok = b->nested_ok;
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  /* past its first steady_after calls a key is sampled at the steady share,
   * and whatever times it is the estimate's late stratum (ust__est_device_time) */
  st->timed_kind = n > pol->steady_after ? UST__TIMED_STEADY : UST__TIMED_SAMPLED;
  const int legacy = call->device == UST__DEV_CUDA && call->stream == NULL;
  if (asks_capture(call, mode) && ust__gpu_capturing(call->stream)) {
    begin_captured(b, r, mode, call, pol, st);
    return;
  }
  if (mode == UST__MODE_OFF)
    return;
  if (mode != UST__MODE_OBSERVE && begin_candidate(b, r, mode, canary_q32, call, pol, st))
    return;
  const int kind = timed_kind(b, pol, n, w, call);
  if (kind < 0)
    return;
  st->timed_kind = kind;
  begin_timing(b, r, call, legacy, st);
}

/* The common case settled in a few lines: a call counted on its route that
 * production alone serves untimed (observed, not sampled, not captured), or
 * an untracked one; st->route says which (NULL: untracked). The rest are
 * planned by begin_route. */
UST__HOT int ust__call_settle(ust__binding *b, const ust__call *call, unsigned w, ust__call_state *st) {
  st->route = NULL;
  if (call->device == UST__DEV_OTHER)
    return 1;
  ust__route_key key;
  const uint64_t h = key_build(b, call, &key);
  ust__route *r = routes_find(b->router, &key, h, b);
  st->route = r;
  if (r == NULL) { /* every call it stands for */
    atomic_fetch_add_explicit(&b->untracked, w, memory_order_relaxed);
    return 1;
  }
  uint32_t canary_q32 = 0;
  const int mode = ust__rollout_mode(&r->rollout, &canary_q32);
  const uint64_t n = atomic_fetch_add_explicit(&r->figs.calls, w, memory_order_relaxed) + w;
  /* after calls, released: a snapshot reads it first (acquire), so never more than its share of them */
  if (w > 1)
    atomic_fetch_add_explicit(&r->figs.estimated, w - 1, memory_order_release);
  if (mode == UST__MODE_OBSERVE && !asks_capture(call, mode) &&
      timed_kind(b, atomic_load_explicit(&b->op->policy, memory_order_acquire), n, w, call) < 0)
    return 1;
  begin_route(b, r, n, w, mode, canary_q32, call, st);
  return 0;
}

UST__HOT void ust__call_end(const ust__call *call, ust__call_state *st, const ust__decision *d) {
  ust__route *r = st->route;
  if (r == NULL)
    return;
  if (st->nested_ok && st->timing != 0) {
    const ust__nested none = {0};
    ust__call_nested_done(st, &none); /* no nested floor reached it: its own */
  }
  if (d->notes & UST__NOTE_INTERNAL)
    ust__call_internal_error(r->binding);
  if (st->graph != NULL) /* a captured shadow the decision did not take to its comparison */
    graph_shadow_end(st, 0, UST__GW_CAPTURE);
  if (d->notes != 0)
    ust__rollout_served(&r->rollout, d->notes, st->capturing);
  if (st->capture_marked && d->outcome == UST__OUT_PRODUCTION)
    ust__timers_captured(r->binding->router->timers, call->stream, st->capture_from, &r->figs, st->tsol_ps);
  if (st->timing == 2) {
    if (d->outcome == UST__OUT_PRODUCTION)
      ust__timers_end(r->binding->router->timers, st->gpu_slot, call->stream, &r->figs, st->tsol_ps, st->timed_kind);
    else
      ust__timers_cancel(r->binding->router->timers, st->gpu_slot);
  } else if (st->timing == 1 && d->outcome == UST__OUT_PRODUCTION) {
    ust__figs_timed(&r->figs, ust__now_ns() - st->t0_ns, st->tsol_ps, st->timed_kind);
  }
  st->timing = 0;
}

void ust__call_mark(ust__call_state *st, int mark, const ust__call *call) {
  if (st->slot != NULL)
    ust__shadow_mark(st->slot, mark, call->device, call->stream);
}

int ust__call_slot_alive(const ust__call_state *st) { return ust__shadow_alive(st->slot); }

void ust__call_note_copied(ust__call_state *st, uint64_t bytes) { ust__shadow_note_copied(st->slot, bytes); }

int ust__call_aa(const ust__call_state *st) { return st->slot != NULL && ust__shadow_aa(st->slot); }

void ust__call_compare(ust__call_state *st, const ust__call *call, const ust__pair *pairs, int n_pairs, int fail,
                       const char *msg) {
  void *slot = st->slot;
  st->slot = NULL;
  ust__shadow_finish(slot, call->device, call->stream, pairs, n_pairs, fail, msg);
}

void ust__call_abandon(ust__call_state *st, const ust__call *call) {
  graph_shadow_end(st, 0, UST__GW_CAPTURE);
  void *slot = st->slot;
  st->slot = NULL;
  ust__shadow_abandon(slot, call->device, call->stream);
}

void ust__call_want_verdict(ust__call_state *st) { ust__shadow_want_verdict(st->slot, &st->verdict); }

int ust__call_verdict(ust__call_state *st, const ust__call *call) {
  ust__route *r = st->route;
  return ust__shadow_verdict(r->binding->router->shadow, &st->verdict, call->device, call->stream, 1) == 1;
}

void ust__call_cand_failed(ust__call_state *st, int fail, const char *msg) {
  ust__route *r = st->route;
  if (r == NULL)
    return;
  ust__evidence *e = failure_evidence(fail, "", msg);
  if (e != NULL) {
    e->serving = 1;
    e->served_at = atomic_load(&r->rollout.served_cand);
  }
  ust__rollout_roll_back(&r->rollout, e);
}

void ust__call_overdue(ust__call_state *st) {
  ust__route *r = st->route;
  if (r != NULL)
    atomic_fetch_add_explicit(&r->verify.overdue, 1, memory_order_relaxed);
}

int ust__call_run_remote(ust__call_state *st, const struct ust_candidate_call *call, char *msg, size_t cap) {
  _Static_assert(UST__CALL_REMOTE_LOST == UST__PROCRUN_LOST && UST__CALL_REMOTE_UNSENT == UST__PROCRUN_UNSENT,
                 "one set of codes");
  return ust__procrun_call(st->cand.proc, call, st->cand.deadline_ns, msg, cap);
}

void ust__call_internal_error(const ust__binding *b) {
  atomic_fetch_add_explicit(&b->router->internal_errors, 1, memory_order_relaxed);
}

/* ---- the sink: verdicts into routes ------------------------------------------------ */

static void sink_failed(void *ctx, void *cookie, ust__evidence *ev) {
  (void)ctx;
  ust__route *r = cookie;
  ust__rollout_roll_back(&r->rollout, ev);
}

static void sink_concluded(void *ctx, void *cookie, const ust__verdict *v) {
  ust__router *router = ctx;
  ust__route *r = cookie;
  if (v->remote) {
    /* a call run in the qualifying process: production's time counts, the
     * candidate's is the wire's, not its kernel's: neither scored nor held
     * against the budget */
    if (v->have_times)
      ust__figs_timed(&r->figs, v->prod_ns, v->tsol_ps, v->timed_kind);
    if (v->kind == UST__VERDICT_PASSED)
      ust__rollout_passed(&r->rollout, v->stage, !v->serving, NAN);
    return;
  }
  if (!v->have_times) {
    /* a replay's verdict: it qualifies the candidate to serve, but has no
     * times to weigh a promotion with */
    if (v->kind == UST__VERDICT_PASSED && !v->serving)
      ust__rollout_qualify(&r->rollout);
    return;
  }
  if (isfinite(v->aa_log_ratio))
    ust__rollout_aa(&r->rollout, v->aa_log_ratio);
  ust__figs_timed(&r->figs, v->prod_ns, v->tsol_ps, v->timed_kind);
  ust__figs_cand_time(&r->figs, v->cand_ns, v->tsol_ps, v->kind == UST__VERDICT_PASSED);
  if (r->binding->cand != NULL && ust__verify_budget(&r->verify, &r->figs, r->binding->cand->max_slowdown))
    ust__log(router->log, UST_LOG_WARN, "%s: shadowing stopped: the candidate's median is %.1fx production's, over "
             "its budget of %gx", r->key_str, (double)atomic_load(&r->verify.paused_ratio_milli) / 1000.0,
             r->binding->cand->max_slowdown);
  if (v->kind == UST__VERDICT_PASSED)
    ust__rollout_passed(&r->rollout, v->stage, !v->serving,
                        v->prod_ns > 0 && v->cand_ns > 0 ? log((double)v->cand_ns / (double)v->prod_ns) : NAN);
}

/* 1 once a graph library changed one of r's captured calls in place (the
 * kernel tracer's callbacks saw it): its replays may no longer run what was
 * captured. */
static int route_replays_stale(ust__route *r) {
  return atomic_load_explicit(&r->figs.graph_changed, memory_order_relaxed) != 0;
}

/* A route's captured calls follow its mode at every replay, as its eager
 * calls do: shadow verifies the sample; canary and live serve the
 * candidate in their share of replays and verify the sample of those
 * (whatever the shadow budget, as eager served calls), once a call on
 * copies has passed (until then every replay is verified on copies, as in
 * shadow); a candidate over its shadow budget is verified in no replay it
 * does not serve; any other mode runs production alone. strict serving
 * waits for a call's verdict before it serves, which a replay cannot: a
 * strict canary or live route's replays are verified as in shadow, with
 * production serving. */
uint64_t ust__route_gate(ust__route *r) {
  uint32_t canary_q32 = 0;
  const int mode = ust__rollout_mode(&r->rollout, &canary_q32);
  const ust__policy *pol = atomic_load_explicit(&r->binding->op->policy, memory_order_acquire);
  if (pol == NULL)
    return 0;
  /* a captured call of the route changed in place by a graph library (the
   * kernel tracer's callbacks saw it): what its sites copy, compare or
   * serve over may no longer be what production's nodes read and write,
   * so its replays run production alone from now on (the route is
   * observe-only under graphs; eager calls are not touched) */
  if (route_replays_stale(r))
    return 0;
  const int paused = atomic_load_explicit(&r->verify.paused, memory_order_relaxed) != 0;
  const int serving = mode == UST__MODE_CANARY || mode == UST__MODE_LIVE;
  const int qualified = ust__rollout_qualified(&r->rollout);
  ust__replay_gate g = {UST__GATE_OFF, pol->sample_q32, 0};
  if (serving && qualified && !pol->strict) {
    g.mode = mode == UST__MODE_LIVE ? UST__GATE_LIVE : UST__GATE_CANARY;
    g.canary_q32 = mode == UST__MODE_LIVE ? UINT32_MAX : canary_q32;
  } else if (serving && !qualified && !paused) {
    g.mode = UST__GATE_SHADOW;
    g.sample_q32 = UINT32_MAX;
  } else if ((mode == UST__MODE_SHADOW || serving) && !paused) {
    g.mode = UST__GATE_SHADOW;
  }
  return g.mode == UST__GATE_OFF ? 0 : ust__gate_pack(g);
}

static uint64_t sink_gate(void *ctx, void *cookie) {
  (void)ctx;
  return ust__route_gate(cookie);
}

static int sink_replays_stale(void *ctx, void *cookie) {
  (void)ctx;
  return route_replays_stale(cookie);
}

const ust__verdict_sink_i ust__router_sink = {sink_failed, sink_concluded, sink_gate, sink_replays_stale};

/* ---- learned output layouts ------------------------------------------------------ */

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
    } else if (a->kind == UST__ARG_INT || a->kind == UST__ARG_BOOL) {
      MIX(a->i);
    } else if (a->kind == UST__ARG_TENSORLIST) {
      return 0; /* the view carries the first tensor only */
    } else if (a->kind == UST__ARG_INTLIST) {
      if (a->i < 0 || a->i > UST__MAX_LIST)
        return 0; /* values the view does not carry could change the layout */
      MIX(a->i);
      for (int64_t k = 0; k < a->i; k++)
        MIX(a->list[k]);
    } else if (a->kind == UST__ARG_DOUBLE) {
      uint64_t bits;
      memcpy(&bits, &a->f, sizeof bits);
      MIX(bits);
    }
  }
#undef MIX
  return h != 0 ? h : 1;
}

int ust__call_layout(const ust__call_state *st, const ust__call *call, ust__layout *out) {
  const ust__route *r = st->route;
  if (r == NULL)
    return -1;
  const uint64_t sig = ust__call_signature(call);
  if (sig == 0)
    return -1;
  for (int i = 0; i < UST__MAX_LAYOUTS; i++) {
    const ust__layout *l = atomic_load_explicit(&((ust__route *)r)->layouts[i], memory_order_acquire);
    if (l == NULL)
      return -1;
    if (l->sig == sig) {
      *out = *l;
      return 0;
    }
  }
  return -1;
}

void ust__call_learn_layout(const ust__call_state *st, const ust__call *call, const ust__layout *l) {
  ust__route *r = st->route;
  const uint64_t sig = ust__call_signature(call);
  if (r == NULL || sig == 0 || l->n_returns < 0 || l->n_returns > UST__MAX_RETURNS)
    return;
  ust__layout *copy = malloc(sizeof *copy);
  if (copy == NULL) {
    ust__call_internal_error(r->binding); /* not learned: served calls without verification fall to production */
    return;
  }
  *copy = *l;
  copy->sig = sig;
  for (int i = 0; i < UST__MAX_LAYOUTS; i++) {
    ust__layout *expected = NULL;
    if (atomic_compare_exchange_strong(&r->layouts[i], &expected, copy))
      return;
    if (expected->sig == sig)
      break; /* learned already */
  }
  free(copy);
}

/* ---- snapshots for the report ---------------------------------------------------------- */

int ust__routes_snapshot(ust__router *router, ust__route_snap **out, int *n_out) {
  ust__route_table *t = &router->routes;
  /* routes made meanwhile land in any slot: the array grows to hold each
   * one found, so none made before the snapshot is left out */
  uint32_t n_alloc = atomic_load(&t->count) + 1;
  ust__route_snap *s = calloc(n_alloc, sizeof *s);
  *out = s;
  *n_out = 0;
  if (s == NULL)
    return ust__error(UST_ENOMEM, "report: out of memory");
  int n = 0, rc = 0;
  for (uint32_t i = 0; i < t->cap && rc == 0; i++) {
    ust__route *r = atomic_load_explicit(&t->slots[i], memory_order_acquire);
    if (r == NULL)
      continue;
    if ((uint32_t)n == n_alloc) {
      ust__route_snap *more = realloc(s, 2 * (size_t)n_alloc * sizeof *s);
      if (more == NULL) {
        rc = ust__error(UST_ENOMEM, "report: out of memory");
        break;
      }
      memset(more + n_alloc, 0, (size_t)n_alloc * sizeof *s);
      *out = s = more;
      n_alloc *= 2;
    }
    ust__route_snap *x = &s[n++];
    memcpy(x->key, r->key_str, sizeof x->key);
    x->binding = r->binding;
    x->k = r->key;
    x->has_cand = r->binding->cand != NULL;
    ust__rollout_snapshot(&r->rollout, &x->rollout); /* served counts first: they grow after calls */
    ust__verify_snapshot(&r->verify, &x->verify);
    rc = ust__figs_snapshot(&r->figs, &x->figs);
  }
  *n_out = n;
  return rc;
}

void ust__routes_snapshot_free(ust__route_snap *s, int n) {
  for (int i = 0; s != NULL && i < n; i++)
    ust__figs_snap_free(&s[i].figs);
  free(s);
}

/* A build without the bridge has no seam; the bridge's definition wins where
 * it is linked. */
__attribute__((weak)) const ust__seam_i *ust__seam(void) { return NULL; }

/* ---- the bridge's accessors ---------------------------------------------------------- */

int ust__in_intercepted_call(void) { return tl_thread.depth > 0; }

/* The hook's head is shared with the bridge (C++): its fields are reached
 * with __atomic builtins on both sides. Sequentially consistent where a call
 * counts itself in flight and then reads the binding, and disable detaches
 * the binding and then moves the epoch on: a call that read a binding before
 * it was detached is counted in an epoch disable waits for, and one counted
 * too late to be waited for reads NULL. */
void ust__hook_attach(ust__hook *h, ust__binding *b) {
  ust__hook_head *hd = &h->head;
  b->hook_epoch = __atomic_load_n(&hd->epoch, __ATOMIC_SEQ_CST) & 1u;
  b->hook_tallied_base = __atomic_load_n(&hd->line->tallied, __ATOMIC_RELAXED);
  atomic_store(&b->hook_counts, 1);
  __atomic_store_n(&hd->binding, b, __ATOMIC_SEQ_CST);
  __atomic_store_n(&hd->line->word, atomic_load(&b->tally), __ATOMIC_SEQ_CST);
}

unsigned ust__hook_detach(ust__hook *h) {
  ust__hook_head *hd = &h->head;
  __atomic_store_n(&hd->line->word, UST__TALLY_OFF, __ATOMIC_SEQ_CST);
  __atomic_store_n(&hd->binding, NULL, __ATOMIC_SEQ_CST);
  return __atomic_fetch_add(&hd->epoch, 1, __ATOMIC_SEQ_CST) & 1u;
}

long ust__hook_inflight(ust__hook *h, unsigned old) {
  return __atomic_load_n(&h->head.inflight[old & 1u], __ATOMIC_ACQUIRE);
}

void ust__hook_republish(ust__hook *h, const ust__binding *b) {
  if (__atomic_load_n(&h->head.binding, __ATOMIC_SEQ_CST) == b)
    __atomic_store_n(&h->head.line->word, atomic_load(&((ust__binding *)b)->tally), __ATOMIC_SEQ_CST);
}

void ust__hook_after_fork(ust__hook *h) {
  __atomic_store_n(&h->head.inflight[0], 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&h->head.inflight[1], 0, __ATOMIC_SEQ_CST);
}

void ust__fork_child(void) { tl_thread.forked = tl_thread.depth; }

/* The calls until the next one keyed at random, one in every (at least 2,
 * as a tally word holds it): a geometric draw (each call keyed with
 * probability 1/every, whatever the calls before it), from the thread's own
 * generator. */
static UST__NOINLINE int64_t key_gap(ust__thread *t, uint32_t every) {
  uint64_t x = t->key_rng;
  if (x == 0) /* seeded once per thread: its block's address and the clock */
    x = ((uint64_t)(uintptr_t)t * 0x9e3779b97f4a7c15ull) ^ ust__now_ns() ^ 0x2545f4914f6cdd1dull;
  if (x == 0)
    x = 1;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  t->key_rng = x;
  const double u = (double)(((x * 0x2545f4914f6cdd1dull) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
  const double gap = floor(log(u) / log1p(-1.0 / every));
  return 1 + (int64_t)(gap < 1e15 ? gap : 1e15);
}

/* A binding's tally word: key_every in its low 16 bits, the engine's number
 * above them; an operator that is off has key_every 0 and no number
 * (UST__TALLY_OFF). */
static UST__INLINE uint32_t word_every(uint64_t word) { return (uint32_t)(word & 0xffffu); }
static UST__INLINE uint64_t word_engine(uint64_t word) { return word >> 16; }

/* A thread's warm-up under a new engine: every call keyed again, up to key_after. */
static UST__NOINLINE void key_restart(ust__binding *b, ust__thread *t, uint64_t word) {
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  t->key_gen = word_engine(word);
  t->key_after = pol->key_after;
  t->key_warm = 0;
  t->key_gap = pol->key_after == 0 ? key_gap(t, word_every(word)) : 0;
  t->key_traced = b->router->tracer;
}

/* A call whose binding's tally word is 0: its operator's policy decides
 * (passed on in mode off, else keyed). */
static UST__NOINLINE int admit_by_policy(const ust__binding *b) {
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  return pol->mode == UST__MODE_OFF ? UST__ADMIT_PASS : 1;
}

/* Every case of the admission, the common one included: a call that
 * admit_word could not settle in its first lines. */
static UST__NOINLINE int admit_other(ust__binding *b, ust__thread *t, uint64_t word) {
  const uint32_t every = word_every(word);
  if (__builtin_expect(every == 0, 0)) /* the operator is off (the word says so), or the policy decides */
    return word == UST__TALLY_OFF ? UST__ADMIT_PASS : admit_by_policy(b);
  if (__builtin_expect(t->key_gen != word_engine(word), 0))
    key_restart(b, t, word);
  if (t->key_warm < t->key_after) {
    if (++t->key_warm == t->key_after) /* the first gap drawn as the warm-up ends */
      t->key_gap = key_gap(t, every);
    return 1;
  }
  /* while the thread captures a graph every call is keyed: its nodes are the route's */
  if (__builtin_expect(t->captures != 0, 0))
    return 1;
  /* inside a kernel-tracing window every call is keyed: its kernels are the route's */
  if (t->key_traced && ust__timers_tracing(b->router->timers) == UST__TRACING_WINDOW)
    return 1;
  if (--t->key_gap > 0)
    return UST__ADMIT_TALLY;
  t->key_gap = key_gap(t, every);
  return (int)every;
}

/* The admission of a call whose binding's tally word is word: its common
 * cases in a few lines, the rest out of line. */
static UST__INLINE int admit_word(ust__binding *b, ust__thread *t, uint64_t word) {
  if (word == UST__TALLY_OFF)
    return UST__ADMIT_PASS;
  if (__builtin_expect(ust__word_tallies(word, t), 1)) {
    t->key_gap--;
    return UST__ADMIT_TALLY;
  }
  return admit_other(b, t, word);
}

int ust__binding_admit(ust__binding *b, ust__thread *t) {
  return admit_word(b, t, atomic_load_explicit(&b->tally, memory_order_relaxed));
}

int ust__hook_admit(ust__hook *h, ust__entry *e) {
  ust__hook_head *const hd = &h->head;
  ust__thread *const t = &tl_thread;
  /* counted in flight on the hook's gate, then the binding read */
  const unsigned ticket = __atomic_load_n(&hd->epoch, __ATOMIC_SEQ_CST) & 1u;
  __atomic_fetch_add(&hd->inflight[ticket], 1, __ATOMIC_SEQ_CST);
  e->thread = t;
  e->hook = hd;
  e->ticket = ticket;
  e->binding = __atomic_load_n(&hd->binding, __ATOMIC_SEQ_CST);
  t->depth++;
  ust__binding *const b = e->binding;
  if (__builtin_expect(b == NULL, 0))
    return UST__ADMIT_PASS;
  if (__builtin_expect((t->own_work | t->call_depth) != 0, 0)) /* both counts, never negative */
    return t->nested != NULL && t->call_depth == 1 ? UST__ADMIT_NESTED : UST__ADMIT_PASS;
  const int w = admit_word(b, t, __atomic_load_n(&hd->line->word, __ATOMIC_ACQUIRE));
  return w == UST__ADMIT_TALLY ? 1 : w;
}

uint64_t ust__tally_word(const ust__policy *pol, uint64_t engine_gen) {
  if (pol->mode == UST__MODE_OFF) /* every call passed on, the policy unread */
    return UST__TALLY_OFF;
  if (pol->mode != UST__MODE_OBSERVE || pol->key_every <= 1)
    return 0;
  const uint64_t numbers = (1ull << 48) - 1; /* the engine's number: 1 to 2^48 - 1, never 0 */
  return (engine_gen % numbers + 1u) << 16 | (pol->key_every & 0xffffu);
}

void ust__binding_tallied(ust__binding *b, unsigned n) {
  atomic_fetch_add_explicit(&b->tallied, n, memory_order_relaxed);
}

/* The hook's count of b's epoch since b was bound, while b reads it. */
static uint64_t hook_tallies(ust__binding *b) {
  if (atomic_load(&b->hook_counts) == 0 || b->hook == NULL)
    return 0;
  return __atomic_load_n(&b->hook->head.line->tallied, __ATOMIC_RELAXED) - b->hook_tallied_base;
}

uint64_t ust__binding_tallied_count(ust__binding *b) { return atomic_load(&b->tallied) + hook_tallies(b); }

void ust__binding_fold_tallies(ust__binding *b) {
  const uint64_t n = hook_tallies(b);
  atomic_store(&b->hook_counts, 0);
  atomic_fetch_add(&b->tallied, n);
}

UST__HOT int ust__binding_needs_names(const ust__binding *b) {
  return atomic_load_explicit(&((ust__binding *)b)->resolved, memory_order_acquire) != 2;
}

const char *ust__binding_display(const ust__binding *b) { return b->display; }
const char *ust__binding_qualname(const ust__binding *b) { return b->qualname; }
const char *ust__binding_overload(const ust__binding *b) { return b->overload; }
const char *ust__binding_arg_name(const ust__binding *b, int i) {
  return i >= 0 && i < b->n_arg_names ? b->arg_names[i] : "?";
}
