/* Candidate calls in flight (guard/flight.h), on a clock the test drives:
 * what a route admits while a call of its candidate is inside, past its
 * deadline or not; what the sweep finds, when, and once; and the bound a
 * candidate earns by returning calls within their deadline. */
#include <stdint.h>

#include "runner.h"

#include "guard/flight.h"

#define MS 1000000ull

typedef struct found {
  int n;
  void *cookie[8];
  uint64_t ran_ns[8];
  int serving[8];
} found;

static void on_found(void *ctx, const ust__overdue_call *c) {
  found *f = ctx;
  if (f->n < 8) {
    f->cookie[f->n] = c->cookie;
    f->ran_ns[f->n] = c->ran_ns;
    f->serving[f->n] = c->serving;
  }
  f->n++;
}

static ust__flight_snap snap(ust__flight *f) {
  ust__flight_snap s;
  ust__flight_snapshot(f, &s);
  return s;
}

TEST(flight_sweeps_a_call_at_its_deadline_and_holds_its_route_until_it_leaves) {
  ust__flights *t = NULL;
  ASSERT_INT_EQ(ust__flights_create(16, &t), 0);
  ust__flight route = {0}, other = {0};
  int cookie, other_cookie;
  ust__flight_ticket a, b;
  /* a candidate that returned no call in time runs one call at a time */
  ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 200 * MS, 1, &a), 1);
  ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 200 * MS, 1, &b), 0);
  ASSERT_INT_EQ(b.index, -1);
  ASSERT_U64_EQ(snap(&route).held[UST__HELD_BOUND], 1);
  /* another route is its own */
  ust__flight_ticket o;
  ASSERT_INT_EQ(ust__flight_admit(t, &other, &other_cookie, 200 * MS, 0, &o), 1);
  ust__flight_begin(t, &a, 1000 * MS);
  ust__flight_begin(t, &o, 1100 * MS);
  found f = {0};
  uint64_t next = 0;
  /* admitted but not begun, or begun and within the deadline: nothing found */
  ASSERT_INT_EQ(ust__flights_sweep(t, 1200 * MS, on_found, &f, &next), 0);
  ASSERT_U64_EQ(next, 1200 * MS); /* a's deadline passes first */
  ASSERT_INT_EQ(ust__flights_sweep(t, 1200 * MS + 1, on_found, &f, &next), 1);
  ASSERT_TRUE(f.cookie[0] == &cookie && f.serving[0] == 1);
  ASSERT_U64_EQ(f.ran_ns[0], 200 * MS + 1);
  ASSERT_U64_EQ(next, 1300 * MS); /* o's; a is found, and never again */
  ASSERT_INT_EQ(ust__flights_sweep(t, 1250 * MS, on_found, &f, &next), 0);
  ust__flight_snap s = snap(&route);
  ASSERT_U64_EQ(s.inside, 1);
  ASSERT_U64_EQ(s.overdue_inside, 1);
  ASSERT_U64_EQ(s.swept, 1);
  /* while it is inside, the route admits nothing */
  ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 200 * MS, 1, &b), 0);
  ASSERT_U64_EQ(snap(&route).held[UST__HELD_OVERDUE], 1);
  /* the other route's call returns in time: it earns a second call in flight */
  uint64_t ran = 0;
  ASSERT_INT_EQ(ust__flight_end(t, &other, &o, 1250 * MS, &ran), 0);
  ASSERT_U64_EQ(ran, 150 * MS);
  ASSERT_U64_EQ(snap(&other).in_time, 1);
  /* the hung call returns at last: the sweep's find, counted there */
  ASSERT_INT_EQ(ust__flight_end(t, &route, &a, 5000 * MS, &ran), 1);
  ASSERT_U64_EQ(ran, 4000 * MS);
  ASSERT_INT_EQ(a.index, -1);
  s = snap(&route);
  ASSERT_U64_EQ(s.inside, 0);
  ASSERT_U64_EQ(s.overdue_inside, 0);
  ASSERT_U64_EQ(s.in_time, 0);
  ASSERT_INT_EQ(ust__flights_sweep(t, 9000 * MS, on_found, &f, &next), 0);
  ASSERT_U64_EQ(next, UINT64_MAX);
  ASSERT_INT_EQ(f.n, 1);
  /* an ended ticket ends nothing again */
  ASSERT_INT_EQ(ust__flight_end(t, &route, &a, 9000 * MS, &ran), 0);
  ASSERT_U64_EQ(snap(&route).inside, 0);
  ust__flights_destroy(t);
}

TEST(flight_bound_grows_with_calls_returned_in_time_and_restarts_after_a_sweep) {
  ust__flights *t = NULL;
  ASSERT_INT_EQ(ust__flights_create(64, &t), 0);
  ust__flight route = {0};
  int cookie;
  ust__flight_ticket tk[8];
  uint64_t now = 0, ran;
  /* three calls in time, one after another: four may be inside at once */
  for (int i = 0; i < 3; i++) {
    ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 10 * MS, 0, &tk[0]), 1);
    ust__flight_begin(t, &tk[0], now += MS);
    ASSERT_INT_EQ(ust__flight_end(t, &route, &tk[0], now += 10 * MS, &ran), 0); /* at the deadline: in time */
  }
  for (int i = 0; i < 4; i++)
    ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 10 * MS, 0, &tk[i]), 1);
  ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 10 * MS, 0, &tk[4]), 0);
  /* a call past its deadline that returns by itself, before any sweep: no credit */
  ust__flight_begin(t, &tk[0], now);
  ASSERT_INT_EQ(ust__flight_end(t, &route, &tk[0], now + 11 * MS, &ran), 0);
  ASSERT_U64_EQ(snap(&route).in_time, 3);
  /* one found past its deadline: one call at a time again, once the route is clear */
  ust__flight_begin(t, &tk[1], now);
  found f = {0};
  ASSERT_INT_EQ(ust__flights_sweep(t, now + 11 * MS, on_found, &f, NULL), 1);
  ASSERT_INT_EQ(ust__flight_end(t, &route, &tk[1], now + 12 * MS, &ran), 1);
  ASSERT_INT_EQ(ust__flight_end(t, &route, &tk[2], now + 12 * MS, &ran), 0); /* never began: no credit */
  ASSERT_INT_EQ(ust__flight_end(t, &route, &tk[3], now + 12 * MS, &ran), 0);
  ASSERT_U64_EQ(ran, 0);
  ust__flight_snap s = snap(&route);
  ASSERT_U64_EQ(s.inside, 0);
  ASSERT_U64_EQ(s.in_time, 0);
  ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 10 * MS, 0, &tk[0]), 1);
  ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 10 * MS, 0, &tk[1]), 0);
  /* no deadline: tracked, never found */
  ust__flight_begin(t, &tk[0], now);
  ASSERT_INT_EQ(ust__flight_end(t, &route, &tk[0], now + 1, &ran), 0);
  ust__flight_snap before = snap(&route);
  ASSERT_INT_EQ(ust__flight_admit(t, &route, &cookie, 0, 0, &tk[0]), 1);
  ust__flight_begin(t, &tk[0], now);
  ASSERT_INT_EQ(ust__flights_sweep(t, UINT64_MAX / 2, on_found, &f, NULL), 0);
  ASSERT_INT_EQ(ust__flight_end(t, &route, &tk[0], UINT64_MAX / 2, &ran), 0);
  ASSERT_U64_EQ(snap(&route).in_time, before.in_time + 1);
  ust__flights_destroy(t);
}

TEST(flight_table_full_serves_production_and_says_so) {
  ust__flights *t = NULL;
  ASSERT_INT_EQ(ust__flights_create(2, &t), 0);
  ust__flight r[3] = {{0}};
  int cookie;
  ust__flight_ticket tk[3];
  ASSERT_INT_EQ(ust__flight_admit(t, &r[0], &cookie, MS, 0, &tk[0]), 1);
  ASSERT_INT_EQ(ust__flight_admit(t, &r[1], &cookie, MS, 0, &tk[1]), 1);
  ASSERT_INT_EQ(ust__flight_admit(t, &r[2], &cookie, MS, 0, &tk[2]), 0);
  ust__flight_snap s = snap(&r[2]);
  ASSERT_U64_EQ(s.held[UST__HELD_FULL], 1);
  ASSERT_U64_EQ(s.inside, 0);
  uint64_t ran;
  ust__flight_end(t, &r[0], &tk[0], 0, &ran);
  ASSERT_INT_EQ(ust__flight_admit(t, &r[2], &cookie, MS, 0, &tk[2]), 1);
  ASSERT_STR_EQ(ust__held_name(UST__HELD_FULL), "full");
  ust__flight *none = NULL;
  ASSERT_INT_EQ(ust__flights_create(0, (ust__flights **)&none) != 0, 1);
  ust__flights_destroy(NULL);
  ust__flights_destroy(t);
}
