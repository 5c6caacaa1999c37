/*
 * The route table's lock-free lookup, inline for every keyed call
 * (dispatch/plan.c); the table itself is dispatch/routes.c. Internal to
 * dispatch/.
 */
#ifndef UST_DISPATCH_ROUTES_H
#define UST_DISPATCH_ROUTES_H

#include "dispatch/route_key.h"

/* A key not in the table at probe: its route made and published there, or
 * the one another thread published first (then the probe goes on); NULL when
 * the table is full or memory ran out. dispatch/routes.c. */
ust__route *ust__routes_add(ust__router *router, const ust__route_key *key, uint64_t h, ust__binding *b,
                            uint32_t probe);

/* Keys hash and compare as words (their head's padding zero); this runs on
 * every observed call. A binding's keys differ only in their head and its
 * own dimensions, and keys of two bindings differ in the head: those words
 * are the key (a route keeps the others zero). */
/* The route of key, whose hash is h: found by probing from h (every call
 * but a key's first), else added. */
static UST__INLINE ust__route *routes_find(ust__router *router, const ust__route_key *key, uint64_t h, ust__binding *b) {
  ust__route_table *t = &router->routes;
  const size_t words = key_words(b);
  const uint32_t mask = t->cap - 1;
  for (uint32_t probe = 0; probe < t->cap; probe++) {
    ust__route *r = atomic_load_explicit(&t->slots[(uint32_t)(h + probe) & mask], memory_order_acquire);
    if (r == NULL)
      return ust__routes_add(router, key, h, b, probe);
    if (r->hash == h && key_equal(&r->key, key, words))
      return r;
  }
  return NULL;
}

#endif /* UST_DISPATCH_ROUTES_H */
