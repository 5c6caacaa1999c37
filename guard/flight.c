/* Candidate calls in flight, and the sweep that finds those past their
 * deadline (guard/flight.h).
 *
 * Each entry of the table carries one word: its generation (moved on by
 * every claim) and its state. Its other fields are written by the call that
 * claimed it before the state says RUNNING, and read by the sweep after it
 * saw RUNNING; the sweep's claim on the call (RUNNING -> SWEPT) names the
 * generation it read, so fields of a call that ended meanwhile are never
 * taken for another's. */
#include <stdlib.h>

#include "base/base.h"
#include "guard/flight.h"

enum { FREE = 0, CLAIMED = 1, RUNNING = 2, SWEPT = 3 };

#define WORD(gen, state) ((gen) << 2 | (uint64_t)(state))
#define STATE(w) ((int)((w)&3u))
#define GEN(w) ((w) >> 2)

typedef struct flight_entry {
  atomic_uint_fast64_t word;
  _Atomic(ust__flight *) part;
  _Atomic(void *) cookie;
  atomic_uint_fast64_t start_ns, deadline_ns;
  atomic_int serving;
} flight_entry;

struct ust__flights {
  int room;
  flight_entry *e;
};

/* where this thread's next claim starts looking: its last entry, most often free again */
static __thread int claim_hint;

const char *ust__held_name(int why) {
  static const char *const names[UST__HELD_COUNT] = {"overdue", "bound", "full"};
  return why >= 0 && why < UST__HELD_COUNT ? names[why] : "?";
}

int ust__flights_create(int room, ust__flights **out) {
  ust__flights *t = calloc(1, sizeof *t);
  if (t == NULL || room < 1 || (t->e = calloc((size_t)room, sizeof *t->e)) == NULL) {
    free(t);
    return ust__error(room < 1 ? UST_EINVAL : UST_ENOMEM, "candidate calls in flight: %s",
                      room < 1 ? "no room" : "out of memory");
  }
  t->room = room;
  *out = t;
  return 0;
}

void ust__flights_destroy(ust__flights *t) {
  if (t == NULL)
    return;
  free(t->e);
  free(t);
}

static void held(ust__flight *f, int why) { atomic_fetch_add_explicit(&f->held[why], 1, memory_order_relaxed); }

int ust__flight_admit(ust__flights *t, ust__flight *f, void *cookie, uint64_t deadline_ns, int serving,
                      ust__flight_ticket *tk) {
  tk->index = -1;
  tk->gen = 0;
  if (atomic_load_explicit(&f->overdue_inside, memory_order_acquire) > 0) {
    held(f, UST__HELD_OVERDUE);
    return 0;
  }
  const uint64_t bound = 1 + atomic_load_explicit(&f->in_time, memory_order_relaxed);
  if (atomic_fetch_add_explicit(&f->inside, 1, memory_order_acq_rel) >= bound) {
    atomic_fetch_sub_explicit(&f->inside, 1, memory_order_relaxed);
    held(f, UST__HELD_BOUND);
    return 0;
  }
  const int start = claim_hint >= 0 && claim_hint < t->room ? claim_hint : 0;
  for (int k = 0; k < t->room; k++) {
    const int i = (start + k) % t->room;
    flight_entry *x = &t->e[i];
    uint64_t w = atomic_load_explicit(&x->word, memory_order_relaxed);
    if (STATE(w) != FREE ||
        !atomic_compare_exchange_strong_explicit(&x->word, &w, WORD(GEN(w) + 1, CLAIMED), memory_order_acquire,
                                                 memory_order_relaxed))
      continue;
    atomic_store_explicit(&x->part, f, memory_order_relaxed);
    atomic_store_explicit(&x->cookie, cookie, memory_order_relaxed);
    atomic_store_explicit(&x->deadline_ns, deadline_ns, memory_order_relaxed);
    atomic_store_explicit(&x->serving, serving, memory_order_relaxed);
    atomic_store_explicit(&x->start_ns, 0, memory_order_relaxed);
    claim_hint = i;
    tk->index = i;
    tk->gen = GEN(w) + 1;
    return 1;
  }
  atomic_fetch_sub_explicit(&f->inside, 1, memory_order_relaxed);
  held(f, UST__HELD_FULL);
  return 0;
}

void ust__flight_begin(ust__flights *t, const ust__flight_ticket *tk, uint64_t now_ns) {
  if (tk->index < 0)
    return;
  flight_entry *x = &t->e[tk->index];
  atomic_store_explicit(&x->start_ns, now_ns, memory_order_relaxed);
  atomic_store_explicit(&x->word, WORD(tk->gen, RUNNING), memory_order_release);
}

int ust__flight_end(ust__flights *t, ust__flight *f, ust__flight_ticket *tk, uint64_t now_ns, uint64_t *ran_ns) {
  if (ran_ns != NULL)
    *ran_ns = 0;
  if (tk->index < 0)
    return 0;
  flight_entry *x = &t->e[tk->index];
  const uint64_t start = atomic_load_explicit(&x->start_ns, memory_order_relaxed);
  const uint64_t deadline = atomic_load_explicit(&x->deadline_ns, memory_order_relaxed);
  /* freed, its generation kept: the next claim moves it on */
  const uint64_t w = atomic_exchange_explicit(&x->word, WORD(tk->gen, FREE), memory_order_acq_rel);
  tk->index = -1;
  const int state = STATE(w);
  const uint64_t ran = state == RUNNING || state == SWEPT ? (now_ns > start ? now_ns - start : 0) : 0;
  if (ran_ns != NULL)
    *ran_ns = ran;
  if (state == SWEPT)
    atomic_fetch_sub_explicit(&f->overdue_inside, 1, memory_order_release);
  else if (state == RUNNING && (deadline == 0 || ran <= deadline))
    atomic_fetch_add_explicit(&f->in_time, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&f->inside, 1, memory_order_release);
  return state == SWEPT;
}

int ust__flights_sweep(ust__flights *t, uint64_t now_ns, void (*found_cb)(void *ctx, const ust__overdue_call *c),
                       void *ctx, uint64_t *next_ns) {
  uint64_t next = UINT64_MAX;
  int found = 0;
  for (int i = 0; i < t->room; i++) {
    flight_entry *x = &t->e[i];
    uint64_t w = atomic_load_explicit(&x->word, memory_order_acquire);
    if (STATE(w) != RUNNING)
      continue;
    const uint64_t start = atomic_load_explicit(&x->start_ns, memory_order_relaxed);
    const uint64_t deadline = atomic_load_explicit(&x->deadline_ns, memory_order_relaxed);
    ust__flight *f = atomic_load_explicit(&x->part, memory_order_relaxed);
    if (deadline == 0)
      continue;
    if (now_ns <= start || now_ns - start <= deadline) {
      if (start + deadline < next)
        next = start + deadline;
      continue;
    }
    const ust__overdue_call c = {atomic_load_explicit(&x->cookie, memory_order_relaxed), now_ns - start, deadline,
                                 atomic_load_explicit(&x->serving, memory_order_relaxed)};
    /* counted before the call is marked: a route never reads fewer calls
     * past their deadline than are inside it (undone if the call left) */
    atomic_fetch_add_explicit(&f->overdue_inside, 1, memory_order_acq_rel);
    if (!atomic_compare_exchange_strong_explicit(&x->word, &w, WORD(GEN(w), SWEPT), memory_order_acq_rel,
                                                 memory_order_acquire)) {
      atomic_fetch_sub_explicit(&f->overdue_inside, 1, memory_order_release);
      continue; /* it left meanwhile */
    }
    atomic_fetch_add_explicit(&f->swept, 1, memory_order_relaxed);
    atomic_store_explicit(&f->in_time, 0, memory_order_relaxed); /* one call at a time again */
    found++;
    if (found_cb != NULL)
      found_cb(ctx, &c);
  }
  if (next_ns != NULL)
    *next_ns = next;
  return found;
}

void ust__flight_snapshot(ust__flight *f, ust__flight_snap *out) {
  out->inside = atomic_load(&f->inside);
  out->overdue_inside = atomic_load(&f->overdue_inside);
  out->in_time = atomic_load(&f->in_time);
  out->swept = atomic_load(&f->swept);
  for (int i = 0; i < UST__HELD_COUNT; i++)
    out->held[i] = atomic_load(&f->held[i]);
}
