/*
 * The route table: an open-addressing array of atomic route pointers, so
 * that lookups and inserts are lock-free and the per-call path takes no
 * lock (the lookup is inline, dispatch/routes.h). Routes are never removed
 * while the engine lives, which is what makes the lock-free read safe; they
 * are freed with the engine, after every call that could see them has left
 * (their hooks drained). Also the routes' snapshots for the report.
 */
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/routes.h"


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
  if (t->slots == NULL)
    return ust__error(UST_ENOMEM, "out of memory for %u route slots", cap);
  int rc = ust__flights_create(UST__FLIGHTS, &r->flights);
  if (rc != 0) {
    free(t->slots);
    t->slots = NULL;
  }
  return rc;
}

static void route_free(ust__route *r) {
  if (r == NULL)
    return;
  ust__figs_free(&r->figs);
  ust__rollout_route_free(&r->rollout);
  for (int i = 0; i < UST__MAX_LAYOUTS; i++)
    free(atomic_load(&r->layouts[i]));
  ust__repro *kept = atomic_load(&r->repro);
  if (kept != NULL)
    kept->destroy(kept);
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
  ust__flights_destroy(r->flights);
  r->flights = NULL;
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

UST__NOINLINE ust__route *ust__routes_add(ust__router *router, const ust__route_key *key, uint64_t h,
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

ust__route *ust__routes_get(ust__router *router, const ust__route_key *key, ust__binding *b) {
  return routes_find(router, key, key_hash(key, key_words(b)), b);
}

/* ---- snapshots for the report ---------------------------------------------------------- */

void ust__fallback_snapshot(const ust__fallback *f, ust__fallback_snap *o) {
  ust__fallback *m = (ust__fallback *)f;
  o->runs = atomic_load(&m->runs);
  o->runs_calling = atomic_load(&m->runs_calling);
  o->aten_calls = atomic_load(&m->aten_calls);
  o->other_calls = atomic_load(&m->other_calls);
  o->bound_calls = atomic_load(&m->bound_calls);
  o->bound_unscored = atomic_load(&m->bound_unscored);
  o->bound_flops = atomic_load(&m->bound_flops);
  o->bound_bytes = atomic_load(&m->bound_bytes);
  o->own_flops = atomic_load(&m->own_flops);
  o->own_bytes = atomic_load(&m->own_bytes);
  int n = atomic_load_explicit(&m->n_ops, memory_order_acquire);
  o->n_ops = n < UST__FALLBACK_OPS ? n : UST__FALLBACK_OPS;
  for (int i = 0; i < o->n_ops; i++) {
    memcpy(o->op[i], m->op[i], sizeof o->op[i]);
    o->op[i][sizeof o->op[i] - 1] = '\0';
    o->op_calls[i] = atomic_load(&m->op_calls[i]);
  }
  o->kernel_runs = atomic_load(&m->kernels.runs);
  o->kernels = atomic_load(&m->kernels.kernels);
  o->kernel_ns = atomic_load(&m->kernels.kernel_ns);
  o->op_kernels = atomic_load(&m->kernels.op_kernels);
  o->op_ns = atomic_load(&m->kernels.op_ns);
}

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
    ust__flight_snapshot(&r->flight, &x->flight);
    ust__fallback_snapshot(&r->fallback, &x->fallback);
    x->repro = atomic_load(&r->repro);
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
