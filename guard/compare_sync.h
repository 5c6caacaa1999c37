/*
 * The synchronous comparison (ust_compare_sync): the guard's comparison of
 * two tensors, on a thread that may wait.
 * Internal header: never installed.
 */
#ifndef UST_GUARD_COMPARE_SYNC_H
#define UST_GUARD_COMPARE_SYNC_H

#include <pthread.h>
#include <stdint.h>

#include "base/base.h"
#include "guard/compare.h"

/* ---- the synchronous comparison (ust_compare_sync) ------------------------------ */

/* Result buffers and events kept for reuse per device; one per process
 * context. */
typedef struct ust__compare_cache {
  pthread_mutex_t lock;
  struct ust__cmp_res *free_list;
  ust__log_sink *log;
} ust__compare_cache;

int ust__compare_sync(ust__compare_cache *cache, const DLTensor *p, const DLTensor *c, int kind, double atol,
                      double rtol, void *stream, ust_compare_result *out);
void ust__compare_cache_free(ust__compare_cache *cache);

#endif /* UST_GUARD_COMPARE_SYNC_H */
