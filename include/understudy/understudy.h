/*
 * understudy: the embedding API.
 *
 * understudy is a shared object loaded into a PyTorch process. Once enabled it
 * intercepts the dispatcher ops bound by the configured operators (see
 * problems/NAME.json), keys every call by (op, dtypes, the operator's key
 * dimensions), and, per route, observes production: call counts, latency
 * histograms and device time, from which the live importance weights follow.
 * In shadow mode a candidate (include/understudy/candidate.h, or a dispatcher
 * op) runs beside production on sampled calls and is judged against it; a
 * route rolls back at its first verified failure. Calls of operators with a
 * roofline definition are scored against the device's floor. Figures leave
 * the process as a versioned JSON report.
 *
 * Errors: every function that can fail returns 0 or a negative UST_E* code;
 * ust_last_error() then holds a message for the calling thread that names what
 * was wrong (the config field, the problem file and its field, ...).
 *
 * Threading: every function may be called from any thread. enable and
 * disable take turns; set_mode, reload and the reports take the lock for
 * changes only briefly and never wait for a disable in progress, an
 * intercepted call, or the device (except ust_flush_sync, which says so).
 * Intercepted calls never take a lock of the control plane.
 *
 * Nothing here aborts, exits or throws: understudy fails open.
 */
#ifndef UNDERSTUDY_UNDERSTUDY_H
#define UNDERSTUDY_UNDERSTUDY_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(UST_BUILDING)
#define UST_API __attribute__((visibility("default")))
#else
#define UST_API
#endif

#define UST_ABI_VERSION 1

/* X(name, code, message): the one list of error codes. */
#define UST_ERRNO_MAP(X)                                                     \
  X(EINVAL, -1, "invalid argument")                                          \
  X(ECONFIG, -2, "invalid config")                                           \
  X(EPROBLEM, -3, "invalid problem definition")                              \
  X(ENOMEM, -4, "out of memory")                                             \
  X(EIO, -5, "input/output error")                                           \
  X(ESTATE, -6, "wrong state for this call")                                 \
  X(ENOTFOUND, -7, "not found")                                              \
  X(ETORCH, -8, "dispatcher registration failed")                            \
  X(EGPU, -9, "GPU runtime error")                                           \
  X(EFULL, -10, "table full")                                                \
  X(EINTERNAL, -11, "internal error")                                        \
  X(ETIMEDOUT, -12, "timed out")

typedef enum ust_errno {
  UST_OK = 0,
#define UST__ERRNO_ENUM(name, code, msg) UST_##name = code,
  UST_ERRNO_MAP(UST__ERRNO_ENUM)
#undef UST__ERRNO_ENUM
} ust_errno;

/* Static description of an error code; never NULL. */
UST_API const char *ust_strerror(int err);
/* Symbolic name ("UST_ECONFIG"); never NULL. */
UST_API const char *ust_err_name(int err);
/* The message of the calling thread's last failed call; "" if none. The
 * string is owned by understudy and valid until the thread's next call. */
UST_API const char *ust_last_error(void);

/* Library version as "major.minor.patch"; static storage. */
UST_API const char *ust_version(void);
/* The ABI versions this library speaks, at run time (the macros are those a
 * caller was compiled against): the embedding API's (UST_ABI_VERSION, this
 * header) and the highest candidate ABI it loads (UST_CANDIDATE_ABI_VERSION,
 * understudy/candidate.h). A caller built against a newer header checks
 * them before using what a later version added. */
UST_API uint32_t ust_abi_version(void);
UST_API uint32_t ust_candidate_abi_version(void);
/* Torch version the dispatcher seam was built against, or "" when the
 * library was built without one. Static storage. */
UST_API const char *ust_torch_version(void);

/* For a candidate's qualifying process only (understudy-qualify, and the
 * Python process a file candidate qualifies in), before it loads the
 * candidate: from now on, on every thread of the calling process, a signal
 * to any process but itself and its own process group, or a system call of
 * another numbering, kills it with SIGSYS; ptrace, process_vm_readv/writev,
 * setsid and setpgid fail with EPERM. 0; or -1 where the kernel or the
 * architecture offers no filter (the process then runs unconfined, and says
 * so on its standard error). Irrevocable: never call it in a serving
 * process. */
UST_API int ust_confine_qualifying_process(void);

typedef enum ust_log_level {
  UST_LOG_ERROR = 0,
  UST_LOG_WARN = 1,
  UST_LOG_INFO = 2,
  UST_LOG_DEBUG = 3,
} ust_log_level;

/* Log sink. msg is borrowed for the duration of the call. Called from any
 * thread, never per intercepted call (a rollback, a transition: once). It
 * must not call back into understudy's enable, disable, set_mode, reload or
 * report functions: some messages are logged while those hold their lock. */
typedef void (*ust_log_cb)(int level, const char *msg, void *user);

/* Replace the log sink (NULL restores the default: stderr, prefixed
 * "understudy: "). Messages above max_level are dropped. Thread-safe. */
UST_API void ust_set_log(ust_log_cb cb, void *user, int max_level);

/* Enable understudy with a JSON config (docs/configuration.md).
 * config_json: borrowed; NULL or "" means the defaults.
 * problems_dir: directory of operator definitions, borrowed; NULL uses the
 * config's "problems_dir".
 * Loads and validates every operator definition and the config before
 * touching the dispatcher: on any error nothing is registered and torch keeps
 * running exactly as before. Returns UST_ESTATE if already enabled. */
UST_API int ust_enable(const char *config_json, const char *problems_dir);

/* Switch interception off, wait for the intercepted calls in flight and the
 * pending device timings, write the final report (if a report path is
 * configured) and free the engine (a report or metrics read in progress
 * keeps it until it finishes). Interceptors stay registered with the
 * dispatcher for the life of the process and pass calls straight through:
 * torch's (de)registration is not atomic against dispatching threads. A
 * no-op returning 0 when not enabled; UST_ESTATE when called from inside an
 * intercepted call (a candidate, or a kernel), which it would wait for. */
UST_API int ust_disable(void);

/* 1 if enabled, else 0. */
UST_API int ust_is_enabled(void);

/* The control plane: ust_set_mode, ust_set_route_mode, ust_reload,
 * ust_report_write, ust_report_json and ust_flush_sync return UST_ESTATE,
 * changing nothing, when called from inside an intercepted call (a
 * candidate, or a kernel serving one, calling back on its thread): a
 * candidate cannot promote itself or read what is known of it. Enable and
 * disable are refused there too. */

/* Change an operator's mode while running: "off" (registered, pure
 * pass-through), "observe", "shadow", "canary" (the candidate serves the
 * operator's configured share of calls) or "live" (the last three:
 * UST_ESTATE unless the config names a candidate for the operator). Takes
 * effect on the next call, on the routes that follow their operator; routes
 * with a mode of their own (rolled back, promoted, set per key) keep it. */
UST_API int ust_set_mode(const char *operator_name, const char *mode);

/* Change one route's mode while running, by its shape key as the report
 * spells it ("_C::rms_norm|cuda|bf16,bf16,bf16|M=8,N=4096"): "off",
 * "observe", "shadow", "canary" (canary: the candidate's share of calls, in
 * (0, 1); ignored otherwise) or "live". A key not seen yet takes the mode
 * when its first call arrives. A rolled-back route set back to shadow,
 * canary or live runs its candidate again (its evidence stays in the
 * report). Recorded in the state file when one is configured. */
UST_API int ust_set_route_mode(const char *route_key, const char *mode, double canary);

/* Apply a changed config while running: operators' mode, canary, strict,
 * promotion and routes. Every other field must equal the running config's
 * (UST_ECONFIG naming the first that differs); nothing is applied on error. */
UST_API int ust_reload(const char *config_json);

/* Write the JSON report to path atomically (temp file, fsync, rename).
 * path NULL uses the configured report path. */
UST_API int ust_report_write(const char *path);

/* The JSON report as a string. *out receives a new string; free it with
 * ust_free(). */
UST_API int ust_report_json(char **out);

/* Derive a report's figures from its additive ones: latency quantiles,
 * device-time estimates, weights, S per route, operator and phase, S_agg.
 * report_json: a report (or a merge of many: counts, sums and histogram
 * buckets added), borrowed. *out receives the report with every derived
 * figure computed by the rules the in-process report uses (free with
 * ust_free). Needs no enabled engine. Thread-safe. */
UST_API int ust_report_derive(const char *report_json, char **out);

/* ---- the figures of the Prometheus metrics ---------------------------------- */

/* A reader of the figures understudy's Prometheus metrics expose, folded
 * into series: per operator and phase, or with top_keys > 0 per operator,
 * shape key and phase for the top_keys keys of each operator with the most
 * estimated device time, the others summed into key "other". A reader keeps
 * each counter as the sum of what its routes added between reads, so every
 * counter only grows for the reader's life, whichever series a route is
 * counted in and across a disable and enable. Opaque; one thread at a time. */
typedef struct ust_metrics ust_metrics;

/* A new reader in *out (free with ust_metrics_free); top_keys in [0, 65536]. */
UST_API int ust_metrics_new(int top_keys, ust_metrics **out);
/* ust_metrics_free(NULL) is a no-op. */
UST_API void ust_metrics_free(ust_metrics *m);
/* The figures now, folded into m's series, as a JSON document whose size
 * follows the series, not the routes (schema "understudy.metrics",
 * docs/metrics.md): from this process's routes when report_json is NULL,
 * read from their snapshot and derived with no JSON report built (never
 * waits for the device: timings in flight appear at a later read; never
 * blocks a serving thread), else from report_json (borrowed), whose derived
 * figures are taken as it gives them. *out receives a new string (free
 * with ust_free). UST_ESTATE when understudy is not enabled (report_json
 * NULL) or from inside an intercepted call. */
UST_API int ust_metrics_read(ust_metrics *m, const char *report_json, char **out);

/* Expand a path template as enable expands the config's report.path and
 * state.path: {pid} is this process's id; {rank} and {local_rank} come from
 * the launcher's environment, the first set of RANK, OMPI_COMM_WORLD_RANK,
 * PMI_RANK, SLURM_PROCID (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
 * MPI_LOCALRANKID, SLURM_LOCALID); '{{' and '}}' are literal braces.
 * templ: borrowed. *out receives a new string (free with ust_free).
 * UST_ECONFIG names an unknown placeholder, an unmatched brace, or a rank
 * the environment does not give. Needs no enabled engine. Thread-safe. */
UST_API int ust_expand_path(const char *templ, char **out);

/* Free memory returned by understudy. ust_free(NULL) is a no-op. */
UST_API void ust_free(void *p);

/* Wait until every device timing recorded so far has been harvested into
 * the route statistics. Synchronises with the device (it waits on events):
 * for tests and for reports at exit, never for the serving path. */
UST_API int ust_flush_sync(void);

/* ---- phases ---------------------------------------------------------------- */

typedef enum ust_phase {
  UST_PHASE_UNKNOWN = 0,
  UST_PHASE_PREFILL = 1,
  UST_PHASE_DECODE = 2,
} ust_phase;

/* Set the calling thread's serving phase; calls it makes from now on are
 * keyed, weighted and scored under that phase. Returns the previous phase,
 * or UST_EINVAL for an unknown one. Thread-local; cheap enough to call per
 * forward step. */
UST_API int ust_set_phase(int phase);

/* ---- CUDA graphs' captures and replays ------------------------------------- */

/* For whoever captures a CUDA graph (the Python package does it for
 * torch.cuda.CUDAGraph: torch.cuda.graph, make_graphed_callables,
 * torch.compile's CUDA graph trees, vLLM, SGLang): call
 * ust_graph_capture_begun on the capturing thread once the capture has
 * begun, and ust_graph_capture_ended on it once it ended (or failed).
 * Between the two every call the thread makes of an observed operator is
 * keyed one by one, none tallied (defaults.key_every), so that the graph's
 * nodes map to routes and its replays are attributed. A capture nobody
 * reports is captured all the same; its calls past the thread's warm-up are
 * then tallied at random like any others, and those calls' nodes are
 * attributed to no route in its replays. Thread-local, engine-less (a
 * capture may begin before ust_enable and end after ust_disable); each
 * returns the captures the thread has under way (ended never goes below
 * 0). */
UST_API int ust_graph_capture_begun(void);
UST_API int ust_graph_capture_ended(void);

/* For whoever routes a thread's allocations to a CUDA graph's memory pool
 * outside a capture (torch.compile's CUDA graph trees run their warm-up
 * so; the Python package reports torch._C._cuda_beginAllocateCurrentThreadToPool
 * and _cuda_endAllocateToPool): between ust_pool_alloc_begun and
 * ust_pool_alloc_ended on that thread, a shadowed call keeps none of its
 * tensors past its return (a failing call is not kept whole, only its
 * evidence), since the pool's owner holds that every block alive in it is
 * an output it knows. Thread-local, engine-less; each returns the thread's
 * depth (ended never goes below 0). */
UST_API int ust_pool_alloc_begun(void);
UST_API int ust_pool_alloc_ended(void);

/* For whoever instantiates and replays a CUDA graph (the Python package
 * does it for torch.cuda.CUDAGraph): a shadow captured beside the chain
 * then runs its kernel in the chain only in the replays it verifies,
 * instead of that kernel deciding on the device at every replay. graph is
 * a cudaGraph_t the caller keeps alive while exec, a cudaGraphExec_t
 * instantiated from it, is bound (its nodes are what is enabled). Never
 * fail the caller: without an enabled understudy (or with
 * shadow.graph_gate "device"), or for a graph without such a shadow, they
 * do nothing.
 *   ust_graph_capture_id: the id of the capture stream (a cudaStream_t) is
 *     in now, 0 when none: ask once the capture has begun;
 *   ust_graph_capture_hosted: the same, for a capture whose executable the
 *     caller will bind and whose replays it will report (replay, then
 *     replayed): a shadow beside the chain captured in it gets no
 *     conditional node; the host starts its body (a graph of its own)
 *     after each replay that verifies it;
 *   ust_graph_bind: exec's replays gated from now on (capture: the id of
 *     the capture that made graph); the number of shadows gated (0: none),
 *     or an error;
 *   ust_graph_replay: call before each replay of exec on stream; returns
 *     1 when ust_graph_replayed must follow that replay, else 0;
 *   ust_graph_replayed: call after that replay was enqueued on stream;
 *   ust_graph_unbind: exec is being destroyed or made again;
 *   ust_graph_unseen: a graph is replayed whose capture this enable did not
 *     see (made before ust_enable, while disabled, or under an earlier
 *     enable), once a graph and enable: counted in the report's
 *     graphs.unseen; 1 when counted (enabled), else 0;
 *   ust_graph_exposed: the graph or executable graph capture made was
 *     handed to code outside understudy (its raw handle), which may change
 *     its kernels in place where understudy cannot see it: its captured
 *     calls that hold a candidate run production alone in its replays from
 *     now on (this enable), each counted on its route (the report's
 *     shadow.graph.exposed, the route observe-only); the number closed. */
UST_API unsigned long long ust_graph_capture_id(void *stream);
UST_API unsigned long long ust_graph_capture_hosted(void *stream);
UST_API int ust_graph_bind(void *graph, unsigned long long capture, void *exec);
UST_API int ust_graph_replay(void *exec, void *stream);
UST_API void ust_graph_replayed(void *exec, void *stream);
UST_API void ust_graph_unbind(void *exec);
UST_API int ust_graph_unseen(void);
UST_API int ust_graph_exposed(unsigned long long capture);

/* ---- the guard's comparison, for tools and tests ------------------------ */

typedef enum ust_compare_kind {
  UST_COMPARE_ALLCLOSE = 0, /* |c - p| <= atol + rtol * |p|; integers exactly */
  UST_COMPARE_EXACT = 1,    /* equal values; NaN equals NaN */
} ust_compare_kind;

typedef struct ust_compare_result {
  uint32_t size; /* the caller sets sizeof(ust_compare_result); fields beyond it are not written */
  uint64_t elements;
  uint64_t mismatches;            /* outside tolerance, non-finite disagreements included */
  uint64_t nonfinite_production;
  uint64_t nonfinite_candidate;
  uint64_t nonfinite_bad;         /* candidate non-finite where production is finite */
  int64_t first_mismatch;         /* row-major index of the first mismatch; -1 if none */
  double max_abs_err;             /* over elements finite on both sides */
  double max_rel_err;             /* |c - p| / |p| over finite elements with p != 0 */
  double sum_sq_diff;             /* sum (c - p)^2 over finite elements */
  double sum_sq_production;       /* sum p^2 over finite production elements */
  double device_time_ns;          /* GPU: the comparison's time on the device (events); host: wall time */
} ust_compare_result;

/* Compare two tensors exactly as the guard judges a candidate's output
 * against production's, in one pass. Both must have the same shape and
 * dtype, be row-major and compact (strides NULL or contiguous) and live on
 * the same device: host memory, or GPU memory when the library was built
 * with a GPU backend. atol or rtol < 0 selects the guard's default for the
 * dtype. On a GPU the work is enqueued on stream (NULL: the default stream)
 * and this function waits for it (it synchronises that stream). Tensors are
 * borrowed for the call. Thread-safe. */
UST_API int ust_compare_sync(const DLTensor *production, const DLTensor *candidate, int kind, double atol,
                             double rtol, void *stream, ust_compare_result *out);

#ifdef __cplusplus
}
#endif

#endif /* UNDERSTUDY_UNDERSTUDY_H */
