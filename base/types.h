/*
 * base/types.h: the vocabulary every layer shares about tensors, valid C and
 * C++ (the bridge and the GPU kernels include it): dtype ids, device kinds,
 * name sizes.
 *
 * Internal header: never installed.
 */
#ifndef UST_BASE_TYPES_H
#define UST_BASE_TYPES_H

#ifdef __cplusplus
extern "C" {
#endif

#define UST__NAME_MAX 64       /* an operator, argument or overload name, NUL included */
#define UST__QUALNAME_MAX 160  /* "ns::op" */
#define UST__DISPLAY_MAX (UST__QUALNAME_MAX + UST__NAME_MAX) /* "ns::op.overload" */
#define UST__KEY_MAX 512       /* a route's shape key as the report spells it */

/* dtypes as small ids. DLPack's codes do not tell the fp8 formats apart;
 * these do. */
typedef enum ust__dtype {
  UST__DT_OTHER = 0,
  UST__DT_F16, UST__DT_BF16, UST__DT_F32, UST__DT_F64,
  UST__DT_I8, UST__DT_U8, UST__DT_I16, UST__DT_I32, UST__DT_I64, UST__DT_BOOL,
  UST__DT_F8E4M3FN, UST__DT_F8E5M2, UST__DT_F8E4M3FNUZ, UST__DT_F8E5M2FNUZ,
  UST__DT_C64, UST__DT_C128,
  UST__DT_COUNT
} ust__dtype;

/* "bf16", "f8e4m3fn", ...; "other" for an unknown id. Static storage. */
const char *ust__dtype_name(int dt);

typedef enum ust__device {
  UST__DEV_CPU = 0,
  UST__DEV_CUDA = 1,  /* CUDA or HIP: torch calls both "cuda" */
  UST__DEV_OTHER = 2, /* meta, fake, ...: served, not counted */
} ust__device;

#ifdef __cplusplus
}
#endif

#endif /* UST_BASE_TYPES_H */
