/*
 * What a candidate calls inside its own runs, counted on its route (the
 * router's own part, ust__fallback): torch's ops it called directly by
 * name, the bound ops among them with their work, and on CUDA inside the
 * kernel tracer's windows the kernels of its runs and of those ops.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dispatch/dispatch.h"

int ust__call_span_begin(ust__call_state *st, const ust__call *call) {
  const ust__route *r = st->route;
  if (r == NULL || call->device != UST__DEV_CUDA || !r->binding->router->tracer)
    return -1;
  return ust__timers_span_begin(r->binding->router->timers);
}

void ust__call_span_end(ust__call_state *st, int token, int role) {
  ust__route *r = st->route;
  if (token >= 0)
    ust__timers_span_end(r->binding->router->timers, token, &r->fallback.kernels,
                         role == UST__SPAN_RUN ? UST__KT_RUN : UST__KT_OP);
}

void ust__call_fallback(ust__call_state *st, const ust__call *call, uint64_t aten, uint64_t other, int n,
                        const char *const *names, const uint32_t *counts, const ust__nested *bound) {
  ust__route *r = st->route;
  if (r == NULL)
    return;
  ust__fallback *f = &r->fallback;
  atomic_fetch_add_explicit(&f->runs, 1, memory_order_relaxed);
  if (aten + other > 0)
    atomic_fetch_add_explicit(&f->runs_calling, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->aten_calls, aten, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->other_calls, other, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->bound_calls, (uint64_t)bound->n, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->bound_unscored, (uint64_t)bound->unworked, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->bound_flops, (uint64_t)(bound->work_flops + 0.5), memory_order_relaxed);
  atomic_fetch_add_explicit(&f->bound_bytes, (uint64_t)(bound->work_bytes + 0.5), memory_order_relaxed);
  double flops = 0, bytes = 0; /* the call's own work, without a hardware profile */
  if (ust__binding_work(r->binding, call, &flops, &bytes) == 0) {
    atomic_fetch_add_explicit(&f->own_flops, (uint64_t)(flops + 0.5), memory_order_relaxed);
    atomic_fetch_add_explicit(&f->own_bytes, (uint64_t)(bytes + 0.5), memory_order_relaxed);
  }
  for (int i = 0; i < n; i++) {
    /* a name's slot: found, or claimed (names never leave; past the last
     * slot a name is counted in the totals alone) */
    int k, seen = atomic_load_explicit(&f->n_ops, memory_order_acquire);
    for (k = 0; k < seen && k < UST__FALLBACK_OPS; k++)
      if (strncmp(f->op[k], names[i], sizeof f->op[k] - 1) == 0)
        break;
    if (k == seen || k == UST__FALLBACK_OPS) {
      static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
      pthread_mutex_lock(&names_lock);
      seen = atomic_load_explicit(&f->n_ops, memory_order_relaxed);
      for (k = 0; k < seen; k++)
        if (strncmp(f->op[k], names[i], sizeof f->op[k] - 1) == 0)
          break;
      if (k == seen && seen < UST__FALLBACK_OPS) {
        snprintf(f->op[k], sizeof f->op[k], "%s", names[i]);
        atomic_store_explicit(&f->n_ops, seen + 1, memory_order_release);
      }
      pthread_mutex_unlock(&names_lock);
    }
    if (k < UST__FALLBACK_OPS)
      atomic_fetch_add_explicit(&f->op_calls[k], counts[i], memory_order_relaxed);
  }
}
