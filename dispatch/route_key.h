/*
 * A call's shape key as words, built and hashed inline: every keyed call
 * runs it (dispatch/plan.c), and the route table hashes and compares keys
 * so (dispatch/routes.c). Internal to dispatch/.
 */
#ifndef UST_DISPATCH_ROUTE_KEY_H
#define UST_DISPATCH_ROUTE_KEY_H

#include <stddef.h>
#include <string.h>

#include "dispatch/dispatch.h"

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

static inline uint64_t key_hash(const ust__route_key *k, size_t words) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = KEY_SEED;
  for (size_t i = 0; i < words; i++) {
    uint64_t w;
    memcpy(&w, p + 8 * i, 8);
    h = key_mix(h, w);
  }
  return h ^ (h >> 29);
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

#endif /* UST_DISPATCH_ROUTE_KEY_H */
