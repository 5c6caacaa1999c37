/*
 * understudy: the candidate ABI.
 *
 * A native candidate is a shared object that exports one function,
 *
 *     const ust_candidate *ust_candidate_get(void);
 *
 * returning a descriptor with static storage. understudy loads it only from
 * the path named in the config and only when the file's sha256 equals the pin
 * written there; the bytes that were hashed are the bytes that are loaded.
 *
 * The candidate stands in for one dispatcher op and overload (its `target`,
 * e.g. "_C::rms_norm" or "aten::mm"). understudy calls `run` with the target's
 * arguments in schema order, as DLPack tensor views and scalars, on the
 * caller's native stream.
 *
 * In shadow mode, after production has served the call:
 * - arguments production writes (schema `Tensor(a!)` annotations and the
 *   operator's curated `writes` list) are understudy's snapshots of their
 *   values before production ran; the candidate writes its results into
 *   them as production would write into the originals;
 * - every other tensor argument is the caller's own tensor, read-only;
 * - `outputs` are production's returns that are not written arguments,
 *   preallocated by understudy with production's shapes, dtypes and strides
 *   (filled with NaN, or -77 for integers: an output left unwritten fails).
 * understudy then compares the candidate's written arguments and outputs
 * with production's; production's results are what the caller receives.
 *
 * In canary and live mode the candidate serves the call: written arguments
 * are the caller's own tensors (`writable` 1), and `outputs` are laid out
 * like production's returns for calls with these input shapes; what it
 * writes is what the caller receives. On a sample of those calls production
 * also runs, on snapshots, and the two are compared; a non-zero status or a
 * mismatch rolls the route back to production.
 *
 * CUDA graphs (the capture contract). Under a CUDA graph (vLLM's and
 * SGLang's decode, torch.compile's "reduce-overhead") understudy captures the
 * candidate with production: run is called while `stream` captures a graph
 * (`capturing` 1, version 3), and what run enqueues is what every replay of
 * the graph runs, with the same arguments and outputs, their values read at
 * each replay. While capturing, the candidate:
 * - enqueues its work on `stream` only (another stream only when it forks
 *   from `stream` with an event recorded there and joins back before run
 *   returns);
 * - does not synchronise a stream, an event or the device, copies nothing
 *   between host and device synchronously, and reads no device value on the
 *   host: a value read at capture is frozen into every replay;
 * - allocates and frees no device memory with cudaMalloc or cudaFree (memory
 *   made before the capture, e.g. at its first call or in ctx, or
 *   cudaMallocAsync on `stream`, which the graph captures);
 * - makes no decision on the host from tensor values (shapes, strides,
 *   dtypes and scalar arguments are fixed for the graph; values are not);
 * - returns 0 once its work is enqueued; a non-zero status while capturing
 *   fails the candidate as it would eagerly.
 * understudy captures the candidate's part on a side stream first, so a
 * candidate that breaks the contract invalidates only that part: the graph
 * then holds production alone and the route's report says why. A candidate
 * that cannot keep the contract says so with UST_CANDIDATE_NO_CAPTURE: it is
 * never called while capturing (production alone in every graph, counted).
 *
 * Versioning: every struct starts with its size (or, for the arguments, is
 * laid out with a stride the call states) and only grows at its tail. A
 * reader reads only the fields that fit in the size it was given. A
 * reserved field and an undefined flag bit are 0 when written and ignored
 * when read; understudy refuses a descriptor whose reserved field or
 * undefined flag bits are not 0 (a later version may give them a meaning).
 * understudy loads candidates of ABI versions 1 to 3 and gives each the
 * layout it was built for: version 1 candidates receive arguments with
 * version 1's stride (UST_VALUE_V1_SIZE) and no exact dtypes; version 2 no
 * `capturing`. ust_candidate_abi_version() (include/understudy/understudy.h)
 * says at run time the highest version the loaded library speaks.
 *
 * Threading: run may be called from several threads at once (one call per
 * serving thread), each with its own stream.
 */
#ifndef UNDERSTUDY_CANDIDATE_H
#define UNDERSTUDY_CANDIDATE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UST_CANDIDATE_ABI_VERSION 3
#define UST_CANDIDATE_ENTRY "ust_candidate_get"

typedef enum ust_value_kind {
  UST_VALUE_NONE = 0,   /* an optional argument that is None */
  UST_VALUE_TENSOR = 1, /* tensor: DLTensor view */
  UST_VALUE_INT = 2,    /* i */
  UST_VALUE_DOUBLE = 3, /* f */
  UST_VALUE_BOOL = 4,   /* i: 0 or 1 */
  UST_VALUE_OTHER = 5,  /* not representable here (int lists, strings, ...) */
} ust_value_kind;

/* Exact dtypes. DLPack's codes give every 8-bit float the same {kDLFloat, 8}
 * (the distributions' DLPack predates fp8 codes); these tell them apart. */
typedef enum ust_dtype {
  UST_DTYPE_OTHER = 0,
  UST_DTYPE_F16 = 1, UST_DTYPE_BF16 = 2, UST_DTYPE_F32 = 3, UST_DTYPE_F64 = 4,
  UST_DTYPE_I8 = 5, UST_DTYPE_U8 = 6, UST_DTYPE_I16 = 7, UST_DTYPE_I32 = 8, UST_DTYPE_I64 = 9,
  UST_DTYPE_BOOL = 10,
  UST_DTYPE_F8E4M3FN = 11, UST_DTYPE_F8E5M2 = 12, UST_DTYPE_F8E4M3FNUZ = 13, UST_DTYPE_F8E5M2FNUZ = 14,
  UST_DTYPE_C64 = 15, UST_DTYPE_C128 = 16,
} ust_dtype;

/* One argument. */
typedef struct ust_value {
  int32_t kind;     /* ust_value_kind */
  int32_t writable; /* 1 for an argument the op writes: understudy's snapshot (shadow) or the caller's (serving) */
  DLTensor tensor;  /* borrowed for the duration of run; data is device memory for GPU tensors */
  int64_t i;
  double f;
  const char *name; /* the schema's argument name; static for the call */
  /* ABI version 2 */
  int32_t dtype;    /* tensors: the exact ust_dtype */
  int32_t reserved; /* 0 */
} ust_value;

/* The stride of the arguments a version 1 candidate receives. */
#define UST_VALUE_V1_SIZE offsetof(ust_value, dtype)

typedef struct ust_candidate_call {
  uint32_t size; /* sizeof(ust_candidate_call) as the caller knows it */
  int32_t n_args;
  const ust_value *args; /* schema order, value_size bytes apart; borrowed for the duration of run */
  int32_t n_outputs;
  const DLTensor *outputs; /* preallocated; data borrowed for the duration of run */
  DLDevice device;         /* where the tensors live */
  void *stream;            /* cudaStream_t / hipStream_t for GPU tensors; NULL on the CPU */
  /* ABI version 2 */
  uint32_t value_size;          /* the stride of args: read argument i at (const char *)args + i * value_size */
  int32_t reserved;             /* 0 */
  const int32_t *output_dtypes; /* n_outputs exact ust_dtype, one per output */
  /* ABI version 3 */
  int32_t capturing;            /* 1 while stream captures a CUDA graph: the capture contract above holds */
  uint32_t reserved3;           /* 0 */
} ust_candidate_call;

/* Argument i of a call, whatever the stride the caller gave. */
static inline const ust_value *ust_candidate_arg(const ust_candidate_call *c, int32_t i) {
  const size_t stride = c->size >= offsetof(ust_candidate_call, reserved) ? c->value_size : UST_VALUE_V1_SIZE;
  return (const ust_value *)(const void *)((const char *)c->args + (size_t)i * stride);
}

/* Status returned by run: 0 is success. A non-zero status fails the
 * verification; msg (capacity msg_cap, NUL-terminated by the candidate) says
 * why and goes into the route's evidence. */
typedef int (*ust_candidate_run_fn)(void *ctx, const ust_candidate_call *call, char *msg, size_t msg_cap);

/* ust_candidate.flags */
#define UST_CANDIDATE_NO_CAPTURE 1u /* run cannot keep the capture contract: never called while capturing */

typedef struct ust_candidate {
  uint32_t size;        /* sizeof(ust_candidate) as the candidate knows it */
  uint32_t abi_version; /* UST_CANDIDATE_ABI_VERSION */
  const char *name;     /* free text shown in reports; static storage */
  const char *target;   /* the dispatcher op it stands in for: "qualname" or "qualname.overload" */
  ust_candidate_run_fn run;
  void *ctx;            /* passed to run; owned by the candidate */
  /* ABI version 3 */
  uint32_t flags;       /* UST_CANDIDATE_*; every other bit 0 */
  uint32_t reserved;    /* 0 */
} ust_candidate;

typedef const ust_candidate *(*ust_candidate_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* UNDERSTUDY_CANDIDATE_H */
