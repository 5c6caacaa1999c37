/*
 * The admission of an intercepted call (dispatch/callview.h): the calling
 * thread's block, the hook a call enters through and its binding, and
 * whether the call is passed on, tallied (counted without a key, standing
 * for the calls between keyed ones) or keyed. Also the thread's phase,
 * graph-capture and graph-pool hints.
 */
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"


/* The calling thread's block (dispatch/callview.h): one thread-local
 * variable, so that a call reads the dynamic loader's table once. */
__thread ust__thread ust__thread_block;
#define tl_thread ust__thread_block

ust__thread *ust__thread_state(void) { return &tl_thread; }

int ust_set_phase(int phase) {
  if (phase < UST_PHASE_UNKNOWN || phase > UST_PHASE_DECODE)
    return ust__error(UST_EINVAL, "set_phase: %d is not a phase (0 unknown, 1 prefill, 2 decode)", phase);
  int prev = tl_thread.phase;
  tl_thread.phase = phase;
  return prev;
}

int ust__thread_phase(void) { return tl_thread.phase; }

int ust_graph_capture_begun(void) { return ++tl_thread.captures; }

int ust_graph_capture_ended(void) {
  if (tl_thread.captures > 0)
    tl_thread.captures--;
  return tl_thread.captures;
}

int ust_pool_alloc_begun(void) { return ++tl_thread.pool_allocs; }

int ust_pool_alloc_ended(void) {
  if (tl_thread.pool_allocs > 0)
    tl_thread.pool_allocs--;
  return tl_thread.pool_allocs;
}

const char *ust__phase_name(int phase) {
  static const char *names[] = {"unknown", "prefill", "decode"};
  return phase >= 0 && phase <= UST_PHASE_DECODE ? names[phase] : "unknown";
}
/* ---- the bridge's accessors ---------------------------------------------------------- */

int ust__in_intercepted_call(void) { return tl_thread.depth > 0; }

/* The hook's head is shared with the bridge (C++): its fields are reached
 * with __atomic builtins on both sides. Sequentially consistent where a call
 * counts itself in flight and then reads the binding, and disable detaches
 * the binding and then moves the epoch on: a call that read a binding before
 * it was detached is counted in an epoch disable waits for, and one counted
 * too late to be waited for reads NULL. */
void ust__hook_attach(ust__hook *h, ust__binding *b) {
  ust__hook_head *hd = &h->head;
  b->hook_epoch = __atomic_load_n(&hd->epoch, __ATOMIC_SEQ_CST) & 1u;
  b->hook_tallied_base = __atomic_load_n(&hd->line->tallied, __ATOMIC_RELAXED);
  atomic_store(&b->hook_counts, 1);
  __atomic_store_n(&hd->binding, b, __ATOMIC_SEQ_CST);
  __atomic_store_n(&hd->line->word, atomic_load(&b->tally), __ATOMIC_SEQ_CST);
}

unsigned ust__hook_detach(ust__hook *h) {
  ust__hook_head *hd = &h->head;
  __atomic_store_n(&hd->line->word, UST__TALLY_OFF, __ATOMIC_SEQ_CST);
  __atomic_store_n(&hd->binding, NULL, __ATOMIC_SEQ_CST);
  return __atomic_fetch_add(&hd->epoch, 1, __ATOMIC_SEQ_CST) & 1u;
}

long ust__hook_inflight(ust__hook *h, unsigned old) {
  return __atomic_load_n(&h->head.inflight[old & 1u], __ATOMIC_ACQUIRE);
}

void ust__hook_republish(ust__hook *h, const ust__binding *b) {
  if (__atomic_load_n(&h->head.binding, __ATOMIC_SEQ_CST) == b)
    __atomic_store_n(&h->head.line->word, atomic_load(&((ust__binding *)b)->tally), __ATOMIC_SEQ_CST);
}

void ust__hook_after_fork(ust__hook *h) {
  __atomic_store_n(&h->head.inflight[0], 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&h->head.inflight[1], 0, __ATOMIC_SEQ_CST);
}

void ust__fork_child(void) { tl_thread.forked = tl_thread.depth; }

/* The calls until the next one keyed at random, one in every (at least 2,
 * as a tally word holds it): a geometric draw (each call keyed with
 * probability 1/every, whatever the calls before it), from the thread's own
 * generator. */
static UST__NOINLINE int64_t key_gap(ust__thread *t, uint32_t every) {
  uint64_t x = t->key_rng;
  if (x == 0) /* seeded once per thread: its block's address and the clock */
    x = ((uint64_t)(uintptr_t)t * 0x9e3779b97f4a7c15ull) ^ ust__now_ns() ^ 0x2545f4914f6cdd1dull;
  if (x == 0)
    x = 1;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  t->key_rng = x;
  const double u = (double)(((x * 0x2545f4914f6cdd1dull) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
  const double gap = floor(log(u) / log1p(-1.0 / every));
  return 1 + (int64_t)(gap < 1e15 ? gap : 1e15);
}

/* A binding's tally word: key_every in its low 16 bits, the engine's number
 * above them; an operator that is off has key_every 0 and no number
 * (UST__TALLY_OFF). */
static UST__INLINE uint32_t word_every(uint64_t word) { return (uint32_t)(word & 0xffffu); }
static UST__INLINE uint64_t word_engine(uint64_t word) { return word >> 16; }

/* A thread's warm-up under a new engine: every call keyed again, up to key_after. */
static UST__NOINLINE void key_restart(ust__binding *b, ust__thread *t, uint64_t word) {
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  t->key_gen = word_engine(word);
  t->key_after = pol->key_after;
  t->key_warm = 0;
  t->key_gap = pol->key_after == 0 ? key_gap(t, word_every(word)) : 0;
  t->key_traced = b->router->tracer;
}

/* A call whose binding's tally word is 0: its operator's policy decides
 * (passed on in mode off, else keyed). */
static UST__NOINLINE int admit_by_policy(const ust__binding *b) {
  const ust__policy *pol = atomic_load_explicit(&b->op->policy, memory_order_acquire);
  return pol->mode == UST__MODE_OFF ? UST__ADMIT_PASS : 1;
}

/* Every case of the admission, the common one included: a call that
 * admit_word could not settle in its first lines. */
static UST__NOINLINE int admit_other(ust__binding *b, ust__thread *t, uint64_t word) {
  const uint32_t every = word_every(word);
  if (__builtin_expect(every == 0, 0)) /* the operator is off (the word says so), or the policy decides */
    return word == UST__TALLY_OFF ? UST__ADMIT_PASS : admit_by_policy(b);
  if (__builtin_expect(t->key_gen != word_engine(word), 0))
    key_restart(b, t, word);
  if (t->key_warm < t->key_after) {
    if (++t->key_warm == t->key_after) /* the first gap drawn as the warm-up ends */
      t->key_gap = key_gap(t, every);
    return 1;
  }
  /* while the thread captures a graph every call is keyed: its nodes are the route's */
  if (__builtin_expect(t->captures != 0, 0))
    return 1;
  /* inside a kernel-tracing window every call is keyed: its kernels are the route's */
  if (t->key_traced && ust__timers_tracing(b->router->timers) == UST__TRACING_WINDOW)
    return 1;
  if (--t->key_gap > 0)
    return UST__ADMIT_TALLY;
  t->key_gap = key_gap(t, every);
  return (int)every;
}

/* The admission of a call whose binding's tally word is word: its common
 * cases in a few lines, the rest out of line. */
static UST__INLINE int admit_word(ust__binding *b, ust__thread *t, uint64_t word) {
  if (word == UST__TALLY_OFF)
    return UST__ADMIT_PASS;
  if (__builtin_expect(ust__word_tallies(word, t), 1)) {
    t->key_gap--;
    return UST__ADMIT_TALLY;
  }
  return admit_other(b, t, word);
}

int ust__binding_admit(ust__binding *b, ust__thread *t) {
  return admit_word(b, t, atomic_load_explicit(&b->tally, memory_order_relaxed));
}

int ust__hook_admit(ust__hook *h, ust__entry *e) {
  ust__hook_head *const hd = &h->head;
  ust__thread *const t = &tl_thread;
  /* counted in flight on the hook's gate, then the binding read */
  const unsigned ticket = __atomic_load_n(&hd->epoch, __ATOMIC_SEQ_CST) & 1u;
  __atomic_fetch_add(&hd->inflight[ticket], 1, __ATOMIC_SEQ_CST);
  e->thread = t;
  e->hook = hd;
  e->ticket = ticket;
  e->binding = __atomic_load_n(&hd->binding, __ATOMIC_SEQ_CST);
  t->depth++;
  ust__binding *const b = e->binding;
  if (__builtin_expect(b == NULL, 0))
    return UST__ADMIT_PASS;
  if (__builtin_expect((t->own_work | t->call_depth) != 0, 0)) /* both counts, never negative */
    return t->nested != NULL && t->call_depth == 1 ? UST__ADMIT_NESTED : UST__ADMIT_PASS;
  const int w = admit_word(b, t, __atomic_load_n(&hd->line->word, __ATOMIC_ACQUIRE));
  return w == UST__ADMIT_TALLY ? 1 : w;
}

uint64_t ust__tally_word(const ust__policy *pol, uint64_t engine_gen) {
  if (pol->mode == UST__MODE_OFF) /* every call passed on, the policy unread */
    return UST__TALLY_OFF;
  if (pol->mode != UST__MODE_OBSERVE || pol->key_every <= 1)
    return 0;
  const uint64_t numbers = (1ull << 48) - 1; /* the engine's number: 1 to 2^48 - 1, never 0 */
  return (engine_gen % numbers + 1u) << 16 | (pol->key_every & 0xffffu);
}

void ust__binding_tallied(ust__binding *b, unsigned n) {
  atomic_fetch_add_explicit(&b->tallied, n, memory_order_relaxed);
}

/* The hook's count of b's epoch since b was bound, while b reads it. */
static uint64_t hook_tallies(ust__binding *b) {
  if (atomic_load(&b->hook_counts) == 0 || b->hook == NULL)
    return 0;
  return __atomic_load_n(&b->hook->head.line->tallied, __ATOMIC_RELAXED) - b->hook_tallied_base;
}

uint64_t ust__binding_tallied_count(ust__binding *b) { return atomic_load(&b->tallied) + hook_tallies(b); }

void ust__binding_fold_tallies(ust__binding *b) {
  const uint64_t n = hook_tallies(b);
  atomic_store(&b->hook_counts, 0);
  atomic_fetch_add(&b->tallied, n);
}

UST__HOT int ust__binding_needs_names(const ust__binding *b) {
  return atomic_load_explicit(&((ust__binding *)b)->resolved, memory_order_acquire) != 2;
}

int ust__binding_reads_lengths(const ust__binding *b) { return b->roofline.present && b->roofline.reads_values; }

const char *ust__binding_display(const ust__binding *b) { return b->display; }
const char *ust__binding_qualname(const ust__binding *b) { return b->qualname; }
const char *ust__binding_overload(const ust__binding *b) { return b->overload; }
const char *ust__binding_arg_name(const ust__binding *b, int i) {
  return i >= 0 && i < b->n_arg_names ? b->arg_names[i] : "?";
}
