/*
 * A stand-in libcupti for the kernel tracer's tests on machines without a
 * GPU: the entry points dispatch/timer_cupti.c loads, with CUPTI's record
 * layouts (the toolkit's headers), driven by the test through fake_cupti_*:
 * a "launch" on the calling thread writes what CUPTI would (an external
 * correlation record for each pushed id and the API record while the API
 * kinds are on, the launch callback while it is enabled, the kernel record
 * while kernels are traced) into buffers obtained from the tracer's request
 * callback, and flushes hand them to its completion callback.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

#define EXPORT __attribute__((visibility("default")))
#define KINDS 64

static CUpti_BuffersCallbackRequestFunc g_req;
static CUpti_BuffersCallbackCompleteFunc g_comp;
static int g_enabled[KINDS];
static CUptiResult g_subscribe_result = CUPTI_SUCCESS;
static int g_subscribed;
static CUpti_CallbackFunc g_cb;
static int g_cb_runtime[1024], g_cb_driver[1024], g_cb_resource[64];
static uint32_t g_corr;
static double g_ticks_per_ns = 1.0;
static int g_hold_kernels;  /* kernel records stay with "the device" until released */
static int g_keep_buffer;   /* a forced flush keeps the kernel buffer (CUPTI holding one) */
static uint64_t g_ext_stack[16];
static int g_ext_n;
static int g_edge_gaps; /* kernel tracing on while a subscriber has no launch callback on */

typedef struct buffer {
  uint8_t *p;
  size_t size, valid;
} buffer;
static buffer g_host, g_device;

/* The tests' clock, ns: the host's (the tracer reads it as its monotonic
 * clock, ust__cupti_clock) and the device's (records and cuptiGetTimestamp,
 * in ticks). It moves only when read, by a fixed step, and when the test
 * moves it: a window stays open, or falls due, exactly when the test says,
 * however slowly the machine runs. The step lets the tracer's own waits
 * (a closed window draining, at least DRAIN_MIN_NS and at most
 * DRAIN_MAX_NS) end after a known number of readings. */
static _Atomic uint64_t g_clock_ns = 1000000000ull;
static _Atomic uint64_t g_clock_step_ns = 1000000ull;

EXPORT uint64_t fake_cupti_clock_ns(void) {
  const uint64_t step = atomic_load(&g_clock_step_ns);
  return atomic_fetch_add(&g_clock_ns, step) + step;
}

/* Time passing between two steps of the test (a sleep, in real time). */
EXPORT void fake_cupti_clock_advance(uint64_t ns) { atomic_fetch_add(&g_clock_ns, ns); }

/* How far each reading moves the clock (1 ms until set). */
EXPORT void fake_cupti_clock_step(uint64_t ns) { atomic_store(&g_clock_step_ns, ns); }

static uint64_t now_ticks(void) { return (uint64_t)((double)fake_cupti_clock_ns() * g_ticks_per_ns); }

static void *room(buffer *b, size_t n) {
  if (b->p == NULL) {
    size_t max = 0;
    g_req(&b->p, &b->size, &max);
    b->valid = 0;
    if (b->p == NULL)
      return NULL; /* dropped: the tracer had no buffer */
  }
  if (b->valid + n > b->size)
    return NULL;
  void *r = b->p + b->valid;
  memset(r, 0, n);
  b->valid += (n + 7) & ~(size_t)7;
  return r;
}

static void hand_over(buffer *b) {
  if (b->p == NULL)
    return;
  uint8_t *p = b->p;
  const size_t size = b->size, valid = b->valid;
  b->p = NULL;
  b->valid = 0;
  g_comp(NULL, 0, p, size, valid);
}

static size_t record_size(CUpti_ActivityKind kind) {
  switch (kind) {
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    return sizeof(CUpti_ActivityKernel10);
  case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
    return sizeof(CUpti_ActivityExternalCorrelation);
  default:
    return sizeof(CUpti_ActivityAPI);
  }
}

/* ---- the test's controls ------------------------------------------------------------- */

EXPORT void fake_cupti_reset(CUptiResult subscribe_result, double ticks_per_ns) {
  g_subscribe_result = subscribe_result;
  g_ticks_per_ns = ticks_per_ns;
  g_hold_kernels = g_keep_buffer = 0;
  g_edge_gaps = 0;
}

EXPORT void fake_cupti_hold_kernels(int hold) { g_hold_kernels = hold; }
EXPORT void fake_cupti_keep_buffer(int keep) { g_keep_buffer = keep; }
EXPORT int fake_cupti_enabled(int kind) { return kind >= 0 && kind < KINDS && g_enabled[kind]; }
EXPORT int fake_cupti_subscribed(void) { return g_subscribed; }
/* Times kernel records were on for a subscriber without launch callbacks:
 * a kernel launched then would reach the tracer without its launch. */
EXPORT int fake_cupti_edge_gaps(void) { return g_edge_gaps; }

static int launch_callbacks_on(void) {
  for (int i = 0; i < 1024; i++)
    if (g_cb_runtime[i] || g_cb_driver[i])
      return 1;
  return 0;
}

/* A CUDA API call on this thread; a kernel launch when name is not NULL
 * (runtime: cudaLaunchKernel, else cuLaunchKernel), running dur_ns. */
EXPORT uint32_t fake_cupti_call(int runtime, const char *name, uint64_t dur_ns) {
  const uint32_t corr = ++g_corr;
  const CUpti_CallbackId cbid = name == NULL ? CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020
                                : runtime   ? CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
                                            : CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel;
  if (g_subscribed && g_cb != NULL && cbid < 1024 && (runtime ? g_cb_runtime[cbid] : g_cb_driver[cbid])) {
    CUpti_CallbackData d = {0};
    d.callbackSite = CUPTI_API_ENTER;
    d.correlationId = corr;
    g_cb(NULL, runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
  }
  const CUpti_ActivityKind api_kind = runtime ? CUPTI_ACTIVITY_KIND_RUNTIME : CUPTI_ACTIVITY_KIND_DRIVER;
  if (g_enabled[api_kind]) {
    if (g_ext_n > 0 && g_enabled[CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION]) {
      CUpti_ActivityExternalCorrelation *x = room(&g_host, sizeof *x);
      if (x != NULL) {
        x->kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
        x->externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;
        x->externalId = g_ext_stack[g_ext_n - 1];
        x->correlationId = corr;
      }
    }
    CUpti_ActivityAPI *a = room(&g_host, sizeof *a);
    if (a != NULL) {
      a->kind = api_kind;
      a->cbid = cbid;
      a->correlationId = corr;
    }
  }
  if (name != NULL && g_enabled[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL]) {
    CUpti_ActivityKernel10 *k = room(&g_device, sizeof *k);
    if (k != NULL) {
      k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
      k->correlationId = corr;
      k->start = g_hold_kernels ? 0 : now_ticks();
      k->end = g_hold_kernels ? 0 : k->start + (uint64_t)((double)dur_ns * g_ticks_per_ns);
      k->name = name;
    }
  }
  return corr;
}

/* A kernel a graph launch ran as node (the executable graph's node id), all
 * the nodes of one launch sharing its correlation id (a fresh one when corr
 * is 0); returns it. */
EXPORT uint32_t fake_cupti_graph_kernel(uint32_t corr, uint64_t node, const char *name, uint64_t dur_ns) {
  if (corr == 0)
    corr = ++g_corr;
  if (g_enabled[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL]) {
    CUpti_ActivityKernel10 *k = room(&g_device, sizeof *k);
    if (k != NULL) {
      k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
      k->correlationId = corr;
      k->graphNodeId = node;
      k->graphId = (uint32_t)(node >> 32);
      k->start = now_ticks();
      k->end = k->start + (uint64_t)((double)dur_ns * g_ticks_per_ns);
      k->name = name;
    }
  }
  return corr;
}

/* CUPTI asking the tracer for n more buffers and keeping them (a busy
 * process's threads each filling its own); returns how many it got. */
static uint8_t *g_taken[256];
static int g_n_taken;
EXPORT int fake_cupti_take_buffers(int n) {
  int got = 0;
  for (int i = 0; i < n && g_n_taken < 256; i++) {
    uint8_t *p = NULL;
    size_t size = 0, max = 0;
    g_req(&p, &size, &max);
    if (p != NULL) {
      g_taken[g_n_taken++] = p;
      got++;
    }
  }
  return got;
}

/* Hands back every buffer fake_cupti_take_buffers kept (no records). */
EXPORT void fake_cupti_return_buffers(void) {
  while (g_n_taken > 0)
    g_comp(NULL, 0, g_taken[--g_n_taken], 0, 0);
}

/* ---- CUPTI's entry points ------------------------------------------------------------ */

/* Graph graph instantiated as executable graph exec (their handles are
 * their ids): the resource callback, while enabled. */
EXPORT void fake_cupti_instantiate(uint32_t graph, uint32_t exec) {
  if (!g_subscribed || g_cb == NULL || !g_cb_resource[CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED])
    return;
  CUpti_GraphData gd = {0};
  gd.graph = (CUgraph)(uintptr_t)graph;
  gd.graphExec = (CUgraphExec)(uintptr_t)exec;
  CUpti_ResourceData rd = {0};
  rd.resourceDescriptor = &gd;
  g_cb(NULL, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED, &rd);
}

EXPORT CUptiResult cuptiGetGraphId(CUgraph graph, uint32_t *id) {
  if (graph == NULL)
    return CUPTI_ERROR_INVALID_PARAMETER;
  *id = (uint32_t)(uintptr_t)graph;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetGraphExecId(CUgraphExec exec, uint32_t *id) {
  if (exec == NULL)
    return CUPTI_ERROR_INVALID_PARAMETER;
  *id = (uint32_t)(uintptr_t)exec;
  return CUPTI_SUCCESS;
}

/* A node handle of the tests is its id. */
EXPORT CUptiResult cuptiGetGraphNodeId(CUgraphNode node, uint64_t *id) {
  if (node == NULL)
    return CUPTI_ERROR_INVALID_PARAMETER;
  *id = (uint64_t)(uintptr_t)node;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetVersion(uint32_t *v) {
  *v = 130001;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetResultString(CUptiResult r, const char **s) {
  *s = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
                                                          : "fake CUPTI error";
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *h, CUpti_CallbackFunc cb, void *data) {
  if (g_subscribe_result != CUPTI_SUCCESS)
    return g_subscribe_result;
  if (g_subscribed)
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  g_subscribed = 1;
  g_cb = cb;
  *h = (CUpti_SubscriberHandle)&g_subscribed;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *h, CUpti_CallbackFunc cb, void *data,
                                     CUpti_SubscriberParams *p) {
  const CUptiResult r = cuptiSubscribe(h, cb, data);
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED && p != NULL && p->oldSubscriberName != NULL &&
      p->oldSubscriberSize > 8)
    strcpy(p->oldSubscriberName, "kineto");
  return r;
}

EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle h) {
  g_subscribed = 0;
  g_cb = NULL;
  memset(g_cb_runtime, 0, sizeof g_cb_runtime);
  memset(g_cb_driver, 0, sizeof g_cb_driver);
  memset(g_cb_resource, 0, sizeof g_cb_resource);
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiEnableCallback(uint32_t on, CUpti_SubscriberHandle h, CUpti_CallbackDomain d,
                                       CUpti_CallbackId cbid) {
  if (!g_subscribed || cbid >= 1024 || (d == CUPTI_CB_DOMAIN_RESOURCE && cbid >= 64))
    return CUPTI_ERROR_INVALID_PARAMETER;
  if (d == CUPTI_CB_DOMAIN_RESOURCE) {
    g_cb_resource[cbid] = (int)on;
  } else {
    const int was = launch_callbacks_on();
    (d == CUPTI_CB_DOMAIN_RUNTIME_API ? g_cb_runtime : g_cb_driver)[cbid] = (int)on;
    if (was && !launch_callbacks_on() && g_enabled[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL])
      g_edge_gaps++;
  }
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
                                                  CUpti_BuffersCallbackCompleteFunc comp) {
  g_req = req;
  g_comp = comp;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind k) {
  if ((int)k < 0 || (int)k >= KINDS)
    return CUPTI_ERROR_INVALID_KIND;
  if (k == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && g_subscribed && !launch_callbacks_on())
    g_edge_gaps++;
  g_enabled[k] = 1;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind k) {
  if ((int)k < 0 || (int)k >= KINDS)
    return CUPTI_ERROR_INVALID_KIND;
  g_enabled[k] = 0;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
  if (g_ext_n == 16)
    return CUPTI_ERROR_MAX_LIMIT_REACHED;
  g_ext_stack[g_ext_n++] = id;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t *last) {
  if (g_ext_n == 0)
    return CUPTI_ERROR_QUEUE_EMPTY;
  const uint64_t id = g_ext_stack[--g_ext_n];
  if (last != NULL)
    *last = id;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  hand_over(&g_host);
  if (g_hold_kernels && !(flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED))
    return CUPTI_SUCCESS; /* the kernels have not run yet */
  if (g_keep_buffer)
    return CUPTI_SUCCESS;
  hand_over(&g_device);
  return CUPTI_SUCCESS;
}

/* Hands back the buffer kept by fake_cupti_keep_buffer (late). */
EXPORT void fake_cupti_release_buffer(void) {
  g_keep_buffer = 0;
  hand_over(&g_device);
}

EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **rec) {
  size_t off = 0;
  if (*rec != NULL)
    off = (size_t)((uint8_t *)*rec - buf) + ((record_size((*rec)->kind) + 7) & ~(size_t)7);
  if (off >= valid)
    return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *rec = (CUpti_Activity *)(buf + off);
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *n) {
  *n = 0;
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetTimestamp(uint64_t *t) {
  *t = now_ticks();
  return CUPTI_SUCCESS;
}
