/* ust_compare_sync: the guard's comparison as a public, synchronous call. */
#include <string.h>

#include <dlpack/dlpack.h>

#include "dispatch/backend.h"
#include "guard/guard.h"
#include "plugin/plugin.h"

#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
#define UST__API_GPU 1
#include "dispatch/gpu_runtime.h"
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
/* A synchronous call: its result buffers are allocated for the call and
 * freed once it has waited for its stream. */
static int compare_gpu(const DLTensor *p, const DLTensor *c, int dt, int64_t n, int kind, double atol, double rtol,
                       void *stream, ust__cmp_stats *host, double *ns) {
  int prev = 0, rc = 0;
  if (UST__GPU_CHECK(cudaGetDevice(&prev)) != 0)
    return ust__error(UST_EGPU, "compare: no usable GPU");
  if (prev != p->device.device_id && UST__GPU_CHECK(cudaSetDevice(p->device.device_id)) != 0)
    return ust__error(UST_EGPU, "compare: cannot select GPU %d", p->device.device_id);
  ust__cmp_stats *dev = NULL, *pinned = NULL;
  if (UST__GPU_CHECK(cudaMalloc((void **)&dev, sizeof *dev)) != 0 ||
      UST__GPU_CHECK(cudaHostAlloc((void **)&pinned, sizeof *pinned, cudaHostAllocDefault)) != 0)
    rc = ust__error(UST_EGPU, "compare: cannot allocate result buffers");
  cudaStream_t s = (cudaStream_t)stream;
  cudaEvent_t ev[2] = {NULL, NULL};
  if (rc == 0 && (UST__GPU_CHECK(cudaEventCreateWithFlags(&ev[0], cudaEventDefault)) != 0 ||
                  UST__GPU_CHECK(cudaEventCreateWithFlags(&ev[1], cudaEventDefault)) != 0))
    rc = ust__error(UST_EGPU, "compare: cannot create events");
  if (rc == 0 && (UST__GPU_CHECK(cudaEventRecord(ev[0], s)) != 0 ||
                  UST__GPU_CHECK(cudaMemsetAsync(dev, 0, sizeof *dev, s)) != 0))
    rc = ust__error(UST_EGPU, "compare: memset failed");
  if (rc == 0)
    rc = ust__compare_launch(p->data, c->data, dt, n, kind, atol, rtol, dev, stream);
  if (rc == 0 && (UST__GPU_CHECK(cudaEventRecord(ev[1], s)) != 0 ||
                  UST__GPU_CHECK(cudaMemcpyAsync(pinned, dev, sizeof *dev, cudaMemcpyDeviceToHost, s)) != 0 ||
                  UST__GPU_CHECK(cudaStreamSynchronize(s)) != 0))
    rc = ust__error(UST_EGPU, "compare: reading the results failed");
  float ms = 0;
  if (rc == 0 && UST__GPU_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1])) == 0)
    *ns = (double)ms * 1e6;
  if (rc == 0)
    *host = *pinned;
  for (int i = 0; i < 2; i++)
    if (ev[i] != NULL)
      cudaEventDestroy(ev[i]);
  if (dev != NULL)
    cudaFree(dev);
  if (pinned != NULL)
    cudaFreeHost(pinned);
  if (prev != p->device.device_id)
    cudaSetDevice(prev);
  return rc;
}
#endif

int ust_compare_sync(const DLTensor *p, const DLTensor *c, int kind, double atol, double rtol, void *stream,
                     ust_compare_result *out) {
  ust__clear_error();
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
  int rc = compare_gpu(&pv, &cv, dt, n, kind, atol, rtol, stream, &st, &ns);
  if (rc != 0)
    return rc;
  st.n = (unsigned long long)n;
  fill_result(&st, ns, out);
  return 0;
#else
  return ust__error(UST_EGPU, "compare: this build of understudy has no GPU backend");
#endif
}
