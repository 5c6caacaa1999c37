// The comparison kernel: one pass over a pair of dense buffers (production,
// candidate) that reduces mismatches, non-finite counts, max abs/rel error
// and L2 sums into a ust__cmp_stats in device memory.
//
// Single source for CUDA and HIP (gpu_runtime.h maps the names). Each thread
// reads 16-byte vectors of both buffers in a grid-stride loop, judges every
// element with the shared rule (compare_elem.h), reduces across its warp and
// block, and one thread per block folds the block's figures in with atomics.
#include <stdint.h>

#include <atomic>
#include <type_traits>

#if defined(UST_GPU_HIP)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define UST__SHFL_DOWN(v, o) __shfl_down((v), (o))
// HIP's wavefront (warpSize, the shuffles' default width): 64 lanes on
// GCN/CDNA (gfx9*, e.g. gfx90a, gfx942), 32 on RDNA (gfx10-12, where HIP
// supports only wave32). Only the device pass's value is ever run.
#if defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__)
#define UST__WARP 32
#else
#define UST__WARP 64
#endif
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define UST__SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#define UST__WARP 32
#endif

#include "base/gpu_runtime.h"
#include "guard/compare_elem.h"
#include "guard/compare.h"
#include "guard/gate.h"
#include "guard/ring.h"

#include "understudy/understudy.h"

extern "C" int ust__error(int err, const char *fmt, ...);

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2; // vectors in flight per thread (4 measured slower on the H200)

template <typename M> struct Acc {
  UST__CMP_ACC_FIELDS(M)
};

template <typename T> struct Traits;
template <> struct Traits<__half> {
  using M = float;
  static __device__ M load(__half v) { return __half2float(v); }
};
struct bf16_t {
  uint16_t bits;
};
template <> struct Traits<bf16_t> {
  using M = float;
  static __device__ M load(bf16_t v) { return __uint_as_float(UST__BF16_BITS_TO_F32_BITS(v.bits)); }
};
template <> struct Traits<float> {
  using M = float;
  static __device__ M load(float v) { return v; }
};
template <> struct Traits<double> {
  using M = double;
  static __device__ M load(double v) { return v; }
};

// Integers compare exactly; their error figures are kept in double.
template <typename T> struct IntTraits {
  using M = double;
};
template <> struct Traits<int8_t> : IntTraits<int8_t> {};
template <> struct Traits<uint8_t> : IntTraits<uint8_t> {};
template <> struct Traits<int16_t> : IntTraits<int16_t> {};
template <> struct Traits<int32_t> : IntTraits<int32_t> {};
template <> struct Traits<int64_t> : IntTraits<int64_t> {};

__device__ __forceinline__ int dev_isfinite_f(float x) { return isfinite(x); }
__device__ __forceinline__ int dev_isfinite_d(double x) { return isfinite(x); }
__device__ __forceinline__ int dev_isnan_f(float x) { return isnan(x); }
__device__ __forceinline__ int dev_isnan_d(double x) { return isnan(x); }

template <typename T, bool Int> struct Elem;
template <typename T> struct Elem<T, false> {
  using M = typename Traits<T>::M;
  // ssd, ssp: where the squares go (float partials in the vector loop).
  template <typename S>
  static __device__ __forceinline__ void run(T pv, T cv, M atol, M rtol, int exact, unsigned long long idx,
                                             Acc<M> &a, S &ssd, S &ssp) {
    if constexpr (sizeof(M) == 4)
      UST__CMP_FLOAT_ELEM(M, S, fabsf, dev_isfinite_f, dev_isnan_f, Traits<T>::load(pv), Traits<T>::load(cv), atol,
                          rtol, exact, idx, a, ssd, ssp);
    else
      UST__CMP_FLOAT_ELEM(M, S, fabs, dev_isfinite_d, dev_isnan_d, Traits<T>::load(pv), Traits<T>::load(cv), atol,
                          rtol, exact, idx, a, ssd, ssp);
  }
};
template <typename T> struct Elem<T, true> {
  using M = double;
  template <typename S>
  static __device__ __forceinline__ void run(T pv, T cv, M, M, int, unsigned long long idx, Acc<M> &a, S &, S &) {
    UST__CMP_INT_ELEM((long long)pv, (long long)cv, idx, a);
  }
};

template <typename T> using MathOf = typename Traits<T>::M;

// One 16-byte vector as values of the math type. bf16 is the high half of a
// float: the low element of a 32-bit word is the word shifted up, the high
// one the word with its low half cleared (one instruction each).
template <typename T> struct Vec;
template <> struct Vec<bf16_t> {
  static __device__ __forceinline__ void unpack(const uint4 &w, float (&out)[8]) {
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      out[2 * i] = __uint_as_float(u[i] << 16);
      out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};
template <> struct Vec<__half> {
  static __device__ __forceinline__ void unpack(const uint4 &w, float (&out)[8]) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&w);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float2 f = __half22float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};
template <> struct Vec<float> {
  static __device__ __forceinline__ void unpack(const uint4 &w, float (&out)[4]) {
    out[0] = __uint_as_float(w.x);
    out[1] = __uint_as_float(w.y);
    out[2] = __uint_as_float(w.z);
    out[3] = __uint_as_float(w.w);
  }
};
template <> struct Vec<double> {
  static __device__ __forceinline__ void unpack(const uint4 &w, double (&out)[2]) {
    out[0] = __hiloint2double((int)w.y, (int)w.x);
    out[1] = __hiloint2double((int)w.w, (int)w.z);
  }
};

__device__ __forceinline__ float dev_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double dev_abs(double x) { return fabs(x); }
__device__ __forceinline__ float dev_max(float x, float y) { return fmaxf(x, y); }
__device__ __forceinline__ double dev_max(double x, double y) { return fmax(x, y); }

// The common case of one vector, judged with a few instructions an element
// and no branch: every pair finite and within tolerance. exact arrives as
// atol = rtol = 0 (for finite values |c - p| <= 0 is c == p). A non-finite
// candidate makes |c - p| fail the tolerance; a non-finite production value
// makes the sum of p^2 non-finite. When it holds, the figures are exactly
// those of the full rule (the squares summed in the math type first), and
// the relative error, whose maximum moves rarely, is divided out only for a
// vector that holds a new maximum. Returns false, having changed nothing,
// when the vector needs the full rule.
template <typename M, int N>
__device__ __forceinline__ bool judge_fast(const M (&p)[N], const M (&c)[N], M atol, M rtol, Acc<M> &a) {
  const M inf = (M)INFINITY, thr = a.max_rel;
  M mx = a.max_abs, sd = 0, sp = 0;
  bool ok = true, rel = false;
#pragma unroll
  for (int k = 0; k < N; k++) {
    const M d = c[k] - p[k], ad = dev_abs(d), ap = dev_abs(p[k]);
    ok &= ad <= atol + rtol * ap;
    mx = dev_max(mx, ad);
    rel |= ad > thr * ap;
    sd += d * d;
    sp += p[k] * p[k];
  }
  if (!(ok && sp < inf && sd < inf))
    return false;
  a.max_abs = mx;
  a.ssd += (double)sd;
  a.ssp += (double)sp;
  if (rel) {
#pragma unroll
    for (int k = 0; k < N; k++) {
      const M ad = dev_abs(c[k] - p[k]), ap = dev_abs(p[k]);
      if (ap > 0 && ad > a.max_rel * ap)
        a.max_rel = ad / ap;
    }
  }
  return true;
}

__device__ __forceinline__ unsigned long long dbits(double d) { return (unsigned long long)__double_as_longlong(d); }

template <typename V> __device__ __forceinline__ V warp_sum(V v) {
  for (int o = UST__WARP / 2; o > 0; o >>= 1)
    v += UST__SHFL_DOWN(v, o);
  return v;
}
template <typename V> __device__ __forceinline__ V warp_max(V v) {
  for (int o = UST__WARP / 2; o > 0; o >>= 1) {
    V w = UST__SHFL_DOWN(v, o);
    v = w > v ? w : v;
  }
  return v;
}
template <typename V> __device__ __forceinline__ V warp_min(V v) {
  for (int o = UST__WARP / 2; o > 0; o >>= 1) {
    V w = UST__SHFL_DOWN(v, o);
    v = w < v ? w : v;
  }
  return v;
}

// One warp's figures into its lane 0: counts add, the first mismatch is the
// smallest index, maxima and sums as named.
__device__ __forceinline__ void reduce_warp(unsigned long long c[5], double mx[2], double sm[2]) {
  for (int k = 0; k < 4; k++)
    c[k] = warp_sum(c[k]);
  c[4] = warp_min(c[4]);
  for (int k = 0; k < 2; k++) {
    mx[k] = warp_max(mx[k]);
    sm[k] = warp_sum(sm[k]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) compare_kernel(const T *__restrict__ prod, const T *__restrict__ cand,
                                                           long long n, int vec_ok, MathOf<T> atol,
                                                           MathOf<T> rtol, int exact, ust__cmp_stats *out) {
  using M = MathOf<T>;
  constexpr bool kInt = std::is_integral<T>::value;
  constexpr int kVec = 16 / sizeof(T);
  Acc<M> a;
  UST__CMP_ACC_INIT(a);
  const M fast_atol = exact ? (M)0 : atol, fast_rtol = exact ? (M)0 : rtol;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long done = 0;
  if (vec_ok) {
    const long long nv = n / kVec;
    const uint4 *pv = reinterpret_cast<const uint4 *>(prod);
    const uint4 *cv = reinterpret_cast<const uint4 *>(cand);
    // kUnroll vectors per thread and iteration, all loaded before any is
    // judged (independent loads, no copy between them), so that more bytes
    // are in flight per thread.
    auto judge = [&](const uint4 &pw, const uint4 &cw, long long v) {
      if constexpr (!kInt) {
        M p[kVec], c[kVec];
        Vec<T>::unpack(pw, p);
        Vec<T>::unpack(cw, c);
        if (judge_fast<M, kVec>(p, c, fast_atol, fast_rtol, a))
          return;
      }
      // The full rule, element by element, from scratch.
      const T *pe = reinterpret_cast<const T *>(&pw);
      const T *ce = reinterpret_cast<const T *>(&cw);
#pragma unroll
      for (int k = 0; k < kVec; k++)
        Elem<T, kInt>::run(pe[k], ce[k], atol, rtol, exact, (unsigned long long)(v * kVec + k), a, a.ssd, a.ssp);
    };
    for (long long v = tid; v < nv; v += kUnroll * stride) {
      uint4 pw[kUnroll], cw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (v + u * stride < nv) {
          pw[u] = __ldg(pv + v + u * stride);
          cw[u] = __ldg(cv + v + u * stride);
        }
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (v + u * stride < nv)
          judge(pw[u], cw[u], v + u * stride);
    }
    done = nv * kVec;
  }
  for (long long i = done + tid; i < n; i += stride)
    Elem<T, kInt>::run(prod[i], cand[i], atol, rtol, exact, (unsigned long long)i, a, a.ssd, a.ssp);

  // Block reduction: warps first, then the first warp over the warp results.
  __shared__ unsigned long long s_cnt[5][kThreads / UST__WARP];
  __shared__ double s_max[2][kThreads / UST__WARP];
  __shared__ double s_sum[2][kThreads / UST__WARP];
  unsigned long long c[5] = {a.mismatches, a.nf_prod, a.nf_cand, a.nf_bad, a.first};
  double mx[2] = {(double)a.max_abs, (double)a.max_rel};
  double sm[2] = {a.ssd, a.ssp};
  reduce_warp(c, mx, sm);
  const int lane = threadIdx.x % UST__WARP, warp = threadIdx.x / UST__WARP;
  if (lane == 0) {
    for (int k = 0; k < 5; k++)
      s_cnt[k][warp] = c[k];
    for (int k = 0; k < 2; k++) {
      s_max[k][warp] = mx[k];
      s_sum[k][warp] = sm[k];
    }
  }
  __syncthreads();
  if (warp != 0)
    return;
  constexpr int kWarps = kThreads / UST__WARP;
  for (int k = 0; k < 5; k++)
    c[k] = lane < kWarps ? s_cnt[k][lane] : (k == 4 ? ~0ull : 0ull);
  for (int k = 0; k < 2; k++) {
    mx[k] = lane < kWarps ? s_max[k][lane] : 0.0;
    sm[k] = lane < kWarps ? s_sum[k][lane] : 0.0;
  }
  reduce_warp(c, mx, sm);
  if (lane != 0)
    return;
  if (c[0])
    atomicAdd(&out->mismatches, c[0]);
  if (c[1])
    atomicAdd(&out->nonfinite_prod, c[1]);
  if (c[2])
    atomicAdd(&out->nonfinite_cand, c[2]);
  if (c[3])
    atomicAdd(&out->nonfinite_bad, c[3]);
  if (c[4] != ~0ull)
    atomicMax(&out->first_mismatch_inv, ~c[4]);
  if (mx[0] > 0)
    atomicMax(&out->max_abs_bits, dbits(mx[0]));
  if (mx[1] > 0)
    atomicMax(&out->max_rel_bits, dbits(mx[1]));
  if (sm[0] != 0)
    atomicAdd(&out->sum_sq_diff, sm[0]);
  if (sm[1] != 0)
    atomicAdd(&out->sum_sq_prod, sm[1]);
  if (blockIdx.x == 0)
    atomicAdd(&out->n, (unsigned long long)n);
}

// The blocks of compare_kernel<T> that are resident at once on the current
// device (SMs times blocks per SM at the kernel's register use): the grid
// is one wave of them. Cached per device; 0 when the runtime cannot say.
template <typename T> int resident_blocks(void) {
  static std::atomic<int> cached[64]; // written once per device; any thread may
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
    return 0;
  if (cached[dev].load(std::memory_order_relaxed) == 0) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0 ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, compare_kernel<T>, kThreads, 0) != cudaSuccess ||
        per_sm <= 0)
      return 0;
    cached[dev].store(sms * per_sm, std::memory_order_relaxed);
  }
  return cached[dev].load(std::memory_order_relaxed);
}

template <typename T>
int launch(const void *prod, const void *cand, long long n, int kind, double atol, double rtol, ust__cmp_stats *out,
           cudaStream_t stream) {
  using M = MathOf<T>;
  constexpr int kVec = 16 / sizeof(T);
  const int vec_ok = (reinterpret_cast<uintptr_t>(prod) % 16 == 0) && (reinterpret_cast<uintptr_t>(cand) % 16 == 0);
  long long work = vec_ok ? (n + kVec - 1) / kVec : n;
  long long blocks = (work + kThreads - 1) / kThreads;
  const int resident = resident_blocks<T>();
  const long long cap = resident > 0 ? resident : 1024; // the loop is grid-stride: any size is correct
  if (blocks > cap)
    blocks = cap;
  if (blocks < 1)
    blocks = 1;
  compare_kernel<T><<<(unsigned)blocks, kThreads, 0, stream>>>(static_cast<const T *>(prod),
                                                               static_cast<const T *>(cand), n, vec_ok, (M)atol,
                                                               (M)rtol, kind == UST__CMP_EXACT, out);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return ust__error(UST_EGPU, "compare kernel launch failed: %s", cudaGetErrorString(err));
  return 0;
}

} // namespace

extern "C" int ust__compare_launch(const void *prod, const void *cand, int dtype, int64_t n, int kind, double atol,
                                   double rtol, ust__cmp_stats *dev_out, void *stream) {
  if (n <= 0)
    return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
  case UST__DT_F16: return launch<__half>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_BF16: return launch<bf16_t>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_F32: return launch<float>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_F64: return launch<double>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_I8: return launch<int8_t>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_U8: case UST__DT_BOOL: return launch<uint8_t>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_I16: return launch<int16_t>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_I32: return launch<int32_t>(prod, cand, n, kind, atol, rtol, dev_out, s);
  case UST__DT_I64: return launch<int64_t>(prod, cand, n, kind, atol, rtol, dev_out, s);
  }
  return ust__error(UST_EINVAL, "compare: dtype %s is not supported", ust__dtype_name(dtype));
}

// ---- the ring's writer (guard/ring.h) -------------------------------------------------

static_assert(offsetof(ust__ring_entry, stats) == 16 && sizeof(ust__cmp_stats) % 8 == 0,
              "an entry: the sequence word, site and n_pairs in one word, then the statistics' words");

// One block: thread 0 takes the publication number and clears its entry's
// sequence word; the block writes the words; thread 0 writes the sequence
// word last, after every thread's words reached the host (system fences).
// A gate (a site's runs word) publishes only the replays it verifies.
__global__ void ring_publish(ust__ring_dev d, unsigned site, const unsigned long long *stats, unsigned n_pairs,
                             const unsigned long long *when) {
  if (when != nullptr && (*(const volatile unsigned long long *)when & UST__GATE_RUN_VERIFY) == 0)
    return; // the whole block: one value
  __shared__ unsigned long long pub;
  if (threadIdx.x == 0) {
    pub = atomicAdd(d.counter, 1ull);
    *(volatile unsigned long long *)(d.words + (pub & (d.size - 1u)) * UST__RING_WORDS) = 0ull;
    __threadfence_system();
  }
  __syncthreads();
  volatile unsigned long long *w = d.words + (pub & (d.size - 1u)) * UST__RING_WORDS;
  const unsigned n_words = n_pairs * (unsigned)(sizeof(ust__cmp_stats) / 8);
  // the entry's second word: site, n_pairs and the replay's run bits (ust__ring_entry)
  const unsigned long long runs = when != nullptr ? (*(const volatile unsigned long long *)when & 0xffffull) : 0ull;
  for (unsigned k = 1 + threadIdx.x; k < UST__RING_WORDS; k += blockDim.x)
    w[k] = k == 1 ? (unsigned long long)site | ((unsigned long long)n_pairs | runs << 16) << 32
                  : (k - 2 < n_words ? stats[k - 2] : 0ull);
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    w[0] = pub + 1;
}

extern "C" int ust__ring_publish_launch(const ust__ring_dev *d, unsigned int site, const ust__cmp_stats *dev_stats,
                                        unsigned int n_pairs, const unsigned long long *when, void *stream) {
  if (n_pairs > UST__MAX_PAIRS)
    return ust__error(UST_EINVAL, "ring: %u pairs, more than an entry holds (%d)", n_pairs, UST__MAX_PAIRS);
  ring_publish<<<1, 64, 0, static_cast<cudaStream_t>(stream)>>>(
      *d, site, reinterpret_cast<const unsigned long long *>(dev_stats), n_pairs, when);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : ust__error(UST_EGPU, "ring: publish launch: %s", cudaGetErrorString(e));
}

// ---- the per-replay condition of a captured shadow (guard/gate.h) ----------------------

#if defined(UST_GPU_CUDA)
// A replay's decision, from the gate word and the site's counters as the
// last replay left them: the counters it leaves (commit_replay writes them).
struct replay_decision {
  unsigned long long replays, served, runs;
};

__device__ replay_decision decide_replay(const unsigned long long *word, const ust__gate_counters *c) {
  // the three loads issued together (L2: the host's copy and the last replay's writes)
  const unsigned long long w = __ldcg(word), replays = __ldcg(&c->replays), served = __ldcg(&c->served);
  const ust__gate_choice ch = ust__gate_decide(ust__gate_unpack(w), replays + 1, served);
  return {replays + 1, served + (ch.candidate ? 1 : 0), ust__gate_runs(ch)};
}

__device__ void commit_replay(ust__gate_counters *c, const replay_decision &d) {
  c->replays = d.replays;
  c->served = d.served;
  c->runs = d.runs;
}

// One thread: the replay's decision (first condition of the replay), then
// the conditional node's handle set from it.
// The condition is set only to open it: every launch of the graph starts
// it at its default, 0 (cudaGraphCondAssignDefault).
__global__ void gate_kernel(const unsigned long long *word, ust__gate_counters *c, int first,
                            cudaGraphConditionalHandle handle) {
  unsigned long long runs;
  if (first) {
    const replay_decision d = decide_replay(word, c);
    commit_replay(c, d);
    runs = d.runs;
  } else {
    runs = __ldcg(&c->runs);
  }
  if (runs != 0)
    cudaGraphSetConditional(handle, 1u);
}

// A span copied by the threads of a grid: 16-byte vectors where both ends
// share their alignment (bytes before the first aligned address and after
// the last whole vector), else bytes.
__device__ void copy_span(unsigned char *dst, const unsigned char *src, size_t bytes, size_t i0, size_t stride) {
  const size_t lead = (16u - ((uintptr_t)dst & 15u)) & 15u;
  const size_t head = (((uintptr_t)dst ^ (uintptr_t)src) & 15u) != 0 || lead > bytes ? bytes : lead;
  const size_t vectors = (bytes - head) / 16, tail = head + vectors * 16;
  for (size_t i = i0; i < head; i += stride)
    dst[i] = src[i];
  uint4 *vd = reinterpret_cast<uint4 *>(dst + head);
  const uint4 *vs = reinterpret_cast<const uint4 *>(src + head);
  for (size_t i = i0; i < vectors; i += stride)
    vd[i] = vs[i];
  for (size_t i = tail + i0; i < bytes; i += stride)
    dst[i] = src[i];
}

// A copy over production's result, in the replays the candidate serves.
__global__ void gate_copy(unsigned char *dst, const unsigned char *src, size_t bytes, const ust__gate_counters *c) {
  if ((*(const volatile unsigned long long *)&c->runs & UST__GATE_RUN_SERVE) == 0)
    return;
  copy_span(dst, src, bytes, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
}

// The body of a shadow beside the chain, started from the device
// (fire-and-forget: it runs beside the rest of the caller's graph, whose
// launch ends when it does). A launch the device refuses (more than it
// takes in one launch of the caller's graph) is counted, its replay left
// unverified. A build without relocatable device code cannot launch: every
// attempt counts as refused (graph.c does not ask such a build to).
__device__ void start_body(cudaGraphExec_t body, ust__gate_counters *c) {
#if defined(__CUDACC_RDC__)
  if (cudaGraphLaunch(body, cudaStreamGraphFireAndForget) == cudaSuccess)
    return;
#else
  (void)body;
#endif
  atomicAdd(&c->refused, 1ull);
}

// A site's kernel in the chain (ust__gate_snap_launch). Every block reads
// the gate and counters (device memory) at its start; when first, one block
// commits the replay's decision (the only block, at once: what a closed
// gate costs is this kernel's time; else the last to finish, a ticket in
// counters->pad: every other block has read by then; each block's thread 0
// made the same decision from the same loads). In a replay that
// verifies, the copies, then the body: an IF node's condition set to open
// (each launch of the graph resets it to 0), by block 0 at once (the node
// runs after the kernel); or the body launched from the device by the
// block that finishes last, once every block's copies are visible. Two
// kernels: only the one that launches refers to the device runtime (a
// kernel that does may be launched only from a graph).
template <bool kLaunch>
__global__ void gate_snap(const unsigned long long *word, ust__gate_counters *c, int first,
                          cudaGraphConditionalHandle handle, cudaGraphExec_t body, ust__gate_copies copies) {
  __shared__ unsigned runs;
  const bool alone = gridDim.x == 1;
  replay_decision d{};
  if (threadIdx.x == 0) {
    if (first) {
      d = decide_replay(word, c);
      runs = (unsigned)d.runs;
      if (alone)
        commit_replay(c, d);
    } else {
      runs = (unsigned)__ldcg(&c->runs);
    }
    if (!kLaunch && (alone || !first) && blockIdx.x == 0 && handle != 0 && (runs & UST__GATE_RUN_VERIFY))
      cudaGraphSetConditional(handle, 1u);
  }
  __syncthreads();
  const bool verify = (runs & UST__GATE_RUN_VERIFY) != 0, launch = kLaunch && verify;
  if (verify) {
    const size_t stride = (size_t)gridDim.x * blockDim.x, i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < copies.n; k++)
      copy_span(static_cast<unsigned char *>(copies.c[k].dst), static_cast<const unsigned char *>(copies.c[k].src),
                copies.c[k].bytes, i0, stride);
  }
  if (alone) {
    if (launch) {
      __syncthreads(); // the block's copies made
      if (threadIdx.x == 0) {
        __threadfence();
        start_body(body, c);
      }
    }
    return;
  }
  if (!first && !launch)
    return;
  __syncthreads();
  if (threadIdx.x != 0)
    return;
  __threadfence();
  if (atomicAdd(&c->pad, 1ull) != gridDim.x - 1)
    return;
  if (first)
    commit_replay(c, d);
  c->pad = 0;
  __threadfence();
  if (launch) {
    if constexpr (kLaunch)
      start_body(body, c);
  } else if (handle != 0 && verify) {
    cudaGraphSetConditional(handle, 1u);
  }
}

extern "C" int ust__gate_device_launch(void) {
#if defined(__CUDACC_RDC__)
  return 1;
#else
  return 0;
#endif
}

extern "C" int ust__gate_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                                unsigned long long handle, void *stream) {
  gate_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(word, counters, first,
                                                                 static_cast<cudaGraphConditionalHandle>(handle));
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : ust__error(UST_EGPU, "gate: launch: %s", cudaGetErrorString(e));
}

extern "C" int ust__gate_snap_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                                     unsigned long long handle, void *body, const ust__gate_copies *copies,
                                     void *stream) {
  size_t units = 0;
  for (int k = 0; k < copies->n; k++)
    units += (copies->c[k].bytes + 15) / 16;
  // one block up to 256 KiB of copies (closed, it decides and exits at
  // once); else enough for the largest copies at open gates, at most 64
  const size_t per_block = 4 * kThreads;
  const unsigned blocks = units <= 16384 ? 1u : (unsigned)(units / per_block + 1 < 64 ? units / per_block + 1 : 64);
  const auto h = static_cast<cudaGraphConditionalHandle>(handle);
  const auto b = static_cast<cudaGraphExec_t>(body);
  if (body != nullptr)
    gate_snap<true><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(word, counters, first, h, b, *copies);
  else
    gate_snap<false><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(word, counters, first, h, b, *copies);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : ust__error(UST_EGPU, "gate: snapshot launch: %s", cudaGetErrorString(e));
}

extern "C" int ust__gate_copy_launch(void *dst, const void *src, size_t bytes, const ust__gate_counters *counters,
                                     void *stream) {
  if (bytes == 0)
    return 0;
  const size_t units = (bytes + 15) / 16, per_block = kThreads;
  const unsigned blocks = (unsigned)(units / per_block + 1 < 1024 ? units / per_block + 1 : 1024);
  gate_copy<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<unsigned char *>(dst), static_cast<const unsigned char *>(src), bytes, counters);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : ust__error(UST_EGPU, "gate: copy launch: %s", cudaGetErrorString(e));
}
#else
extern "C" int ust__gate_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                                unsigned long long handle, void *stream) {
  (void)word, (void)counters, (void)first, (void)handle, (void)stream;
  return ust__error(UST_EGPU, "gate: this build's GPU runtime has no conditional graph nodes");
}

extern "C" int ust__gate_copy_launch(void *dst, const void *src, size_t bytes, const ust__gate_counters *counters,
                                     void *stream) {
  (void)dst, (void)src, (void)bytes, (void)counters, (void)stream;
  return ust__error(UST_EGPU, "gate: this build's GPU runtime has no conditional graph nodes");
}

extern "C" int ust__gate_snap_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                                     unsigned long long handle, void *body, const ust__gate_copies *copies,
                                     void *stream) {
  (void)word, (void)counters, (void)first, (void)handle, (void)body, (void)copies, (void)stream;
  return ust__error(UST_EGPU, "gate: this build's GPU runtime has no conditional graph nodes");
}

extern "C" int ust__gate_device_launch(void) { return 0; }
#endif
