/*
 * guard/gate.h: which arm serves a replay of a captured call, and whether
 * the replay is verified. A replay runs no host code, so the decision for
 * each replay is taken on the device, by the rule below, from a word the
 * host writes (the site's gate) and the site's replay counters in device
 * memory; the host changes a route's mode, sample or canary share, or rolls
 * it back, by writing the word, and the next replay follows it.
 *
 * Shares follow the host's rule (base/share.h, ust__sampled's). As for
 * eager calls: in shadow, production serves and a sample of
 * the replays is verified; in canary, the candidate serves a share of them,
 * live all, and a sample of those it served is verified.
 *
 * Valid C, C++ and CUDA/HIP (host and device). Internal header: never
 * installed.
 */
#ifndef UST_GUARD_GATE_H
#define UST_GUARD_GATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/share.h"

enum { UST__GATE_OFF = 0, UST__GATE_SHADOW = 1, UST__GATE_CANARY = 2, UST__GATE_LIVE = 3 };

/* The gate of one site, one 64-bit word (so that the device reads a whole
 * one): the mode in the top 2 bits, the sample share in the next 31, the
 * canary share in the low 31; shares in units of 2^-31 (all of them: the
 * largest unit count). */
typedef struct ust__replay_gate {
  int mode;
  uint32_t sample_q32, canary_q32; /* shares as ust__share_q32 gives them */
} ust__replay_gate;

/* The decision for one replay. */
typedef struct ust__gate_choice {
  int candidate; /* 1: the candidate's results serve this replay; 0: production's */
  int verify;    /* 1: the two arms' results are compared (in a captured call both arms run
                    whenever the candidate does: it serves over production's results) */
} ust__gate_choice;

#define UST__GATE_Q31_ALL 0x7fffffffu

static inline UST__HD uint32_t ust__gate_q31(uint32_t q32) {
  return q32 == UINT32_MAX ? UST__GATE_Q31_ALL : (q32 >> 1) - ((q32 >> 1) == UST__GATE_Q31_ALL);
}

static inline UST__HD uint32_t ust__gate_q32(uint32_t q31) {
  return q31 == UST__GATE_Q31_ALL ? UINT32_MAX : q31 << 1;
}

static inline UST__HD uint64_t ust__gate_pack(ust__replay_gate g) {
  return (uint64_t)(g.mode & 3) << 62 | (uint64_t)ust__gate_q31(g.sample_q32) << 31 |
         (uint64_t)ust__gate_q31(g.canary_q32);
}

static inline UST__HD ust__replay_gate ust__gate_unpack(uint64_t w) {
  ust__replay_gate g;
  g.mode = (int)(w >> 62);
  g.sample_q32 = ust__gate_q32((uint32_t)(w >> 31) & UST__GATE_Q31_ALL);
  g.canary_q32 = ust__gate_q32((uint32_t)w & UST__GATE_Q31_ALL);
  return g;
}

/* w for a site whose results cannot serve: canary and live verified as in
 * shadow (their sample), production serving; other words as they are. */
static inline UST__HD uint64_t ust__gate_verify_only(uint64_t w) {
  ust__replay_gate g = ust__gate_unpack(w);
  if (g.mode != UST__GATE_CANARY && g.mode != UST__GATE_LIVE)
    return w;
  g.mode = UST__GATE_SHADOW;
  g.canary_q32 = 0;
  return ust__gate_pack(g);
}

/* The n-th replay (from 1) of a site whose candidate served `served` of
 * the replays before it. */
static inline UST__HD ust__gate_choice ust__gate_decide(ust__replay_gate g, uint64_t n, uint64_t served) {
  ust__gate_choice c;
  c.candidate = g.mode == UST__GATE_LIVE || (g.mode == UST__GATE_CANARY && ust__share_hit(n, g.canary_q32));
  c.verify = g.mode == UST__GATE_SHADOW ? ust__share_hit(n, g.sample_q32)
             : c.candidate              ? ust__share_hit(served + 1, g.sample_q32)
                                        : 0;
  return c;
}

/* A site beside the chain (verify-only) whose replays the host gates: the
 * host decides the n-th replay (from 1) by the rule above from its own
 * count, and enables the site's kernels in the chain only for a replay that
 * verifies (disabled, a kernel costs the replay almost nothing); the word
 * the kernels read meanwhile verifies every replay they run in. */
static inline UST__HD int ust__gate_host_verify(uint64_t w, uint64_t n) {
  return ust__gate_decide(ust__gate_unpack(ust__gate_verify_only(w)), n, 0).verify;
}

static inline UST__HD uint64_t ust__gate_host_word(uint64_t w) {
  ust__replay_gate g = ust__gate_unpack(ust__gate_verify_only(w));
  if (g.mode != UST__GATE_SHADOW || g.sample_q32 == 0)
    return 0;
  g.sample_q32 = UINT32_MAX;
  g.canary_q32 = 0;
  return ust__gate_pack(g);
}

/* What the candidate does in one replay: nothing (0), or run on copies of
 * the arguments and have its results compared (VERIFY), copied over
 * production's (SERVE), or both. */
enum { UST__GATE_RUN_VERIFY = 1, UST__GATE_RUN_SERVE = 2 };

static inline UST__HD unsigned ust__gate_runs(ust__gate_choice c) {
  return (c.verify ? UST__GATE_RUN_VERIFY : 0u) | (c.candidate ? UST__GATE_RUN_SERVE : 0u);
}

/* A captured site's state on the device: the replays it saw, how many of
 * them its candidate served, and the last replay's UST__GATE_RUN_* bits,
 * which the site's later conditions, its ring writer and its copies over
 * production's results read; the launches of its body the device refused
 * (a shadow beside the chain started from the device). Zeroed when the
 * site is made. */
typedef struct ust__gate_counters {
  unsigned long long replays, served, runs, pad, refused;
} ust__gate_counters;

#ifdef __cplusplus
extern "C" {
#endif
/* Enqueue on stream (capturable) the kernel that sets the conditional
 * handle `handle` (a cudaGraphConditionalHandle) to whether the candidate
 * runs in this replay: decided from *word (the site's gate, host memory
 * mapped for the device, read once per replay) and counters when first,
 * else read from counters->runs as the first condition of the replay left
 * it. 0, or UST_EGPU (a build without CUDA conditional nodes: always). */
int ust__gate_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                     unsigned long long handle, void *stream);
/* Enqueue on stream (capturable) a copy of bytes from src to dst (device
 * memory) that happens only in a replay the candidate serves
 * (counters->runs has UST__GATE_RUN_SERVE). 0, or UST_EGPU. */
int ust__gate_copy_launch(void *dst, const void *src, size_t bytes, const ust__gate_counters *counters, void *stream);

/* The copies one kernel in the chain takes in a replay the gate verifies:
 * what a shadow beside the chain reads (guard/graph.c). */
#define UST__GATE_MAX_COPIES 32
typedef struct ust__gate_copies {
  int n;
  struct {
    void *dst;
    const void *src;
    size_t bytes;
  } c[UST__GATE_MAX_COPIES];
} ust__gate_copies;

/* Enqueue on stream (capturable) one kernel that (first) decides the
 * replay from *word and counters or else reads counters->runs as the
 * replay's first kernel left it; copies every span of copies when the
 * replay verifies; and then starts the body: body (a cudaGraphExec_t
 * instantiated for device launch and uploaded), launched from the device
 * fire-and-forget once the copies are made, or when body is NULL the
 * conditional handle `handle` (0: none) set to open. *word is read from
 * device memory. 0, or UST_EGPU. */
int ust__gate_snap_launch(const unsigned long long *word, ust__gate_counters *counters, int first,
                          unsigned long long handle, void *body, const ust__gate_copies *copies, void *stream);
/* 1 when this build's gate kernel can launch a graph from the device
 * (CUDA, relocatable device code and the device runtime linked). */
int ust__gate_device_launch(void);
#ifdef __cplusplus
}
#endif

#endif /* UST_GUARD_GATE_H */
