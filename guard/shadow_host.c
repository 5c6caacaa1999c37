/* The device side of the shadow slots in a build without a GPU
 * (guard/shadow_dev.h): there is no device, so shadow.c takes the host path
 * for every call and reaches nothing here but the pool's create and destroy
 * and a slot's reset and release, which have nothing to do. */
#include "guard/shadow_dev.h"

#if !defined(UST_GPU_CUDA) && !defined(UST_GPU_HIP)
int ust__shadow_dev_available(void) { return 0; }
int ust__shadow_dev_create(int n_slots, ust__log_sink *log, pthread_mutex_t *lock, ust__shadow_dev **out) {
  *out = NULL;
  return 0;
}
void ust__shadow_dev_destroy(ust__shadow_dev *d) {}
void ust__shadow_dev_slot_reset(ust__shadow_dev *d, int slot) {}
int ust__shadow_dev_bind(ust__shadow_dev *d, int slot) { return -1; }
int ust__shadow_dev_record(ust__shadow_dev *d, int slot, int i, void *stream) { return -1; }
void ust__shadow_dev_events_free(ust__shadow_dev *d, int slot) {}
double ust__shadow_dev_elapsed_ns(ust__shadow_dev *d, int slot, int from, int to) { return 0; }
int ust__shadow_dev_query(ust__shadow_dev *d, int slot) { return -1; }
ust__cmp_stats *ust__shadow_dev_stats(ust__shadow_dev *d, int slot) { return NULL; }
const ust__cmp_stats *ust__shadow_dev_results(ust__shadow_dev *d, int slot) { return NULL; }
int ust__shadow_dev_zero(ust__shadow_dev *d, ust__cmp_stats *dev_stats, int n_pairs, void *stream) { return -1; }
int ust__shadow_dev_fetch(ust__shadow_dev *d, int slot, int n_pairs, void *stream) { return -1; }
void ust__shadow_dev_stream_sync(ust__shadow_dev *d, void *stream) {}
int ust__shadow_dev_relaxed_begin(void) { return 0; }
void ust__shadow_dev_relaxed_end(int mode) {}
#endif
