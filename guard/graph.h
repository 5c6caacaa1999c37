/*
 * A shadow captured into CUDA graphs (guard/graph.c): the candidate's side
 * captured with production, behind the gate that decides each replay.
 * Internal header: never installed.
 */
#ifndef UST_GUARD_GRAPH_H
#define UST_GUARD_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "guard/shadow.h"

/* ---- shadow captured into CUDA graphs (guard/graph.c) ------------------------------ */

/* The captured calls of one enable: their sites, gates and rings. */
typedef struct ust__graphs ust__graphs;
/* pool and sink are borrowed for its life. */
int ust__graphs_create(ust__shadow_pool *pool, const ust__verdict_sink_i *sink, void *sink_ctx, ust__graphs **out);
/* Turns every gate off (graphs replayed later run production alone) and
 * frees the table; the device memory graphs read is kept. NULL: no-op. */
void ust__graphs_destroy(ust__graphs *g);
/* At disable: every gate off, and later ticks judge nothing (the rings,
 * kept for the process, belong to the next enable's sites). NULL: no-op. */
void ust__graphs_close(ust__graphs *g);
/* The worker's turn: judges the replays the rings hold (as eager calls) and
 * writes each site's gate from its route (sink->gate). Returns how many
 * replays it judged. Thread-safe (the worker and a flush). */
uint64_t ust__graphs_tick(ust__graphs *g);
/* Live sites whose gate was open at the last tick (the worker polls the
 * rings often only while some are). */
uint32_t ust__graphs_open(ust__graphs *g);
/* For the report: captured calls given a site, those whose shadow is whole
 * in their graph (live), live with an open gate at the last tick, ring
 * entries naming no site of this enable, and entries the rings lost since
 * this enable (overwritten before they were read: replays verified but not
 * judged). */
typedef struct ust__graphs_figs {
  uint64_t sites, live, open, unknown, lost;
  uint64_t launched; /* live sites beside the chain whose shadow the device launches */
  uint64_t refused;  /* launches of those the device refused (replays left unverified) */
  uint64_t gated;         /* live sites whose replays the host gates (ust__graphs_bind) */
  uint64_t gated_replays; /* replays of executable graphs the host gated */
  uint64_t gate_failed;   /* executable graphs given back to the device's decision (a node would not change) */
  uint64_t hosted;        /* live sites whose shadow the host starts after the replays that verify */
  uint64_t host_starts;   /* those starts (one per site and verifying replay) */
  uint64_t unseen;        /* graphs replayed whose capture understudy did not see (ust__graphs_unseen) */
} ust__graphs_figs;
void ust__graphs_figures(ust__graphs *g, ust__graphs_figs *f);
/* A graph replayed whose capture understudy did not see (made before
 * enable(), or while it was off: the Python package's hook, once a graph):
 * its calls are neither counted, timed (but by the kernel tracer's names)
 * nor verified. */
void ust__graphs_unseen(ust__graphs *g);

/* Replays gated from the host (sites beside the chain, in a graph its
 * owner keeps alive: its nodes are what is enabled): where the host sees a
 * graph's replays (the Python package's hook on torch.cuda.CUDAGraph),
 * each replay enables the kernels of only the sites it verifies
 * (ust__gate_host_verify), and the kernels verify whenever they run. Any
 * thread; a replay waits only while a bind or unbind runs (they may wait
 * for the worker's gate writes).
 *   capture_id: the id of the capture stream is in now, 0 when none;
 *   capture_hosted: that id, and the capture marked as one whose
 *         executable the host will bind and gate: a shadow beside the chain
 *         captured in it gets no IF node; its body is an executable graph
 *         of its own, which the host starts after each replay that
 *         verifies (ust__graphs_replayed), and which never runs while the
 *         executable is not bound;
 *   bind: exec, instantiated from graph, which capture made and which
 *         stays alive while exec is bound, gated from now on; the number
 *         of sites, 0 (none: nothing changes; a site another executable
 *         gates is not gated again), or an error;
 *   replay: before a replay of exec on stream (nothing for one not bound):
 *         the number of bodies to start after it (0: no call of replayed);
 *         stream waits for the bodies the last verifying replay started
 *         when this one writes the copies they read;
 *   replayed: after that replay, on stream: the bodies started on streams
 *         of the binding's, each behind the replay or (captured with
 *         start_kernel) behind its kernel in the chain (an event that
 *         kernel's replays record once the copies are taken), so that it
 *         runs under the rest of the replay;
 *   unbind: exec gone or made again: its sites decide on the device (a
 *         hosted one's gate stays closed). */
unsigned long long ust__graph_capture_id(void *stream);
unsigned long long ust__graphs_capture_hosted(ust__graphs *g, void *stream);
int ust__graphs_bind(ust__graphs *g, void *graph, unsigned long long capture, void *exec);
int ust__graphs_replay(ust__graphs *g, void *exec, void *stream);
void ust__graphs_replayed(ust__graphs *g, void *exec, void *stream);
void ust__graphs_unbind(ust__graphs *g, void *exec);
/* The graph (or executable graph) capture made was handed to code outside
 * understudy (its raw handle), which may change its kernels in place where
 * nothing of understudy's sees it: each live site of that capture runs
 * production alone in its replays from now on (its gate closed for this
 * enable: no shadow, no candidate's arm), counted once on its route
 * (graph_exposed). The number of sites closed now. */
int ust__graphs_exposed(ust__graphs *g, unsigned long long capture);

/* One shadowed call being captured. */
struct graph_site;
typedef struct ust__graph_call {
  ust__graphs *graphs;
  struct graph_site *site;
  struct ust__ring *ring;
  ust__slot_route r;
  void *stream; /* the caller's capturing stream */
  void *side;   /* where this thread captures parts */
  int mode;     /* the thread's capture mode while a part is open */
  int open;     /* a part is being captured */
  int parts;    /* parts added to the caller's graph */
  int beside;   /* verify-only, its body beside the chain (ust__graph_call_begin) */
  int launch;   /* beside: its body launched from the device where CUDA takes it (else an IF node) */
  int start_kernel; /* beside, started by the host: behind its kernel in the chain (an event that kernel's
                       replays record), else behind the whole replay */
  uint64_t kept, kept_max; /* bytes kept for its body beside the chain, and the bound */
  ust__gate_copies chain;  /* beside: the open part's copies, for its kernel in the chain */
  char why[192]; /* what kept the call from being shadowed in its graph */
  int why_code;  /* ust__graph_why, as ust__graph_part_end found it */
} ust__graph_call;

/* A site for a call of route r being captured on stream (device): its gate
 * off until ust__graph_call_end. 0, or an error (the call stays
 * production alone). */
int ust__graph_call_begin(ust__graphs *g, const ust__slot_route *r, int device, void *stream, ust__graph_call *c);
/* The work enqueued on *side until ust__graph_part_end is a part: it runs
 * at the replays the gate verifies. */
int ust__graph_part_begin(ust__graph_call *c, void **side);
/* Ends the part; keep: into the caller's graph behind its condition (else,
 * or when it cannot be, dropped: why says so). */
int ust__graph_part_end(ust__graph_call *c, int keep);
/* 1 while the open part's stream still captures (nothing the candidate did
 * ended or invalidated it). */
int ust__graph_part_active(const ust__graph_call *c);
/* Device memory for a call beside the chain, on its device: kept for the
 * process (a graph holding it may replay at any time). NULL when there is
 * none (why says so). */
void *ust__graph_keep(ust__graph_call *c, size_t bytes);
/* Inside the open part: the comparisons of pairs into dev_stats and their
 * publication (ust__shadow_site_capture) in the replays the gate verifies;
 * then, for the replays the candidate serves (canary, live), its results
 * copied over production's (each pair of a result or written argument).
 * A call whose results cannot be copied so (another dtype or shape), or
 * not all of them (servable 0: results left out of the pairs), is only
 * ever verified: its gate never lets the candidate serve. */
int ust__graph_call_finish(ust__graph_call *c, const ust__pair *pairs, int n_pairs, ust__cmp_stats *dev_stats,
                           int servable);
/* Inside the open part: a device copy, or bytes set to byte. */
int ust__graph_copy(ust__graph_call *c, void *dst, const void *src, size_t bytes);
int ust__graph_fill(ust__graph_call *c, void *dst, int byte, size_t bytes);
/* ok: the call's shadow is whole in the caller's graph; its site goes live. */
void ust__graph_call_end(ust__graph_call *c, int ok);

#endif /* UST_GUARD_GRAPH_H */
