/*
 * Kernel-level timing: windows of call slots joined with the tracer's
 * records (see dispatch.h). Plain C, no GPU: the CUPTI tracer
 * (timer_cupti.c) feeds it, and the C tests feed it records directly.
 *
 * Threads: serving threads take and end call slots (atomics only); the
 * tracer's buffer callback adds records under the lock; the worker opens,
 * closes and concludes windows. A window's slots are reused only once no
 * call of it is in flight: a call counts itself in before it reads whether
 * the window is open, the worker closes it before it reads the count (both
 * sequentially consistent), so a call that saw it open is always counted.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"

typedef struct kernel_rec {
  uint32_t corr;
  uint64_t start, end;
  uint64_t node;    /* the graph node it ran as (a replay), else 0 */
  const char *name; /* the tracer's string, valid while the process runs */
} kernel_rec;

/* An id's entry in an id_table: a launch's correlation id (val: its call
 * slot + 1, 0 while only its launch record was seen; flags:
 * UST__KT_LAUNCH_*), or a graph node's id (val: its captured call + 1). */
typedef struct id_slot {
  uint64_t id; /* 0: empty (the tracer's ids start at 1) */
  uint32_t val, flags;
} id_slot;

/* An executable graph's flags: its graph known from the ids understudy took
 * itself (ust__kt_graph_made), not from CUPTI's resource callback. */
#define EXEC_INFERRED 1u

/* Open addressing, linear probing; cap a power of two (0 until the first add). */
typedef struct id_table {
  id_slot *s;
  uint32_t cap, n;
} id_table;

/* A production kernel's name, learned from the eager calls timed by their
 * kernels: the routes whose calls ran it (their figures), so that a kernel
 * of that name run by a graph no bound op was seen captured into counts on
 * them as unseen. */
#define KT_NAME_ROUTES 4
#define KT_NAMES_MAX 8192u
typedef struct known_name {
  ust__figs *figs[KT_NAME_ROUTES];
  uint32_t n;
} known_name;

typedef struct captured_call {
  ust__figs *figs;
  uint64_t tsol_ps;
  uint32_t kernels; /* its kernel nodes: a replay with fewer records lost some (0: not known) */
  uint32_t graph;   /* the captured graph it is in */
  int changed;      /* counted as changed in place (once) */
} captured_call;

/* Ids understudy's own graphs took while a graph was captured (its
 * shadows' parts and bodies: ust__kt_graph_made), from..to: their kernels
 * are understudy's, not of a graph it did not see captured. */
typedef struct id_range {
  uint32_t from, to;
} id_range;


struct ust__kt {
  atomic_int open;
  atomic_int collecting; /* from open to conclude: records are kept */
  atomic_int inflight;
  atomic_uint next_call;
  uint32_t seq;
  ust__kt_call *calls;
  pthread_mutex_t lock; /* the records and the totals */
  kernel_rec *kernels;
  uint32_t n_kernels;
  id_table corrs; /* the window's launches */
  uint64_t lost;
  ust__kt_totals totals;
  /* graph nodes of captured calls: kept across windows (under the lock) */
  id_table nodes;
  id_table graphs;     /* captured graphs' ids: val 1, or 2 once captured at the same time as another */
  id_table execs;      /* executable graphs' ids known from instantiation: val the graph's */
  uint64_t prev_graph; /* the graph of the last captured call */
  captured_call *captured;
  uint32_t n_captured, captured_cap;
  /* production kernels' names (their hashes), kept across windows: val the
   * entry in known + 1 */
  id_table names;
  known_name *known;
  uint32_t n_known;
  id_range *own; /* sorted by from, disjoint */
  uint32_t n_own, own_cap;
  ust__kt_floor_fn floor_fn; /* staged floors' resolution (ust__kt_defer_floor) */
  void *floor_ctx;
};

static _Thread_local int tls_current = -1; /* the calling thread's innermost slot */

static uint32_t id_hash(uint64_t id) { return (uint32_t)((id * 0x9E3779B97F4A7C15ull) >> 32); }

/* The entry of id, added (zeroed) when absent and add is set; NULL when
 * absent, or out of memory to grow. Called with the lock held. */
static id_slot *id_find(id_table *t, uint64_t id, int add) {
  if (add && (t->n + 1) * 2 > t->cap) {
    const uint32_t cap = t->cap != 0 ? t->cap * 2 : 1024;
    id_slot *grown = calloc(cap, sizeof *grown);
    if (grown == NULL)
      return NULL;
    for (uint32_t i = 0; i < t->cap; i++)
      for (uint32_t j = id_hash(t->s[i].id) & (cap - 1); t->s[i].id != 0; j = (j + 1) & (cap - 1))
        if (grown[j].id == 0) {
          grown[j] = t->s[i];
          break;
        }
    free(t->s);
    t->s = grown;
    t->cap = cap;
  }
  for (uint32_t j = id_hash(id) & (t->cap - 1); t->cap != 0; j = (j + 1) & (t->cap - 1)) {
    if (t->s[j].id == id)
      return &t->s[j];
    if (t->s[j].id == 0) {
      if (!add)
        return NULL;
      t->s[j] = (id_slot){id, 0, 0};
      t->n++;
      return &t->s[j];
    }
  }
  return NULL;
}

static void id_clear(id_table *t) {
  if (t->cap != 0)
    memset(t->s, 0, (size_t)t->cap * sizeof *t->s);
  t->n = 0;
}


int ust__kt_create(ust__kt **out) {
  ust__kt *k = calloc(1, sizeof *k);
  *out = NULL;
  if (k == NULL)
    return ust__error(UST_ENOMEM, "out of memory for kernel timing");
  k->calls = calloc(UST__KT_MAX_CALLS, sizeof *k->calls);
  if (k->calls == NULL) {
    free(k);
    return ust__error(UST_ENOMEM, "out of memory for kernel timing");
  }
  pthread_mutex_init(&k->lock, NULL);
  *out = k;
  return 0;
}

void ust__kt_destroy(ust__kt *k) {
  if (k == NULL)
    return;
  pthread_mutex_destroy(&k->lock);
  free(k->nodes.s);
  free(k->graphs.s);
  free(k->execs.s);
  free(k->captured);
  free(k->names.s);
  free(k->known);
  free(k->own);
  free(k->calls);
  free(k->kernels);
  free(k->corrs.s);
  free(k);
}

void ust__kt_collect(ust__kt *k, int on) {
  pthread_mutex_lock(&k->lock);
  k->seq++;
  k->n_kernels = 0;
  id_clear(&k->corrs);
  k->lost = 0;
  atomic_store_explicit(&k->collecting, on != 0, memory_order_relaxed);
  pthread_mutex_unlock(&k->lock);
}

void ust__kt_open(ust__kt *k) {
  /* collecting already: ust__kt_collect started this window's sequence
   * (every window ends in ust__kt_conclude or ust__kt_collect(k, 0)) */
  if (!atomic_load_explicit(&k->collecting, memory_order_relaxed))
    ust__kt_collect(k, 1);
  atomic_store(&k->next_call, 0);
  atomic_store(&k->open, 1);
}

int ust__kt_window_open(const ust__kt *k) { return atomic_load_explicit(&((ust__kt *)k)->open, memory_order_relaxed); }

void ust__kt_close(ust__kt *k) { atomic_store(&k->open, 0); }

int ust__kt_quiet(ust__kt *k) { return !atomic_load(&k->open) && atomic_load(&k->inflight) == 0; }

int ust__kt_begin(ust__kt *k, uint64_t *ext) {
  atomic_fetch_add(&k->inflight, 1);
  if (!atomic_load(&k->open)) {
    atomic_fetch_sub(&k->inflight, 1);
    return -1;
  }
  const unsigned slot = atomic_fetch_add_explicit(&k->next_call, 1, memory_order_relaxed);
  if (slot >= UST__KT_MAX_CALLS) {
    atomic_fetch_sub(&k->inflight, 1);
    return -1;
  }
  ust__kt_call *c = &k->calls[slot];
  memset(c, 0, sizeof *c);
  c->parent = tls_current;
  tls_current = (int)slot;
  *ext = (uint64_t)k->seq << 32 | (slot + 1);
  return (int)slot;
}

static void end_slot(ust__kt *k, int slot, int how) {
  ust__kt_call *c = &k->calls[slot];
  tls_current = c->parent;
  atomic_store_explicit(&c->ended, how, memory_order_release);
  atomic_fetch_sub(&k->inflight, 1);
}

void ust__kt_end(ust__kt *k, int slot, ust__figs *figs, uint64_t tsol_ps, int kind) {
  ust__kt_call *c = &k->calls[slot];
  c->figs = figs;
  c->tsol_ps = tsol_ps;
  c->kind = kind;
  end_slot(k, slot, 1);
}

void ust__kt_cancel(ust__kt *k, int slot) { end_slot(k, slot, 2); }

void ust__kt_floor_fn_set(ust__kt *k, ust__kt_floor_fn resolve, void *ctx) {
  k->floor_fn = resolve;
  k->floor_ctx = ctx;
}

void ust__kt_defer_floor(ust__kt *k, int slot, int tag1, int part) {
  k->calls[slot].floor_tag1 = tag1;
  k->calls[slot].floor_part = part;
}

void ust__kt_floor_settled(ust__kt *k, int slot, int part) {
  ust__kt_call *c = &k->calls[slot];
  if (c->floor_tag1 > 0 && c->floor_part != part)
    c->floor_part = 0;
}

int ust__kt_floor_tag(const ust__kt *k, int slot, int stands) {
  const ust__kt_call *c = &k->calls[slot];
  return !stands || c->floor_part != 0 ? c->floor_tag1 : 0;
}

/* A concluding call's floor, with its staged lengths' part in place of the
 * bound when it takes a figure (timed); the lengths let go otherwise. */
static uint64_t floor_settle(ust__kt *k, ust__kt_call *c, int timed) {
  if (c->floor_tag1 <= 0 || k->floor_fn == NULL)
    return c->tsol_ps;
  const int applies = timed && c->floor_part != 0;
  const uint64_t tsol_ps = k->floor_fn(k->floor_ctx, c->floor_tag1, applies ? c->tsol_ps : 0);
  c->floor_tag1 = 0;
  return applies ? tsol_ps : c->tsol_ps;
}

void ust__kt_end_span(ust__kt *k, int slot, ust__kt_sink *sink, int role) {
  ust__kt_call *c = &k->calls[slot];
  c->sink = sink;
  c->role = role;
  end_slot(k, slot, sink != NULL ? 1 : 2);
}

/* The call slot + 1 a launch belongs to, or 0. Called with the lock held. */
static uint32_t corr_get(ust__kt *k, uint32_t corr) {
  const id_slot *e = id_find(&k->corrs, corr, 0);
  return e != NULL ? e->val : 0; /* 0: a launch no call claimed */
}

void ust__kt_ext(ust__kt *k, uint32_t corr, uint64_t ext) {
  const uint32_t call = (uint32_t)ext;
  if (corr == 0 || call == 0 || call > UST__KT_MAX_CALLS)
    return;
  pthread_mutex_lock(&k->lock);
  id_slot *e = (uint32_t)(ext >> 32) == k->seq ? id_find(&k->corrs, corr, 1) : NULL;
  if (e == NULL && (uint32_t)(ext >> 32) == k->seq)
    k->lost++;
  else if (e != NULL && e->val == 0)
    e->val = call;
  pthread_mutex_unlock(&k->lock);
}

int ust__kt_current(void) { return tls_current; }

/* A launch's phase, in its id_slot's flags above the launch kinds: the
 * launching thread's ust_phase + 1 (0: not known). */
#define PHASE_SHIFT 4
#define PHASE_MASK (3u << PHASE_SHIFT)

void ust__kt_launch_of(ust__kt *k, uint32_t corr, int slot, uint32_t flags, int phase) {
  if (corr == 0 || slot >= UST__KT_MAX_CALLS || phase < 0 || phase >= UST__N_PHASES)
    return;
  pthread_mutex_lock(&k->lock);
  id_slot *e = atomic_load_explicit(&k->collecting, memory_order_relaxed) ? id_find(&k->corrs, corr, 1) : NULL;
  if (e != NULL) {
    if (e->val == 0 && slot >= 0)
      e->val = (uint32_t)slot + 1;
    if (slot >= 0)
      e->flags |= flags;
    if ((e->flags & PHASE_MASK) == 0)
      e->flags |= (uint32_t)(phase + 1) << PHASE_SHIFT;
  }
  pthread_mutex_unlock(&k->lock);
}


void ust__kt_launch(ust__kt *k, uint32_t corr, uint32_t flags) {
  if (corr == 0)
    return;
  pthread_mutex_lock(&k->lock);
  id_slot *e = atomic_load_explicit(&k->collecting, memory_order_relaxed) ? id_find(&k->corrs, corr, 1) : NULL;
  if (e != NULL)
    e->flags |= flags;
  pthread_mutex_unlock(&k->lock);
}

void ust__kt_graph_exec(ust__kt *k, uint32_t graph, uint32_t exec) {
  if (graph == 0 || exec == 0)
    return;
  pthread_mutex_lock(&k->lock);
  id_slot *x = id_find(&k->execs, exec, 1);
  if (x != NULL) {
    x->val = graph;
    x->flags = 0; /* certain */
  }
  pthread_mutex_unlock(&k->lock);
}

/* graph's capture made graphs of understudy's own up to id last: the ids
 * graph + 1..last are kept as its own (ranges merged; at most
 * UST__KT_MAX_CAPTURED). Lock held. */
static void own_add(ust__kt *k, uint32_t graph, uint32_t last) {
  const id_range r = {graph + 1, last};
  uint32_t i = k->n_own;
  while (i > 0 && k->own[i - 1].from > r.from)
    i--;
  if (i > 0 && k->own[i - 1].to + 1 >= r.from) { /* extends the one before */
    if (r.to > k->own[i - 1].to)
      k->own[i - 1].to = r.to;
  } else {
    if (k->n_own == k->own_cap) {
      const uint32_t cap = k->own_cap ? k->own_cap * 2 : 64;
      id_range *grown = cap <= UST__KT_MAX_CAPTURED ? realloc(k->own, cap * sizeof *grown) : NULL;
      if (grown == NULL)
        return;
      k->own = grown;
      k->own_cap = cap;
    }
    memmove(&k->own[i + 1], &k->own[i], (k->n_own - i) * sizeof *k->own);
    k->own[i] = r;
    k->n_own++;
    i++;
  }
  /* ranges it now reaches merge into it */
  while (i < k->n_own && k->own[i - 1].to + 1 >= k->own[i].from) {
    if (k->own[i].to > k->own[i - 1].to)
      k->own[i - 1].to = k->own[i].to;
    memmove(&k->own[i], &k->own[i + 1], (k->n_own - i - 1) * sizeof *k->own);
    k->n_own--;
  }
}

/* 1 when id is one of understudy's own graphs'. Lock held. */
static int own_graph(const ust__kt *k, uint64_t id) {
  uint32_t lo = 0, hi = k->n_own;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (k->own[mid].to < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < k->n_own && k->own[lo].from <= id;
}

void ust__kt_graph_made(ust__kt *k, uint32_t graph, uint32_t last) {
  if (graph == 0 || last == 0 || last == UINT32_MAX)
    return;
  pthread_mutex_lock(&k->lock);
  /* the graph's flags: the executable graph inferred so far, which the ids
   * taken since make wrong (it was a graph of understudy's own) */
  id_slot *g = id_find(&k->graphs, graph, 0);
  /* the ids taken since are understudy's own, unless another capture ran
   * beside this one (its ids interleave) */
  if (last > graph && (g == NULL || g->val != 2))
    own_add(k, graph, last);
  if (g != NULL && g->flags != last + 1) {
    id_slot *old = g->flags != 0 ? id_find(&k->execs, g->flags, 0) : NULL;
    if (old != NULL && old->flags == EXEC_INFERRED && old->val == graph)
      old->val = 0;
    id_slot *x = id_find(&k->execs, (uint64_t)last + 1, 1);
    if (x != NULL && (x->val == 0 || x->flags == EXEC_INFERRED)) {
      x->val = graph;
      x->flags = EXEC_INFERRED;
      g->flags = last + 1;
    }
  }
  pthread_mutex_unlock(&k->lock);
}

int ust__kt_graph_call(ust__kt *k, const uint64_t *nodes, int n, uint32_t kernels, ust__figs *figs,
                       uint64_t tsol_ps) {
  if (n <= 0 || nodes[0] >> 32 == 0)
    return 0;
  const uint64_t graph = nodes[0] >> 32;
  pthread_mutex_lock(&k->lock);
  int rc = 0;
  /* Two graphs captured at once (their calls interleave): the executable
   * graph that follows a captured graph's id need not be its own, so
   * neither is followed. */
  id_slot *g = id_find(&k->graphs, graph, 1);
  if (g == NULL) {
    rc = ust__error(UST_ENOMEM, "kernel timing: out of memory for captured graphs");
  } else if (g->val == 0) {
    g->val = 1;
  } else if (k->prev_graph != graph && k->prev_graph != 0) {
    g->val = 2;
    id_slot *p = id_find(&k->graphs, k->prev_graph, 0);
    if (p != NULL)
      p->val = 2;
  }
  k->prev_graph = graph;
  if (rc == 0 && k->n_captured == k->captured_cap) {
    const uint32_t cap = k->captured_cap ? k->captured_cap * 2 : 256;
    captured_call *grown = cap <= UST__KT_MAX_CAPTURED ? realloc(k->captured, cap * sizeof *grown) : NULL;
    if (grown == NULL) {
      rc = ust__error(UST_ENOMEM, "kernel timing: no room for more captured calls");
    } else {
      k->captured = grown;
      k->captured_cap = cap;
    }
  }
  if (rc == 0) {
    k->captured[k->n_captured++] = (captured_call){figs, tsol_ps, kernels, (uint32_t)graph, 0};
    for (int i = 0; i < n && rc == 0; i++) {
      id_slot *e = nodes[i] != 0 ? id_find(&k->nodes, nodes[i], 1) : NULL;
      if (nodes[i] != 0 && e == NULL)
        rc = ust__error(UST_ENOMEM, "kernel timing: out of memory for graph nodes");
      else if (e != NULL)
        e->val = k->n_captured;
    }
    if (rc != 0) /* partly mapped: no figures (counted unmapped below), rather than part of a call */
      k->captured[k->n_captured - 1].figs = NULL;
  }
  if (rc != 0)
    k->totals.captured_unmapped++;
  pthread_mutex_unlock(&k->lock);
  return rc;
}

void ust__kt_kernel(ust__kt *k, uint32_t corr, uint64_t node, uint64_t start, uint64_t end, const char *name) {
  pthread_mutex_lock(&k->lock);
  if (!atomic_load_explicit(&k->collecting, memory_order_relaxed)) {
    /* between windows: not ours to count */
  } else if (start == 0 || end < start) {
    k->lost++; /* a kernel without timestamps (the tracer ran out of device memory) */
  } else if (k->n_kernels < UST__KT_MAX_KERNELS) {
    if (k->kernels == NULL && (k->kernels = malloc((size_t)UST__KT_MAX_KERNELS * sizeof *k->kernels)) == NULL)
      k->lost++;
    else
      k->kernels[k->n_kernels++] = (kernel_rec){corr, start, end, node, name};
  } else {
    k->lost++;
  }
  pthread_mutex_unlock(&k->lock);
}

void ust__kt_lost(ust__kt *k, uint64_t n) {
  pthread_mutex_lock(&k->lock);
  k->lost += n;
  pthread_mutex_unlock(&k->lock);
}

uint64_t ust__kt_window_kernels(ust__kt *k) {
  pthread_mutex_lock(&k->lock);
  const uint64_t n = k->n_kernels;
  pthread_mutex_unlock(&k->lock);
  return n;
}

/* An unattributed kernel's time into the named list (kept sorted by time,
 * the smallest dropped when full). Called with the lock held. */
static void name_add(ust__kt_totals *t, const char *name, uint64_t ns) {
  if (name == NULL)
    name = "(unnamed)";
  int i = 0;
  while (i < t->n_names && strncmp(t->names[i].name, name, UST__KT_NAME_MAX - 1) != 0)
    i++;
  const int cap = (int)(sizeof t->names / sizeof t->names[0]);
  if (i == t->n_names) {
    if (t->n_names == cap) {
      if (t->names[cap - 1].ns >= ns)
        return;
      i = cap - 1;
    } else {
      t->n_names++;
    }
    memset(&t->names[i], 0, sizeof t->names[i]);
    strncpy(t->names[i].name, name, UST__KT_NAME_MAX - 1);
  }
  t->names[i].ns += ns;
  t->names[i].kernels++;
  while (i > 0 && t->names[i - 1].ns < t->names[i].ns) {
    const ust__kt_name tmp = t->names[i - 1];
    t->names[i - 1] = t->names[i];
    t->names[i] = tmp;
    i--;
  }
}

/* A kernel name's key in k->names (FNV-1a; never 0, the empty slot). */
static uint64_t name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return h != 0 ? h : 1;
}

/* figs's route ran a kernel called name in an eager call: remembered (up
 * to KT_NAME_ROUTES routes a name, KT_NAMES_MAX names). Lock held. */
static void name_learn(ust__kt *k, const char *name, ust__figs *figs) {
  if (name == NULL || figs == NULL)
    return;
  ust__figs_kernel_name(figs, name); /* the route's own list: which kernels served it */
  const uint64_t h = name_hash(name);
  id_slot *e = id_find(&k->names, h, 0);
  if (e == NULL) {
    if (k->n_known == KT_NAMES_MAX)
      return;
    if (k->known == NULL && (k->known = calloc(KT_NAMES_MAX, sizeof *k->known)) == NULL)
      return;
    if ((e = id_find(&k->names, h, 1)) == NULL)
      return;
    e->val = ++k->n_known;
    k->known[e->val - 1].n = 0;
  }
  known_name *kn = &k->known[e->val - 1];
  for (uint32_t i = 0; i < kn->n; i++)
    if (kn->figs[i] == figs)
      return;
  if (kn->n < KT_NAME_ROUTES)
    kn->figs[kn->n++] = figs;
}

/* A kernel called name, ns long, run by a graph no bound op was seen
 * captured into: unseen on each route whose eager calls ran a kernel of
 * that name. Lock held. */
static void name_unseen(ust__kt *k, const char *name, uint64_t ns) {
  const id_slot *e = name != NULL ? id_find(&k->names, name_hash(name), 0) : NULL;
  if (e == NULL)
    return;
  const known_name *kn = &k->known[e->val - 1];
  for (uint32_t i = 0; i < kn->n; i++)
    ust__figs_unseen_kernel(kn->figs[i], ns);
}

static int kernel_order(const void *a, const void *b) {
  const kernel_rec *x = a, *y = b;
  if (x->corr != y->corr)
    return x->corr < y->corr ? -1 : 1;
  if (x->node != y->node)
    return x->node < y->node ? -1 : 1;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static uint32_t window_calls(ust__kt *k) {
  const unsigned n = atomic_load(&k->next_call);
  return n < UST__KT_MAX_CALLS ? n : UST__KT_MAX_CALLS;
}

/* The captured graph an executable graph was instantiated from (one a
 * bound op was captured in), or 0: known for certain; else the captured
 * graph just before it, or the one whose capture made the graphs just
 * before it (ust__kt_graph_made); not when that one was captured beside
 * another. Called with the lock held. */
static uint64_t exec_graph(ust__kt *k, uint64_t exec) {
  if (exec < 2)
    return 0;
  const id_slot *x = id_find(&k->execs, exec, 0);
  const uint64_t graph = x != NULL ? x->val : exec - 1;
  if (x == NULL || x->flags == EXEC_INFERRED) {
    const id_slot *g = id_find(&k->graphs, graph, 0);
    if (g == NULL || g->val != 1)
      return 0;
  }
  return graph;
}

/* A captured call changed in place: counted on its route the first time. */
static void changed_once(captured_call *cc) {
  if (cc->changed || cc->figs == NULL)
    return;
  cc->changed = 1;
  ust__figs_graph_changed(cc->figs);
}

void ust__kt_exec_changed(ust__kt *k, uint32_t exec, uint64_t node) {
  pthread_mutex_lock(&k->lock);
  if (node != 0) {
    const id_slot *e = id_find(&k->nodes, node, 0);
    if (e != NULL && e->val != 0 && e->val <= k->n_captured)
      changed_once(&k->captured[e->val - 1]);
  } else {
    /* every captured call of its graph (the calls, not their nodes: a
     * serving thread's launch in a window waits for this lock) */
    const uint64_t graph = exec_graph(k, exec);
    for (uint32_t i = 0; graph != 0 && i < k->n_captured; i++)
      if (k->captured[i].graph == graph)
        changed_once(&k->captured[i]);
  }
  pthread_mutex_unlock(&k->lock);
}

/* The captured call (index + 1) a kernel of captured graph `graph`
 * (exec_graph) ran for, or 0. Called with the lock held. */
static uint32_t replay_of(ust__kt *k, uint64_t graph, const kernel_rec *kr) {
  const id_slot *e = graph != 0 ? id_find(&k->nodes, graph << 32 | (kr->node & 0xffffffffu), 0) : NULL;
  return e != NULL ? e->val : 0;
}

typedef struct replay_rec {
  uint32_t corr, captured;
  uint64_t start, end, ns;
} replay_rec;

static int replay_order(const void *a, const void *b) {
  const replay_rec *x = a, *y = b;
  if (x->corr != y->corr)
    return x->corr < y->corr ? -1 : 1;
  return x->captured < y->captured ? -1 : x->captured > y->captured;
}

/* The replayed kernels of the window into their captured calls' figures:
 * the kernels one graph launch ran for one captured call are one replayed
 * call of its route. Called with the lock held. */
static void conclude_replays(ust__kt *k, replay_rec *r, uint32_t n, double ns_per_tick) {
  qsort(r, n, sizeof *r, replay_order);
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i;
    uint64_t sum = 0, start = r[i].start, end = r[i].end;
    for (; j < n && r[j].corr == r[i].corr && r[j].captured == r[i].captured; j++) {
      sum += r[j].ns;
      start = r[j].start < start ? r[j].start : start;
      end = r[j].end > end ? r[j].end : end;
    }
    const captured_call *cc = &k->captured[r[i].captured - 1];
    if (cc->figs == NULL) {
      /* a call whose nodes were only partly kept (captured_unmapped) */
    } else if (cc->kernels != 0 && j - i != cc->kernels) {
      /* records lost: no figure rather than part of one */
      k->totals.calls_dropped++;
      ust__figs_kernel_lost(cc->figs);
    } else {
      ust__figs_kernel_time(cc->figs, sum, (uint64_t)((double)(end - start) * ns_per_tick + 0.5), j - i, cc->tsol_ps,
                            0);
      ust__figs_replayed(cc->figs);
      k->totals.calls_replayed++;
    }
    i = j;
  }
}

/* Each call's own launches (by API) and own kernels, from the records so
 * far; returns the launches still without a kernel. Called with the lock
 * held. */
static uint64_t tally(ust__kt *k, uint32_t n_calls) {
  for (uint32_t i = 0; i < n_calls; i++) {
    ust__kt_call *c = &k->calls[i];
    c->rt_launches = c->drv_launches = c->kernels = 0;
  }
  for (uint32_t j = 0; j < k->corrs.cap; j++) {
    const id_slot *e = &k->corrs.s[j];
    if (e->id == 0 || e->val == 0 || e->val > n_calls)
      continue;
    ust__kt_call *c = &k->calls[e->val - 1];
    c->rt_launches += (e->flags & UST__KT_LAUNCH_RUNTIME) != 0;
    c->drv_launches += (e->flags & UST__KT_LAUNCH_DRIVER) != 0;
  }
  for (uint32_t i = 0; i < k->n_kernels; i++) {
    const uint32_t call = k->kernels[i].corr != 0 ? corr_get(k, k->kernels[i].corr) : 0;
    if (call != 0 && call <= n_calls)
      k->calls[call - 1].kernels++;
  }
  uint64_t missing = 0;
  for (uint32_t i = 0; i < n_calls; i++) {
    ust__kt_call *c = &k->calls[i];
    c->launches = c->rt_launches > c->drv_launches ? c->rt_launches : c->drv_launches;
    if (c->kernels < c->launches)
      missing += c->launches - c->kernels;
  }
  return missing;
}

uint64_t ust__kt_outstanding(ust__kt *k) {
  pthread_mutex_lock(&k->lock);
  const uint64_t n = tally(k, window_calls(k));
  pthread_mutex_unlock(&k->lock);
  return n;
}

/* The spans of candidates' runs, their children's kernels summed in: each
 * run seen whole counts into its sink with its kernels, and each op span
 * inside such a run with its own (complete NULL: none is known whole). */
static void conclude_spans(ust__kt *k, uint32_t n_calls, const int *complete) {
  for (uint32_t i = 0; i < n_calls && complete != NULL; i++) {
    const ust__kt_call *c = &k->calls[i];
    if (c->sink == NULL || atomic_load_explicit(&c->ended, memory_order_acquire) != 1)
      continue;
    int run = c->role == UST__KT_RUN ? (int)i : c->parent;
    while (run >= 0 && k->calls[run].role != UST__KT_RUN)
      run = k->calls[run].parent;
    if (run < 0 || !complete[run] || k->calls[run].sink != c->sink ||
        atomic_load_explicit(&k->calls[run].ended, memory_order_acquire) != 1)
      continue;
    if (c->role == UST__KT_RUN) {
      atomic_fetch_add_explicit(&c->sink->runs, 1, memory_order_relaxed);
      atomic_fetch_add_explicit(&c->sink->kernels, c->kernels, memory_order_relaxed);
      atomic_fetch_add_explicit(&c->sink->kernel_ns, c->sum_ns, memory_order_relaxed);
    } else {
      atomic_fetch_add_explicit(&c->sink->op_kernels, c->kernels, memory_order_relaxed);
      atomic_fetch_add_explicit(&c->sink->op_ns, c->sum_ns, memory_order_relaxed);
    }
  }
}

void ust__kt_conclude(ust__kt *k, uint64_t window_ns, double ns_per_tick) {
  const uint32_t n_calls = window_calls(k);
  pthread_mutex_lock(&k->lock);
  ust__kt_totals *t = &k->totals;
  /* a kernel delivered twice (two activity kinds, a buffer handed back
   * twice) counts once */
  if (k->n_kernels > 1) {
    qsort(k->kernels, k->n_kernels, sizeof *k->kernels, kernel_order);
    uint32_t kept = 1;
    for (uint32_t i = 1; i < k->n_kernels; i++)
      if (kernel_order(&k->kernels[i], &k->kernels[kept - 1]) != 0)
        k->kernels[kept++] = k->kernels[i];
    k->n_kernels = kept;
  }
  const uint64_t missing = tally(k, n_calls);
  for (uint32_t i = 0; i < n_calls; i++) {
    ust__kt_call *c = &k->calls[i];
    c->kernels = 0; /* counted again below, with the sums */
    c->sum_ns = c->start = c->end = 0;
  }
  /* the names of the kernels production ran in the window's eager calls
   * (each its innermost call's; those a candidate served are not) */
  for (uint32_t i = 0; i < k->n_kernels; i++) {
    const kernel_rec *kr = &k->kernels[i];
    const id_slot *launch = kr->node == 0 && kr->corr != 0 ? id_find(&k->corrs, kr->corr, 0) : NULL;
    const uint32_t call = launch != NULL ? launch->val : 0;
    if (call != 0 && call <= n_calls && atomic_load_explicit(&k->calls[call - 1].ended, memory_order_acquire) == 1)
      name_learn(k, kr->name, k->calls[call - 1].figs);
  }
  replay_rec *replays = NULL;
  uint32_t n_replays = 0;
  for (uint32_t i = 0; i < k->n_kernels; i++) {
    const kernel_rec *kr = &k->kernels[i];
    const uint64_t ns = (uint64_t)((double)(kr->end - kr->start) * ns_per_tick + 0.5);
    t->kernels++;
    t->kernel_ns += ns;
    /* its launch: the call (slot + 1) and the phase (+ 1) it was noted with */
    const id_slot *launch = kr->corr != 0 ? id_find(&k->corrs, kr->corr, 0) : NULL;
    const uint32_t noted = launch != NULL ? (launch->flags & PHASE_MASK) >> PHASE_SHIFT : 0;
    const int phase = noted > 0 ? (int)noted - 1 : UST_PHASE_UNKNOWN;
    t->phase_kernel_ns[phase] += ns;
    /* a replayed node is its captured call's; the graph launch may itself
     * be inside a call of the window, whose time then includes it (as a
     * bound op called inside another adds to its parent) */
    const uint64_t graph = kr->node != 0 ? exec_graph(k, kr->node >> 32) : 0;
    const uint32_t cap = replay_of(k, graph, kr);
    if (kr->node != 0 && cap == 0 && own_graph(k, kr->node >> 32)) {
      /* run by a graph of understudy's own (a shadow's body; known for
       * certain when instantiated in a window, else by its id) */
      t->graph_own++;
      t->graph_own_ns += ns;
    } else if (kr->node != 0 && graph == 0) {
      /* run by a graph no bound op was seen captured into: captured before
       * enable(), without bound ops, or beside another capture */
      t->graph_unknown++;
      t->graph_unknown_ns += ns;
      name_unseen(k, kr->name, ns);
    }
    int grouped = 0;
    if (cap != 0 && (replays != NULL || (replays = malloc((size_t)k->n_kernels * sizeof *replays)) != NULL)) {
      replays[n_replays++] = (replay_rec){kr->corr, cap, kr->start, kr->end, ns};
      grouped = 1;
    }
    const uint32_t call = launch != NULL ? launch->val : 0;
    if (call == 0 || call > n_calls) {
      if (grouped) {
        t->attributed++;
        t->attributed_ns += ns;
        t->phase_attributed_ns[phase] += ns;
      } else {
        name_add(t, kr->name, ns); /* no call claimed it (or no memory to group a replay) */
      }
      continue;
    }
    ust__kt_call *c = &k->calls[call - 1];
    if (c->kernels == 0 || kr->start < c->start)
      c->start = kr->start;
    if (kr->end > c->end)
      c->end = kr->end;
    c->sum_ns += ns;
    c->kernels++;
    t->attributed++;
    t->attributed_ns += ns;
    t->phase_attributed_ns[phase] += ns;
  }
  /* a call whose own launches outnumber its own kernels lost records (a
   * runtime launch may make a driver launch of its own, whose record has no
   * kernel: a call's launches are the larger of the two counts) */
  int *complete = n_calls > 0 ? malloc(n_calls * sizeof *complete) : NULL;
  for (uint32_t i = 0; i < n_calls && complete != NULL; i++)
    complete[i] = k->calls[i].kernels >= k->calls[i].launches;
  /* children began after their parents: walking down, each call's own
   * kernels are all in before it passes them up */
  for (uint32_t i = n_calls; i-- > 0;) {
    ust__kt_call *c = &k->calls[i];
    if (c->parent < 0 || (uint32_t)c->parent >= i)
      continue;
    ust__kt_call *p = &k->calls[c->parent];
    if (c->kernels > 0) {
      if (p->kernels == 0 || c->start < p->start)
        p->start = c->start;
      if (c->end > p->end)
        p->end = c->end;
      p->sum_ns += c->sum_ns;
      p->kernels += c->kernels;
    }
    if (complete != NULL && !complete[i])
      complete[c->parent] = 0;
  }
  conclude_spans(k, n_calls, complete);
  for (uint32_t i = 0; i < n_calls; i++) {
    ust__kt_call *c = &k->calls[i];
    const int ended = atomic_load_explicit(&c->ended, memory_order_acquire) == 1 && c->figs != NULL;
    const int whole = ended && complete != NULL && complete[i];
    const uint64_t tsol_ps = floor_settle(k, c, whole && c->kernels > 0);
    if (!ended)
      continue;
    if (!whole) {
      t->calls_dropped++;
      ust__figs_kernel_lost(c->figs);
      continue;
    }
    if (c->kernels == 0) {
      t->calls_empty++; /* launched nothing the tracer saw: no figure rather than a zero */
      continue;
    }
    t->calls_timed++;
    const uint64_t span = (uint64_t)((double)(c->end - c->start) * ns_per_tick + 0.5);
    ust__figs_kernel_time(c->figs, c->sum_ns, span, c->kernels, tsol_ps, c->kind);
  }
  free(complete);
  if (n_replays > 0)
    conclude_replays(k, replays, n_replays, ns_per_tick);
  free(replays);
  t->records_lost += k->lost + missing;
  t->windows++;
  t->window_ns += window_ns;
  k->n_kernels = 0;
  id_clear(&k->corrs);
  k->lost = 0;
  k->seq++; /* late records of this window are ignored */
  atomic_store_explicit(&k->collecting, 0, memory_order_relaxed);
  pthread_mutex_unlock(&k->lock);
}

void ust__kt_totals_get(ust__kt *k, ust__kt_totals *out) {
  pthread_mutex_lock(&k->lock);
  *out = k->totals;
  pthread_mutex_unlock(&k->lock);
}

uint64_t ust__kt_next_open(uint64_t opened_ns, uint64_t window_ns, uint64_t kernels, double launch_cost_ns, double budget,
                           uint64_t min_gap_ns) {
  uint64_t period = window_ns + min_gap_ns;
  if (budget > 0) {
    const double cost = (double)kernels * launch_cost_ns;
    const double wanted = cost / budget; /* cost over the period within budget */
    if (wanted > (double)period)
      period = wanted > 1e18 ? (uint64_t)1e18 : (uint64_t)wanted;
  }
  return opened_ns + period;
}
