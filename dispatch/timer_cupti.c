/*
 * The CUPTI kernel tracer behind the GPU timers (CUDA builds).
 *
 * libcupti is loaded at run time (the copy torch already mapped when there
 * is one, else the path the config names, else by its soname); a process
 * without it times with events. The tracer records kernels only in windows
 * (tracing slows every launch of the process while it is on): a window
 * opens when the budget allows; every intercepted CUDA call inside it takes
 * a call slot, and either pushes the slot's external correlation id around
 * its redispatch (records: the API records carry it) or is named by the
 * launch APIs' callbacks on its thread (callbacks); when the window closes
 * the worker drains the records and joins them (kerneltime.c). Serving
 * threads only take slots, push, pop and count; the worker (ust__cupti_poll)
 * does everything else. Nothing synchronises a stream.
 *
 * One client per process (before CUDA 13.3): a window asks for CUPTI's
 * subscription (holds it only for callbacks). A tool injected into the
 * process, or torch's profiler (Kineto) preparing or recording, and the
 * tracer stands down (events time the calls), asking again a second later;
 * a subscriber left by an idle torch profiler is no claim. Buffers of ours
 * that do not come back, or another client's that come to us, mean another
 * client took the activity callbacks: the tracer stands down too.
 *
 * CUPTI's callbacks carry no context argument, so the tracer whose window is
 * open is published in one process-wide pointer (the registration it stands
 * for is process-wide too), and the activity buffers are process-wide and
 * never freed (CUPTI may hold one past the tracer it was handed out for).
 */
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cupti.h>

#include "dispatch/dispatch.h"

#define N_BUFFERS 16   /* allocated when the first window opens */
#define MAX_BUFFERS 64  /* grown to, when CUPTI asks and none is free */
#define BUFFER_BYTES (2u << 20)
#define DRAIN_FLUSH_NS 5000000ull   /* a draining window's buffers are flushed this often */
#define DRAIN_MIN_NS 2000000ull     /* a closed window waits at least this long for its kernels */
#define DRAIN_MAX_NS 2000000000ull  /* and at most this long */
#define RETRY_NS 1000000000ull      /* a yielded tracer asks again this often */
#define MIN_GAP_NS 100000000ull     /* between two windows, at least */

typedef CUptiResult (*fn_u32p)(uint32_t *);
typedef CUptiResult (*fn_subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
typedef CUptiResult (*fn_subscribe2)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *, CUpti_SubscriberParams *);
typedef CUptiResult (*fn_unsubscribe)(CUpti_SubscriberHandle);
typedef CUptiResult (*fn_register)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*fn_kind)(CUpti_ActivityKind);
typedef CUptiResult (*fn_push)(CUpti_ExternalCorrelationKind, uint64_t);
typedef CUptiResult (*fn_pop)(CUpti_ExternalCorrelationKind, uint64_t *);
typedef CUptiResult (*fn_flush)(uint32_t);
typedef CUptiResult (*fn_next)(uint8_t *, size_t, CUpti_Activity **);
typedef CUptiResult (*fn_dropped)(CUcontext, uint32_t, size_t *);
typedef CUptiResult (*fn_u64p)(uint64_t *);
typedef CUptiResult (*fn_errstr)(CUptiResult, const char **);
typedef CUptiResult (*fn_enable_cb)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
typedef CUptiResult (*fn_node_id)(CUgraphNode, uint64_t *);
typedef CUptiResult (*fn_graph_id)(CUgraph, uint32_t *);
typedef CUptiResult (*fn_exec_id)(CUgraphExec, uint32_t *);

typedef struct cupti_api {
  fn_u32p get_version;
  fn_subscribe subscribe;
  fn_subscribe2 subscribe_v2; /* NULL before CUDA 13.0 */
  fn_unsubscribe unsubscribe;
  fn_register register_callbacks;
  fn_kind enable, disable;
  fn_push push;
  fn_pop pop;
  fn_flush flush_all;
  fn_next next_record;
  fn_dropped dropped;
  fn_u64p timestamp;
  fn_errstr error_string;
  fn_enable_cb enable_callback;
  fn_node_id graph_node_id; /* NULL: captured calls are not mapped to their graph nodes */
  fn_graph_id graph_id;     /* with exec_id: which graph an executable graph was instantiated */
  fn_exec_id exec_id;       /* from, seen while a window holds the subscription (NULL: not asked) */
} cupti_api;

enum { ST_OFF, ST_IDLE, ST_OPEN, ST_CLOSING, ST_DRAINING, ST_YIELDED };
static const char *const state_names[] = {"off", "idle", "window", "closing", "draining", "yielded"};

/* The launch APIs (CUDA 13.0 ids): a call's launches are counted from
 * their records, so that a call whose kernel records were lost is known. */
static const CUpti_CallbackId runtime_launches[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunch_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunch_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000,
};
static const CUpti_CallbackId driver_launches[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

/* The APIs that change an executable graph in place (a node's parameters,
 * or the whole of it from another graph): a graph library that changes a
 * captured call's nodes makes its replays run something else. Every one's
 * parameters begin with the executable graph, then the node it sets (or,
 * for an update, the graph it is updated from). 0: not one of them; 1: a
 * node's; 2: the whole executable graph's. */
static int change_kind(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
    switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecKernelNodeSetParams_v10010:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecNodeSetParams_v12020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecChildGraphNodeSetParams_v11010:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecMemcpyNodeSetParams_v10020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecMemcpyNodeSetParams1D_v11010:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecMemsetNodeSetParams_v10020:
      return 1;
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecUpdate_v10020:
      return 2;
    default:
      return 0;
    }
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API)
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecChildGraphNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemcpyNodeSetParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemsetNodeSetParams:
      return 1;
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate_v2:
      return 2;
    default:
      return 0;
    }
  return 0;
}

/* The leading fields change_kind reads, as CUPTI's parameter structures lay
 * them out (checked for each below). */
typedef struct exec_change_params {
  void *exec, *second;
} exec_change_params;
#define SAME_LEAD(type, exec_field, second_field)                                                                      \
  _Static_assert(offsetof(type, exec_field) == offsetof(exec_change_params, exec) &&                                 \
                     offsetof(type, second_field) == offsetof(exec_change_params, second),                           \
                 #type " leads with the executable graph")
SAME_LEAD(cudaGraphExecKernelNodeSetParams_v10010_params, hGraphExec, node);
SAME_LEAD(cudaGraphExecNodeSetParams_v12020_params, graphExec, node);
SAME_LEAD(cudaGraphExecChildGraphNodeSetParams_v11010_params, hGraphExec, node);
SAME_LEAD(cudaGraphExecMemcpyNodeSetParams_v10020_params, hGraphExec, node);
SAME_LEAD(cudaGraphExecMemcpyNodeSetParams1D_v11010_params, hGraphExec, node);
SAME_LEAD(cudaGraphExecMemsetNodeSetParams_v10020_params, hGraphExec, node);
SAME_LEAD(cudaGraphExecUpdate_v10020_params, hGraphExec, hGraph);
SAME_LEAD(cuGraphExecKernelNodeSetParams_params, hGraphExec, hNode);
SAME_LEAD(cuGraphExecKernelNodeSetParams_v2_params, hGraphExec, hNode);
SAME_LEAD(cuGraphExecNodeSetParams_params, hGraphExec, hNode);
SAME_LEAD(cuGraphExecChildGraphNodeSetParams_params, hGraphExec, hNode);
SAME_LEAD(cuGraphExecMemcpyNodeSetParams_params, hGraphExec, hNode);
SAME_LEAD(cuGraphExecMemsetNodeSetParams_params, hGraphExec, hNode);
SAME_LEAD(cuGraphExecUpdate_params, hGraphExec, hGraph);
SAME_LEAD(cuGraphExecUpdate_v2_params, hGraphExec, hGraph);
#undef SAME_LEAD

static const CUpti_CallbackId runtime_changes[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecKernelNodeSetParams_v10010,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecNodeSetParams_v12020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecChildGraphNodeSetParams_v11010,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecUpdate_v10020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecMemcpyNodeSetParams_v10020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecMemcpyNodeSetParams1D_v11010,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecMemsetNodeSetParams_v10020,
};
static const CUpti_CallbackId driver_changes[] = {
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecChildGraphNodeSetParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemcpyNodeSetParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecMemsetNodeSetParams,
};

struct ust__cupti {
  cupti_api api;
  void *lib;
  uint32_t version;
  ust__log_sink *log;
  ust__timer_opts opts;
  ust__kt *kt;
  int state;
  atomic_int traced; /* 1 in idle, window, closing, draining: the serving threads' view */
  char why[200]; /* why the tracer is off or yielded; "" otherwise */
  CUpti_SubscriberHandle sub;
  int subscribed, noted_incumbent;
  atomic_int by_callbacks; /* this window joins launches through callbacks (no external ids pushed) */
  double ns_per_tick; /* the last window's */
  uint64_t opened_ns, closed_ns, next_open_ns, last_flush_ns;
  uint64_t opened_ticks, opened_clock_ns; /* cuptiGetTimestamp and the host clock at the window's opening */
  uint64_t opened_pair_ns;                /* how far apart that pair may be */
  uint64_t yields, windows_cut;
  uint64_t buffers_lost; /* still with CUPTI after a window's forced flush */
  atomic_uint_fast64_t buffers_short, foreign_buffers;
};

static _Atomic(ust__cupti *) g_tracer; /* the tracer CUPTI's callbacks feed (see the top) */
static atomic_int g_in_callback;      /* callbacks running: a tracer is freed only after they left */

/* The activity buffers, process-wide and never freed: CUPTI may hold one
 * past the window (and the tracer) it was handed out for, and write into it
 * later. A buffer is handed out only while not with CUPTI; one that comes
 * back is read only while a tracer is there. */
static struct {
  pthread_mutex_t lock;
  uint8_t *buf[MAX_BUFFERS];
  int with_cupti[MAX_BUFFERS];
  int n;
} g_pool = {PTHREAD_MUTEX_INITIALIZER, {NULL}, {0}, 0};

static const char *cupti_error(const ust__cupti *c, CUptiResult r) {
  const char *s = NULL;
  if (c->api.error_string == NULL || c->api.error_string(r, &s) != CUPTI_SUCCESS || s == NULL)
    return "CUPTI error";
  return s;
}

/* The monotonic clock, ns (windows are scheduled on it). The tracer's
 * tests put a stand-in here, a clock they move themselves (set before a
 * tracer is made), so that no window of theirs closes by how fast the
 * machine ran. */
uint64_t (*ust__cupti_clock)(void) = ust__now_ns;

static uint64_t now_ns(void) { return ust__cupti_clock(); }

static void set_why(ust__cupti *c, const char *fmt, const char *a, const char *b) {
  snprintf(c->why, sizeof c->why, fmt, a != NULL ? a : "", b != NULL ? b : "");
}

/* ---- CUPTI's buffer callbacks -------------------------------------------------------- */

/* One more buffer in the pool, up to MAX_BUFFERS: 0, or -1. Called with
 * the pool's lock held. */
static int pool_grow_locked(void) {
  uint8_t *b = g_pool.n < MAX_BUFFERS ? aligned_alloc(8, BUFFER_BYTES) : NULL;
  if (b == NULL)
    return -1;
  g_pool.with_cupti[g_pool.n] = 0;
  g_pool.buf[g_pool.n++] = b;
  return 0;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = NULL;
  *size = 0;
  *max_records = 0;
  pthread_mutex_lock(&g_pool.lock);
  int i = 0;
  while (i < g_pool.n && g_pool.with_cupti[i])
    i++;
  /* None free (records come faster than the worker gets them back): one
   * more; without a buffer CUPTI drops records. */
  if (i == g_pool.n)
    pool_grow_locked();
  if (i < g_pool.n) {
    g_pool.with_cupti[i] = 1;
    *buffer = g_pool.buf[i];
    *size = BUFFER_BYTES;
  }
  pthread_mutex_unlock(&g_pool.lock);
  atomic_fetch_add(&g_in_callback, 1);
  ust__cupti *c = atomic_load(&g_tracer);
  if (*buffer == NULL && c != NULL)
    atomic_fetch_add_explicit(&c->buffers_short, 1, memory_order_relaxed);
  atomic_fetch_sub(&g_in_callback, 1);
}

static int is_launch(const CUpti_CallbackId *ids, size_t n, CUpti_CallbackId cbid) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] == cbid)
      return 1;
  return 0;
}

static void read_records(ust__cupti *c, uint8_t *buf, size_t valid) {
  CUpti_Activity *rec = NULL;
  while (c->api.next_record(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      /* CUpti_ActivityKernel10 in 13.0; later versions append fields */
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
      ust__kt_kernel(c->kt, k->correlationId, k->graphNodeId, k->start, k->end, k->name);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME || rec->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
      if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME
              ? is_launch(runtime_launches, sizeof runtime_launches / sizeof runtime_launches[0], a->cbid)
              : is_launch(driver_launches, sizeof driver_launches / sizeof driver_launches[0], a->cbid))
        ust__kt_launch(c->kt, a->correlationId,
                       rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? UST__KT_LAUNCH_RUNTIME : UST__KT_LAUNCH_DRIVER);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
      const CUpti_ActivityExternalCorrelation *x = (const CUpti_ActivityExternalCorrelation *)rec;
      if (x->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2)
        ust__kt_ext(c->kt, x->correlationId, x->externalId);
    }
  }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  int i = -1;
  pthread_mutex_lock(&g_pool.lock);
  for (int j = 0; j < g_pool.n && i < 0; j++)
    if (g_pool.buf[j] == buffer && g_pool.with_cupti[j])
      i = j;
  pthread_mutex_unlock(&g_pool.lock);
  atomic_fetch_add(&g_in_callback, 1);
  ust__cupti *c = atomic_load(&g_tracer);
  if (i < 0) {
    if (c != NULL)
      atomic_fetch_add_explicit(&c->foreign_buffers, 1, memory_order_relaxed); /* not ours: leave it */
    atomic_fetch_sub(&g_in_callback, 1);
    return;
  }
  if (c != NULL && valid > 0)
    read_records(c, buffer, valid);
  atomic_fetch_sub(&g_in_callback, 1);
  pthread_mutex_lock(&g_pool.lock);
  g_pool.with_cupti[i] = 0;
  pthread_mutex_unlock(&g_pool.lock);
}

/* Inside a runtime change API: its driver call is the same change. Kept as
 * the subscription's generation at the runtime call's entry (0: none), so
 * that an entry seen under an earlier subscription, whose exit never came,
 * counts for nothing. */
static atomic_uint g_change_gen;
static _Thread_local unsigned tls_change_gen;

/* An executable graph changed in place (callbacks mode, at the API's exit):
 * counted on the routes of the captured calls it changed. A runtime API's
 * own driver call is the same change: counted once, by the runtime's. */
static void graph_changed(CUpti_CallbackDomain domain, int kind, const CUpti_CallbackData *cb) {
  const int runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
  const unsigned gen = atomic_load_explicit(&g_change_gen, memory_order_relaxed);
  if (cb->callbackSite == CUPTI_API_ENTER) {
    if (runtime)
      tls_change_gen = gen;
    return;
  }
  /* a runtime change's entry seen under this subscription (a driver exit
   * it hid, and a runtime exit come under the next one, count nothing) */
  const int inside = tls_change_gen != 0 && tls_change_gen == gen;
  if (runtime) {
    tls_change_gen = 0;
    if (!inside)
      return; /* its driver call, if any, was counted */
  } else if (inside) {
    return;
  }
  const int ok = cb->functionReturnValue != NULL &&
                 (runtime ? *(const cudaError_t *)cb->functionReturnValue == cudaSuccess
                          : *(const CUresult *)cb->functionReturnValue == CUDA_SUCCESS);
  const exec_change_params *p = cb->functionParams;
  void *exec = p != NULL ? p->exec : NULL, *node = p != NULL && kind == 1 ? p->second : NULL;
  atomic_fetch_add(&g_in_callback, 1);
  ust__cupti *c = atomic_load(&g_tracer);
  uint32_t exec_id = 0;
  uint64_t node_id = 0;
  if (ok && c != NULL && exec != NULL && c->api.exec_id != NULL &&
      c->api.exec_id((CUgraphExec)exec, &exec_id) == CUPTI_SUCCESS &&
      (node == NULL || (c->api.graph_node_id != NULL &&
                        c->api.graph_node_id((CUgraphNode)node, &node_id) == CUPTI_SUCCESS && node_id != 0)))
    ust__kt_exec_changed(c->kt, exec_id, node_id);
  atomic_fetch_sub(&g_in_callback, 1);
}

/* A launch API entered on a serving thread (callbacks mode): its correlation
 * id is the one its kernels' records will carry; the thread's current call
 * slot is the call it launches for. */
static void CUPTIAPI launch_callback(void *data, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                     const void *info) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED && info != NULL) {
    /* a graph instantiated while the window holds the subscription: which
     * captured graph its executable graph's replays are of, for certain */
    const CUpti_ResourceData *rd = info;
    const CUpti_GraphData *gd = rd->resourceDescriptor;
    atomic_fetch_add(&g_in_callback, 1);
    ust__cupti *c = atomic_load(&g_tracer);
    uint32_t graph = 0, exec = 0;
    if (c != NULL && gd != NULL && c->api.graph_id != NULL && c->api.exec_id != NULL &&
        c->api.graph_id(gd->graph, &graph) == CUPTI_SUCCESS && c->api.exec_id(gd->graphExec, &exec) == CUPTI_SUCCESS)
      ust__kt_graph_exec(c->kt, graph, exec);
    atomic_fetch_sub(&g_in_callback, 1);
    return;
  }
  const CUpti_CallbackData *cb = info;
  if ((domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) || cb == NULL)
    return;
  const int kind = change_kind(domain, cbid); /* a switch: every launch of a window passes here */
  if (kind != 0) {
    graph_changed(domain, kind, cb);
    return;
  }
  if (cb->callbackSite != CUPTI_API_ENTER)
    return;
  /* every launch of the window: inside a call it is the call's; any is
   * counted by the launching thread's phase. A launch outside calls on a
   * thread without a phase has nothing to note (unknown is what an unnoted
   * launch counts as): no lock for it. */
  const int slot = ust__kt_current();
  const int phase = ust__thread_phase();
  if (slot < 0 && phase == UST_PHASE_UNKNOWN)
    return;
  atomic_fetch_add(&g_in_callback, 1);
  ust__cupti *c = atomic_load(&g_tracer);
  if (c != NULL)
    ust__kt_launch_of(c->kt, cb->correlationId, slot,
                      domain == CUPTI_CB_DOMAIN_RUNTIME_API ? UST__KT_LAUNCH_RUNTIME : UST__KT_LAUNCH_DRIVER, phase);
  atomic_fetch_sub(&g_in_callback, 1);
}

static void set_callbacks(ust__cupti *c, uint32_t on) {
  if (on) {
    unsigned gen = atomic_fetch_add(&g_change_gen, 1) + 1;
    if (gen == 0) /* never 0, the thread's "none" */
      atomic_fetch_add(&g_change_gen, 1);
  }
  for (size_t i = 0; i < sizeof runtime_launches / sizeof runtime_launches[0]; i++)
    c->api.enable_callback(on, c->sub, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_launches[i]);
  for (size_t i = 0; i < sizeof driver_launches / sizeof driver_launches[0]; i++)
    c->api.enable_callback(on, c->sub, CUPTI_CB_DOMAIN_DRIVER_API, driver_launches[i]);
  if (c->api.graph_id != NULL && c->api.exec_id != NULL) {
    c->api.enable_callback(on, c->sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED);
    for (size_t i = 0; i < sizeof runtime_changes / sizeof runtime_changes[0]; i++)
      c->api.enable_callback(on, c->sub, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_changes[i]);
    for (size_t i = 0; i < sizeof driver_changes / sizeof driver_changes[0]; i++)
      c->api.enable_callback(on, c->sub, CUPTI_CB_DOMAIN_DRIVER_API, driver_changes[i]);
  }
}

/* ---- loading ------------------------------------------------------------------------- */

static void *load_library(const char *path) {
  void *h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
  if (h == NULL && path != NULL && path[0] != '\0')
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL)
    h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  return h;
}

static int load_api(ust__cupti *c) {
#define SYM(field, name)                                                                                               \
  do {                                                                                                                 \
    *(void **)(&c->api.field) = dlsym(c->lib, name);                                                                   \
    if (c->api.field == NULL) {                                                                                        \
      set_why(c, "libcupti lacks %s%s", name, NULL);                                                                   \
      return -1;                                                                                                       \
    }                                                                                                                  \
  } while (0)
  SYM(get_version, "cuptiGetVersion");
  SYM(subscribe, "cuptiSubscribe");
  SYM(unsubscribe, "cuptiUnsubscribe");
  *(void **)(&c->api.subscribe_v2) = dlsym(c->lib, "cuptiSubscribe_v2");
  SYM(register_callbacks, "cuptiActivityRegisterCallbacks");
  SYM(enable, "cuptiActivityEnable");
  SYM(disable, "cuptiActivityDisable");
  SYM(push, "cuptiActivityPushExternalCorrelationId");
  SYM(pop, "cuptiActivityPopExternalCorrelationId");
  SYM(flush_all, "cuptiActivityFlushAll");
  SYM(next_record, "cuptiActivityGetNextRecord");
  SYM(dropped, "cuptiActivityGetNumDroppedRecords");
  SYM(timestamp, "cuptiGetTimestamp");
  SYM(error_string, "cuptiGetResultString");
  SYM(enable_callback, "cuptiEnableCallback");
  *(void **)(&c->api.graph_node_id) = dlsym(c->lib, "cuptiGetGraphNodeId");
  *(void **)(&c->api.graph_id) = dlsym(c->lib, "cuptiGetGraphId");
  *(void **)(&c->api.exec_id) = dlsym(c->lib, "cuptiGetGraphExecId");
#undef SYM
  return 0;
}

int ust__cupti_create(const ust__timer_opts *opts, ust__log_sink *log, ust__cupti **out) {
  *out = NULL;
  ust__cupti *c = calloc(1, sizeof *c);
  if (c == NULL)
    return ust__error(UST_ENOMEM, "out of memory for the kernel tracer");
  c->opts = *opts;
  c->log = log;
  c->ns_per_tick = 1.0;
  int rc = ust__kt_create(&c->kt);
  if (rc != 0) {
    free(c);
    return rc;
  }
  c->state = ST_OFF;
  if (opts->kind == UST__TIMER_EVENTS) {
    set_why(c, "timer.kind is \"events\"%s%s", NULL, NULL);
  } else if ((c->lib = load_library(opts->cupti_path)) == NULL) {
    const char *e = dlerror();
    set_why(c, "libcupti.so.13 could not be loaded: %s%s", e != NULL ? e : "not found", NULL);
  } else if (load_api(c) == 0) {
    if (c->api.get_version(&c->version) != CUPTI_SUCCESS || c->version < 130000 || c->version >= 140000) {
      char v[32];
      snprintf(v, sizeof v, "%u", c->version);
      set_why(c, "libcupti API version %s is not a CUDA 13 one (the kernel record's layout is 13.x's)%s", v, NULL);
    } else {
      c->state = ST_IDLE;
      c->why[0] = '\0';
      atomic_store(&c->traced, 1);
    }
  }
  if (c->state == ST_OFF && opts->kind == UST__TIMER_CUPTI)
    ust__log(log, UST_LOG_WARN, "timer: CUPTI was asked for and is not available (%s); events time the calls", c->why);
  *out = c;
  return 0;
}

/* ---- windows ------------------------------------------------------------------------- */

/* CUPTI's clock and the host's read as one pair: the host's on both sides
 * of CUPTI's (the midpoint; *gap_ns how far apart), the closest of a few
 * tries, so that a preemption between the two readings is not taken for a
 * clock rate. */
static int clock_pair(ust__cupti *c, uint64_t *ticks, uint64_t *clock_ns, uint64_t *gap_ns) {
  *gap_ns = UINT64_MAX;
  for (int i = 0; i < 4; i++) {
    uint64_t t = 0;
    const uint64_t a = now_ns();
    if (c->api.timestamp(&t) != CUPTI_SUCCESS)
      return -1;
    const uint64_t b = now_ns();
    if (b - a < *gap_ns) {
      *gap_ns = b - a;
      *ticks = t;
      *clock_ns = a + (b - a) / 2;
    }
  }
  return 0;
}

static int alloc_buffers(void) {
  pthread_mutex_lock(&g_pool.lock);
  while (g_pool.n < N_BUFFERS && pool_grow_locked() == 0) {
  }
  const int n = g_pool.n;
  pthread_mutex_unlock(&g_pool.lock);
  return n > 0 ? 0 : -1;
}

/* Buffers still with CUPTI. */
static int buffers_out(void) {
  pthread_mutex_lock(&g_pool.lock);
  int n = 0;
  for (int i = 0; i < g_pool.n; i++)
    n += g_pool.with_cupti[i];
  pthread_mutex_unlock(&g_pool.lock);
  return n;
}

static void disable_kinds(ust__cupti *c) {
  c->api.disable(CUPTI_ACTIVITY_KIND_RUNTIME);
  c->api.disable(CUPTI_ACTIVITY_KIND_DRIVER);
  c->api.disable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
  c->api.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
}

static void yield(ust__cupti *c, uint64_t now, const char *why, const char *detail) {
  if (c->state != ST_YIELDED || strcmp(c->why, why) != 0)
    ust__log(c->log, UST_LOG_INFO, "timer: CUPTI stands down (%s%s%s); events time the calls until it is free", why,
              detail != NULL ? ": " : "", detail != NULL ? detail : "");
  set_why(c, "%s%s", why, NULL);
  c->state = ST_YIELDED;
  c->yields++;
  c->next_open_ns = now + RETRY_NS;
}

static void open_window(ust__cupti *c, uint64_t now) {
  if (c->opts.profiler_active != NULL && c->opts.profiler_active()) {
    yield(c, now, "torch's profiler is recording", NULL);
    return;
  }
  if (alloc_buffers() != 0) {
    yield(c, now, "no memory for activity buffers", NULL);
    return;
  }
  /* Claim CUPTI for the window. A subscriber already there is a tool that
   * injected itself (Nsight Systems or Compute, a debugger: they set
   * CUDA_INJECTION64_PATH) or torch's profiler, which subscribes at its first
   * trace and stays subscribed after it: while torch's profiler is idle its
   * subscription is no claim on the activity records. */
  char incumbent[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1] = "";
  CUptiResult r;
  if (c->api.subscribe_v2 != NULL) {
    CUpti_SubscriberParams p = {.structSize = CUpti_SubscriberParams_STRUCT_SIZE,
                                .subscriberName = "understudy",
                                .oldSubscriberName = incumbent,
                                .oldSubscriberSize = sizeof incumbent - 1};
    r = c->api.subscribe_v2(&c->sub, launch_callback, NULL, &p);
  } else {
    r = c->api.subscribe(&c->sub, launch_callback, NULL);
  }
  c->subscribed = r == CUPTI_SUCCESS;
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    const char *inj = getenv("CUDA_INJECTION64_PATH");
    if (inj != NULL && inj[0] != '\0') {
      yield(c, now, "a CUDA tool injected into the process holds CUPTI", inj);
      return;
    }
    if (!c->noted_incumbent) {
      ust__log(c->log, UST_LOG_INFO, "timer: CUPTI has a subscriber (%s) and torch's profiler is idle: tracing",
               incumbent[0] != '\0' ? incumbent : "unnamed");
      c->noted_incumbent = 1;
    }
  } else if (r != CUPTI_SUCCESS) {
    yield(c, now, "cuptiSubscribe failed", cupti_error(c, r));
    return;
  }
  atomic_store(&g_tracer, c);
  /* Two ways to know which call launched a kernel. Callbacks (asked for,
   * and only while understudy holds the subscription): the launch APIs'
   * callbacks note each launch's correlation id against the calling
   * thread's call; only kernel records are traced. Records (else): each call
   * pushes an external id, and external correlation records come with the
   * API records of the calls made while it is pushed, the runtime's and the
   * driver's (Triton and cuBLAS launch through the driver), which makes
   * every API call of the process dearer, for the rest of its life. */
  const int by_callbacks = c->opts.callbacks && c->subscribed;
  if (c->subscribed && !by_callbacks) {
    /* the subscription was a question (is another tool there?): holding it
     * through the window would make torch's profiler, starting meanwhile,
     * fail its one-time CUPTI initialisation for the life of the process */
    c->api.unsubscribe(c->sub);
    c->subscribed = 0;
  }
  /* callbacks before kernel records, and off after them (stop_tracing): a
   * launch at either edge may be noted without its kernel (harmless), never
   * a kernel traced without its launch's call and phase */
  ust__kt_collect(c->kt, 1);
  if (by_callbacks)
    set_callbacks(c, 1);
  r = c->api.register_callbacks(buffer_requested, buffer_completed);
  if (r == CUPTI_SUCCESS)
    r = c->api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r == CUPTI_SUCCESS && !by_callbacks)
    r = c->api.enable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
  if (r == CUPTI_SUCCESS && !by_callbacks)
    r = c->api.enable(CUPTI_ACTIVITY_KIND_RUNTIME);
  if (r == CUPTI_SUCCESS && !by_callbacks)
    r = c->api.enable(CUPTI_ACTIVITY_KIND_DRIVER);
  if (r != CUPTI_SUCCESS) {
    if (by_callbacks)
      set_callbacks(c, 0);
    disable_kinds(c);
    ust__kt_collect(c->kt, 0);
    if (c->subscribed)
      c->api.unsubscribe(c->sub);
    c->subscribed = 0;
    yield(c, now, "CUPTI refused kernel tracing", cupti_error(c, r));
    return;
  }
  atomic_store(&c->foreign_buffers, 0);
  atomic_store(&c->by_callbacks, by_callbacks); /* before the window opens: its calls read it */
  ust__kt_open(c->kt);
  c->state = ST_OPEN;
  c->why[0] = '\0';
  c->opened_ns = now;
  if (clock_pair(c, &c->opened_ticks, &c->opened_clock_ns, &c->opened_pair_ns) != 0)
    c->opened_ticks = 0;
}

static void close_window(ust__cupti *c, uint64_t now) {
  ust__kt_close(c->kt);
  c->closed_ns = now;
  c->state = ST_CLOSING;
}

/* After the last call of the window left: no new records but those in flight. */
static void stop_tracing(ust__cupti *c, uint64_t now) {
  disable_kinds(c);
  if (atomic_load(&c->by_callbacks))
    set_callbacks(c, 0);
  c->state = ST_DRAINING;
  c->last_flush_ns = now;
}

static void finish_window(ust__cupti *c, uint64_t now) {
  c->api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  size_t dropped = 0;
  if (c->api.dropped(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
    ust__kt_lost(c->kt, dropped);
  const uint64_t kernels = ust__kt_window_kernels(c->kt);
  const uint64_t open_ns = c->closed_ns - c->opened_ns;
  /* Records carry CUPTI's clock: ns, unless a client registered a clock of
   * its own (torch's profiler registers its approximate clock, in TSC
   * ticks, and it stays after the profiler stops). The ratio of the host
   * clock to CUPTI's over the window converts them. */
  uint64_t ticks = 0, clock_ns = 0, pair_ns = 0;
  double ns_per_tick = c->ns_per_tick; /* the last window's, unless this one says better */
  if (c->opened_ticks != 0 && clock_pair(c, &ticks, &clock_ns, &pair_ns) == 0 && ticks > c->opened_ticks &&
      clock_ns > c->opened_clock_ns) {
    const double span = (double)(clock_ns - c->opened_clock_ns);
    const double r = span / (double)(ticks - c->opened_ticks);
    /* known to 0.1 % when the pairs' uncertainty is that small a share of
     * the window (a short window on a busy host is not) */
    if ((double)(c->opened_pair_ns + pair_ns) <= 1e-3 * span)
      ns_per_tick = r < 0.995 || r > 1.005 ? r : 1.0;
  }
  c->ns_per_tick = ns_per_tick;
  ust__kt_conclude(c->kt, open_ns, ns_per_tick);
  const int missing = buffers_out();
  /* CUPTI stays attached: the kernel records leave every later launch
   * slower until cuptiFinalize (benchmarks/cupti_residue.py), and detaching
   * between windows corrupted the heap of a torch process (CUDA 13.0), called
   * from the worker (H200) and at a launch API's exit callsite, CUPTI's
   * documented dynamic detach (H100: "malloc(): unsorted double linked list
   * corrupted" within the first HF generate), though a CUDA program of its
   * own detached 100 times beside launching threads without harm. */
  if (c->subscribed)
    c->api.unsubscribe(c->sub);
  c->subscribed = 0;
  c->next_open_ns = ust__kt_next_open(c->opened_ns, c->opts.window_ns, kernels, c->opts.launch_cost_ns,
                                      c->opts.budget, MIN_GAP_NS);
  c->state = ST_IDLE;
  if (missing > 0 || atomic_load(&c->foreign_buffers) > 0) {
    /* Buffers of ours did not come back, or another client's came to us:
     * another client holds the callbacks now. Ours stay out until they
     * come back (never handed out twice). */
    c->buffers_lost = (uint64_t)missing;
    yield(c, now, "another CUPTI client took the activity callbacks", NULL);
  }
}

int ust__cupti_poll(ust__cupti *c, int used, int sync) {
  if (c == NULL || c->state == ST_OFF)
    return 0;
  const uint64_t now = now_ns();
  const int profiler = (c->state == ST_OPEN || c->state == ST_IDLE || c->state == ST_YIELDED) &&
                       c->opts.profiler_active != NULL && c->opts.profiler_active();
  switch (c->state) {
  case ST_YIELDED:
    if (!profiler && now >= c->next_open_ns)
      c->state = ST_IDLE;
    else if (profiler)
      c->next_open_ns = now + RETRY_NS;
    break;
  case ST_IDLE:
    if (used && !sync && now >= c->next_open_ns)
      open_window(c, now);
    break;
  case ST_OPEN: {
    /* records coming faster than they come back: the window ends early */
    const int crowded = buffers_out() > MAX_BUFFERS * 3 / 4;
    if (profiler || crowded || sync || now >= c->opened_ns + c->opts.window_ns) {
      if (profiler || crowded)
        c->windows_cut++;
      close_window(c, now);
    }
    /* No flush while the window is open: flushing while serving threads
     * made API records crashed libcupti 13.0 (SIGSEGV in its runtime-API
     * record path, in each of 5 runs of benchmarks/overhead.py with the
     * records-mode child on an H200; none in 40 rounds without). The
     * records wait in the buffers (grown as needed) until tracing stops. */
    break;
  }
  default:
    break;
  }
  /* closing and draining move on in the same poll when they can; a sync
   * poll waits for them (a call in flight, the kernels still queued), at
   * most DRAIN_MAX_NS */
  for (;;) {
    const uint64_t t = now_ns();
    if (c->state == ST_CLOSING && ust__kt_quiet(c->kt)) {
      stop_tracing(c, t);
    } else if (c->state == ST_CLOSING && sync && t < c->closed_ns + DRAIN_MAX_NS) {
      usleep(1000);
    } else if (c->state == ST_DRAINING) {
      if (!sync && t < c->last_flush_ns + DRAIN_FLUSH_NS)
        break;
      c->api.flush_all(0);
      /* drained once every launch of the window's calls has its kernel (the
       * device may still be busy with work queued before them) */
      const int settled = ust__kt_outstanding(c->kt) == 0 && t >= c->closed_ns + DRAIN_MIN_NS;
      c->last_flush_ns = t;
      if (settled || t >= c->closed_ns + DRAIN_MAX_NS)
        finish_window(c, t);
      else if (sync)
        usleep(2000);
    } else {
      break;
    }
  }
  atomic_store_explicit(&c->traced, c->state != ST_OFF && c->state != ST_YIELDED, memory_order_relaxed);
  return c->state == ST_OPEN || c->state == ST_CLOSING || c->state == ST_DRAINING;
}

int ust__cupti_tracing(const ust__cupti *c) {
  if (c == NULL || !atomic_load_explicit(&((ust__cupti *)c)->traced, memory_order_relaxed))
    return UST__TRACING_OFF;
  return ust__kt_window_open(c->kt) ? UST__TRACING_WINDOW : UST__TRACING_BETWEEN;
}

int ust__cupti_present(const ust__cupti *c) { return c != NULL && c->state != ST_OFF; }

ust__kt *ust__cupti_kt(ust__cupti *c) { return c != NULL ? c->kt : NULL; }

int ust__cupti_begin(ust__cupti *c) {
  uint64_t ext = 0;
  const int slot = ust__kt_begin(c->kt, &ext);
  if (slot < 0)
    return -1;
  /* the mode cannot change while a call of the window is in flight */
  if (!atomic_load_explicit(&c->by_callbacks, memory_order_relaxed) &&
      c->api.push(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, ext) != CUPTI_SUCCESS) {
    ust__kt_cancel(c->kt, slot);
    return -1;
  }
  return slot;
}

void ust__cupti_end(ust__cupti *c, int slot, ust__figs *figs, uint64_t tsol_ps, int kind) {
  if (!atomic_load_explicit(&c->by_callbacks, memory_order_relaxed))
    c->api.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, NULL);
  if (figs != NULL)
    ust__kt_end(c->kt, slot, figs, tsol_ps, kind);
  else
    ust__kt_cancel(c->kt, slot);
}

void ust__cupti_end_span(ust__cupti *c, int slot, ust__kt_sink *sink, int role) {
  if (!atomic_load_explicit(&c->by_callbacks, memory_order_relaxed))
    c->api.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, NULL);
  ust__kt_end_span(c->kt, slot, sink, role);
}

int ust__cupti_maps_graphs(const ust__cupti *c) {
  return c != NULL && c->api.graph_node_id != NULL && atomic_load_explicit(&((ust__cupti *)c)->traced, memory_order_relaxed);
}

int ust__cupti_node_ids(ust__cupti *c, void *const *nodes, size_t n, uint64_t *ids) {
  if (!ust__cupti_maps_graphs(c))
    return -1;
  for (size_t i = 0; i < n; i++)
    if (c->api.graph_node_id((CUgraphNode)nodes[i], &ids[i]) != CUPTI_SUCCESS)
      return -1;
  return 0;
}

void ust__cupti_graph_made(ust__cupti *c, void *graph, void *made) {
  uint32_t g = 0, last = 0;
  if (ust__cupti_maps_graphs(c) && c->api.graph_id != NULL && c->api.graph_id((CUgraph)graph, &g) == CUPTI_SUCCESS &&
      c->api.graph_id((CUgraph)made, &last) == CUPTI_SUCCESS && last > g)
    ust__kt_graph_made(c->kt, g, last);
}

int ust__cupti_graph_call(ust__cupti *c, const uint64_t *ids, int n, uint32_t kernels, ust__figs *figs,
                          uint64_t tsol_ps) {
  return c != NULL ? ust__kt_graph_call(c->kt, ids, n, kernels, figs, tsol_ps) : -1;
}

void ust__cupti_status(ust__cupti *c, ust__timer_status *out) {
  memset(out, 0, sizeof *out);
  if (c == NULL) {
    out->kind = "events";
    return;
  }
  out->kind = c->state == ST_OFF ? "events" : "cupti";
  out->state = state_names[c->state];
  snprintf(out->why, sizeof out->why, "%s", c->why);
  out->version = c->version;
  out->correlation = c->state == ST_OFF ? NULL : atomic_load(&c->by_callbacks) ? "callbacks" : "records";
  out->yields = c->yields;
  out->windows_cut = c->windows_cut;
  out->buffers_short = atomic_load(&c->buffers_short);
  out->buffers_lost = c->buffers_lost;
  out->ns_per_tick = c->ns_per_tick;
  ust__kt_totals_get(c->kt, &out->totals);
}

void ust__cupti_destroy(ust__cupti *c) {
  if (c == NULL)
    return;
  if (c->state == ST_OPEN)
    close_window(c, now_ns());
  for (int i = 0; i < 1000 && c->state == ST_CLOSING && !ust__kt_quiet(c->kt); i++)
    usleep(1000);
  if (c->state == ST_CLOSING && ust__kt_quiet(c->kt))
    stop_tracing(c, now_ns());
  if (c->state == ST_DRAINING)
    finish_window(c, now_ns());
  ust__cupti *self = c;
  atomic_compare_exchange_strong(&g_tracer, &self, NULL);
  while (atomic_load(&g_in_callback) > 0)
    usleep(100); /* a callback that loaded this tracer before it was unpublished */
  /* the buffers stay (process-wide): CUPTI may still hold some */
  ust__kt_destroy(c->kt);
  free(c);
}
