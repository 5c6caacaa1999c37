/*
 * guard/graph.c: the candidate captured into CUDA graphs. A call of a
 * shadow, canary or live route captured into a graph gets, beside
 * production's nodes, the candidate's side in conditional nodes (IF) whose
 * condition a one-thread kernel sets at each replay from the site's gate
 * word (guard/gate.h): the copies production would overwrite before
 * production, then the candidate on the copies, the comparisons and a
 * publication of their statistics into the device's ring (guard/ring.h) in
 * the replays the gate verifies, and copies of the candidate's results over
 * production's in the replays the candidate serves (canary, live: production
 * still runs in those, its results overwritten). The worker judges the
 * ring's entries as eager calls (the shadow pool's sites) and writes each
 * site's gate from its route's mode, so that a rollback, a promotion or a
 * share change holds from the next replay on, in every graph that holds the
 * route's sites.
 *
 * A call of a route in shadow when captured goes beside the chain instead
 * (verify-only: nothing it computes is copied back): the copies its shadow
 * reads (production's results, the inputs, what production overwrites) are
 * taken by one kernel in the chain, which also decides the replay and
 * exits at once when the gate is closed; the candidate, the comparisons
 * and the publication run in an IF node on a branch off that kernel, which
 * nothing in the chain waits for. They read and write only memory kept for
 * the process (ust__graph_keep), so no node after them in the chain can
 * race them. A closed gate then costs that kernel, not an IF node in the
 * chain (benchmarks/graph_shadow.py, benchmarks/graph_conditions.cu). In a
 * capture whose replays the host sees and gates (ust__graphs_capture_hosted:
 * the Python package's torch.cuda.CUDAGraph), there is no IF node either:
 * the part is an executable graph of its own, which the host starts after
 * each replay that verifies is enqueued, on a stream of the binding's,
 * behind that replay; or (shadow.graph_host_start kernel) behind an event
 * its kernel in the chain records once the copies are taken (an event
 * record node on a branch off that kernel), so that it runs under the rest
 * of the replay. The next replay that takes the copies again waits for it.
 * A closed gate then costs only that kernel, disabled (and the event's
 * node).
 *
 * Each part is captured on a stream of its own into a graph of its own
 * first, and checked: only kernels, copies, memsets, empty nodes and child
 * graphs of those may run in a conditional body. A part that cannot be
 * captured, or holds anything else, leaves the call as production alone
 * (the route's graph figures say why); nothing half-made enters the
 * caller's graph.
 *
 * The device memory graphs read (gate words, counters, the rings, the
 * copies beside the chain) is kept for the life of the process: a graph may
 * be replayed after understudy is disabled, and then reads gates that say
 * off. The gate words replays read are in device memory, copied from the
 * host's when they change.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard/gate.h"
#include "guard/guard.h"
#include "guard/ring.h"

#if defined(UST_GPU_CUDA)
#define GRAPH_GPU 1
#include "base/gpu_runtime.h"
#endif

#define GRAPH_DEVICES 64
#define GRAPH_CHUNK 256    /* sites per device allocation */
#define GRAPH_RING 4096u   /* entries per device */
#define GRAPH_SITE_NODES 4 /* kernels in the chain per site the host can gate */
#define GRAPH_HOSTED 64    /* captures marked as gated from the host, newest kept */
#define GRAPH_SIDES 4      /* streams a binding starts its hosted sites' parts on (site i on i % 4) */

enum { SITE_BUILDING = 0, SITE_LIVE, SITE_DROPPED };

typedef struct graph_site {
  void *cookie;      /* the route */
  ust__verify *verify; /* its counters */
  int state;         /* SITE_* */
  int device;
  uint32_t pool_site; /* the shadow pool's site once finished */
  int serves;         /* its results can be copied over production's */
  _Atomic uint64_t *word;           /* the gate, as the host last wrote it (pinned host memory) */
  ust__gate_counters *counters;     /* device memory */
  unsigned long long *dev_word;     /* the gate replays read: device memory, copied from *word */
  int launched;                     /* parts beside the chain started from the device (their executable
                                       graphs are kept for the process: replays may launch them) */
  unsigned long long capture;       /* the id of the capture it was captured in (0: not known) */
  int exposed;                      /* that capture's graph was handed out (ust__graphs_exposed): gate closed */
  /* beside the chain: what gating its replays from the host needs */
  void *graph;                      /* the caller's graph (cudaGraph_t) it was captured into */
  void *nodes[GRAPH_SITE_NODES];    /* its kernels in the chain, nodes of that graph */
  int n_nodes;                      /* -1: one could not be told apart, or more than fit: device-gated only */
  int gated;                        /* bindings that gate it from the host (g->lock) */
  uint64_t dev_last;                /* what *dev_word was last set to (g->lock) */
  /* of a capture the host gates (ust__graphs_capture_hosted): its parts' bodies, started by the host */
  int hosted;                       /* some part's body is in bodies: its gate stays closed unless gated */
  void *bodies[GRAPH_SITE_NODES];   /* per kernel in the chain: its body's executable graph (only this
                                       enable's bindings start it: destroyed at its end), or NULL (none, or
                                       an IF node after that kernel) */
  void *marks[GRAPH_SITE_NODES];    /* per body started behind its kernel in the chain (shadow.graph_host_start
                                       kernel): the event that kernel's replays record once it took the
                                       copies (an event record node on a branch off it), which the body
                                       waits for; kept for the process (the caller's graph records it);
                                       NULL: the body waits for the whole replay */
} graph_site;

#ifdef GRAPH_GPU
/* Per device, kept for the process (see above): the ring and the current
 * chunk of gates and counters. */
typedef struct kept_device {
  ust__ring *ring;
  _Atomic uint64_t *words;      /* GRAPH_CHUNK gates as the host wrote them, pinned */
  unsigned long long *dev_words; /* the same in device memory, what replays read (a read across the bus
                                    costs a replay about 1.3 µs per gate: benchmarks/graph_conditions.cu) */
  ust__gate_counters *counters; /* GRAPH_CHUNK, device memory */
  cudaStream_t gates;           /* where the host's gate writes are copied to the device */
  int used;                     /* of the current chunk */
  char *arena;                  /* memory for shadows beside the chain: bump-allocated, never freed */
  size_t arena_used, arena_size;
} kept_device;

static pthread_mutex_t g_kept_lock = PTHREAD_MUTEX_INITIALIZER;
static kept_device g_kept[GRAPH_DEVICES];
#endif

struct ust__graphs {
  pthread_mutex_t lock; /* the sites */
  ust__shadow_pool *pool;
  const ust__verdict_sink_i *sink;
  void *sink_ctx;
  graph_site **sites; /* never moved once added */
  uint32_t n_sites, cap_sites;
  uint64_t unknown;   /* ring entries naming no site of this pool */
  uint64_t unseen;    /* graphs replayed whose capture understudy did not see (lock) */
  uint32_t open;      /* live sites whose gate is open, at the last tick */
  uint64_t lost_base; /* the kept rings' lost entries when this was made */
  int closed;         /* understudy disabled: every gate off, nothing harvested */
  /* executable graphs whose replays the host gates (ust__graphs_bind) */
  pthread_mutex_t bind_lock; /* taken before lock where both are */
  struct exec_bind *binds;
  uint32_t n_binds, cap_binds;
  uint64_t gated_replays; /* replays the host gated */
  uint64_t gate_failed;   /* executable graphs given back to the device's decision: a node would not change */
  uint64_t host_starts;   /* bodies of hosted sites the host started (per site and replay) */
  unsigned long long hosted[GRAPH_HOSTED]; /* ids of captures the host gates (lock), a ring */
  uint32_t n_hosted;
};

/* One site in one executable graph gated from the host: its count of
 * replays and whether its kernels are enabled there now. */
typedef struct exec_site {
  graph_site *site;
  uint64_t n;
  int on;
} exec_site;

typedef struct exec_bind {
  void *exec; /* cudaGraphExec_t */
  exec_site *sites;
  uint32_t n;
  /* where it holds hosted sites: their bodies start on its side streams
   * (each hosted site on one of them, beside the others), each behind its
   * kernel in the chain (its marks) or behind the replay (replayed:
   * recorded on the replay's stream), and done[j] says when those last
   * started on side[j] finished */
  void *replayed;                /* cudaEvent_t */
  void *side[GRAPH_SIDES];       /* cudaStream_t */
  void *done[GRAPH_SIDES];       /* cudaEvent_t */
  int n_sides;                   /* made (0: no hosted site) */
  int device;                    /* theirs */
  int pending[GRAPH_SIDES];      /* done[j] was recorded */
  uint32_t starts;               /* sites the current replay verifies whose bodies start after it */
} exec_bind;

/* A binding's own memory, and its stream and events where it made them,
 * once the bodies it started are done (the copies they read are its
 * sites', which a binding made next may have taken again at its first
 * replay). */
static void bind_release(exec_bind *b) {
#ifdef GRAPH_GPU
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  for (int j = 0; j < GRAPH_SIDES; j++) {
    if (b->pending[j])
      cudaEventSynchronize((cudaEvent_t)b->done[j]);
    if (b->done[j] != NULL)
      cudaEventDestroy((cudaEvent_t)b->done[j]);
    if (b->side[j] != NULL)
      cudaStreamDestroy((cudaStream_t)b->side[j]);
  }
  if (b->replayed != NULL)
    cudaEventDestroy((cudaEvent_t)b->replayed);
  cudaThreadExchangeStreamCaptureMode(&mode);
#endif
  free(b->sites);
}

/* Entries the kept rings lost so far (overwritten before the worker read
 * them), all devices. */
static uint64_t kept_lost(void) {
  uint64_t n = 0;
#ifdef GRAPH_GPU
  pthread_mutex_lock(&g_kept_lock);
  for (int d = 0; d < GRAPH_DEVICES; d++)
    if (g_kept[d].ring != NULL)
      n += ust__ring_lost(g_kept[d].ring);
  pthread_mutex_unlock(&g_kept_lock);
#endif
  return n;
}

#ifdef GRAPH_GPU
/* The thread on device in relaxed capture mode (a capture of another
 * thread stays valid), and back as it was. */
typedef struct on_device {
  enum cudaStreamCaptureMode mode;
  int current, device;
} on_device;

static int device_enter(on_device *o, int device) {
  o->mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&o->mode);
  o->device = device;
  o->current = -1;
  int rc = UST__GPU_CHECK(NULL, cudaGetDevice(&o->current));
  if (rc == 0 && o->current != device)
    rc = UST__GPU_CHECK(NULL, cudaSetDevice(device));
  return rc;
}

static void device_leave(on_device *o) {
  if (o->current >= 0 && o->current != o->device)
    cudaSetDevice(o->current);
  cudaThreadExchangeStreamCaptureMode(&o->mode);
}

/* bytes between a site's device memory and the host's, on its device's
 * gate stream, waited for. 0, or UST_EGPU. */
static int site_copy(const graph_site *s, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  on_device o;
  device_enter(&o, s->device); /* where it cannot, the copy fails and says so */
  pthread_mutex_lock(&g_kept_lock);
  cudaStream_t st = g_kept[s->device].gates;
  pthread_mutex_unlock(&g_kept_lock);
  int rc = UST__GPU_CHECK(NULL, cudaMemcpyAsync(dst, src, bytes, kind, st));
  if (rc == 0)
    rc = UST__GPU_CHECK(NULL, cudaStreamSynchronize(st));
  device_leave(&o);
  return rc;
}

/* A site's gate set to w: the host's copy, then the device's, which the
 * next replay reads (copied and waited for: gates change rarely); a site
 * the host gates gets the word its kernels read then (ust__gate_host_word);
 * a hosted one not gated, a closed gate (nothing would start its body).
 * The caller holds g->lock. */
static void set_word(graph_site *s, uint64_t w) {
  atomic_store(s->word, w);
  const unsigned long long d = s->gated > 0 ? ust__gate_host_word(w) : s->hosted ? 0 : w;
  if (d != s->dev_last && site_copy(s, s->dev_word, &d, sizeof d, cudaMemcpyHostToDevice) == 0)
    s->dev_last = d;
}
#else
static void set_word(graph_site *s, uint64_t w) { atomic_store(s->word, w); }
#endif

/* A live site's gate word from its route (the caller holds g->lock): a
 * site whose results cannot serve is verified as in shadow instead. */
static uint64_t site_gate(ust__graphs *g, const graph_site *s) {
  if (s->state != SITE_LIVE || s->exposed)
    return 0;
  const uint64_t w = g->sink->gate(g->sink_ctx, s->cookie);
  return s->serves ? w : ust__gate_verify_only(w);
}

/* The launches of s's bodies the device refused so far (read from its
 * counters; 0 when it has none, or they cannot be read). */
static uint64_t site_refused(const graph_site *s) {
  unsigned long long n = 0;
#ifdef GRAPH_GPU
  if (s->launched > 0 && site_copy(s, &n, &s->counters->refused, sizeof n, cudaMemcpyDeviceToHost) != 0)
    n = 0;
#else
  (void)s;
#endif
  return n;
}

int ust__graphs_create(ust__shadow_pool *pool, const ust__verdict_sink_i *sink, void *sink_ctx, ust__graphs **out) {
  *out = NULL;
  ust__graphs *g = calloc(1, sizeof *g);
  if (g == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  pthread_mutex_init(&g->lock, NULL);
  pthread_mutex_init(&g->bind_lock, NULL);
  g->pool = pool;
  g->sink = sink;
  g->sink_ctx = sink_ctx;
  g->lost_base = kept_lost();
  *out = g;
  return 0;
}

void ust__graphs_unseen(ust__graphs *g) {
  if (g == NULL)
    return;
  pthread_mutex_lock(&g->lock);
  g->unseen++;
  pthread_mutex_unlock(&g->lock);
}

int ust__graphs_exposed(ust__graphs *g, unsigned long long capture) {
  if (g == NULL || capture == 0)
    return 0;
  int n = 0;
  pthread_mutex_lock(&g->lock);
  for (uint32_t i = 0; i < g->n_sites; i++) {
    graph_site *s = g->sites[i];
    if (s->state != SITE_LIVE || s->capture != capture || s->exposed) /* a site being built is not read */
      continue;
    s->exposed = 1;
    if (s->verify != NULL)
      atomic_fetch_add_explicit(&s->verify->graph_exposed, 1, memory_order_relaxed);
    if (!g->closed) /* the next replay reads it: copied and waited for */
      set_word(s, 0);
    n++;
  }
  pthread_mutex_unlock(&g->lock);
  return n;
}

void ust__graphs_figures(ust__graphs *g, ust__graphs_figs *f) {
  memset(f, 0, sizeof *f);
  if (g == NULL)
    return;
  pthread_mutex_lock(&g->lock);
  f->sites = g->n_sites;
  for (uint32_t i = 0; i < g->n_sites; i++) {
    f->live += g->sites[i]->state == SITE_LIVE;
    f->launched += g->sites[i]->state == SITE_LIVE && g->sites[i]->launched > 0;
    f->gated += g->sites[i]->state == SITE_LIVE && g->sites[i]->gated > 0;
    f->hosted += g->sites[i]->state == SITE_LIVE && g->sites[i]->hosted;
    f->refused += site_refused(g->sites[i]);
  }
  f->open = g->open;
  f->unknown = g->unknown;
  f->unseen = g->unseen;
  const uint64_t base = g->lost_base;
  pthread_mutex_unlock(&g->lock);
  pthread_mutex_lock(&g->bind_lock);
  f->gated_replays = g->gated_replays;
  f->gate_failed = g->gate_failed;
  f->host_starts = g->host_starts;
  pthread_mutex_unlock(&g->bind_lock);
  const uint64_t lost = kept_lost();
  f->lost = lost > base ? lost - base : 0;
}

void ust__graphs_close(ust__graphs *g) {
  if (g == NULL)
    return;
  pthread_mutex_lock(&g->lock);
  g->closed = 1;
  g->open = 0;
  /* replays from now on find every gate off */
  for (uint32_t i = 0; i < g->n_sites; i++)
    if (g->sites[i]->word != NULL)
      set_word(g->sites[i], 0);
  pthread_mutex_unlock(&g->lock);
}

uint32_t ust__graphs_open(ust__graphs *g) {
  if (g == NULL)
    return 0;
  pthread_mutex_lock(&g->lock);
  const uint32_t n = g->open;
  pthread_mutex_unlock(&g->lock);
  return n;
}

void ust__graphs_destroy(ust__graphs *g) {
  if (g == NULL)
    return;
  /* the bodies the host started done (bind_release waits), then judged */
  for (uint32_t i = 0; i < g->n_binds; i++)
    bind_release(&g->binds[i]);
  free(g->binds);
  ust__graphs_tick(g);
  ust__graphs_close(g);
  for (uint32_t i = 0; i < g->n_sites; i++) {
#ifdef GRAPH_GPU
    /* only this enable's bindings started them */
    for (int k = 0; k < GRAPH_SITE_NODES; k++)
      if (g->sites[i]->bodies[k] != NULL)
        cudaGraphExecDestroy((cudaGraphExec_t)g->sites[i]->bodies[k]);
#endif
    free(g->sites[i]);
  }
  free(g->sites);
  pthread_mutex_destroy(&g->bind_lock);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

#ifdef GRAPH_GPU

/* The device's kept memory, and a gate and counters for one more site (the
 * caller holds g_kept_lock; capture mode relaxed). */
static int kept_site(int device, cudaStream_t side, _Atomic uint64_t **word, unsigned long long **dev_word,
                     ust__gate_counters **counters, ust__ring **ring) {
  kept_device *k = &g_kept[device];
  if (k->ring == NULL) {
    int rc = ust__ring_create(GRAPH_RING, 1, &k->ring);
    if (rc != 0)
      return rc;
  }
  if (k->gates == NULL && UST__GPU_CHECK(NULL, cudaStreamCreateWithFlags(&k->gates, cudaStreamNonBlocking)) != 0)
    return UST_EGPU;
  if (k->words == NULL || k->used == GRAPH_CHUNK) {
    void *host = NULL, *dev = NULL, *counters_dev = NULL;
    const size_t words_bytes = GRAPH_CHUNK * sizeof(uint64_t);
    const size_t counters_bytes = GRAPH_CHUNK * sizeof(ust__gate_counters);
    if (UST__GPU_CHECK(NULL, cudaHostAlloc(&host, words_bytes, cudaHostAllocPortable)) != 0)
      return UST_EGPU;
    memset(host, 0, words_bytes);
    if (UST__GPU_CHECK(NULL, cudaMalloc(&dev, words_bytes)) != 0) {
      cudaFreeHost(host);
      return UST_EGPU;
    }
    if (UST__GPU_CHECK(NULL, cudaMalloc(&counters_dev, counters_bytes)) != 0) {
      cudaFreeHost(host);
      cudaFree(dev);
      return UST_EGPU;
    }
    /* on this thread's own stream: the legacy stream could meet the capture */
    if (UST__GPU_CHECK(NULL, cudaMemsetAsync(counters_dev, 0, counters_bytes, side)) != 0 ||
        UST__GPU_CHECK(NULL, cudaMemsetAsync(dev, 0, words_bytes, side)) != 0 ||
        UST__GPU_CHECK(NULL, cudaStreamSynchronize(side)) != 0) {
      cudaFreeHost(host);
      cudaFree(dev);
      cudaFree(counters_dev);
      return UST_EGPU;
    }
    /* the previous chunk stays: graphs hold its addresses */
    k->words = host;
    k->dev_words = dev;
    k->counters = counters_dev;
    k->used = 0;
  }
  *word = &k->words[k->used];
  *dev_word = &k->dev_words[k->used];
  *counters = &k->counters[k->used];
  *ring = k->ring;
  k->used++;
  return 0;
}

#define ARENA_CHUNK ((size_t)8 << 20)
#define ARENA_ALIGN ((size_t)256)

void *ust__graph_keep(ust__graph_call *c, size_t bytes) {
  if (c->site == NULL || bytes == 0)
    return NULL;
  const int device = c->site->device;
  const size_t need = (bytes + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
  void *p = NULL;
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  pthread_mutex_lock(&g_kept_lock);
  kept_device *k = &g_kept[device];
  if (k->arena == NULL || k->arena_size - k->arena_used < need) {
    /* a new chunk (the rest of the last one stays unused: graphs hold it) */
    const size_t size = need > ARENA_CHUNK ? need : ARENA_CHUNK;
    void *chunk = NULL;
    if (UST__GPU_CHECK(NULL, cudaMalloc(&chunk, size)) == 0) {
      k->arena = chunk;
      k->arena_size = size;
      k->arena_used = 0;
    }
  }
  if (k->arena != NULL && k->arena_size - k->arena_used >= need) {
    p = k->arena + k->arena_used;
    k->arena_used += need;
  }
  pthread_mutex_unlock(&g_kept_lock);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (p == NULL) {
    snprintf(c->why, sizeof c->why, "no device memory for its copies beside the chain: %s", ust_last_error());
    ust__error(UST_EGPU, "%s", c->why);
  }
  return p;
}

/* This thread's stream for capturing parts on device (made once, kept for
 * the thread's life). */
static _Thread_local cudaStream_t tl_side[GRAPH_DEVICES];

int ust__graph_call_begin(ust__graphs *g, const ust__slot_route *r, int device, void *stream, ust__graph_call *c) {
  memset(c, 0, sizeof *c);
  c->graphs = g;
  c->r = *r;
  c->stream = stream;
  if (device < 0 || device >= GRAPH_DEVICES)
    return ust__error(UST_EINVAL, "graph: device %d", device);
  graph_site *s = calloc(1, sizeof *s);
  if (s == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  /* made on the call's device, whichever the thread has current */
  on_device o;
  int rc = device_enter(&o, device);
  if (rc == 0 && tl_side[device] == NULL)
    rc = UST__GPU_CHECK(NULL, cudaStreamCreateWithFlags(&tl_side[device], cudaStreamNonBlocking));
  if (rc == 0) {
    pthread_mutex_lock(&g_kept_lock);
    rc = kept_site(device, tl_side[device], &s->word, &s->dev_word, &s->counters, &c->ring);
    pthread_mutex_unlock(&g_kept_lock);
  }
  s->device = device;
  device_leave(&o);
  if (rc != 0) {
    free(s);
    return rc;
  }
  s->cookie = r->cookie;
  s->verify = r->verify;
  atomic_store(s->word, 0);
  pthread_mutex_lock(&g->lock);
  if (g->n_sites == g->cap_sites) {
    const uint32_t cap = g->cap_sites ? g->cap_sites * 2 : 16;
    graph_site **grown = cap <= UST__MAX_SITES ? realloc(g->sites, cap * sizeof *grown) : NULL;
    if (grown == NULL) {
      pthread_mutex_unlock(&g->lock);
      free(s); /* its gate stays off */
      return ust__error(UST_ENOMEM, "graph: no room for another captured call (%u kept)", (unsigned)g->n_sites);
    }
    g->sites = grown;
    g->cap_sites = cap;
  }
  g->sites[g->n_sites++] = s;
  pthread_mutex_unlock(&g->lock);
  c->site = s;
  c->side = tl_side[device];
  return 0;
}

int ust__graph_part_begin(ust__graph_call *c, void **side) {
  *side = NULL;
  if (c->site == NULL || c->open)
    return ust__error(UST_EINVAL, "graph: no call, or a part is open");
  c->mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode((enum cudaStreamCaptureMode *)&c->mode);
  if (UST__GPU_CHECK(NULL, cudaStreamBeginCapture((cudaStream_t)c->side, cudaStreamCaptureModeRelaxed)) != 0) {
    cudaThreadExchangeStreamCaptureMode((enum cudaStreamCaptureMode *)&c->mode);
    return UST_EGPU;
  }
  c->open = 1;
  c->chain.n = 0;
  *side = c->side;
  return 0;
}

/* 1 when every node of graph (and of its child graphs) may run in a
 * conditional body; else names the first that may not into why. */
static int body_ok(cudaGraph_t graph, int depth, char *why, size_t cap) {
  size_t n = 0;
  if (UST__GPU_CHECK(NULL, cudaGraphGetNodes(graph, NULL, &n)) != 0) {
    snprintf(why, cap, "its nodes could not be read");
    return 0;
  }
  if (n == 0)
    return 1;
  cudaGraphNode_t *nodes = malloc(n * sizeof *nodes);
  if (nodes == NULL || UST__GPU_CHECK(NULL, cudaGraphGetNodes(graph, nodes, &n)) != 0) {
    free(nodes);
    snprintf(why, cap, "its nodes could not be read");
    return 0;
  }
  int ok = 1;
  for (size_t i = 0; i < n && ok; i++) {
    enum cudaGraphNodeType t;
    if (UST__GPU_CHECK(NULL, cudaGraphNodeGetType(nodes[i], &t)) != 0) {
      snprintf(why, cap, "a node's type could not be read");
      ok = 0;
    } else if (t == cudaGraphNodeTypeGraph) {
      cudaGraph_t child;
      ok = depth < 8 && UST__GPU_CHECK(NULL, cudaGraphChildGraphNodeGetGraph(nodes[i], &child)) == 0 &&
           body_ok(child, depth + 1, why, cap);
      if (!ok && why[0] == '\0')
        snprintf(why, cap, "child graphs nested too deep");
    } else if (t != cudaGraphNodeTypeKernel && t != cudaGraphNodeTypeMemcpy && t != cudaGraphNodeTypeMemset &&
               t != cudaGraphNodeTypeEmpty) {
      snprintf(why, cap, "it holds a graph node of type %d, which a conditional body cannot", (int)t);
      ok = 0;
    }
  }
  free(nodes);
  return ok;
}

/* An IF node on handle into graph after deps (edges may be NULL), with
 * part (copied) as its body. */
static int add_if(cudaGraph_t graph, cudaGraphConditionalHandle handle, const cudaGraphNode_t *deps,
                  const cudaGraphEdgeData *edges, size_t n_deps, cudaGraph_t part, cudaGraphNode_t *node) {
  struct cudaGraphNodeParams p;
  memset(&p, 0, sizeof p);
  p.type = cudaGraphNodeTypeConditional;
  p.conditional.handle = handle;
  p.conditional.type = cudaGraphCondTypeIf;
  p.conditional.size = 1;
  cudaGraphNode_t child;
  int rc = UST__GPU_CHECK(NULL, cudaGraphAddNode(node, graph, deps, edges, n_deps, &p));
  if (rc == 0)
    rc = UST__GPU_CHECK(NULL, cudaGraphAddChildGraphNode(&child, p.conditional.phGraph_out[0], NULL, 0, part));
  return rc;
}

/* part instantiated (flags: for launch from the device, or 0: from the
 * host) and uploaded. Launched from the device, never destroyed (the
 * caller's graph holds its handle and may replay at any time, as with the
 * rest of the kept memory); from the host, destroyed when the enable ends
 * (ust__graphs_destroy). NULL when CUDA refuses it (its IF node serves
 * then). */
static void *body_exec(cudaGraph_t part, cudaStream_t side, unsigned long long flags) {
  cudaGraphExec_t exec = NULL;
  if (UST__GPU_CHECK(NULL, cudaGraphInstantiateWithFlags(&exec, part, flags)) != 0)
    return NULL;
  if (UST__GPU_CHECK(NULL, cudaGraphUpload(exec, side)) != 0 || UST__GPU_CHECK(NULL, cudaStreamSynchronize(side)) != 0) {
    cudaGraphExecDestroy(exec);
    return NULL;
  }
  return exec;
}

/* 1 when capture is one the host gates (g->hosted). */
static int capture_hosted(ust__graphs *g, unsigned long long capture) {
  int found = 0;
  pthread_mutex_lock(&g->lock);
  for (uint32_t i = 0; i < GRAPH_HOSTED && i < g->n_hosted && !found; i++)
    found = g->hosted[i] == capture;
  pthread_mutex_unlock(&g->lock);
  return found;
}

/* The part into the caller's capture. In the chain: a gate kernel sets the
 * condition, then the IF node holding the part, which the caller's next
 * work waits for. Beside the chain: the kernel that decides the replay
 * (first) or reads its decision, takes the part's copies when it verifies
 * and starts the part (when it has nodes): in a capture the host gates
 * (ust__graphs_capture_hosted), the host starts it, as a graph of its own,
 * after each replay that verifies, so that the caller's graph holds only
 * that kernel; else launched from the device (shadow.graph_beside_launch
 * "device", where CUDA takes the part as a device graph); else an IF node
 * on a branch off that kernel, whose condition it sets. Nothing in the
 * chain waits for any of them. The part reads only memory kept for it (the
 * copies), so the writers after it in the chain cannot race it. */
static int part_into_capture(ust__graph_call *c, cudaGraph_t part, size_t n_nodes) {
  enum cudaStreamCaptureStatus st;
  cudaGraph_t graph = NULL;
  const cudaGraphNode_t *deps = NULL;
  const cudaGraphEdgeData *edges = NULL;
  size_t n_deps = 0;
  cudaGraphConditionalHandle handle = 0;
  cudaGraphNode_t node;
  const cudaStream_t s = (cudaStream_t)c->stream;
  graph_site *site = c->site;
  void *body = NULL, *hosted = NULL;
  cudaEvent_t mark = NULL;
  unsigned long long capture = 0;
  int rc = UST__GPU_CHECK(NULL, cudaStreamGetCaptureInfo(s, &st, &capture, &graph, NULL, NULL, NULL));
  if (rc == 0 && (st != cudaStreamCaptureStatusActive || graph == NULL))
    rc = ust__error(UST_EGPU, "graph: the caller's stream no longer captures");
  if (rc == 0 && site->capture == 0)
    site->capture = capture; /* the capture whose graph, handed out, closes it (ust__graphs_exposed) */
  /* its kernel in the chain must be one the host can tell apart (below) */
  const int can_gate = site->n_nodes >= 0 && site->n_nodes < GRAPH_SITE_NODES &&
                       (site->graph == NULL || site->graph == graph);
  if (rc == 0 && c->beside && n_nodes > 0 && can_gate && capture_hosted(c->graphs, capture) &&
      (!c->start_kernel || UST__GPU_CHECK(NULL, cudaEventCreateWithFlags(&mark, cudaEventDisableTiming)) == 0))
    hosted = body_exec(part, (cudaStream_t)c->side, 0);
  if (rc == 0 && c->beside && n_nodes > 0 && hosted == NULL && c->launch && ust__gate_device_launch() &&
      (body = body_exec(part, (cudaStream_t)c->side, cudaGraphInstantiateFlagDeviceLaunch)) != NULL)
    site->launched++;
  const int has_if = !c->beside || (n_nodes > 0 && body == NULL && hosted == NULL);
  if (rc == 0 && has_if)
    rc = UST__GPU_CHECK(NULL, cudaGraphConditionalHandleCreate(&handle, graph, 0, cudaGraphCondAssignDefault));
  if (rc == 0)
    rc = c->beside ? ust__gate_snap_launch(site->dev_word, site->counters, c->parts == 0, (unsigned long long)handle,
                                           body, &c->chain, c->stream)
                   : ust__gate_launch(site->dev_word, site->counters, c->parts == 0, (unsigned long long)handle,
                                      c->stream);
  if (rc == 0 && (has_if || c->beside))
    rc = UST__GPU_CHECK(NULL, cudaStreamGetCaptureInfo(s, &st, NULL, &graph, &deps, &edges, &n_deps));
  if (rc == 0 && c->beside) {
    /* the kernel just captured: the node the host enables in the replays that verify */
    /* a host-started body waits for its kernel in the chain alone: the
     * event it records once the copies are taken, a node nothing waits for */
    cudaGraphNode_t marker;
    if (n_deps == 1 && hosted != NULL && mark != NULL)
      rc = UST__GPU_CHECK(NULL, cudaGraphAddEventRecordNode(&marker, graph, deps, 1, mark));
    if (rc == 0 && n_deps == 1 && can_gate) {
      site->bodies[site->n_nodes] = hosted;
      site->marks[site->n_nodes] = hosted != NULL ? mark : NULL;
      if (hosted != NULL)
        mark = NULL; /* the caller's graph records it */
      site->nodes[site->n_nodes++] = deps[0];
      site->graph = graph;
      site->hosted |= hosted != NULL;
      hosted = NULL;
    } else if (rc == 0) {
      site->n_nodes = -1;
      if (hosted != NULL || site->hosted)
        rc = ust__error(UST_EGPU, "graph: a shadow the host starts, its kernel in the chain not told apart");
    }
  }
  if (hosted != NULL)
    cudaGraphExecDestroy((cudaGraphExec_t)hosted);
  if (mark != NULL)
    cudaEventDestroy(mark); /* in no graph */
  if (rc == 0 && has_if)
    rc = add_if(graph, handle, deps, edges, n_deps, part, &node);
  if (rc == 0 && !c->beside)
    rc = UST__GPU_CHECK(NULL, cudaStreamUpdateCaptureDependencies(s, &node, NULL, 1, cudaStreamSetCaptureDependencies));
  if (rc != 0)
    snprintf(c->why, sizeof c->why, "its copies or condition could not be added: %s", ust_last_error());
  c->chain.n = 0;
  return rc;
}

/* 1 when part instantiates as the body of an IF node of a graph of its own:
 * what CUDA refuses in a conditional body beyond the node types (another
 * device, pageable host memory in a copy, device-side launches) fails here,
 * before the part enters the caller's graph, and not when the caller
 * instantiates it. Else says why. */
static int body_instantiates(cudaGraph_t part, char *why, size_t cap) {
  cudaGraph_t scratch = NULL;
  cudaGraphExec_t exec = NULL;
  cudaGraphConditionalHandle handle;
  cudaGraphNode_t node;
  const int ok =
      UST__GPU_CHECK(NULL, cudaGraphCreate(&scratch, 0)) == 0 &&
      UST__GPU_CHECK(NULL, cudaGraphConditionalHandleCreate(&handle, scratch, 0, cudaGraphCondAssignDefault)) == 0 &&
      add_if(scratch, handle, NULL, NULL, 0, part, &node) == 0 &&
      UST__GPU_CHECK(NULL, cudaGraphInstantiate(&exec, scratch, 0)) == 0;
  if (!ok)
    snprintf(why, cap, "it cannot run in a conditional body: %s", ust_last_error());
  if (exec != NULL)
    cudaGraphExecDestroy(exec);
  if (scratch != NULL)
    cudaGraphDestroy(scratch);
  return ok;
}

int ust__graph_part_end(ust__graph_call *c, int keep) {
  if (!c->open)
    return ust__error(UST_EINVAL, "graph: no part is open");
  cudaGraph_t part = NULL;
  int rc = UST__GPU_CHECK(NULL, cudaStreamEndCapture((cudaStream_t)c->side, &part));
  c->open = 0;
  c->why_code = UST__GW_CAPTURE;
  if (rc != 0 || part == NULL) {
    snprintf(c->why, sizeof c->why, "its shadow could not be captured: %s", ust_last_error());
    keep = 0;
    rc = rc != 0 ? rc : UST_EGPU;
  }
  size_t n_nodes = 0;
  if (keep && UST__GPU_CHECK(NULL, cudaGraphGetNodes(part, NULL, &n_nodes)) != 0) {
    snprintf(c->why, sizeof c->why, "its shadow's nodes could not be read: %s", ust_last_error());
    keep = 0;
    rc = UST_EGPU;
  } else if (keep && (n_nodes > 0 || !c->beside) &&
             (!body_ok(part, 0, c->why, sizeof c->why) || !body_instantiates(part, c->why, sizeof c->why))) {
    keep = 0;
    c->why_code = UST__GW_NODES;
    rc = ust__error(UST_EINVAL, "graph: the shadow's part: %s", c->why);
  }
  if (keep) {
    rc = part_into_capture(c, part, n_nodes);
    c->parts += rc == 0;
  }
  if (part != NULL)
    cudaGraphDestroy(part);
  cudaThreadExchangeStreamCaptureMode((enum cudaStreamCaptureMode *)&c->mode);
  return rc;
}

int ust__graph_part_active(const ust__graph_call *c) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return c->open && UST__GPU_CHECK(NULL, cudaStreamIsCapturing((cudaStream_t)c->side, &st)) == 0 &&
         st == cudaStreamCaptureStatusActive;
}

/* Bytes of a dense tensor. */
static size_t dense_bytes(const DLTensor *t) {
  return (size_t)ust__dl_numel(t) * (((size_t)t->dtype.bits * t->dtype.lanes + 7) / 8);
}

/* 1 when each result pair can be copied, candidate's over production's:
 * both dense, of one dtype and shape. */
static int pairs_serve(const ust__pair *pairs, int n_pairs) {
  for (int i = 0; i < n_pairs; i++) {
    const ust__pair *q = &pairs[i];
    if (q->aa || q->input_arg)
      continue;
    if (q->prod_dense == NULL || q->cand_dense == NULL || q->prod_dtype != q->cand_dtype ||
        dense_bytes(&q->prod) != dense_bytes(&q->cand))
      return 0;
  }
  return 1;
}

int ust__graph_call_finish(ust__graph_call *c, const ust__pair *pairs, int n_pairs, ust__cmp_stats *dev_stats,
                           int servable) {
  if (!c->open)
    return ust__error(UST_EINVAL, "graph: the comparison belongs in an open part");
  const ust__ring_dev ring = ust__ring_device(c->ring);
  ust__gate_counters *gc = c->site->counters;
  int rc = ust__shadow_site_capture(c->graphs->pool, &c->r, pairs, n_pairs, c->side, dev_stats, &ring, &gc->runs,
                                    &c->site->pool_site);
  if (rc != 0) {
    snprintf(c->why, sizeof c->why, "its comparison could not be captured: %s", ust_last_error());
    return rc;
  }
  /* after the comparisons (which read production's results), in order;
   * beside the chain, never (verify-only) */
  const int serves = !c->beside && servable && pairs_serve(pairs, n_pairs);
  for (int i = 0; i < n_pairs && serves && rc == 0; i++)
    if (!pairs[i].aa && !pairs[i].input_arg)
      rc = ust__gate_copy_launch((void *)pairs[i].prod_dense, pairs[i].cand_dense, dense_bytes(&pairs[i].prod), gc,
                                 c->side);
  if (rc != 0)
    snprintf(c->why, sizeof c->why, "its copies over production's results could not be captured: %s",
             ust_last_error());
  c->site->serves = serves;
  return rc;
}

int ust__graph_copy(ust__graph_call *c, void *dst, const void *src, size_t bytes) {
  if (!c->open)
    return ust__error(UST_EINVAL, "graph: a copy outside a part");
  if (c->beside) {
    /* taken in the chain, by the part's kernel there */
    if (c->chain.n == UST__GATE_MAX_COPIES) {
      snprintf(c->why, sizeof c->why, "more than %d copies in one part beside the chain", UST__GATE_MAX_COPIES);
      return ust__error(UST_EINVAL, "graph: %s", c->why);
    }
    c->chain.c[c->chain.n].dst = dst;
    c->chain.c[c->chain.n].src = src;
    c->chain.c[c->chain.n].bytes = bytes;
    c->chain.n++;
    return 0;
  }
  int rc = UST__GPU_CHECK(NULL, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)c->side));
  if (rc != 0)
    snprintf(c->why, sizeof c->why, "a copy could not be captured: %s", ust_last_error());
  return rc;
}

int ust__graph_fill(ust__graph_call *c, void *dst, int byte, size_t bytes) {
  if (!c->open)
    return ust__error(UST_EINVAL, "graph: a fill outside a part");
  int rc = UST__GPU_CHECK(NULL, cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)c->side));
  if (rc != 0)
    snprintf(c->why, sizeof c->why, "a fill could not be captured: %s", ust_last_error());
  return rc;
}

uint64_t ust__graphs_tick(ust__graphs *g) {
  uint64_t judged = 0;
  if (g == NULL)
    return 0;
  pthread_mutex_lock(&g->lock);
  const int closed = g->closed;
  pthread_mutex_unlock(&g->lock);
  if (closed) /* the rings are the next enable's now */
    return 0;
  for (int d = 0; d < GRAPH_DEVICES; d++) {
    pthread_mutex_lock(&g_kept_lock);
    ust__ring *ring = g_kept[d].ring;
    pthread_mutex_unlock(&g_kept_lock);
    if (ring != NULL) {
      uint64_t unknown = 0;
      judged += ust__shadow_sites_harvest(g->pool, ring, &unknown);
      pthread_mutex_lock(&g->lock); /* the worker and a flush may tick at once */
      g->unknown += unknown;
      pthread_mutex_unlock(&g->lock);
    }
  }
  pthread_mutex_lock(&g->lock);
  uint32_t open = 0;
  for (uint32_t i = 0; i < g->n_sites && !g->closed; i++) {
    graph_site *s = g->sites[i];
    const uint64_t w = site_gate(g, s);
    set_word(s, w);
    open += w != 0;
  }
  g->open = open;
  pthread_mutex_unlock(&g->lock);
  return judged;
}

/* ---- replays gated from the host ------------------------------------------------------ */

/* A site whose kernels an executable graph of one capture holds, told
 * apart: live, beside the chain, its kernels known, of that capture (its id
 * is unique in the process: a site of a graph since destroyed, whose
 * address the new graph may have, is of another). The caller holds
 * g->lock. */
static int of_capture(const graph_site *s, const void *graph, unsigned long long capture) {
  return s->state == SITE_LIVE && s->graph == graph && s->capture == capture && s->n_nodes > 0;
}

/* The sites such an executable graph can gate from the host: those gated
 * by no other executable graph (the word its kernels read is the site's:
 * another executable of the graph would read it too). */
static int bindable(const graph_site *s, const void *graph, unsigned long long capture) {
  return of_capture(s, graph, capture) && s->gated == 0;
}

/* Enables or disables a site's kernels in exec. 0, or UST_EGPU. */
static int site_enable(void *exec, const graph_site *s, int on) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  int rc = 0;
  for (int k = 0; k < s->n_nodes && rc == 0; k++)
    rc = UST__GPU_CHECK(NULL, cudaGraphNodeSetEnabled((cudaGraphExec_t)exec, (cudaGraphNode_t)s->nodes[k],
                                                      on ? 1u : 0u));
  cudaThreadExchangeStreamCaptureMode(&mode);
  return rc;
}

/* A site left out of an executable graph's gating (a hosted one whose
 * binding failed or was given back; any gated by another executable graph
 * of its capture): its replays there run production alone, counted on its
 * route. */
static void ungated(graph_site *s) {
  if (s->verify != NULL)
    atomic_fetch_add_explicit(&s->verify->graph_ungated, 1, memory_order_relaxed);
}

/* Drops binding i: its sites go back to deciding on the device. The caller
 * holds g->bind_lock and g->lock. */
static void unbind_at(ust__graphs *g, uint32_t i) {
  exec_bind *b = &g->binds[i];
  for (uint32_t k = 0; k < b->n; k++) {
    graph_site *s = b->sites[k].site;
    s->gated--;
    if (!g->closed)
      set_word(s, atomic_load(s->word));
  }
  bind_release(b);
  g->binds[i] = g->binds[--g->n_binds];
}

static exec_bind *find_bind(ust__graphs *g, const void *exec, uint32_t *at) {
  for (uint32_t i = 0; i < g->n_binds; i++)
    if (g->binds[i].exec == exec) {
      if (at != NULL)
        *at = i;
      return &g->binds[i];
    }
  return NULL;
}

unsigned long long ust__graph_capture_id(void *stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo((cudaStream_t)stream, &st, &id, NULL, NULL, NULL, NULL) != cudaSuccess) {
    cudaGetLastError(); /* not this thread's error to keep */
    return 0;
  }
  return st == cudaStreamCaptureStatusActive ? id : 0;
}

unsigned long long ust__graphs_capture_hosted(ust__graphs *g, void *stream) {
  const unsigned long long id = ust__graph_capture_id(stream);
  if (g != NULL && id != 0) {
    pthread_mutex_lock(&g->lock);
    g->hosted[g->n_hosted++ % GRAPH_HOSTED] = id;
    pthread_mutex_unlock(&g->lock);
  }
  return id;
}

/* n streams, each with its event, and the replay's event, for the bodies
 * of hosted sites, on device. */
static int bind_sides(exec_bind *b, int device, int n) {
  on_device o;
  int rc = device_enter(&o, device);
  if (rc == 0)
    rc = UST__GPU_CHECK(NULL, cudaEventCreateWithFlags((cudaEvent_t *)&b->replayed, cudaEventDisableTiming));
  for (int j = 0; j < n && rc == 0; j++) {
    rc = UST__GPU_CHECK(NULL, cudaStreamCreateWithFlags((cudaStream_t *)&b->side[j], cudaStreamNonBlocking));
    if (rc == 0)
      rc = UST__GPU_CHECK(NULL, cudaEventCreateWithFlags((cudaEvent_t *)&b->done[j], cudaEventDisableTiming));
    b->n_sides += rc == 0;
  }
  device_leave(&o);
  return rc;
}

int ust__graphs_bind(ust__graphs *g, void *graph, unsigned long long capture, void *exec) {
  if (g == NULL || graph == NULL || capture == 0 || exec == NULL)
    return 0;
  pthread_mutex_lock(&g->bind_lock);
  pthread_mutex_lock(&g->lock);
  uint32_t at;
  if (find_bind(g, exec, &at) != NULL) /* an executable graph made again at the address of one gone */
    unbind_at(g, at);
  uint32_t n = 0, hosted = 0;
  int device = -1;
  for (uint32_t i = 0; i < g->n_sites && !g->closed; i++) {
    const graph_site *s = g->sites[i];
    if (of_capture(s, graph, capture) && s->gated > 0) {
      /* gated by another executable graph of the same capture: its kernels
       * here would read the word that binding's replays are decided by,
       * and take the copies its bodies read; left out (production alone) */
      g->gate_failed += site_enable(exec, s, 0) != 0; /* a node that would not change: said in graphs.gate_failed */
      ungated(g->sites[i]);
    }
    if (bindable(g->sites[i], graph, capture)) {
      n++;
      if (g->sites[i]->hosted) {
        hosted++;
        device = g->sites[i]->device;
      }
    }
  }
  int rc = 0;
  exec_bind b;
  memset(&b, 0, sizeof b);
  b.exec = exec;
  b.n = n;
  b.device = device;
  if (n > 0 && g->n_binds == g->cap_binds) {
    const uint32_t cap = g->cap_binds ? g->cap_binds * 2 : 8;
    exec_bind *grown = realloc(g->binds, cap * sizeof *grown);
    if (grown == NULL)
      rc = ust__error(UST_ENOMEM, "graph: out of memory");
    else {
      g->binds = grown;
      g->cap_binds = cap;
    }
  }
  if (n > 0 && rc == 0 && (b.sites = calloc(n, sizeof *b.sites)) == NULL)
    rc = ust__error(UST_ENOMEM, "graph: out of memory");
  if (n > 0 && rc == 0 && hosted > 0)
    rc = bind_sides(&b, device, hosted < GRAPH_SIDES ? (int)hosted : GRAPH_SIDES);
  if (n > 0 && rc == 0) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < g->n_sites && k < n; i++)
      if (bindable(g->sites[i], graph, capture)) {
        graph_site *s = g->sites[i];
        b.sites[k++] = (exec_site){s, 0, -1}; /* its nodes' state unknown: set at the first replay */
        s->gated++;
        set_word(s, atomic_load(s->word));
      }
    g->binds[g->n_binds++] = b;
  } else {
    bind_release(&b);
    /* its hosted sites are started by no one in this executable graph */
    for (uint32_t i = 0; i < g->n_sites && n > 0; i++)
      if (g->sites[i]->hosted && bindable(g->sites[i], graph, capture))
        ungated(g->sites[i]);
  }
  pthread_mutex_unlock(&g->lock);
  pthread_mutex_unlock(&g->bind_lock);
  return rc != 0 ? rc : (int)n;
}

void ust__graphs_unbind(ust__graphs *g, void *exec) {
  if (g == NULL || exec == NULL)
    return;
  pthread_mutex_lock(&g->bind_lock);
  pthread_mutex_lock(&g->lock);
  uint32_t at;
  if (find_bind(g, exec, &at) != NULL)
    unbind_at(g, at);
  pthread_mutex_unlock(&g->lock);
  pthread_mutex_unlock(&g->bind_lock);
}

/* Binding at went wrong on the GPU: back to the device's decision, every
 * kernel enabled (a hosted site's gate closed), counted in
 * graphs.gate_failed. The caller holds g->bind_lock. */
static void give_back(ust__graphs *g, uint32_t at) {
  exec_bind *b = &g->binds[at];
  g->gate_failed++;
  for (uint32_t k = 0; k < b->n; k++) {
    site_enable(b->exec, b->sites[k].site, 1);
    if (b->sites[k].site->hosted)
      ungated(b->sites[k].site);
  }
  pthread_mutex_lock(&g->lock);
  unbind_at(g, at);
  pthread_mutex_unlock(&g->lock);
}

int ust__graphs_replay(ust__graphs *g, void *exec, void *stream) {
  if (g == NULL || exec == NULL)
    return 0;
  pthread_mutex_lock(&g->bind_lock);
  uint32_t at;
  exec_bind *b = find_bind(g, exec, &at);
  int failed = 0;
  uint32_t starts = 0;
  if (b != NULL) {
    g->gated_replays++;
    for (uint32_t k = 0; k < b->n && !failed; k++) {
      exec_site *es = &b->sites[k];
      const int on = ust__gate_host_verify(atomic_load(es->site->word), ++es->n);
      if (on != es->on) {
        failed = site_enable(exec, es->site, on) != 0;
        es->on = on;
      }
      starts += on && es->site->hosted;
    }
    /* its copies wait until the bodies reading the last ones are done; a
     * replay captured into another graph starts none (its copies are taken,
     * never read: that replay is not verified) */
    if (!failed && starts > 0) {
      on_device o;
      enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      failed = device_enter(&o, b->device) != 0 ||
               UST__GPU_CHECK(NULL, cudaStreamIsCapturing((cudaStream_t)stream, &st)) != 0;
      if (st != cudaStreamCaptureStatusNone)
        starts = 0;
      for (int j = 0; j < b->n_sides && !failed && starts > 0; j++)
        if (b->pending[j])
          failed = UST__GPU_CHECK(NULL, cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)b->done[j], 0)) != 0;
      device_leave(&o);
    }
    b->starts = failed ? 0 : starts;
  }
  if (failed)
    give_back(g, at);
  pthread_mutex_unlock(&g->bind_lock);
  return failed ? 0 : (int)starts;
}

void ust__graphs_replayed(ust__graphs *g, void *exec, void *stream) {
  if (g == NULL || exec == NULL)
    return;
  pthread_mutex_lock(&g->bind_lock);
  uint32_t at;
  exec_bind *b = find_bind(g, exec, &at);
  if (b != NULL && b->starts > 0) {
    on_device o; /* torch's replay makes the graph's device current only while it runs */
    int rc = device_enter(&o, b->device);
    int used[GRAPH_SIDES] = {0}, behind[GRAPH_SIDES] = {0}, recorded = 0; /* behind: side j waits for the replay */
    uint32_t hosted = 0; /* the binding's hosted sites so far: site i on side i % n_sides */
    for (uint32_t k = 0; k < b->n && rc == 0; k++) {
      const graph_site *s = b->sites[k].site;
      if (!s->hosted)
        continue;
      const int j = (int)(hosted++ % (uint32_t)b->n_sides);
      if (!b->sites[k].on)
        continue;
      const cudaStream_t side = (cudaStream_t)b->side[j];
      used[j] = 1;
      /* each body behind its kernel in the chain (under the rest of the
       * replay), or behind the replay */
      for (int p = 0; p < s->n_nodes && rc == 0; p++)
        if (s->bodies[p] != NULL) {
          if (s->marks[p] == NULL && !recorded) {
            rc = UST__GPU_CHECK(NULL, cudaEventRecord((cudaEvent_t)b->replayed, (cudaStream_t)stream));
            recorded = rc == 0;
          }
          if (rc == 0 && s->marks[p] != NULL)
            rc = UST__GPU_CHECK(NULL, cudaStreamWaitEvent(side, (cudaEvent_t)s->marks[p], 0));
          else if (rc == 0 && !behind[j]) /* once a stream: what follows on it is behind the replay too */
            behind[j] = (rc = UST__GPU_CHECK(NULL, cudaStreamWaitEvent(side, (cudaEvent_t)b->replayed, 0))) == 0;
          if (rc == 0)
            rc = UST__GPU_CHECK(NULL, cudaGraphLaunch((cudaGraphExec_t)s->bodies[p], side));
        }
      g->host_starts += rc == 0;
    }
    /* on every stream that started some, also after a failure (the release waits for them) */
    for (int j = 0; j < b->n_sides; j++)
      if (used[j]) {
        const int r = UST__GPU_CHECK(NULL, cudaEventRecord((cudaEvent_t)b->done[j], (cudaStream_t)b->side[j]));
        b->pending[j] = r == 0;
        rc = rc != 0 ? rc : r;
      }
    device_leave(&o);
    b->starts = 0;
    if (rc != 0)
      give_back(g, at);
  }
  pthread_mutex_unlock(&g->bind_lock);
}

#else /* no CUDA conditional nodes */

int ust__graph_call_begin(ust__graphs *g, const ust__slot_route *r, int device, void *stream, ust__graph_call *c) {
  (void)g, (void)r, (void)device, (void)stream;
  memset(c, 0, sizeof *c);
  return ust__error(UST_EGPU, "graph: this build has no CUDA conditional graph nodes");
}

int ust__graph_part_begin(ust__graph_call *c, void **side) {
  (void)c;
  *side = NULL;
  return ust__error(UST_EGPU, "graph: this build has no CUDA conditional graph nodes");
}

int ust__graph_part_end(ust__graph_call *c, int keep) {
  (void)c, (void)keep;
  return ust__error(UST_EGPU, "graph: this build has no CUDA conditional graph nodes");
}

int ust__graph_part_active(const ust__graph_call *c) {
  (void)c;
  return 0;
}

int ust__graph_call_finish(ust__graph_call *c, const ust__pair *pairs, int n_pairs, ust__cmp_stats *dev_stats,
                           int servable) {
  (void)c, (void)pairs, (void)n_pairs, (void)dev_stats, (void)servable;
  return ust__error(UST_EGPU, "graph: this build has no CUDA conditional graph nodes");
}

int ust__graph_copy(ust__graph_call *c, void *dst, const void *src, size_t bytes) {
  (void)c, (void)dst, (void)src, (void)bytes;
  return ust__error(UST_EGPU, "graph: this build has no CUDA conditional graph nodes");
}

void *ust__graph_keep(ust__graph_call *c, size_t bytes) {
  (void)c, (void)bytes;
  return NULL;
}

int ust__graph_fill(ust__graph_call *c, void *dst, int byte, size_t bytes) {
  (void)c, (void)dst, (void)byte, (void)bytes;
  return ust__error(UST_EGPU, "graph: this build has no CUDA conditional graph nodes");
}

uint64_t ust__graphs_tick(ust__graphs *g) {
  (void)g;
  return 0;
}

#if !defined(UST_GPU_HIP)
int ust__gate_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                     unsigned long long handle, void *stream) {
  (void)word, (void)counters, (void)first, (void)handle, (void)stream;
  return ust__error(UST_EGPU, "gate: this build has no GPU backend");
}

int ust__gate_copy_launch(void *dst, const void *src, size_t bytes, const ust__gate_counters *counters, void *stream) {
  (void)dst, (void)src, (void)bytes, (void)counters, (void)stream;
  return ust__error(UST_EGPU, "gate: this build has no GPU backend");
}

int ust__gate_snap_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                          unsigned long long handle, void *body, const ust__gate_copies *copies, void *stream) {
  (void)word, (void)counters, (void)first, (void)handle, (void)body, (void)copies, (void)stream;
  return ust__error(UST_EGPU, "gate: this build has no GPU backend");
}

int ust__gate_device_launch(void) { return 0; }
#endif

int ust__graphs_bind(ust__graphs *g, void *graph, unsigned long long capture, void *exec) {
  (void)g, (void)graph, (void)capture, (void)exec;
  return 0;
}

unsigned long long ust__graph_capture_id(void *stream) {
  (void)stream;
  return 0;
}

void ust__graphs_unbind(ust__graphs *g, void *exec) { (void)g, (void)exec; }

int ust__graphs_replay(ust__graphs *g, void *exec, void *stream) {
  (void)g, (void)exec, (void)stream;
  return 0;
}

void ust__graphs_replayed(ust__graphs *g, void *exec, void *stream) { (void)g, (void)exec, (void)stream; }

unsigned long long ust__graphs_capture_hosted(ust__graphs *g, void *stream) {
  (void)g, (void)stream;
  return 0;
}

#endif

/* The call's end: a finished call's site goes live, its gate set from its
 * route now and kept so by the worker's ticks; any other leaves its gate
 * off. */
void ust__graph_call_end(ust__graph_call *c, int ok) {
  if (c->site == NULL)
    return;
  ust__graphs *g = c->graphs;
  pthread_mutex_lock(&g->lock);
  c->site->state = ok && c->site->pool_site != 0 ? SITE_LIVE : SITE_DROPPED;
  /* its first replays follow the route already (the worker keeps it so) */
  if (c->site->state == SITE_LIVE && !g->closed)
    set_word(c->site, site_gate(g, c->site));
  pthread_mutex_unlock(&g->lock);
  c->site = NULL;
}
