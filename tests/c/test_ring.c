/* The ring that carries comparison results out of CUDA graphs
 * (guard/ring.h): order, laps, entries torn while read, and the device's
 * writer inside a replayed graph where there is a GPU. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

#include "base/base.h"
#include "guard/gate.h"
#include "guard/guard.h"
#include "guard/ring.h"
#include "understudy/understudy.h"

#if defined(UST_GPU_CUDA)
#include <cuda_runtime_api.h>
#endif

/* Statistics that all follow from one token, so that a torn entry shows. */
static void stats_of(uint64_t token, ust__cmp_stats *s, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    memset(&s[i], 0, sizeof s[i]);
    s[i].n = token * 16 + i;
    s[i].mismatches = token ^ 0x5555u;
    s[i].first_mismatch_inv = ~token;
    s[i].max_abs_bits = token * 3 + i;
    s[i].sum_sq_diff = (double)token;
    s[i].sum_sq_prod = (double)(token + i);
  }
}

static int stats_whole(const ust__ring_entry *e) {
  const uint64_t token = e->stats[0].n / 16;
  ust__cmp_stats want[UST__MAX_PAIRS];
  stats_of(token, want, e->n_pairs);
  return e->site == (unsigned)(token & 0xffffu) && memcmp(want, e->stats, e->n_pairs * sizeof want[0]) == 0;
}

#if defined(UST_GPU_CUDA)
/* CUDA devices this process sees (0 without a driver or a device). */
static int gpu_devices(void) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess)
    devices = 0;
  cudaGetLastError();
  return devices;
}
#endif

typedef struct seen {
  uint64_t n, last_seq, torn, out_of_order;
  unsigned sites[64], runs[64];
} seen;

static void note(void *ctx, const ust__ring_entry *e) {
  seen *s = ctx;
  if (s->n < 64) {
    s->sites[s->n] = e->site;
    s->runs[s->n] = e->runs;
  }
  s->out_of_order += e->seq <= s->last_seq;
  s->torn += !stats_whole(e);
  s->last_seq = e->seq;
  s->n++;
}

static uint64_t publish(ust__ring *r, uint64_t token, unsigned n_pairs) {
  ust__cmp_stats st[UST__MAX_PAIRS];
  stats_of(token, st, n_pairs);
  return ust__ring_host_publish(r, (unsigned)(token & 0xffffu), st, n_pairs, 0);
}

TEST(ring_delivers_in_order_and_counts_what_a_lap_overwrote) {
  ust__ring *r = NULL;
  ASSERT_INT_EQ(ust__ring_create(8, 0, &r), 0);
  seen s = {0};
  ASSERT_U64_EQ(ust__ring_harvest(r, note, &s), 0); /* nothing yet */
  for (uint64_t t = 0; t < 5; t++)
    ASSERT_U64_EQ(publish(r, t, 1 + (unsigned)t % 3), t);
  ASSERT_U64_EQ(ust__ring_harvest(r, note, &s), 5);
  for (unsigned i = 0; i < 5; i++)
    ASSERT_INT_EQ((int)s.sites[i], (int)i);
  ASSERT_U64_EQ(s.torn + s.out_of_order, 0);
  ASSERT_U64_EQ(ust__ring_harvest(r, note, &s), 0); /* each once */
  /* 20 more without a harvest: 8 entries hold the last 8, the 12 before are gone */
  for (uint64_t t = 5; t < 25; t++)
    publish(r, t, UST__MAX_PAIRS);
  ASSERT_U64_EQ(ust__ring_harvest(r, note, &s), 8);
  ASSERT_INT_EQ((int)s.sites[5], 17);
  ASSERT_INT_EQ((int)s.sites[12], 24);
  ASSERT_U64_EQ(ust__ring_lost(r), 12);
  ASSERT_U64_EQ(ust__ring_next(r), 25);
  ASSERT_U64_EQ(s.torn + s.out_of_order, 0);
  ust__ring_dev none = ust__ring_device(r);
  ASSERT_TRUE(none.words == NULL && none.counter == NULL); /* a host ring has no device side */
  ust__ring_destroy(r);
}

typedef struct writer_arg {
  ust__ring *r;
  uint64_t from, n;
} writer_arg;

static void *writer(void *arg) {
  writer_arg *w = arg;
  for (uint64_t i = 0; i < w->n; i++)
    publish(w->r, w->from + i, 1 + (unsigned)((w->from + i) % UST__MAX_PAIRS));
  return NULL;
}

TEST(ring_never_hands_out_an_entry_torn_by_a_concurrent_writer) {
  /* a ring of 4 written while it is read: the writer laps the reader and
   * rewrites entries while they are copied; every entry delivered is whole
   * and in order, and every publication is either delivered or counted
   * lost. (One writer: the ring allows fewer than its size in flight, and
   * two host threads a lap apart can be, when one is descheduled.) */
  ust__ring *r = NULL;
  ASSERT_INT_EQ(ust__ring_create(4, 0, &r), 0);
  enum { N = 12000 };
  writer_arg a = {r, 1, N};
  pthread_t ta;
  pthread_create(&ta, NULL, writer, &a);
  seen s = {0};
  /* read while the writer writes, until it wrote the last (however long
   * it is kept from running) */
  do {
    ust__ring_harvest(r, note, &s);
  } while (ust__ring_next(r) < N);
  pthread_join(ta, NULL);
  ust__ring_harvest(r, note, &s);
  ASSERT_U64_EQ(ust__ring_next(r), N);
  ASSERT_U64_EQ(s.torn, 0);
  ASSERT_U64_EQ(s.out_of_order, 0);
  ASSERT_U64_EQ(s.n + ust__ring_lost(r), N);
  ASSERT_TRUE(s.n > 0);
  ust__ring_destroy(r);
}

TEST(ring_refuses_what_it_cannot_be) {
  ust__ring *r = NULL;
  ASSERT_INT_EQ(ust__ring_create(6, 0, &r), UST_EINVAL);
  ASSERT_TRUE(strstr(ust_last_error(), "power of two") != NULL);
  ASSERT_INT_EQ(ust__ring_create(1u << 17, 0, &r), UST_EINVAL);
  ASSERT_TRUE(r == NULL);
  ust__ring_dev d = {0};
#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
  ASSERT_INT_EQ(ust__ring_publish_launch(&d, 1, NULL, UST__MAX_PAIRS + 1, NULL, NULL), UST_EINVAL);
#else
  ASSERT_INT_EQ(ust__ring_publish_launch(&d, 1, NULL, 1, NULL, NULL), UST_EGPU);
#endif
}

TEST(ring_on_a_gpu_carries_the_replays_of_a_captured_writer) {
  /* where there is no GPU (or no GPU backend), a clear error; where there
   * is one, the ring is made on it and the test below runs */
  ust__ring *r = NULL;
  int rc = ust__ring_create(1024, 1, &r);
#if defined(UST_GPU_CUDA)
  ASSERT_TRUE(gpu_devices() == 0 || rc == 0); /* where there is a GPU, the ring is made on it */
#endif
  if (rc != 0) {
    ASSERT_TRUE(r == NULL && ust_last_error()[0] != '\0');
    return;
  }
#if defined(UST_GPU_CUDA)
  /* A GPU: the writer kernel captured once into a graph, the graph replayed
   * 1000 times; each replay's publication comes out, in order, whole. */
  ust__ring_dev d = ust__ring_device(r);
  ASSERT_TRUE(d.words != NULL && d.counter != NULL && d.size == 1024);
  ust__cmp_stats host[2], *dev = NULL;
  stats_of(7, host, 2);
  ASSERT_INT_EQ(cudaMalloc((void **)&dev, sizeof host), cudaSuccess);
  ASSERT_INT_EQ(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s;
  ASSERT_INT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t g;
  cudaGraphExec_t x;
  ASSERT_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_INT_EQ(ust__ring_publish_launch(&d, 7, dev, 2, NULL, s), 0);
  ASSERT_INT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  ASSERT_INT_EQ(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
  for (int i = 0; i < 1000; i++)
    ASSERT_INT_EQ(cudaGraphLaunch(x, s), cudaSuccess);
  ASSERT_INT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  seen got = {0};
  ASSERT_U64_EQ(ust__ring_harvest(r, note, &got), 1000);
  ASSERT_U64_EQ(got.torn + got.out_of_order + ust__ring_lost(r), 0);
  ASSERT_INT_EQ((int)got.sites[63], 7);
  fprintf(stderr, "ring on GPU: 1000 replays, %llu entries whole and in order\n", (unsigned long long)got.n);
  /* 3000 more replays before the next harvest: the ring holds the last 1024 */
  for (int i = 0; i < 3000; i++)
    ASSERT_INT_EQ(cudaGraphLaunch(x, s), cudaSuccess);
  ASSERT_INT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_U64_EQ(ust__ring_harvest(r, note, &got), 1024);
  ASSERT_U64_EQ(ust__ring_lost(r), 3000 - 1024);
  ASSERT_U64_EQ(got.torn + got.out_of_order, 0);
  /* a gated writer: it publishes in the replays its run bits verify, and
   * the entry carries them (whether the candidate served) */
  ust__gate_counters *gc = NULL;
  ASSERT_INT_EQ(cudaMalloc((void **)&gc, sizeof *gc), cudaSuccess);
  const unsigned long long runs[3] = {UST__GATE_RUN_VERIFY | UST__GATE_RUN_SERVE, UST__GATE_RUN_SERVE,
                                      UST__GATE_RUN_VERIFY};
  for (int i = 0; i < 3; i++) {
    ASSERT_INT_EQ(cudaMemcpyAsync(&gc->runs, &runs[i], sizeof runs[i], cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_INT_EQ(ust__ring_publish_launch(&d, 7, dev, 2, &gc->runs, s), 0);
    ASSERT_INT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  seen gated = {0};
  ASSERT_U64_EQ(ust__ring_harvest(r, note, &gated), 2);
  ASSERT_TRUE(gated.sites[0] == 7 && gated.runs[0] == (UST__GATE_RUN_VERIFY | UST__GATE_RUN_SERVE));
  ASSERT_TRUE(gated.sites[1] == 7 && gated.runs[1] == UST__GATE_RUN_VERIFY && gated.torn == 0);
  cudaFree(gc);
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(dev);
#endif
  ust__ring_destroy(r);
}

TEST(gate_snap_decides_each_replay_and_copies_when_it_verifies) {
  /* The kernel in the chain of a shadow beside it: as the replay's first
   * kernel it decides from the gate word (device memory) and the counters,
   * counts the replay and leaves its run bits; it copies its spans only when
   * the replay verifies. One block (small copies) and many (over 256 KiB,
   * the last block committing): the decisions are ust__gate_decide's,
   * counted here. */
#if defined(UST_GPU_CUDA)
  if (gpu_devices() == 0)
    return;
  const size_t sizes[2] = {4096 + 3, (size_t)1 << 20};
  for (int big = 0; big <= 1; big++) {
    const size_t n = sizes[big];
    unsigned char *src = NULL, *dst = NULL;
    unsigned long long *word = NULL;
    ust__gate_counters *gc = NULL;
    ASSERT_INT_EQ(cudaMalloc((void **)&src, n), cudaSuccess);
    ASSERT_INT_EQ(cudaMalloc((void **)&dst, n), cudaSuccess);
    ASSERT_INT_EQ(cudaMalloc((void **)&word, sizeof *word), cudaSuccess);
    ASSERT_INT_EQ(cudaMalloc((void **)&gc, sizeof *gc), cudaSuccess);
    ASSERT_INT_EQ(cudaMemset(gc, 0, sizeof *gc), cudaSuccess);
    ASSERT_INT_EQ(cudaMemset(src, 0x5a, n), cudaSuccess);
    const ust__replay_gate g = {UST__GATE_SHADOW, 0x80000000u, 0}; /* half the replays: the even ones */
    const unsigned long long w = ust__gate_pack(g);
    ASSERT_INT_EQ(cudaMemcpy(word, &w, sizeof w, cudaMemcpyHostToDevice), cudaSuccess);
    ust__gate_copies copies = {.n = 1};
    copies.c[0].dst = dst + 1; /* misaligned ends: the byte edges too */
    copies.c[0].src = src + 1;
    copies.c[0].bytes = n - 2;
    unsigned char *got = malloc(n);
    ASSERT_TRUE(got != NULL);
    uint64_t verified = 0;
    for (uint64_t i = 1; i <= 9; i++) {
      ASSERT_INT_EQ(cudaMemset(dst, 0, n), cudaSuccess);
      const int launched = ust__gate_snap_launch(word, gc, 1, 0, NULL, &copies, NULL);
      if (launched != 0)
        fprintf(stderr, "  %s\n", ust_last_error());
      ASSERT_INT_EQ(launched, 0);
      ASSERT_INT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ust__gate_counters host;
      ASSERT_INT_EQ(cudaMemcpy(&host, gc, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_INT_EQ(cudaMemcpy(got, dst, n, cudaMemcpyDeviceToHost), cudaSuccess);
      const ust__gate_choice ch = ust__gate_decide(ust__gate_unpack(w), i, 0);
      ASSERT_U64_EQ(host.replays, i);
      ASSERT_U64_EQ(host.runs, ust__gate_runs(ch));
      ASSERT_U64_EQ(host.pad, 0);
      verified += ch.verify;
      ASSERT_TRUE(got[0] == 0 && got[n - 1] == 0);
      ASSERT_TRUE(got[1] == (ch.verify ? 0x5a : 0) && got[n - 2] == (ch.verify ? 0x5a : 0) &&
                  got[n / 2] == (ch.verify ? 0x5a : 0));
      /* a later kernel of the same replay reads the decision, decides nothing */
      ASSERT_INT_EQ(ust__gate_snap_launch(word, gc, 0, 0, NULL, &copies, NULL), 0);
      ASSERT_INT_EQ(cudaMemcpy(&host, gc, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_U64_EQ(host.replays, i);
    }
    ASSERT_U64_EQ(verified, 4); /* replays 2, 4, 6, 8 */
    free(got);
    cudaFree(gc);
    cudaFree(word);
    cudaFree(dst);
    cudaFree(src);
  }
#endif
}

TEST(gate_snap_launches_its_body_from_the_device_once_the_copies_are_made) {
  /* A shadow beside the chain started from the device: the kernel in a
   * captured graph, replayed; its body (a graph instantiated for device
   * launch: a copy of what the kernel copied into a mirror) runs in the
   * replays that verify, and only after every block's copies are made (the
   * mirror is whole, one block or 64). The graph's launch ends with it. */
#if defined(UST_GPU_CUDA)
  if (gpu_devices() == 0)
    return;
  if (!ust__gate_device_launch()) {
    fprintf(stderr, "  (this build cannot launch graphs from the device)\n");
    ASSERT_TRUE(0);
  }
  const size_t sizes[2] = {4096 + 3, (size_t)1 << 20};
  for (int big = 0; big <= 1; big++) {
    const size_t n = sizes[big];
    unsigned char *src = NULL, *dst = NULL, *mirror = NULL;
    unsigned long long *word = NULL;
    ust__gate_counters *gc = NULL;
    ASSERT_INT_EQ(cudaMalloc((void **)&src, n), cudaSuccess);
    ASSERT_INT_EQ(cudaMalloc((void **)&dst, n), cudaSuccess);
    ASSERT_INT_EQ(cudaMalloc((void **)&mirror, n), cudaSuccess);
    ASSERT_INT_EQ(cudaMalloc((void **)&word, sizeof *word), cudaSuccess);
    ASSERT_INT_EQ(cudaMalloc((void **)&gc, sizeof *gc), cudaSuccess);
    ASSERT_INT_EQ(cudaMemset(gc, 0, sizeof *gc), cudaSuccess);
    unsigned char *want = malloc(n), *got = malloc(n);
    ASSERT_TRUE(want != NULL && got != NULL);
    for (size_t i = 0; i < n; i++)
      want[i] = (unsigned char)(i * 13 + 1);
    ASSERT_INT_EQ(cudaMemcpy(src, want, n, cudaMemcpyHostToDevice), cudaSuccess);
    const ust__replay_gate g = {UST__GATE_SHADOW, 0x80000000u, 0}; /* the even replays */
    const unsigned long long w = ust__gate_pack(g);
    ASSERT_INT_EQ(cudaMemcpy(word, &w, sizeof w, cudaMemcpyHostToDevice), cudaSuccess);
    /* the body: the mirror copied from what the kernel copied */
    cudaGraph_t body_graph = NULL;
    cudaGraphExec_t body = NULL;
    cudaGraphNode_t node;
    ASSERT_INT_EQ(cudaGraphCreate(&body_graph, 0), cudaSuccess);
    ASSERT_INT_EQ(cudaGraphAddMemcpyNode1D(&node, body_graph, NULL, 0, mirror, dst, n, cudaMemcpyDeviceToDevice),
                  cudaSuccess);
    ASSERT_INT_EQ(cudaGraphInstantiateWithFlags(&body, body_graph, cudaGraphInstantiateFlagDeviceLaunch),
                  cudaSuccess);
    cudaStream_t s;
    ASSERT_INT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_INT_EQ(cudaGraphUpload(body, s), cudaSuccess);
    ust__gate_copies copies = {.n = 1};
    copies.c[0].dst = dst;
    copies.c[0].src = src;
    copies.c[0].bytes = n;
    cudaGraph_t caller = NULL;
    cudaGraphExec_t replay = NULL;
    ASSERT_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_INT_EQ(ust__gate_snap_launch(word, gc, 1, 0, body, &copies, s), 0);
    ASSERT_INT_EQ(cudaStreamEndCapture(s, &caller), cudaSuccess);
    ASSERT_INT_EQ(cudaGraphInstantiate(&replay, caller, 0), cudaSuccess);
    uint64_t ran = 0;
    for (uint64_t i = 1; i <= 9; i++) {
      ASSERT_INT_EQ(cudaMemset(dst, 0, n), cudaSuccess);
      ASSERT_INT_EQ(cudaMemset(mirror, 0, n), cudaSuccess);
      ASSERT_INT_EQ(cudaGraphLaunch(replay, s), cudaSuccess);
      ASSERT_INT_EQ(cudaStreamSynchronize(s), cudaSuccess); /* the body included */
      ASSERT_INT_EQ(cudaMemcpy(got, mirror, n, cudaMemcpyDeviceToHost), cudaSuccess);
      const ust__gate_choice ch = ust__gate_decide(ust__gate_unpack(w), i, 0);
      if (ch.verify) {
        ran++;
        ASSERT_TRUE(memcmp(got, want, n) == 0);
      } else {
        size_t nonzero = 0;
        for (size_t k = 0; k < n; k++)
          nonzero += got[k] != 0;
        ASSERT_U64_EQ(nonzero, 0);
      }
    }
    ust__gate_counters host;
    ASSERT_INT_EQ(cudaMemcpy(&host, gc, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_U64_EQ(host.replays, 9);
    ASSERT_U64_EQ(host.refused, 0);
    ASSERT_U64_EQ(ran, 4); /* replays 2, 4, 6, 8 */
    cudaGraphExecDestroy(replay);
    cudaGraphDestroy(caller);
    cudaGraphExecDestroy(body);
    cudaGraphDestroy(body_graph);
    cudaStreamDestroy(s);
    free(want);
    free(got);
    cudaFree(gc);
    cudaFree(word);
    cudaFree(mirror);
    cudaFree(dst);
    cudaFree(src);
  }
#endif
}

TEST(gate_copy_copies_in_served_replays_only_at_any_alignment) {
  /* The copy of the candidate's results over production's: only when the
   * replay's run bits say the candidate serves; whole at any alignment of
   * its ends and length (16-byte vectors inside, bytes at the edges). */
#if defined(UST_GPU_CUDA)
  if (gpu_devices() == 0)
    return;
  enum { N = 1 << 16 };
  unsigned char *src = NULL, *dst = NULL;
  ust__gate_counters *gc = NULL;
  ASSERT_INT_EQ(cudaMalloc((void **)&src, N), cudaSuccess);
  ASSERT_INT_EQ(cudaMalloc((void **)&dst, N), cudaSuccess);
  ASSERT_INT_EQ(cudaMalloc((void **)&gc, sizeof *gc), cudaSuccess);
  unsigned char *want = malloc(N), *got = malloc(N);
  ASSERT_TRUE(want != NULL && got != NULL);
  for (int i = 0; i < N; i++)
    want[i] = (unsigned char)(i * 7 + 3);
  ASSERT_INT_EQ(cudaMemcpy(src, want, N, cudaMemcpyHostToDevice), cudaSuccess);
  /* (dst offset, src offset, bytes): aligned; the same misalignment at
   * both ends with a ragged length; different misalignments; tiny */
  const size_t cases[][3] = {{0, 0, 4096}, {1, 1, 40000}, {3, 5, 7777}, {16, 0, 4095}, {7, 7, 9}, {0, 0, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    for (int serve = 0; serve <= 1; serve++) {
      const unsigned long long r = serve ? UST__GATE_RUN_SERVE : UST__GATE_RUN_VERIFY;
      ASSERT_INT_EQ(cudaMemset(dst, 0xee, N), cudaSuccess);
      ASSERT_INT_EQ(cudaMemcpy(&gc->runs, &r, sizeof r, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_INT_EQ(ust__gate_copy_launch(dst + cases[c][0], src + cases[c][1], cases[c][2], gc, NULL), 0);
      ASSERT_INT_EQ(cudaMemcpy(got, dst, N, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < N; i++) {
        const int inside = serve && i >= cases[c][0] && i < cases[c][0] + cases[c][2];
        const unsigned char expect = inside ? want[i - cases[c][0] + cases[c][1]] : 0xee;
        if (got[i] != expect) {
          fprintf(stderr, "case %zu serve %d: byte %zu is %u, not %u\n", c, serve, i, got[i], expect);
          ASSERT_TRUE(0);
        }
      }
    }
  }
  free(want);
  free(got);
  cudaFree(gc);
  cudaFree(dst);
  cudaFree(src);
#endif
}

/* ---- replays judged as eager calls (guard/shadow.c's sites) ---- */

typedef struct judged_log {
  int n, kinds[8];
  char reasons[8][32], outputs[8][80];
  int64_t first[8][2];
  uint64_t shadow_call[8];
  int serving[8], failed_serving[8]; /* the verdict's and the evidence's */
  int failures;
} judged_log;

static judged_log g_log;

static void log_failed(void *ctx, void *route, ust__evidence *ev) {
  (void)ctx;
  (void)route;
  if (ev != NULL && g_log.failures < 8) {
    snprintf(g_log.reasons[g_log.failures], 32, "%s", ev->reason);
    snprintf(g_log.outputs[g_log.failures], 80, "%s", ev->output);
    g_log.first[g_log.failures][0] = ev->first_index[0];
    g_log.first[g_log.failures][1] = ev->first_index[1];
    g_log.shadow_call[g_log.failures] = ev->shadow_call;
    g_log.failed_serving[g_log.failures] = ev->serving;
  }
  g_log.failures++;
  free(ev);
}

static void log_concluded(void *ctx, void *route, const ust__verdict *v) {
  (void)ctx;
  (void)route;
  if (g_log.n < 8) {
    g_log.kinds[g_log.n] = v->kind;
    g_log.serving[g_log.n] = v->serving;
  }
  g_log.n++;
}

static const ust__verdict_sink_i log_sink = {log_failed, log_concluded};

static DLTensor cpu_f32(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

TEST(graph_replays_are_judged_as_eager_calls) {
  /* Three replays of a captured call (output "out", read-only input "x"):
   * one right, one off at [2,5], one that wrote x. Their statistics come
   * from the host comparison of real buffers, the eager path's own; each
   * replay, published into a ring under its site and harvested, must reach
   * the same verdict and evidence as the same call run eagerly. */
  ust__shadow_pool *pool = NULL;
  ASSERT_INT_EQ(ust__shadow_pool_create(4, NULL, &log_sink, NULL, &pool), 0);
  ust__verify eager_v, graph_v;
  memset(&eager_v, 0, sizeof eager_v);
  memset(&graph_v, 0, sizeof graph_v);
  ust__cand cand;
  memset(&cand, 0, sizeof cand);
  cand.atol = cand.rtol = -1; /* the dtype's defaults */
  int64_t shape[2] = {4, 8};
  float prod[32], cand_out[3][32], x[32], x_after[3][32];
  for (int i = 0; i < 32; i++)
    prod[i] = x[i] = (float)i * 0.25f - 3.0f;
  for (int k = 0; k < 3; k++) {
    memcpy(cand_out[k], prod, sizeof prod);
    memcpy(x_after[k], x, sizeof x);
  }
  cand_out[1][2 * 8 + 5] += 1.0f;
  x_after[2][7] = 1234.0f;
  ust__pair pairs[3][2];
  for (int k = 0; k < 3; k++) {
    memset(pairs[k], 0, sizeof pairs[k]);
    pairs[k][0] = (ust__pair){.name = "out", .prod_dtype = UST__DT_F32, .cand_dtype = UST__DT_F32,
                              .prod = cpu_f32(prod, shape), .cand = cpu_f32(cand_out[k], shape),
                              .prod_dense = prod, .cand_dense = cand_out[k]};
    pairs[k][1] = (ust__pair){.name = "x", .input_arg = 1, .prod_dtype = UST__DT_F32, .cand_dtype = UST__DT_F32,
                              .prod = cpu_f32(x, shape), .cand = cpu_f32(x_after[k], shape),
                              .prod_dense = x, .cand_dense = x_after[k]};
  }
  /* eagerly */
  ust__slot_route er = {&eager_v, &eager_v, &cand, 0, 0, 0, 0, 0};
  for (int k = 0; k < 3; k++) {
    void *slot = ust__shadow_acquire(pool, &er);
    ASSERT_TRUE(slot != NULL);
    ust__shadow_finish(slot, UST__DEV_CPU, NULL, pairs[k], 2, UST__FAIL_NONE, NULL);
  }
  const judged_log eager = g_log;
  memset(&g_log, 0, sizeof g_log);
  /* replayed: the site keeps the metadata; the ring brings each replay's statistics */
  ust__slot_route gr = {&graph_v, &graph_v, &cand, 0, 0, 0, 0, 0};
  uint32_t site = 0;
  ASSERT_INT_EQ(ust__shadow_site_add(pool, &gr, pairs[0], 2, UST__DEV_CPU, &site), 0);
  ASSERT_TRUE(site != 0);
  ust__ring *ring = NULL;
  ASSERT_INT_EQ(ust__ring_create(16, 0, &ring), 0);
  /* the first two replays served by the candidate (their gate's run bits), the third verified on copies */
  const unsigned runs[3] = {UST__GATE_RUN_VERIFY | UST__GATE_RUN_SERVE, UST__GATE_RUN_VERIFY | UST__GATE_RUN_SERVE,
                            UST__GATE_RUN_VERIFY};
  for (int k = 0; k < 3; k++) {
    ust__cmp_stats st[2];
    ust__compare_host(prod, cand_out[k], UST__DT_F32, 32, UST__CMP_ALLCLOSE, 1e-5, 1.3e-6, &st[0]);
    ust__compare_host(x, x_after[k], UST__DT_F32, 32, UST__CMP_EXACT, 0, 0, &st[1]);
    ust__ring_host_publish(ring, site, st, 2, runs[k]);
  }
  ust__cmp_stats one;
  memset(&one, 0, sizeof one);
  ust__ring_host_publish(ring, 99, &one, 1, 0);  /* no such site */
  ust__ring_host_publish(ring, site, &one, 1, 0); /* not its pair count */
  uint64_t unknown = 0;
  ASSERT_U64_EQ(ust__shadow_sites_harvest(pool, ring, &unknown), 3);
  ASSERT_U64_EQ(unknown, 2);
  /* the same verdicts, evidence and counts both ways */
  ASSERT_INT_EQ(g_log.n, 3);
  ASSERT_INT_EQ(eager.n, 3);
  for (int k = 0; k < 3; k++)
    ASSERT_INT_EQ(g_log.kinds[k], eager.kinds[k]);
  ASSERT_INT_EQ(g_log.kinds[0], UST__VERDICT_PASSED);
  ASSERT_INT_EQ(g_log.failures, 2);
  ASSERT_INT_EQ(eager.failures, 2);
  for (int f = 0; f < 2; f++) {
    ASSERT_STR_EQ(g_log.reasons[f], eager.reasons[f]);
    ASSERT_STR_EQ(g_log.outputs[f], eager.outputs[f]);
    ASSERT_U64_EQ(g_log.shadow_call[f], eager.shadow_call[f]);
  }
  ASSERT_STR_EQ(g_log.reasons[0], "mismatch");
  ASSERT_TRUE(g_log.first[0][0] == 2 && g_log.first[0][1] == 5 && eager.first[0][0] == 2 && eager.first[0][1] == 5);
  ASSERT_STR_EQ(g_log.reasons[1], "wrote input");
  ASSERT_STR_EQ(g_log.outputs[1], "x");
  /* whether the candidate served says each replay's entry, not the site */
  ASSERT_TRUE(g_log.serving[0] == 1 && g_log.serving[1] == 1 && g_log.serving[2] == 0);
  ASSERT_TRUE(g_log.failed_serving[0] == 1 && g_log.failed_serving[1] == 0);
  ASSERT_TRUE(eager.failed_serving[0] == 0 && eager.failed_serving[1] == 0);
  ust__verify_snap a, b;
  ust__verify_snapshot(&eager_v, &a);
  ust__verify_snapshot(&graph_v, &b);
  ASSERT_TRUE(a.calls == 3 && b.calls == 3 && a.passed == b.passed && a.failed == b.failed && b.failed == 2);
  ust__ring_destroy(ring);
  ust__shadow_pool_destroy(pool);
}

/* A keeper's log (ust__shadow_keep): what each kept call was told. */
typedef struct kept_log {
  int n, failed[8];
  char reason[8][32], output[8][80];
  int64_t first[8];
  void *cookie[8];
} kept_log;

static void keep_told(void *ctx, void *cookie, const ust__keep_verdict *v) {
  kept_log *k = ctx;
  if (k->n < 8) {
    k->failed[k->n] = v->failed;
    snprintf(k->reason[k->n], 32, "%s", v->reason != NULL ? v->reason : "-");
    snprintf(k->output[k->n], 80, "%s", v->output != NULL ? v->output : "-");
    k->first[k->n] = v->first_mismatch;
    k->cookie[k->n] = cookie;
  }
  k->n++;
}

TEST(a_kept_call_is_told_its_verdict_once_whatever_the_end) {
  /* Five host calls, each with a keeper: a passing one, one off at flat
   * index 21 of "out", one that wrote its input "x", one the candidate
   * raised in, and one abandoned. Each keeper is told once, with the
   * reason, the output and the first mismatch of the evidence. */
  ust__shadow_pool *pool = NULL;
  ASSERT_INT_EQ(ust__shadow_pool_create(4, NULL, &log_sink, NULL, &pool), 0);
  memset(&g_log, 0, sizeof g_log);
  ust__verify v;
  memset(&v, 0, sizeof v);
  ust__cand cand;
  memset(&cand, 0, sizeof cand);
  cand.atol = cand.rtol = -1;
  int64_t shape[2] = {4, 8};
  float prod[32], off[32], x[32], x_written[32];
  for (int i = 0; i < 32; i++)
    prod[i] = off[i] = x[i] = x_written[i] = (float)i * 0.5f;
  off[21] += 3.0f;
  x_written[3] = -9.0f;
  const float *cands[3] = {prod, off, prod};
  const float *x_after[3] = {x, x, x_written};
  kept_log k;
  memset(&k, 0, sizeof k);
  ust__slot_route r = {&v, &v, &cand, 0, 0, 0, 0, 0};
  for (int c = 0; c < 5; c++) {
    void *slot = ust__shadow_acquire(pool, &r);
    ASSERT_TRUE(slot != NULL);
    ust__shadow_keep(slot, &k, keep_told);
    if (c == 4) {
      ust__shadow_abandon(slot, UST__DEV_CPU, NULL);
      continue;
    }
    if (c == 3) {
      ust__shadow_finish(slot, UST__DEV_CPU, NULL, NULL, 0, UST__FAIL_RAISED, "candidate raised: boom");
      continue;
    }
    ust__pair pairs[2];
    memset(pairs, 0, sizeof pairs);
    pairs[0] = (ust__pair){.name = "out", .prod_dtype = UST__DT_F32, .cand_dtype = UST__DT_F32,
                           .prod = cpu_f32(prod, shape), .cand = cpu_f32((float *)cands[c], shape),
                           .prod_dense = prod, .cand_dense = cands[c]};
    pairs[1] = (ust__pair){.name = "x", .input_arg = 1, .prod_dtype = UST__DT_F32, .cand_dtype = UST__DT_F32,
                           .prod = cpu_f32(x, shape), .cand = cpu_f32((float *)x_after[c], shape),
                           .prod_dense = x, .cand_dense = x_after[c]};
    ust__shadow_finish(slot, UST__DEV_CPU, NULL, pairs, 2, UST__FAIL_NONE, NULL);
  }
  ASSERT_INT_EQ(k.n, 5);
  const int failed[5] = {0, 1, 1, 1, 0};
  const char *reason[5] = {"-", "mismatch", "wrote input", "raised", "-"};
  const char *output[5] = {"-", "out", "x", "-", "-"};
  const int64_t first[5] = {-1, 21, 3, -1, -1};
  for (int c = 0; c < 5; c++) {
    ASSERT_INT_EQ(k.failed[c], failed[c]);
    ASSERT_STR_EQ(k.reason[c], reason[c]);
    ASSERT_STR_EQ(k.output[c], output[c]);
    ASSERT_INT_EQ(k.first[c], first[c]);
    ASSERT_TRUE(k.cookie[c] == &v);
  }
  ASSERT_INT_EQ(g_log.failures, 3);
  ust__shadow_pool_destroy(pool);
}

static int g_stale;
static int say_stale(void *ctx, void *route) {
  (void)ctx, (void)route;
  return g_stale;
}
static const ust__verdict_sink_i stale_sink = {log_failed, log_concluded, NULL, say_stale};

TEST(replays_of_a_route_changed_in_place_are_dropped_not_judged) {
  /* A site's replays published into the ring: judged while the route's
   * replays stand; once the sink says they are stale (a captured call
   * changed in place), each entry is dropped: no verdict, no failure (a
   * wrong one would roll back a candidate on copies a change left stale),
   * no call counted, not counted as another pool's either, but counted as
   * dropped on the route. */
  memset(&g_log, 0, sizeof g_log);
  g_stale = 0;
  ust__shadow_pool *pool = NULL;
  ASSERT_INT_EQ(ust__shadow_pool_create(4, NULL, &stale_sink, NULL, &pool), 0);
  ust__verify v;
  memset(&v, 0, sizeof v);
  ust__cand cand;
  memset(&cand, 0, sizeof cand);
  cand.atol = cand.rtol = -1;
  int64_t shape[2] = {4, 8};
  float prod[32], wrong[32];
  for (int i = 0; i < 32; i++)
    prod[i] = wrong[i] = (float)i;
  wrong[31] += 100.0f;
  ust__pair pair = {.name = "out", .prod_dtype = UST__DT_F32, .cand_dtype = UST__DT_F32,
                    .prod = cpu_f32(prod, shape), .cand = cpu_f32(wrong, shape),
                    .prod_dense = prod, .cand_dense = wrong};
  ust__slot_route r = {&v, &v, &cand, 0, 0, 0, 0, 0};
  uint32_t site = 0;
  ASSERT_INT_EQ(ust__shadow_site_add(pool, &r, &pair, 1, UST__DEV_CPU, &site), 0);
  ust__ring *ring = NULL;
  ASSERT_INT_EQ(ust__ring_create(16, 0, &ring), 0);
  ust__cmp_stats right, off;
  ust__compare_host(prod, prod, UST__DT_F32, 32, UST__CMP_ALLCLOSE, 1e-5, 1.3e-6, &right);
  ust__compare_host(prod, wrong, UST__DT_F32, 32, UST__CMP_ALLCLOSE, 1e-5, 1.3e-6, &off);
  ust__ring_host_publish(ring, site, &right, 1, UST__GATE_RUN_VERIFY);
  uint64_t unknown = 0;
  ASSERT_U64_EQ(ust__shadow_sites_harvest(pool, ring, &unknown), 1);
  ASSERT_INT_EQ(g_log.n, 1);
  g_stale = 1;
  ust__ring_host_publish(ring, site, &off, 1, UST__GATE_RUN_VERIFY | UST__GATE_RUN_SERVE);
  ust__ring_host_publish(ring, site, &right, 1, UST__GATE_RUN_VERIFY);
  ASSERT_U64_EQ(ust__shadow_sites_harvest(pool, ring, &unknown), 0);
  ASSERT_U64_EQ(unknown, 0);
  ASSERT_INT_EQ(g_log.n, 1);
  ASSERT_INT_EQ(g_log.failures, 0);
  ust__verify_snap snap;
  ust__verify_snapshot(&v, &snap);
  ASSERT_U64_EQ(snap.calls, 1);
  ASSERT_U64_EQ(snap.failed, 0);
  ASSERT_U64_EQ(snap.graph_dropped, 2);
  /* the same wrong entry judged while the replays stand: it fails */
  g_stale = 0;
  ust__ring_host_publish(ring, site, &off, 1, UST__GATE_RUN_VERIFY);
  ASSERT_U64_EQ(ust__shadow_sites_harvest(pool, ring, &unknown), 1);
  ASSERT_INT_EQ(g_log.failures, 1);
  ust__ring_destroy(ring);
  ust__shadow_pool_destroy(pool);
}

/* ---- captured calls' sites (guard/graph.c) ---- */

static int g_gate_calls;
static uint64_t count_gate(void *ctx, void *cookie) {
  (void)ctx, (void)cookie;
  g_gate_calls++;
  return ust__gate_pack((ust__replay_gate){UST__GATE_SHADOW, UINT32_MAX, 0});
}
static const ust__verdict_sink_i gate_sink = {log_failed, log_concluded, count_gate};

TEST(graph_calls_refused_or_dropped_leave_every_gate_closed) {
  /* Without a device (or a build without conditional nodes) a captured
   * call's shadow is refused with a message and no site is kept; with one,
   * a call that ends without its comparison is dropped: its site never
   * asks the route for a gate. Either way a part cannot be ended or
   * finished outside one, and the worker's tick judges nothing. */
  ust__shadow_pool *pool = NULL;
  ASSERT_INT_EQ(ust__shadow_pool_create(4, NULL, &gate_sink, NULL, &pool), 0);
  ust__graphs *g = NULL;
  ASSERT_INT_EQ(ust__graphs_create(pool, &gate_sink, NULL, &g), 0);
  ust__verify v;
  memset(&v, 0, sizeof v);
  ust__cand cand;
  memset(&cand, 0, sizeof cand);
  ust__slot_route r = {&v, &v, &cand, 0, 0, 0, 0, 0};
  ust__graph_call c;
  g_gate_calls = 0;
  const int rc = ust__graph_call_begin(g, &r, 0, NULL, &c);
#if defined(UST_GPU_CUDA)
  ASSERT_TRUE(gpu_devices() == 0 || rc == 0);
#else
  ASSERT_INT_EQ(rc, UST_EGPU);
#endif
  ust__graphs_figs f;
  ust__graphs_figures(g, &f);
  ASSERT_U64_EQ(f.sites, rc == 0 ? 1 : 0);
  if (rc != 0) {
    ASSERT_TRUE(ust_last_error()[0] != '\0' && c.site == NULL);
  } else {
    ASSERT_INT_EQ(ust__graph_part_end(&c, 1), UST_EINVAL);
    ASSERT_INT_EQ(ust__graph_call_finish(&c, NULL, 0, NULL, 1), UST_EINVAL);
  }
  ust__graph_call_end(&c, 0);
  ASSERT_TRUE(c.site == NULL);
  ASSERT_U64_EQ(ust__graphs_tick(g), 0);
  ASSERT_INT_EQ(g_gate_calls, 0);
  ust__graphs_figures(g, &f);
  ASSERT_U64_EQ(f.sites, rc == 0 ? 1 : 0);
  ASSERT_U64_EQ(f.live + f.open + f.unknown + f.lost, 0);
  ASSERT_INT_EQ((int)ust__graphs_open(g), 0);
  ust__graphs_destroy(g);
  ust__shadow_pool_destroy(pool);
  /* a captured call that holds production alone is counted with its reason */
  ust__verify_graph_plain(&v, UST__GW_LAYOUT);
  ust__verify_graph_plain(&v, UST__GW_TORCH_OP);
  ust__verify_snap snap;
  ust__verify_snapshot(&v, &snap);
  ASSERT_U64_EQ(snap.graph_plain, 2);
  ASSERT_U64_EQ(snap.graph_shadowed, 0);
  ASSERT_INT_EQ(snap.graph_why, UST__GW_TORCH_OP);
  ASSERT_STR_CONTAINS(ust__graph_why_text(snap.graph_why), "torch-op candidate");
  ASSERT_STR_EQ(ust__graph_why_text(UST__GW_NONE), "");
  ASSERT_STR_EQ(ust__graph_why_text(UST__GW_COUNT), "");
}

TEST(a_later_pool_never_judges_an_earlier_pools_replays) {
  /* A replay still running when understudy was disabled publishes under a
   * site of the pool that is gone; the next enable's pool, reading the same
   * kept ring, counts it unknown instead of judging it as its own first
   * site (whose route and pairs are another call's). */
  ust__verify va, vb;
  memset(&va, 0, sizeof va);
  memset(&vb, 0, sizeof vb);
  ust__cand cand;
  memset(&cand, 0, sizeof cand);
  cand.atol = cand.rtol = -1;
  int64_t shape[2] = {2, 4};
  float prod[8] = {0}, other[8] = {0};
  other[7] = 1.0f; /* a mismatch, were it judged */
  ust__pair pair = {.name = "out", .prod_dtype = UST__DT_F32, .cand_dtype = UST__DT_F32,
                    .prod = cpu_f32(prod, shape), .cand = cpu_f32(other, shape),
                    .prod_dense = prod, .cand_dense = other};
  ust__ring *ring = NULL;
  ASSERT_INT_EQ(ust__ring_create(16, 0, &ring), 0);
  ust__cmp_stats st;
  ust__compare_host(prod, other, UST__DT_F32, 8, UST__CMP_ALLCLOSE, 1e-5, 1.3e-6, &st);
  ust__shadow_pool *a = NULL, *b = NULL;
  ASSERT_INT_EQ(ust__shadow_pool_create(4, NULL, &log_sink, NULL, &a), 0);
  ust__slot_route ra = {&va, &va, &cand, 0, 0, 0, 0, 0};
  uint32_t site_a = 0, site_b = 0;
  ASSERT_INT_EQ(ust__shadow_site_add(a, &ra, &pair, 1, UST__DEV_CPU, &site_a), 0);
  ust__shadow_pool_destroy(a);
  ust__ring_host_publish(ring, site_a, &st, 1, 0); /* after its pool is gone */
  ASSERT_INT_EQ(ust__shadow_pool_create(4, NULL, &log_sink, NULL, &b), 0);
  ust__slot_route rb = {&vb, &vb, &cand, 0, 0, 0, 0, 0};
  ASSERT_INT_EQ(ust__shadow_site_add(b, &rb, &pair, 1, UST__DEV_CPU, &site_b), 0);
  ASSERT_TRUE(site_a != site_b);
  memset(&g_log, 0, sizeof g_log);
  uint64_t unknown = 0;
  ASSERT_U64_EQ(ust__shadow_sites_harvest(b, ring, &unknown), 0);
  ASSERT_U64_EQ(unknown, 1);
  ASSERT_INT_EQ(g_log.n, 0);
  ASSERT_U64_EQ(atomic_load(&vb.calls), 0);
  /* its own site's entry is judged (and fails) */
  ust__ring_host_publish(ring, site_b, &st, 1, 0);
  ASSERT_U64_EQ(ust__shadow_sites_harvest(b, ring, &unknown), 1);
  ASSERT_U64_EQ(atomic_load(&vb.failed), 1);
  ust__shadow_pool_destroy(b);
  ust__ring_destroy(ring);
}
