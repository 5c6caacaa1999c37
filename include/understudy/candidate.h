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
 * Versioning: every struct starts with its size and only grows at its tail.
 * A reader reads only the fields that fit in the size it was given.
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

#define UST_CANDIDATE_ABI_VERSION 1
#define UST_CANDIDATE_ENTRY "ust_candidate_get"

typedef enum ust_value_kind {
  UST_VALUE_NONE = 0,   /* an optional argument that is None */
  UST_VALUE_TENSOR = 1, /* tensor: DLTensor view */
  UST_VALUE_INT = 2,    /* i */
  UST_VALUE_DOUBLE = 3, /* f */
  UST_VALUE_BOOL = 4,   /* i: 0 or 1 */
  UST_VALUE_OTHER = 5,  /* not representable here (int lists, strings, ...) */
} ust_value_kind;

/* One argument. */
typedef struct ust_value {
  int32_t kind;     /* ust_value_kind */
  int32_t writable; /* 1 for an argument the op writes: understudy's snapshot (shadow) or the caller's (serving) */
  DLTensor tensor;  /* borrowed for the duration of run; data is device memory for GPU tensors */
  int64_t i;
  double f;
  const char *name; /* the schema's argument name; static for the call */
} ust_value;

typedef struct ust_candidate_call {
  uint32_t size; /* sizeof(ust_candidate_call) as the caller knows it */
  int32_t n_args;
  const ust_value *args; /* schema order; borrowed for the duration of run */
  int32_t n_outputs;
  const DLTensor *outputs; /* preallocated; data borrowed for the duration of run */
  DLDevice device;         /* where the tensors live */
  void *stream;            /* cudaStream_t / hipStream_t for GPU tensors; NULL on the CPU */
} ust_candidate_call;

/* Status returned by run: 0 is success. A non-zero status fails the
 * verification; msg (capacity msg_cap, NUL-terminated by the candidate) says
 * why and goes into the route's evidence. */
typedef int (*ust_candidate_run_fn)(void *ctx, const ust_candidate_call *call, char *msg, size_t msg_cap);

typedef struct ust_candidate {
  uint32_t size;        /* sizeof(ust_candidate) as the candidate knows it */
  uint32_t abi_version; /* UST_CANDIDATE_ABI_VERSION */
  const char *name;     /* free text shown in reports; static storage */
  const char *target;   /* the dispatcher op it stands in for: "qualname" or "qualname.overload" */
  ust_candidate_run_fn run;
  void *ctx;            /* passed to run; owned by the candidate */
} ust_candidate;

typedef const ust_candidate *(*ust_candidate_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* UNDERSTUDY_CANDIDATE_H */
