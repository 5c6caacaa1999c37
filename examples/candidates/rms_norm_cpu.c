/*
 * A native understudy candidate for vLLM's
 *
 *     _C::rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float eps) -> ()
 *
 * on CPU tensors of float32, float16 or bfloat16:
 *
 *     out[r, :] = input[r, :] * rsqrt(mean(input[r, :]^2) + eps) * weight
 *
 * for every row r of input (all dimensions but the last). The arithmetic is
 * vLLM's: float accumulation, and for 16-bit types the normalised value is
 * rounded to the element type before it is multiplied by the weight, as
 * vLLM's kernels and its reference do ((x * inv).to(dtype) * weight).
 *
 * One source, several candidates: a macro picks a deliberately broken variant
 * so that tests can check that understudy tells them apart.
 *
 *   (none)                    correct                     "rms_norm_cpu"
 *   UST_EXAMPLE_WRONG_TAIL    the last row's last element  "rms_norm_cpu_wrong_tail"
 *                             is off by at least 1 + |y|
 *   UST_EXAMPLE_WRONG_NAN     NaN in the middle of the     "rms_norm_cpu_wrong_nan"
 *                             last row
 *   UST_EXAMPLE_WRONG_ERROR   returns -1 without writing   "rms_norm_cpu_wrong_error"
 *
 * Build with hidden visibility: the only exported symbol is ust_candidate_get.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rms_norm_args.h"

#if (defined(UST_EXAMPLE_WRONG_TAIL) + defined(UST_EXAMPLE_WRONG_NAN) + defined(UST_EXAMPLE_WRONG_ERROR)) > 1
#error "define at most one UST_EXAMPLE_WRONG_* variant"
#endif

#if defined(UST_EXAMPLE_WRONG_TAIL)
#define RMS_NAME "rms_norm_cpu_wrong_tail"
#elif defined(UST_EXAMPLE_WRONG_NAN)
#define RMS_NAME "rms_norm_cpu_wrong_nan"
#elif defined(UST_EXAMPLE_WRONG_ERROR)
#define RMS_NAME "rms_norm_cpu_wrong_error"
#else
#define RMS_NAME "rms_norm_cpu"
#endif

#if defined(UST_EXAMPLE_WRONG_ERROR)
#define RMS_DELIBERATE_ERROR 1
#else
#define RMS_DELIBERATE_ERROR 0
#endif

__attribute__((visibility("default"))) const ust_candidate *ust_candidate_get(void);

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t bits_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bf16_to_f32(uint16_t h) {
  return f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest, ties to even; NaN stays a (quiet) NaN. */
static uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_from_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    /* Zero or subnormal: man * 2^-24, exact in float. */
    const float mag = (float)man * 0x1p-24f;
    return sign ? -mag : mag;
  }
  if (exp == 31)
    return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Round to nearest, ties to even, with subnormals, overflow to infinity and
 * NaN kept quiet. */
static uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_from_f32(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
  if (mag >= 0x477ff000u) /* 65520 and up round to infinity */
    return (uint16_t)(sign | 0x7c00u);
  if (mag < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
    if (mag < 0x33000000u) /* at most 2^-25: rounds to zero */
      return sign;
    const uint32_t e = mag >> 23;
    const uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e; /* units of 2^-24: m * 2^(e - 126) */
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
      ++q;
    return (uint16_t)(sign | q);
  }
  const uint32_t r = mag - 0x38000000u; /* rebias the exponent from 127 to 15 */
  uint32_t q = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
    ++q;
  return (uint16_t)(sign | q);
}

static float load(const void *p, int64_t i, rms_dtype t) {
  switch (t) {
  case RMS_F16:
    return f16_to_f32(((const uint16_t *)p)[i]);
  case RMS_BF16:
    return bf16_to_f32(((const uint16_t *)p)[i]);
  case RMS_F32:
  default:
    return ((const float *)p)[i];
  }
}

static void store(void *p, int64_t i, rms_dtype t, float v) {
  switch (t) {
  case RMS_F16:
    ((uint16_t *)p)[i] = f32_to_f16(v);
    break;
  case RMS_BF16:
    ((uint16_t *)p)[i] = f32_to_bf16(v);
    break;
  case RMS_F32:
  default:
    ((float *)p)[i] = v;
    break;
  }
}

/* The value v has once it is stored as type t. */
static float round_to(rms_dtype t, float v) {
  switch (t) {
  case RMS_F16:
    return f16_to_f32(f32_to_f16(v));
  case RMS_BF16:
    return bf16_to_f32(f32_to_bf16(v));
  case RMS_F32:
  default:
    return v;
  }
}

static size_t elem_size(rms_dtype t) {
  return t == RMS_F32 ? 4 : 2;
}

static void rms_norm_row(const rms_norm_args *a, int64_t row) {
  int64_t in_off, out_off;
  rms_row_offsets(&a->layout, row, &in_off, &out_off);
  const size_t es = elem_size(a->dtype);
  const void *x = (const char *)a->in + in_off * (int64_t)es;
  void *y = (char *)a->out + out_off * (int64_t)es;

  /* Eight partial sums: the compiler can vectorise them, and the rounding
   * error grows with N/8 rather than N. */
  float part[8] = {0};
  for (int64_t j = 0; j < a->n; ++j) {
    const float v = load(x, j, a->dtype);
    part[j & 7] += v * v;
  }
  const float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const float inv = 1.0f / sqrtf(sum / (float)a->n + a->eps);

  for (int64_t j = 0; j < a->n; ++j) {
    float v = round_to(a->dtype, load(x, j, a->dtype) * inv) * load(a->weight, j, a->dtype);
#if defined(UST_EXAMPLE_WRONG_TAIL)
    if (row == a->rows - 1 && j == a->n - 1)
      v = isfinite(v) ? 1.0f + 2.0f * fabsf(v) : 0.0f;
#elif defined(UST_EXAMPLE_WRONG_NAN)
    if (row == a->rows - 1 && j == a->n / 2)
      v = NAN;
#endif
    store(y, j, a->dtype, v);
  }
}

static int rms_norm_cpu_run(void *ctx, const ust_candidate_call *call, char *msg, size_t msg_cap) {
  (void)ctx;
  /* Before any check, so the failure does not depend on the arguments. */
  if (RMS_DELIBERATE_ERROR)
    return rms_fail(msg, msg_cap, RMS_EINVAL, "deliberate failure: %s never computes", RMS_NAME);
  rms_norm_args a;
  const int rc = rms_norm_parse(call, kDLCPU, &a, msg, msg_cap);
  if (rc != 0)
    return rc;
  if (a.n > 0)
    for (int64_t r = 0; r < a.rows; ++r)
      rms_norm_row(&a, r);
  rms_clear_msg(msg, msg_cap);
  return 0;
}

static const ust_candidate rms_norm_cpu_candidate = {
    .size = sizeof(ust_candidate),
    .abi_version = UST_CANDIDATE_ABI_VERSION,
    .name = RMS_NAME,
    .target = "_C::rms_norm",
    .run = rms_norm_cpu_run,
    .ctx = NULL,
};

const ust_candidate *ust_candidate_get(void) {
  return &rms_norm_cpu_candidate;
}
