/*
 * A native understudy candidate for vLLM's
 *
 *     _C::rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float eps) -> ()
 *
 * on CUDA tensors of float32, float16 or bfloat16: the GPU twin of
 * rms_norm_cpu.c, with the same arithmetic (float accumulation; for 16-bit
 * types the normalised value is rounded to the element type before the weight
 * multiply, as vLLM does).
 *
 * One block per row. Each thread sums the squares of a strided slice of the
 * row, warps reduce with shuffles, the per-warp sums meet in shared memory and
 * the first warp reduces those. The kernel is launched on the caller's stream
 * (call->stream) and nothing here synchronises.
 *
 *   (none)                    correct                     "rms_norm_cuda"
 *   UST_EXAMPLE_WRONG_TAIL    the last row's last element  "rms_norm_cuda_wrong_tail"
 *                             is off by at least 1 + |y|
 *   UST_EXAMPLE_WRONG_WRITES_INPUT  correct, then writes     "rms_norm_cuda_writes_input"
 *                             1234 into each row's first input element (which it may only read)
 *   UST_EXAMPLE_WRONG_SATURATES  stores through a         "rms_norm_cuda_saturates"
 *                             saturating conversion to [-8, 8]: right while
 *                             every result is within it (unit-scale weights),
 *                             wrong on rows whose results are not
 *   UST_EXAMPLE_WRONG_FAULTS  writes far past its output  "rms_norm_cuda_faults"
 *                             (an illegal address: the kernel faults, and the
 *                             CUDA context that ran it is lost for good)
 *   UST_EXAMPLE_SLOW          correct, its kernel run 64   "rms_norm_cuda_slow"
 *                             times over (each run writes the same results):
 *                             a candidate over any shadow budget
 *
 * The same source builds with hipcc: the few runtime names it uses are
 * aliased below, and the reduction reads the warp width at run time.
 */
#if defined(__HIPCC__)
#include <hip/hip_bf16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaStream_t hipStream_t
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
typedef __hip_bfloat16 rms_bf16_t;
#define RMS_DL_DEVICE kDLROCM
#define RMS_SHFL_XOR(v, offset) __shfl_xor((v), (offset))
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
typedef __nv_bfloat16 rms_bf16_t;
#define RMS_DL_DEVICE kDLCUDA
#define RMS_SHFL_XOR(v, offset) __shfl_xor_sync(0xffffffffu, (v), (offset))
#endif

#include <stdint.h>

#include "rms_norm_args.h"

#if defined(UST_EXAMPLE_WRONG_TAIL)
#define RMS_NAME "rms_norm_cuda_wrong_tail"
#define RMS_WRONG_TAIL true
#define RMS_WRITES_INPUT false
#elif defined(UST_EXAMPLE_WRONG_WRITES_INPUT)
#define RMS_NAME "rms_norm_cuda_writes_input"
#define RMS_WRONG_TAIL false
#define RMS_WRITES_INPUT true
#elif defined(UST_EXAMPLE_WRONG_SATURATES)
#define RMS_NAME "rms_norm_cuda_saturates"
#define RMS_WRONG_TAIL false
#define RMS_WRITES_INPUT false
#define RMS_SATURATES true
#elif defined(UST_EXAMPLE_WRONG_FAULTS)
#define RMS_NAME "rms_norm_cuda_faults"
#define RMS_WRONG_TAIL false
#define RMS_WRITES_INPUT false
#define RMS_FAULTS true
#elif defined(UST_EXAMPLE_SLOW)
#define RMS_NAME "rms_norm_cuda_slow"
#define RMS_WRONG_TAIL false
#define RMS_WRITES_INPUT false
#define RMS_RUNS 64
#else
#define RMS_NAME "rms_norm_cuda"
#define RMS_WRONG_TAIL false
#define RMS_WRITES_INPUT false
#endif
#ifndef RMS_FAULTS
#define RMS_FAULTS false
#endif
#ifndef RMS_RUNS
#define RMS_RUNS 1
#endif
#ifndef RMS_SATURATES
#define RMS_SATURATES false
#endif

/* Block width: enough threads for short rows, 1024 at most; a multiple of 64
 * so that blocks are whole warps on both CUDA (32) and AMD (64). */
#define RMS_MAX_THREADS 1024
#define RMS_MAX_WARPS 32 /* RMS_MAX_THREADS / the narrowest warp */

extern "C" __attribute__((visibility("default"))) const ust_candidate *ust_candidate_get(void);

namespace {

template <typename T> struct elem;

template <> struct elem<float> {
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};

template <> struct elem<__half> {
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};

template <> struct elem<rms_bf16_t> {
  static __device__ __forceinline__ float load(rms_bf16_t v) { return __bfloat162float(v); }
  static __device__ __forceinline__ rms_bf16_t store(float v) { return __float2bfloat16(v); }
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = warpSize / 2; offset > 0; offset /= 2)
    v += RMS_SHFL_XOR(v, offset);
  return v;
}

/* Every thread of the block must call this: it synchronises the block. */
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[RMS_MAX_WARPS];
  const int lane = threadIdx.x % warpSize;
  const int warp = threadIdx.x / warpSize;
  const int n_warps = (blockDim.x + warpSize - 1) / warpSize;
  v = warp_sum(v);
  if (lane == 0)
    warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < n_warps ? warp_sums[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0)
      warp_sums[0] = v;
  }
  __syncthreads();
  return warp_sums[0];
}

template <typename T>
__global__ void __launch_bounds__(RMS_MAX_THREADS)
    rms_norm_kernel(T *__restrict__ out, const T *__restrict__ in, const T *__restrict__ weight, rms_rows layout,
                    int64_t n, float eps) {
  const int64_t row = blockIdx.x;
  int64_t in_off, out_off;
  rms_row_offsets(&layout, row, &in_off, &out_off);
  const T *x = in + in_off;
  T *y = out + out_off;

  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = elem<T>::load(x[j]);
    sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sq) / (float)n + eps);

  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float normed = elem<T>::load(elem<T>::store(elem<T>::load(x[j]) * inv));
    float v = normed * elem<T>::load(weight[j]);
    if (RMS_WRONG_TAIL && row == (int64_t)gridDim.x - 1 && j == n - 1)
      v = isfinite(v) ? 1.0f + 2.0f * fabsf(v) : 0.0f;
    if (RMS_SATURATES)
      v = fminf(fmaxf(v, -8.0f), 8.0f);
    y[j] = elem<T>::store(v);
  }
  if (RMS_WRITES_INPUT) {
    __syncthreads(); /* the row is read: scratch space taken from an input, a classic bug */
    if (threadIdx.x == 0)
      const_cast<T *>(x)[0] = elem<T>::store(1234.0f);
  }
  if (RMS_FAULTS && row == 0 && threadIdx.x == 0)
    *(volatile T *)((char *)out + (1ull << 46)) = elem<T>::store(0.0f); /* 64 TiB past it: no one's memory */
}

template <typename T>
void launch(const rms_norm_args &a, unsigned threads, cudaStream_t stream) {
  for (int i = 0; i < RMS_RUNS; i++)
    rms_norm_kernel<T><<<(unsigned)a.rows, threads, 0, stream>>>((T *)a.out, (const T *)a.in, (const T *)a.weight,
                                                                  a.layout, a.n, a.eps);
}

int rms_norm_cuda_run(void *ctx, const ust_candidate_call *call, char *msg, size_t msg_cap) {
  (void)ctx;
  rms_norm_args a;
  const int rc = rms_norm_parse(call, RMS_DL_DEVICE, &a, msg, msg_cap);
  if (rc != 0)
    return rc;
  if (a.rows == 0 || a.n == 0) {
    rms_clear_msg(msg, msg_cap);
    return 0;
  }
  if (a.rows > INT32_MAX)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "%lld rows exceed the grid's limit of %d blocks", (long long)a.rows,
                    INT32_MAX);

  /* Launch on the tensors' device; put the caller's current device back. */
  int prev = -1;
  cudaError_t err = cudaGetDevice(&prev);
  if (err == cudaSuccess && prev != call->device.device_id)
    err = cudaSetDevice(call->device.device_id);
  if (err != cudaSuccess)
    return rms_fail(msg, msg_cap, RMS_EGPU, "cannot select device %d: %s", (int)call->device.device_id,
                    cudaGetErrorString(err));

  const int64_t want = (a.n + 63) / 64 * 64;
  const unsigned threads = (unsigned)(want < RMS_MAX_THREADS ? want : RMS_MAX_THREADS);
  cudaStream_t stream = (cudaStream_t)call->stream;
  switch (a.dtype) {
  case RMS_F32:
    launch<float>(a, threads, stream);
    break;
  case RMS_F16:
    launch<__half>(a, threads, stream);
    break;
  case RMS_BF16:
    launch<rms_bf16_t>(a, threads, stream);
    break;
  }
  err = cudaGetLastError();
  if (prev != call->device.device_id)
    cudaSetDevice(prev);
  if (err != cudaSuccess)
    return rms_fail(msg, msg_cap, RMS_EGPU, "rms_norm_kernel launch (%lld rows, %u threads): %s", (long long)a.rows,
                    threads, cudaGetErrorString(err));
  rms_clear_msg(msg, msg_cap);
  return 0;
}

const ust_candidate rms_norm_cuda_candidate = {
    sizeof(ust_candidate), UST_CANDIDATE_ABI_VERSION, RMS_NAME, "_C::rms_norm", rms_norm_cuda_run, NULL,
    0, // flags: it keeps the capture contract (one launch on the call's stream, nothing synchronised)
    0, // reserved
};

} // namespace

extern "C" const ust_candidate *ust_candidate_get(void) {
  return &rms_norm_cuda_candidate;
}
