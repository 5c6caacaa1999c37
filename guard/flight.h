/*
 * Candidate calls in flight (guard/flight.c): a part of each route
 * (ust__flight) and one table of every call inside a candidate now
 * (ust__flights), so that a call that hangs is found at its deadline, not
 * when (or if) it returns.
 *
 * A route admits a new call of its candidate only while
 * - no call of it is inside past its deadline (a hung candidate takes at
 *   most the threads already inside; every later call is production's), and
 * - fewer of its calls are inside than 1 + the calls that returned within
 *   their deadline since the route's last call past one: a candidate that
 *   has not yet returned a call is run one call at a time, so a candidate
 *   that hangs on its first call holds one serving thread, not every thread
 *   that reaches its route before the deadline.
 * A call not admitted is served by production and counted by why
 * (ust__held). The engine's worker sweeps the table (ust__flights_sweep):
 * a call past its deadline is counted on its route and handed to the
 * caller, which rolls the route back while the call is still inside.
 *
 * Times are the caller's clock (ust__now_ns on the serving path), passed
 * in, so that the C tests drive them.
 *
 * Threading: admit, begin and end on the calling thread, lock-free; sweep on
 * one thread (the worker); the snapshot from any thread.
 * Includes only base/. Internal header: never installed.
 */
#ifndef UST_GUARD_FLIGHT_H
#define UST_GUARD_FLIGHT_H

#include <stdatomic.h>
#include <stdint.h>

/* Why a candidate call was not admitted (production served it). */
typedef enum ust__held {
  UST__HELD_OVERDUE = 0, /* a call of the candidate was inside past its deadline */
  UST__HELD_BOUND,       /* as many calls were inside as the candidate has earned */
  UST__HELD_FULL,        /* the table of calls in flight was full */
  UST__HELD_COUNT
} ust__held;

const char *ust__held_name(int why);

/* A route's candidate calls in flight: the guard's part of a route. */
typedef struct ust__flight {
  atomic_uint inside;                          /* calls admitted and not ended */
  atomic_uint overdue_inside;                  /* of them, found past their deadline (swept) */
  atomic_uint_fast64_t in_time;                /* calls that returned within their deadline since the last one
                                                  found past it (the bound: 1 + this) */
  atomic_uint_fast64_t held[UST__HELD_COUNT];  /* calls production served instead, by why */
  atomic_uint_fast64_t swept;                  /* calls found past their deadline while inside */
} ust__flight;

typedef struct ust__flight_snap {
  uint64_t inside, overdue_inside, in_time, swept;
  uint64_t held[UST__HELD_COUNT];
} ust__flight_snap;

void ust__flight_snapshot(ust__flight *f, ust__flight_snap *out);

typedef struct ust__flights ust__flights;

/* A table of room calls in flight (room >= 1): 0 and *out, or an error. */
int ust__flights_create(int room, ust__flights **out);
/* NULL: a no-op. No call may be in flight. */
void ust__flights_destroy(ust__flights *t);

/* A call admitted: its entry in the table, for begin and end. */
typedef struct ust__flight_ticket {
  int index;    /* -1: none (not admitted, or ended) */
  uint64_t gen; /* the entry's generation it holds */
} ust__flight_ticket;

/* Admit a call of route cookie (whose part is f) whose candidate is held to
 * deadline_ns (0: none; the call is tracked but never swept); serving: the
 * candidate would serve it. 1 and *tk; else 0, counted on f by why
 * (ust__held), *tk's index -1. */
int ust__flight_admit(ust__flights *t, ust__flight *f, void *cookie, uint64_t deadline_ns, int serving,
                      ust__flight_ticket *tk);
/* The candidate starts running now_ns. */
void ust__flight_begin(ust__flights *t, const ust__flight_ticket *tk, uint64_t now_ns);
/* The call leaves (the candidate returned, or never ran), now_ns: 1 when
 * the sweep found it past its deadline (counted there), else 0; into *ran_ns
 * how long its candidate ran (0: it never began). A returned call within
 * its deadline counts toward the route's bound. tk's index is -1 after.
 * A ticket with index -1: a no-op returning 0. */
int ust__flight_end(ust__flights *t, ust__flight *f, ust__flight_ticket *tk, uint64_t now_ns, uint64_t *ran_ns);

/* What the sweep found: a call of route cookie past its deadline. */
typedef struct ust__overdue_call {
  void *cookie;
  uint64_t ran_ns, deadline_ns;
  int serving;
} ust__overdue_call;

/* Every call that began more than its deadline before now_ns and is still
 * inside, not found before: counted on its route (swept; its route admits
 * no call until it leaves, and its bound starts again at 1), then
 * found_cb(ctx, call) for each. Returns how many; *next_ns (may be NULL):
 * when the earliest deadline of a call still inside will pass (UINT64_MAX:
 * none). One thread at a time. */
int ust__flights_sweep(ust__flights *t, uint64_t now_ns, void (*found_cb)(void *ctx, const ust__overdue_call *c),
                       void *ctx, uint64_t *next_ns);

#endif /* UST_GUARD_FLIGHT_H */
