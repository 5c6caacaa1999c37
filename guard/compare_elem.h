/*
 * The element rule of the comparison, written once for the host loop
 * (compare_host.c, C) and the GPU kernel (compare.cu, CUDA or HIP), so both
 * apply the same rule. The math type differs: the host computes in double,
 * the kernel in float for 16- and 32-bit inputs (double for 64-bit), so an
 * element within a float rounding of the tolerance may be judged
 * differently by the two.
 *
 * For one pair (p: production, c: candidate) of floating values, in math
 * type T:
 * - both finite: a mismatch when |c - p| > atol + rtol * |p| (allclose; the
 *   inequality is written so that NaN-free values compare as torch.allclose
 *   does), or when they differ at all (exact); |c - p| feeds max_abs, the
 *   relative error max_rel (p != 0) and the L2 sums;
 * - p finite, c not: a mismatch and a "bad" non-finite value;
 * - p not finite: a match only when c is the same (both NaN, or the same
 *   infinity): the candidate must reproduce production's overflow.
 * Integer values compare exactly (UST__CMP_INT_ELEM).
 */
#ifndef UST_COMPARE_ELEM_H
#define UST_COMPARE_ELEM_H

/* Per-thread accumulators. first is the smallest mismatching index,
 * UINT64 max when none. */
#define UST__CMP_ACC_FIELDS(T)                                                                 \
  unsigned long long mismatches, nf_prod, nf_cand, nf_bad, first;                              \
  T max_abs, max_rel;                                                                          \
  double ssd, ssp;

#define UST__CMP_ACC_INIT(a)                                                                   \
  do {                                                                                         \
    (a).mismatches = (a).nf_prod = (a).nf_cand = (a).nf_bad = 0;                               \
    (a).first = ~0ull;                                                                         \
    (a).max_abs = 0;                                                                           \
    (a).max_rel = 0;                                                                           \
    (a).ssd = (a).ssp = 0;                                                                     \
  } while (0)

#define UST__CMP_MISMATCH(a, idx)                                                              \
  do {                                                                                         \
    (a).mismatches++;                                                                          \
    if ((unsigned long long)(idx) < (a).first)                                                 \
      (a).first = (unsigned long long)(idx);                                                   \
  } while (0)

/* T: math type; FABS, ISFINITE, ISNAN: its functions; S: the type the
 * squares are summed in, into ssd and ssp (the kernel sums a vector's worth
 * in float and folds it into double once per vector). */
#define UST__CMP_FLOAT_ELEM(T, S, FABS, ISFINITE, ISNAN, p, c, atol, rtol, exact, idx, a, ssd, ssp) \
  do {                                                                                         \
    const T p_ = (p), c_ = (c);                                                                \
    const int pf_ = ISFINITE(p_), cf_ = ISFINITE(c_);                                          \
    if (pf_ && cf_) {                                                                          \
      const T d_ = FABS(c_ - p_), ap_ = FABS(p_);                                              \
      if ((exact) ? (c_ != p_) : !(d_ <= (atol) + (rtol) * ap_))                               \
        UST__CMP_MISMATCH(a, idx);                                                             \
      if (d_ > (a).max_abs)                                                                    \
        (a).max_abs = d_;                                                                      \
      if (ap_ > 0 && d_ > (a).max_rel * ap_) /* divides only for a new maximum */              \
        (a).max_rel = d_ / ap_;                                                                \
      (ssd) += (S)d_ * (S)d_;                                                                  \
      (ssp) += (S)p_ * (S)p_;                                                                  \
    } else {                                                                                   \
      (a).nf_prod += !pf_;                                                                     \
      (a).nf_cand += !cf_;                                                                     \
      if (pf_) {                                                                               \
        (a).nf_bad++;                                                                          \
        UST__CMP_MISMATCH(a, idx);                                                             \
        (ssp) += (S)p_ * (S)p_;                                                                \
      } else if (!((ISNAN(p_) && ISNAN(c_)) || p_ == c_)) {                                    \
        UST__CMP_MISMATCH(a, idx);                                                             \
      }                                                                                        \
    }                                                                                          \
  } while (0)

/* p, c: long long. */
#define UST__CMP_INT_ELEM(p, c, idx, a)                                                        \
  do {                                                                                         \
    const long long p_ = (p), c_ = (c);                                                        \
    if (p_ != c_) {                                                                            \
      UST__CMP_MISMATCH(a, idx);                                                               \
      const double d_ = p_ > c_ ? (double)((unsigned long long)p_ - (unsigned long long)c_)    \
                                : (double)((unsigned long long)c_ - (unsigned long long)p_);   \
      if (d_ > (a).max_abs)                                                                    \
        (a).max_abs = d_;                                                                      \
      if (p_ != 0 && d_ / (p_ < 0 ? -(double)p_ : (double)p_) > (a).max_rel)                  \
        (a).max_rel = d_ / (p_ < 0 ? -(double)p_ : (double)p_);                                \
      (a).ssd += d_ * d_;                                                                      \
    }                                                                                          \
    (a).ssp += (double)p_ * (double)p_;                                                        \
  } while (0)

/* 16-bit float decoding, bit-exact, for host and device alike. */
#define UST__BF16_BITS_TO_F32_BITS(h) ((unsigned)(h) << 16)

#endif /* UST_COMPARE_ELEM_H */
