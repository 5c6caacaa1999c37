/* The guard's comparison as a synchronous call (ust_compare_sync). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

#include "guard/guard.h"

#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
#define UST__API_GPU 1
#include "base/gpu_runtime.h"
#endif

/* DLPack 1.0 calls bool kDLBool (6); the distribution's 0.6 header predates it. */
enum { DL_BOOL_CODE = 6 };

static int dtype_from_dl(DLDataType t) {
  if (t.lanes != 1)
    return UST__DT_OTHER;
  switch (t.code) {
  case kDLFloat:
    return t.bits == 16 ? UST__DT_F16 : t.bits == 32 ? UST__DT_F32 : t.bits == 64 ? UST__DT_F64 : UST__DT_OTHER;
  case kDLBfloat:
    return t.bits == 16 ? UST__DT_BF16 : UST__DT_OTHER;
  case kDLInt:
    return t.bits == 8 ? UST__DT_I8 : t.bits == 16 ? UST__DT_I16 : t.bits == 32 ? UST__DT_I32
           : t.bits == 64 ? UST__DT_I64 : UST__DT_OTHER;
  case kDLUInt:
    return t.bits == 8 ? UST__DT_U8 : UST__DT_OTHER;
  case DL_BOOL_CODE:
    return t.bits == 8 ? UST__DT_BOOL : UST__DT_OTHER;
  }
  return UST__DT_OTHER;
}

static int compact(const DLTensor *t) {
  if (t->strides == NULL)
    return 1;
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != expect)
      return 0;
    expect *= t->shape[d];
  }
  return 1;
}

static void fill_result(const ust__cmp_stats *s, double ns, ust_compare_result *out) {
  ust_compare_result r;
  memset(&r, 0, sizeof r);
  r.size = out->size;
  r.elements = s->n;
  r.mismatches = s->mismatches;
  r.nonfinite_production = s->nonfinite_prod;
  r.nonfinite_candidate = s->nonfinite_cand;
  r.nonfinite_bad = s->nonfinite_bad;
  r.first_mismatch = ust__cmp_first_mismatch(s);
  r.max_abs_err = ust__bits_to_double(s->max_abs_bits);
  r.max_rel_err = ust__bits_to_double(s->max_rel_bits);
  r.sum_sq_diff = s->sum_sq_diff;
  r.sum_sq_production = s->sum_sq_prod;
  r.device_time_ns = ns;
  size_t n = out->size < sizeof r ? out->size : sizeof r;
  memcpy(out, &r, n);
}

#ifdef UST__API_GPU
/* Result buffers and events of the synchronous GPU comparison, kept for
 * reuse: allocating them per call (cudaMalloc, cudaHostAlloc, and freeing
 * them) can synchronise the device, which stalls work the caller queued
 * ahead and lets launch gaps into the measured time. A call takes a free
 * entry of its device, or makes one, under a lock held only for the list;
 * there are as many entries as calls ever ran at once, kept in the cache. */
typedef struct ust__cmp_res {
  struct ust__cmp_res *next;
  int device;
  ust__cmp_stats *dev, *pinned;
  cudaEvent_t ev[2];
} cmp_res;

static void res_destroy(cmp_res *r) {
  for (int i = 0; i < 2; i++)
    if (r->ev[i] != NULL)
      cudaEventDestroy(r->ev[i]);
  if (r->dev != NULL)
    cudaFree(r->dev);
  if (r->pinned != NULL)
    cudaFreeHost(r->pinned);
  free(r);
}

/* A free entry of the current device into *out, made if there is none;
 * 0 or the error. */
static int res_take(ust__compare_cache *cache, int device, cmp_res **out) {
  ust__log_sink *log = cache->log;
  pthread_mutex_lock(&cache->lock);
  cmp_res **at = &cache->free_list;
  while (*at != NULL && (*at)->device != device)
    at = &(*at)->next;
  cmp_res *r = *at;
  if (r != NULL)
    *at = r->next;
  pthread_mutex_unlock(&cache->lock);
  if (r != NULL) {
    *out = r;
    return 0;
  }
  r = calloc(1, sizeof *r);
  if (r == NULL)
    return ust__error(UST_ENOMEM, "compare: out of memory");
  r->device = device;
  if (UST__GPU_CHECK(log, cudaMalloc((void **)&r->dev, sizeof *r->dev)) != 0 ||
      UST__GPU_CHECK(log, cudaHostAlloc((void **)&r->pinned, sizeof *r->pinned, cudaHostAllocDefault)) != 0 ||
      UST__GPU_CHECK(log, cudaEventCreateWithFlags(&r->ev[0], cudaEventDefault)) != 0 ||
      UST__GPU_CHECK(log, cudaEventCreateWithFlags(&r->ev[1], cudaEventDefault)) != 0) {
    res_destroy(r);
    return ust__error(UST_EGPU, "compare: cannot allocate result buffers and events on GPU %d", device);
  }
  *out = r;
  return 0;
}

static void res_give(ust__compare_cache *cache, cmp_res *r) {
  pthread_mutex_lock(&cache->lock);
  r->next = cache->free_list;
  cache->free_list = r;
  pthread_mutex_unlock(&cache->lock);
}

static int compare_gpu(ust__compare_cache *cache, const DLTensor *p, const DLTensor *c, int dt, int64_t n, int kind, double atol, double rtol,
                       void *stream, ust__cmp_stats *host, double *ns) {
  int prev = 0, rc = 0;
  ust__log_sink *log = cache->log;
  if (UST__GPU_CHECK(log, cudaGetDevice(&prev)) != 0)
    return ust__error(UST_EGPU, "compare: no usable GPU");
  const int device = p->device.device_id;
  if (prev != device && UST__GPU_CHECK(log, cudaSetDevice(device)) != 0)
    return ust__error(UST_EGPU, "compare: cannot select GPU %d", device);
  cmp_res *r = NULL;
  if ((rc = res_take(cache, device, &r)) != 0)
    goto out;
  cudaStream_t s = (cudaStream_t)stream;
  if (UST__GPU_CHECK(log, cudaEventRecord(r->ev[0], s)) != 0 ||
      UST__GPU_CHECK(log, cudaMemsetAsync(r->dev, 0, sizeof *r->dev, s)) != 0)
    rc = ust__error(UST_EGPU, "compare: memset failed");
  if (rc == 0)
    rc = ust__compare_launch(p->data, c->data, dt, n, kind, atol, rtol, r->dev, stream);
  if (rc == 0 && (UST__GPU_CHECK(log, cudaEventRecord(r->ev[1], s)) != 0 ||
                  UST__GPU_CHECK(log, cudaMemcpyAsync(r->pinned, r->dev, sizeof *r->dev, cudaMemcpyDeviceToHost, s)) != 0))
    rc = ust__error(UST_EGPU, "compare: reading the results failed");
  /* Whatever was queued is waited for before the entry is reused. */
  if (UST__GPU_CHECK(log, cudaStreamSynchronize(s)) != 0 && rc == 0)
    rc = ust__error(UST_EGPU, "compare: waiting for the stream failed");
  float ms = 0;
  if (rc == 0 && UST__GPU_CHECK(log, cudaEventElapsedTime(&ms, r->ev[0], r->ev[1])) == 0)
    *ns = (double)ms * 1e6;
  if (rc == 0)
    *host = *r->pinned;
  if (rc == 0)
    res_give(cache, r);
  else
    res_destroy(r); /* after an error its state is unknown */
out:
  if (prev != device)
    cudaSetDevice(prev);
  return rc;
}
#endif

int ust__compare_sync(ust__compare_cache *cache, const DLTensor *p, const DLTensor *c, int kind, double atol,
                      double rtol, void *stream, ust_compare_result *out) {
  if (p == NULL || c == NULL || out == NULL || out->size < sizeof(uint32_t))
    return ust__error(UST_EINVAL, "compare: production, candidate and out (with out->size set) are required");
  if (kind != UST_COMPARE_ALLCLOSE && kind != UST_COMPARE_EXACT)
    return ust__error(UST_EINVAL, "compare: kind %d is not UST_COMPARE_ALLCLOSE or UST_COMPARE_EXACT", kind);
  int dt = dtype_from_dl(p->dtype);
  if (dt == UST__DT_OTHER || !ust__cmp_dtype_supported(dt))
    return ust__error(UST_EINVAL, "compare: dtype (code %d, %d bits, %d lanes) is not supported", p->dtype.code,
                      p->dtype.bits, p->dtype.lanes);
  if (dtype_from_dl(c->dtype) != dt)
    return ust__error(UST_EINVAL, "compare: the candidate's dtype differs from production's");
  if (p->ndim != c->ndim)
    return ust__error(UST_EINVAL, "compare: %d dimensions against %d", c->ndim, p->ndim);
  int64_t n = 1;
  for (int d = 0; d < p->ndim; d++) {
    if (p->shape[d] != c->shape[d])
      return ust__error(UST_EINVAL, "compare: size %lld in dimension %d, production's %lld", (long long)c->shape[d],
                        d, (long long)p->shape[d]);
    n *= p->shape[d];
  }
  if (!compact(p) || !compact(c))
    return ust__error(UST_EINVAL, "compare: tensors must be row-major and compact");
  if (p->device.device_type != c->device.device_type || p->device.device_id != c->device.device_id)
    return ust__error(UST_EINVAL, "compare: the tensors are on different devices");
  double dl_atol, dl_rtol;
  ust__cmp_default_tol(dt, &dl_atol, &dl_rtol);
  if (atol < 0)
    atol = dl_atol;
  if (rtol < 0)
    rtol = dl_rtol;
  const char *pb = (const char *)p->data + p->byte_offset, *cb = (const char *)c->data + c->byte_offset;
  ust__cmp_stats st;
  memset(&st, 0, sizeof st);
  if (p->device.device_type == kDLCPU) {
    uint64_t t0 = ust__now_ns();
    ust__compare_host(pb, cb, dt, n, kind, atol, rtol, &st);
    fill_result(&st, (double)(ust__now_ns() - t0), out);
    return 0;
  }
  if (p->device.device_type != kDLCUDA && p->device.device_type != kDLROCM)
    return ust__error(UST_EINVAL, "compare: device type %d is neither the host nor a GPU", (int)p->device.device_type);
#ifdef UST__API_GPU
  DLTensor pv = *p, cv = *c;
  pv.data = (void *)pb;
  cv.data = (void *)cb;
  double ns = 0;
  int rc = compare_gpu(cache, &pv, &cv, dt, n, kind, atol, rtol, stream, &st, &ns);
  if (rc != 0)
    return rc;
  st.n = (unsigned long long)n;
  fill_result(&st, ns, out);
  return 0;
#else
  return ust__error(UST_EGPU, "compare: this build of understudy has no GPU backend");
#endif
}

void ust__compare_cache_free(ust__compare_cache *cache) {
#ifdef UST__API_GPU
  pthread_mutex_lock(&cache->lock);
  while (cache->free_list != NULL) {
    cmp_res *r = cache->free_list;
    cache->free_list = r->next;
    res_destroy(r);
  }
  pthread_mutex_unlock(&cache->lock);
#else
  (void)cache;
#endif
}
