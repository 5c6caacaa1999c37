/* The ring of comparison results out of CUDA graphs (guard/ring.h): its
 * memory and the host's reader; the device's writer is in compare.cu. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "guard/ring.h"

#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
#define RING_GPU 1
#include "base/gpu_runtime.h"
#endif

_Static_assert(sizeof(ust__ring_entry) % 8u == 0 && offsetof(ust__ring_entry, seq) == 0,
               "an entry is whole words, its sequence word first");

struct ust__ring {
  pthread_mutex_t lock; /* one harvest at a time */
  uint64_t *words;      /* the entries, as the host sees them */
  uint32_t size;
  int on_device;
  ust__ring_dev dev;                /* on_device: the device's addresses */
  _Atomic uint64_t host_counter;    /* else: the next publication number */
  uint64_t next;                    /* the publication the reader waits for (under lock) */
  _Atomic uint64_t lost;
};

static uint64_t *entry_words(const ust__ring *r, uint64_t publication) {
  return r->words + (size_t)(publication & (r->size - 1u)) * UST__RING_WORDS;
}

int ust__ring_create(uint32_t size, int on_device, ust__ring **out) {
  if (out == NULL || size < 2 || size > 65536 || (size & (size - 1u)) != 0)
    return ust__error(UST_EINVAL, "ring: size must be a power of two from 2 to 65536 (got %u)", (unsigned)size);
  ust__ring *r = calloc(1, sizeof *r);
  if (r == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  pthread_mutex_init(&r->lock, NULL);
  r->size = size;
  r->on_device = on_device;
  const size_t bytes = (size_t)size * sizeof(ust__ring_entry);
  if (!on_device) {
    r->words = aligned_alloc(64, bytes);
    if (r->words == NULL) {
      ust__ring_destroy(r);
      return ust__error(UST_ENOMEM, "ring: out of memory for %zu bytes", bytes);
    }
    memset(r->words, 0, bytes);
    *out = r;
    return 0;
  }
#ifdef RING_GPU
  /* entries where the device writes and the host reads without a copy; the
   * counter where the device's atomics are native */
  int rc = UST__GPU_CHECK(NULL, cudaHostAlloc((void **)&r->words, bytes, cudaHostAllocMapped));
  if (rc == 0) {
    memset(r->words, 0, bytes);
    rc = UST__GPU_CHECK(NULL, cudaHostGetDevicePointer((void **)&r->dev.words, r->words, 0));
  } else {
    r->words = NULL;
  }
  const unsigned long long zero = 0;
  if (rc == 0)
    rc = UST__GPU_CHECK(NULL, cudaMalloc((void **)&r->dev.counter, sizeof zero));
  /* zeroed on a stream of its own, never the legacy one: a ring may be made
   * while the caller's (blocking) stream captures a graph */
  cudaStream_t s = NULL;
  if (rc == 0)
    rc = UST__GPU_CHECK(NULL, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (rc == 0) {
    rc = UST__GPU_CHECK(NULL, cudaMemsetAsync(r->dev.counter, 0, sizeof zero, s));
    if (rc == 0)
      rc = UST__GPU_CHECK(NULL, cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
  }
  if (rc != 0) {
    ust__ring_destroy(r);
    return rc;
  }
  r->dev.size = size;
  *out = r;
  return 0;
#else
  ust__ring_destroy(r);
  return ust__error(UST_EGPU, "ring: this build has no GPU backend");
#endif
}

void ust__ring_destroy(ust__ring *r) {
  if (r == NULL)
    return;
  if (!r->on_device) {
    free(r->words);
  } else {
#ifdef RING_GPU
    if (r->words != NULL)
      cudaFreeHost(r->words);
    if (r->dev.counter != NULL)
      cudaFree(r->dev.counter);
    cudaGetLastError();
#endif
  }
  pthread_mutex_destroy(&r->lock);
  free(r);
}

ust__ring_dev ust__ring_device(const ust__ring *r) { return r->dev; }

uint64_t ust__ring_lost(const ust__ring *r) { return atomic_load(&((ust__ring *)r)->lost); }

uint64_t ust__ring_next(const ust__ring *r) {
  pthread_mutex_lock(&((ust__ring *)r)->lock);
  const uint64_t n = r->next;
  pthread_mutex_unlock(&((ust__ring *)r)->lock);
  return n;
}

uint64_t ust__ring_harvest(ust__ring *r, ust__ring_fn fn, void *ctx) {
  uint64_t delivered = 0;
  uint64_t buf[UST__RING_WORDS];
  ust__ring_entry e;
  pthread_mutex_lock(&r->lock);
  for (;;) {
    uint64_t *w = entry_words(r, r->next);
    const uint64_t s1 = __atomic_load_n(&w[0], __ATOMIC_ACQUIRE);
    if (s1 <= r->next)
      break; /* not written yet (0: being written; older: last lap's) */
    if (s1 > r->next + 1) {
      /* a later lap's publication is there: the one waited for is gone */
      atomic_fetch_add(&r->lost, 1);
      r->next++;
      continue;
    }
    /* acquire loads: the second read of the sequence word comes after them */
    for (size_t k = 1; k < UST__RING_WORDS; k++)
      buf[k] = __atomic_load_n(&w[k], __ATOMIC_ACQUIRE);
    const uint64_t s2 = __atomic_load_n(&w[0], __ATOMIC_RELAXED);
    r->next++;
    if (s2 != s1) {
      atomic_fetch_add(&r->lost, 1); /* overwritten while it was read */
      continue;
    }
    buf[0] = s1;
    memcpy(&e, buf, sizeof e);
    if (e.n_pairs > UST__MAX_PAIRS) {
      atomic_fetch_add(&r->lost, 1); /* not a writer of this build's */
      continue;
    }
    fn(ctx, &e);
    delivered++;
  }
  pthread_mutex_unlock(&r->lock);
  return delivered;
}

uint64_t ust__ring_host_publish(ust__ring *r, unsigned int site, const ust__cmp_stats *stats, unsigned int n_pairs,
                                unsigned int runs) {
  if (n_pairs > UST__MAX_PAIRS)
    n_pairs = UST__MAX_PAIRS;
  ust__ring_entry e;
  memset(&e, 0, sizeof e);
  e.site = site;
  e.n_pairs = (unsigned short)n_pairs;
  e.runs = (unsigned short)runs;
  if (n_pairs > 0)
    memcpy(e.stats, stats, n_pairs * sizeof *stats);
  uint64_t buf[UST__RING_WORDS];
  memcpy(buf, &e, sizeof e);
  const uint64_t p = atomic_fetch_add(&r->host_counter, 1);
  uint64_t *w = entry_words(r, p);
  /* the device's order: invalidate, the words (release stores: none is
   * seen before the invalidation), the sequence word last */
  __atomic_store_n(&w[0], 0, __ATOMIC_RELAXED);
  for (size_t k = 1; k < UST__RING_WORDS; k++)
    __atomic_store_n(&w[k], buf[k], __ATOMIC_RELEASE);
  __atomic_store_n(&w[0], p + 1, __ATOMIC_RELEASE);
  return p;
}

#ifndef RING_GPU
int ust__ring_publish_launch(const ust__ring_dev *d, unsigned int site, const ust__cmp_stats *dev_stats,
                             unsigned int n_pairs, const unsigned long long *when, void *stream) {
  (void)d;
  (void)site;
  (void)dev_stats;
  (void)n_pairs;
  (void)when;
  (void)stream;
  return ust__error(UST_EGPU, "ring: this build has no GPU backend");
}
#endif
