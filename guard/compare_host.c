/* The comparison for host tensors, and the helpers shared with the GPU path. */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "guard/compare.h"
#include "guard/compare_elem.h"

typedef struct acc_d {
  UST__CMP_ACC_FIELDS(double)
} acc_d;

double ust__bits_to_double(unsigned long long bits) {
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

static unsigned long long double_bits(double d) {
  unsigned long long b;
  memcpy(&b, &d, sizeof b);
  return b;
}

int64_t ust__cmp_first_mismatch(const ust__cmp_stats *s) {
  return s->first_mismatch_inv == 0 ? -1 : (int64_t)~s->first_mismatch_inv;
}

int ust__cmp_dtype_supported(int dt) {
  switch (dt) {
  case UST__DT_F16: case UST__DT_BF16: case UST__DT_F32: case UST__DT_F64:
  case UST__DT_I8: case UST__DT_U8: case UST__DT_I16: case UST__DT_I32: case UST__DT_I64: case UST__DT_BOOL:
    return 1;
  }
  return 0;
}

/* 16-bit types: the paper's tolerances; fp32 and fp64 are held tighter. */
void ust__cmp_default_tol(int dt, double *atol, double *rtol) {
  switch (dt) {
  case UST__DT_F32:
    *atol = 1e-4;
    *rtol = 1e-3;
    break;
  case UST__DT_F64:
    *atol = 1e-8;
    *rtol = 1e-7;
    break;
  case UST__DT_F16: case UST__DT_BF16:
    *atol = 1e-2;
    *rtol = 5e-2;
    break;
  default:
    *atol = 0;
    *rtol = 0;
  }
}

static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: normalise */
    int e = -1;
    do {
      e++;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = UST__BF16_BITS_TO_F32_BITS(h);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* One loop per dtype, so that the element load is inlined. */
#define FLOAT_LOOP(T, LOAD)                                                                      \
  do {                                                                                           \
    const T *pp_ = prod, *cp_ = cand;                                                            \
    for (int64_t i = 0; i < n; i++)                                                              \
      UST__CMP_FLOAT_ELEM(double, double, fabs, isfinite, isnan, (double)LOAD(pp_[i]),            \
                          (double)LOAD(cp_[i]), atol, rtol, exact, i, a, a.ssd, a.ssp);          \
  } while (0)
#define INT_LOOP(T)                                                                              \
  do {                                                                                           \
    const T *pp_ = prod, *cp_ = cand;                                                            \
    for (int64_t i = 0; i < n; i++)                                                              \
      UST__CMP_INT_ELEM((long long)pp_[i], (long long)cp_[i], i, a);                             \
  } while (0)
#define AS_IS(x) (x)

void ust__compare_host(const void *prod, const void *cand, int dt, int64_t n, int kind, double atol, double rtol,
                       ust__cmp_stats *out) {
  acc_d a;
  UST__CMP_ACC_INIT(a);
  const int exact = kind == UST__CMP_EXACT;
  switch (dt) {
  case UST__DT_F16: FLOAT_LOOP(uint16_t, f16_to_f32); break;
  case UST__DT_BF16: FLOAT_LOOP(uint16_t, bf16_to_f32); break;
  case UST__DT_F32: FLOAT_LOOP(float, AS_IS); break;
  case UST__DT_F64: FLOAT_LOOP(double, AS_IS); break;
  case UST__DT_I8: INT_LOOP(int8_t); break;
  case UST__DT_U8: case UST__DT_BOOL: INT_LOOP(uint8_t); break;
  case UST__DT_I16: INT_LOOP(int16_t); break;
  case UST__DT_I32: INT_LOOP(int32_t); break;
  default: INT_LOOP(int64_t); break;
  }
  memset(out, 0, sizeof *out);
  out->n = (unsigned long long)(n > 0 ? n : 0);
  out->mismatches = a.mismatches;
  out->nonfinite_prod = a.nf_prod;
  out->nonfinite_cand = a.nf_cand;
  out->nonfinite_bad = a.nf_bad;
  out->first_mismatch_inv = a.first == ~0ull ? 0 : ~a.first;
  out->max_abs_bits = double_bits(a.max_abs);
  out->max_rel_bits = double_bits(a.max_rel);
  out->sum_sq_diff = a.ssd;
  out->sum_sq_prod = a.ssp;
}

#if !defined(UST_GPU_CUDA) && !defined(UST_GPU_HIP)
int ust__compare_launch(const void *prod, const void *cand, int dtype, int64_t n, int kind, double atol,
                        double rtol, ust__cmp_stats *dev_out, void *stream) {
  return ust__error(UST_EGPU, "this build of understudy has no GPU backend");
}
#endif

int ust__cmp_kind_parse(const char *s) {
  static const char *names[] = {"allclose", "exact", "set"};
  for (int i = 0; i < 3; i++)
    if (strcmp(s, names[i]) == 0)
      return i;
  return -1;
}

const char *ust__cmp_kind_name(int kind) {
  static const char *names[] = {"allclose", "exact", "set"};
  return kind >= 0 && kind < 3 ? names[kind] : "allclose";
}
