/* The host timing backend, and the GPU stubs of a build without a GPU. */
#include <time.h>

#include "dispatch/backend.h"

uint64_t ust__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#if !defined(UST_GPU_CUDA) && !defined(UST_GPU_HIP)
int ust__gpu_available(void) { return 0; }
int ust__gpu_init(int max_pending) { return 0; }
void ust__gpu_shutdown(void) {}
int ust__gpu_capturing(void *stream) { return 0; }
int ust__gpu_timer_begin(int device_id, void *stream) { return -1; }
void ust__gpu_timer_end(int slot, void *stream, struct ust__route *route, uint64_t tsol_ps) {}
int ust__gpu_device_name(int device, char *buf, size_t cap) { return -1; }
void ust__gpu_timer_cancel(int slot) {}
int ust__gpu_harvest(void) { return 0; }
void ust__gpu_harvest_all_sync(void) {}
#endif
