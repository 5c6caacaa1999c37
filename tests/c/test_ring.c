/* The ring that carries comparison results out of CUDA graphs
 * (guard/ring.h): order, laps, entries torn while read, and the device's
 * writer inside a replayed graph where there is a GPU. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runner.h"

#include "base/base.h"
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

typedef struct seen {
  uint64_t n, last_seq, torn, out_of_order;
  unsigned sites[64];
} seen;

static void note(void *ctx, const ust__ring_entry *e) {
  seen *s = ctx;
  if (s->n < 64)
    s->sites[s->n] = e->site;
  s->out_of_order += e->seq <= s->last_seq;
  s->torn += !stats_whole(e);
  s->last_seq = e->seq;
  s->n++;
}

static uint64_t publish(ust__ring *r, uint64_t token, unsigned n_pairs) {
  ust__cmp_stats st[UST__MAX_PAIRS];
  stats_of(token, st, n_pairs);
  return ust__ring_host_publish(r, (unsigned)(token & 0xffffu), st, n_pairs);
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
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    ust__ring_harvest(r, note, &s);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (ust__ring_next(r) < N && t.tv_sec - t0.tv_sec < 20);
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
  /* on a device: in a build or on a machine without one, a clear error */
  int rc = ust__ring_create(1024, 1, &r);
#if defined(UST_GPU_CUDA)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess)
    devices = 0;
  cudaGetLastError();
  ASSERT_TRUE(devices == 0 || rc == 0); /* where there is a GPU, the ring is made on it */
#endif
  if (rc != 0) {
    ASSERT_TRUE(r == NULL && ust_last_error()[0] != '\0');
    ust__ring_dev d = {0};
#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
    ASSERT_INT_EQ(ust__ring_publish_launch(&d, 1, NULL, UST__MAX_PAIRS + 1, NULL), UST_EINVAL);
#else
    ASSERT_INT_EQ(ust__ring_publish_launch(&d, 1, NULL, 1, NULL), UST_EGPU);
#endif
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
  ASSERT_INT_EQ(ust__ring_publish_launch(&d, 7, dev, 2, s), 0);
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
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(dev);
#endif
  ust__ring_destroy(r);
}
