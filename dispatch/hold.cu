/*
 * The hold's kernels (dispatch/hold.h, dispatch/hold_gpu.h): CUDA, and HIP
 * from the same source. A hold is one thread of one block; it reads its
 * release word from host memory each turn (a bus read, about a microsecond:
 * the loop needs no pause) and measures its deadline on the device's clock,
 * so it ends whatever the host does.
 */
#if defined(__HIP_PLATFORM_AMD__) || defined(UST_GPU_HIP)
#include <hip/hip_runtime.h>
#define cudaStream_t hipStream_t
#define cudaGetLastError hipGetLastError
#else
#include <cuda_runtime.h>
#endif

#include "dispatch/hold_gpu.h"

static __device__ __forceinline__ unsigned long long device_clock() {
#if (defined(__HIP_PLATFORM_AMD__) || defined(UST_GPU_HIP)) && HIP_VERSION >= 60000000
  return wall_clock64();
#elif defined(__HIP_PLATFORM_AMD__) || defined(UST_GPU_HIP)
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_s_memrealtime(); /* what wall_clock64() reads on the gfx9 and later families */
#else
  return 0; /* the host pass never runs it */
#endif
#else
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

__global__ void ust__hold_kernel(const volatile unsigned *release, unsigned seq, unsigned long long deadline,
                                 volatile unsigned *expired) {
  const unsigned long long t0 = device_clock();
  /* released once the word reaches seq (words only grow; wrap-safe) */
  while (static_cast<int>(*release - seq) < 0) {
    if (device_clock() - t0 >= deadline) {
      *expired = seq;
      __threadfence_system();
      return;
    }
  }
}

/* the calibration's work: a kernel that does nothing */
__global__ void ust__hold_empty() {}

extern "C" int ust__hold_launch(void *stream, const unsigned *release, unsigned seq, unsigned long long deadline_ticks,
                                unsigned *expired) {
  ust__hold_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(release, seq, deadline_ticks, expired);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int ust__hold_empty_launch(void *stream, int n) {
  for (int i = 0; i < n; i++)
    ust__hold_empty<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>();
  return static_cast<int>(cudaGetLastError());
}

extern "C" double ust__hold_ticks_per_ns(int device) {
#if (defined(__HIP_PLATFORM_AMD__) || defined(UST_GPU_HIP)) && HIP_VERSION >= 60000000
  int khz = 0;
  if (hipDeviceGetAttribute(&khz, hipDeviceAttributeWallClockRate, device) != hipSuccess || khz <= 0)
    return 0;
  return khz / 1e6;
#elif defined(__HIP_PLATFORM_AMD__) || defined(UST_GPU_HIP)
  /* a HIP without the attribute: the wall clock of the gfx9 and later
   * families (s_memrealtime) counts at a constant 100 MHz */
  (void)device;
  return 0.1;
#else
  (void)device;
  return 1.0;
#endif
}
