/*
 * base/share.h: the exact-share rule, for host and device code. The n-th
 * event (from 1) of a share q (a fraction of 2^32; UINT32_MAX: all) is
 * taken when floor(n q / 2^32) steps, so exactly floor(n q / 2^32) of the
 * first n are, spread evenly. In 64-bit arithmetic (a device has no
 * 128-bit), writing n = a 2^32 + b: floor(n q / 2^32) = a q + floor(b q / 2^32).
 *
 * Valid C, C++ and CUDA/HIP. Internal header: never installed.
 */
#ifndef UST_BASE_SHARE_H
#define UST_BASE_SHARE_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define UST__HD __host__ __device__
#else
#define UST__HD
#endif

static inline UST__HD uint64_t ust__share_floor(uint64_t n, uint32_t q) {
  return (n >> 32) * q + (((n & 0xffffffffull) * q) >> 32);
}

static inline UST__HD int ust__share_hit(uint64_t n, uint32_t q) {
  return q == UINT32_MAX || (n > 0 && ust__share_floor(n, q) != ust__share_floor(n - 1, q));
}

#endif /* UST_BASE_SHARE_H */
