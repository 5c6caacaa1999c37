/* Kernel-level timing without a GPU: windows, call slots and the join of a
 * tracer's records (dispatch/kerneltime.c), fed by hand in the orders a
 * tracer may deliver them. The expected figures are summed here from the
 * records given. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "dispatch/dispatch.h"
#include "figs_probe.h"
#include "runner.h"

TEST(kernel_records_join_calls_in_any_order) {
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs outer, inner, other;
  ASSERT_INT_EQ(ust__figs_init(&outer), 0);
  ASSERT_INT_EQ(ust__figs_init(&inner), 0);
  ASSERT_INT_EQ(ust__figs_init(&other), 0);
  uint64_t ext_o = 0, ext_i = 0, ext_x = 0;
  ASSERT_INT_EQ(ust__kt_begin(k, &ext_o), -1); /* no window yet */
  ust__kt_open(k);
  ASSERT_TRUE(ust__kt_window_open(k));
  const int so = ust__kt_begin(k, &ext_o);
  const int si = ust__kt_begin(k, &ext_i); /* nested in the outer call (same thread) */
  ASSERT_TRUE(so >= 0 && si >= 0 && ext_o != ext_i);
  ust__kt_end(k, si, &inner, 0, 0);
  ust__kt_end(k, so, &outer, 0, 0);
  const int sx = ust__kt_begin(k, &ext_x);
  ust__kt_end(k, sx, &other, 0, 0);
  /* the outer call launched kernels 11 and 12, the inner one 13, the other
   * call 14; kernels 20 and 21 belong to no call; records out of order,
   * kernels before their launches' records, one launch record twice */
  ust__kt_kernel(k, 13, 0, 5000, 5400, "inner_gemm");
  ust__kt_kernel(k, 11, 0, 1000, 1100, "outer_pre");
  ust__kt_ext(k, 13, ext_i);
  ust__kt_kernel(k, 20, 0, 100, 400, "rms_mul");
  ust__kt_ext(k, 11, ext_o);
  ust__kt_ext(k, 12, ext_o);
  ust__kt_ext(k, 12, ext_o);
  ust__kt_kernel(k, 21, 0, 500, 600, "rms_mul");
  ust__kt_kernel(k, 12, 0, 6000, 6050, "outer_post");
  ust__kt_kernel(k, 14, 0, 7000, 7070, "other");
  ust__kt_ext(k, 14, ext_x);
  ust__kt_kernel(k, 22, 0, 800, 850, "copy");
  ust__kt_kernel(k, 13, 0, 5000, 5400, "inner_gemm"); /* delivered twice: counted once */
  ust__kt_close(k);
  ASSERT_TRUE(ust__kt_quiet(k));
  ust__kt_conclude(k, 1000000, 1.0);
  /* each call timed once, by the sum of its kernels (its children's too) */
  ASSERT_U64_EQ(hist_count(&outer), 1);
  ASSERT_U64_EQ(hist_sum(&outer), 100 + 400 + 50);
  ASSERT_U64_EQ(atomic_load(&outer.kernel_span_ns), 6050 - 1000);
  ASSERT_U64_EQ(hist_sum(&inner), 400);
  ASSERT_U64_EQ(atomic_load(&inner.kernel_span_ns), 400);
  ASSERT_U64_EQ(hist_sum(&other), 70);
  ASSERT_U64_EQ(atomic_load(&outer.kernel_timed), 1);
  /* the kernels each ran: its own and its nested calls' */
  ASSERT_U64_EQ(atomic_load(&outer.kernels), 3);
  ASSERT_U64_EQ(atomic_load(&inner.kernels), 1);
  ASSERT_U64_EQ(atomic_load(&other.kernels), 1);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.windows, 1);
  ASSERT_U64_EQ(t.kernels, 7);
  ASSERT_U64_EQ(t.kernel_ns, 100 + 50 + 400 + 70 + 300 + 100 + 50);
  ASSERT_U64_EQ(t.attributed, 4);
  ASSERT_U64_EQ(t.attributed_ns, 100 + 50 + 400 + 70);
  ASSERT_U64_EQ(t.calls_timed, 3);
  ASSERT_U64_EQ(t.calls_dropped, 0);
  ASSERT_U64_EQ(t.records_lost, 0);
  /* unattributed by name, most time first */
  ASSERT_INT_EQ(t.n_names, 2);
  ASSERT_STR_EQ(t.names[0].name, "rms_mul");
  ASSERT_U64_EQ(t.names[0].ns, 400);
  ASSERT_U64_EQ(t.names[0].kernels, 2);
  ASSERT_STR_EQ(t.names[1].name, "copy");
  /* each route names the kernels production ran in its own calls (a
   * nested call's are the inner route's), each once */
  ASSERT_STR_EQ(atomic_load(&outer.kernel_names[0]), "outer_pre");
  ASSERT_STR_EQ(atomic_load(&outer.kernel_names[1]), "outer_post");
  ASSERT_TRUE(atomic_load(&outer.kernel_names[2]) == NULL);
  ASSERT_STR_EQ(atomic_load(&inner.kernel_names[0]), "inner_gemm");
  ASSERT_TRUE(atomic_load(&inner.kernel_names[1]) == NULL);
  ASSERT_STR_EQ(atomic_load(&other.kernel_names[0]), "other");
  ASSERT_TRUE(atomic_load(&other.kernel_names[1]) == NULL);
  /* more names than a route keeps: the first ones stay */
  const char *many[6] = {"k0", "k1", "k2", "k3", "k4", "k0"};
  for (int i = 0; i < 6; i++)
    ust__figs_kernel_name(&other, many[i]);
  ASSERT_STR_EQ(atomic_load(&other.kernel_names[1]), "k0");
  ASSERT_STR_EQ(atomic_load(&other.kernel_names[3]), "k2");
  ust__figs_free(&outer);
  ust__figs_free(&inner);
  ust__figs_free(&other);
  ust__kt_destroy(k);
}

TEST(kernel_spans_of_a_candidates_run_count_its_kernels_and_those_of_the_ops_it_called) {
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__kt_sink sink = {0}, other_sink = {0};
  ust__figs bound;
  ASSERT_INT_EQ(ust__figs_init(&bound), 0);
  ust__kt_open(k);
  /* run 1: the candidate's own kernel (1), an op it called (2, 3), a bound
   * op called inside that op (4, its own route's call), then its own again (5) */
  uint64_t e_run, e_op, e_bound, e_run2, e_op2, e_lone;
  const int run = ust__kt_begin(k, &e_run);
  const int op = ust__kt_begin(k, &e_op);
  const int bnd = ust__kt_begin(k, &e_bound);
  ust__kt_end(k, bnd, &bound, 0, 0);
  ust__kt_end_span(k, op, &sink, UST__KT_OP);
  ust__kt_end_span(k, run, &sink, UST__KT_RUN);
  /* run 2 lost a kernel record: neither it nor its op counts */
  const int run2 = ust__kt_begin(k, &e_run2);
  const int op2 = ust__kt_begin(k, &e_op2);
  ust__kt_end_span(k, op2, &sink, UST__KT_OP);
  ust__kt_end_span(k, run2, &sink, UST__KT_RUN);
  /* an op span outside any run (its run's span could not be had) counts nowhere */
  const int lone = ust__kt_begin(k, &e_lone);
  ust__kt_end_span(k, lone, &other_sink, UST__KT_OP);
  ust__kt_ext(k, 1, e_run);
  ust__kt_ext(k, 2, e_op);
  ust__kt_ext(k, 3, e_op);
  ust__kt_ext(k, 4, e_bound);
  ust__kt_ext(k, 5, e_run);
  ust__kt_kernel(k, 1, 0, 100, 130, "own");
  ust__kt_kernel(k, 2, 0, 200, 270, "torch_a");
  ust__kt_kernel(k, 3, 0, 300, 311, "torch_b");
  ust__kt_kernel(k, 4, 0, 400, 450, "gemm");
  ust__kt_kernel(k, 5, 0, 500, 505, "own_tail");
  ust__kt_ext(k, 6, e_run2);
  ust__kt_launch(k, 6, UST__KT_LAUNCH_RUNTIME);
  ust__kt_ext(k, 7, e_op2);
  ust__kt_launch(k, 7, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 7, 0, 600, 640, "torch_a"); /* 6's record never came */
  ust__kt_ext(k, 8, e_lone);
  ust__kt_kernel(k, 8, 0, 700, 790, "torch_a");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_U64_EQ(atomic_load(&sink.runs), 1);
  ASSERT_U64_EQ(atomic_load(&sink.kernels), 5);
  ASSERT_U64_EQ(atomic_load(&sink.kernel_ns), 30 + 70 + 11 + 50 + 5);
  ASSERT_U64_EQ(atomic_load(&sink.op_kernels), 3);
  ASSERT_U64_EQ(atomic_load(&sink.op_ns), 70 + 11 + 50);
  ASSERT_U64_EQ(atomic_load(&other_sink.runs) + atomic_load(&other_sink.op_kernels), 0);
  /* the bound op inside is its own route's call, timed by its kernel alone */
  ASSERT_U64_EQ(hist_count(&bound), 1);
  ASSERT_U64_EQ(hist_sum(&bound), 50);
  ASSERT_STR_EQ(atomic_load(&bound.kernel_names[0]), "gemm");
  ASSERT_TRUE(atomic_load(&bound.kernel_names[1]) == NULL);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.calls_timed, 1); /* spans are no calls */
  ust__figs_free(&bound);
  ust__kt_destroy(k);
}

/* A stand-in for the timers' staged lengths: each tag's floor is the bound
 * given less 1000 * tag (the lengths' own), and every resolution is noted. */
typedef struct staged {
  int tags[8];
  uint64_t given[8];
  int n;
} staged;

static uint64_t staged_floor(void *ctx, int tag1, uint64_t tsol_ps) {
  staged *s = ctx;
  s->tags[s->n] = tag1;
  s->given[s->n++] = tsol_ps;
  return tsol_ps > 0 ? tsol_ps - 1000u * (uint64_t)tag1 : 0;
}

TEST(staged_varlen_floors_settle_at_the_windows_conclusion_once_for_every_tag) {
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  staged st = {0};
  ust__kt_floor_fn_set(k, staged_floor, &st);
  ust__figs timed, let_go, raised, lost, empty;
  ust__figs *all[] = {&timed, &let_go, &raised, &lost, &empty};
  for (int i = 0; i < 5; i++)
    ASSERT_INT_EQ(ust__figs_init(all[i]), 0);
  ust__kt_open(k);
  uint64_t e[5];
  int s[5];
  for (int i = 0; i < 5; i++) {
    s[i] = ust__kt_begin(k, &e[i]);
    ust__kt_defer_floor(k, s[i], i + 1, 1); /* tags 1..5, each the call's own floor */
    ASSERT_INT_EQ(ust__kt_floor_tag(k, s[i], 1), i + 1);
    if (i == 1) { /* its callees' floor stands: its own lengths are let go, not copied */
      ust__kt_floor_settled(k, s[i], 2);
      ASSERT_INT_EQ(ust__kt_floor_tag(k, s[i], 1), 0);
      ASSERT_INT_EQ(ust__kt_floor_tag(k, s[i], 0), 2);
    }
    if (i == 0) /* the part that stands: kept */
      ust__kt_floor_settled(k, s[i], 1);
    if (i == 2)
      ust__kt_cancel(k, s[i]);
    else
      ust__kt_end(k, s[i], all[i], 9000u + (uint64_t)i, 0);
  }
  /* kernels for the first two; the fourth lost one; the fifth launched none */
  ust__kt_ext(k, 1, e[0]);
  ust__kt_kernel(k, 1, 0, 100, 140, "fa2");
  ust__kt_ext(k, 2, e[1]);
  ust__kt_kernel(k, 2, 0, 200, 260, "fa2");
  ust__kt_ext(k, 3, e[2]);
  ust__kt_kernel(k, 3, 0, 300, 310, "fa2");
  ust__kt_ext(k, 4, e[3]);
  ust__kt_launch(k, 4, UST__KT_LAUNCH_RUNTIME);
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  /* every tag resolved once; the lengths read only for the call timed with
   * its own floor standing, the others let go (0) */
  ASSERT_INT_EQ(st.n, 5);
  int seen[6] = {0};
  for (int i = 0; i < st.n; i++) {
    seen[st.tags[i]]++;
    ASSERT_U64_EQ(st.given[i], st.tags[i] == 1 ? 9000u : 0u);
  }
  for (int tag = 1; tag <= 5; tag++)
    ASSERT_INT_EQ(seen[tag], 1);
  ASSERT_U64_EQ(hist_sum(&timed), 40);
  ASSERT_U64_EQ(atomic_load(&timed.prod.tsol_ps), 9000u - 1000u);
  ASSERT_U64_EQ(hist_sum(&let_go), 60);
  ASSERT_U64_EQ(atomic_load(&let_go.prod.tsol_ps), 9001u); /* the floor given stands */
  ASSERT_U64_EQ(hist_count(&raised) + hist_count(&lost) + hist_count(&empty), 0);
  ASSERT_U64_EQ(atomic_load(&lost.timing_dropped), 1);
  /* a second window: the slots start without a deferral */
  st.n = 0;
  ust__kt_open(k);
  uint64_t e2;
  const int s2 = ust__kt_begin(k, &e2);
  ASSERT_INT_EQ(ust__kt_floor_tag(k, s2, 0), 0);
  ust__kt_end(k, s2, &timed, 7000, 0);
  ust__kt_ext(k, 5, e2);
  ust__kt_kernel(k, 5, 0, 400, 430, "fa2");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_INT_EQ(st.n, 0);
  ASSERT_U64_EQ(atomic_load(&timed.prod.tsol_ps), 9000u - 1000u + 7000u);
  for (int i = 0; i < 5; i++)
    ust__figs_free(all[i]);
  ust__kt_destroy(k);
}

TEST(kernel_records_lost_or_stale_do_not_make_figures) {
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs a, b, c;
  ASSERT_INT_EQ(ust__figs_init(&a), 0);
  ASSERT_INT_EQ(ust__figs_init(&b), 0);
  ASSERT_INT_EQ(ust__figs_init(&c), 0);
  ust__kt_open(k);
  uint64_t ea, eb, ec;
  const int sa = ust__kt_begin(k, &ea), sb = ust__kt_begin(k, &eb);
  ust__kt_end(k, sb, &b, 0, 0);
  ust__kt_end(k, sa, &a, 0, 0);
  const int sc = ust__kt_begin(k, &ec);
  ust__kt_cancel(k, sc); /* raised, or served by a candidate: not production's time */
  /* a launched two kernels (driver launches), one record of which never
   * came: no figure */
  ust__kt_ext(k, 1, ea);
  ust__kt_launch(k, 1, UST__KT_LAUNCH_DRIVER);
  ust__kt_launch(k, 2, UST__KT_LAUNCH_DRIVER); /* the launch record before its external id's */
  ust__kt_ext(k, 2, ea);
  ust__kt_ext(k, 5, ea); /* an API call that is no launch (cudaGetDevice): no kernel expected */
  ust__kt_kernel(k, 1, 0, 10, 20, "k");
  /* b's kernel came without timestamps (the tracer ran out of memory) */
  ust__kt_ext(k, 3, eb);
  ust__kt_launch(k, 3, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 3, 0, 0, 0, "k");
  ust__kt_ext(k, 4, ec);
  ust__kt_launch(k, 4, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 4, 0, 30, 40, "k");
  ust__kt_close(k);
  /* the window waits for a's second kernel and b's (neither will come) */
  ASSERT_U64_EQ(ust__kt_outstanding(k), 2);
  ust__kt_conclude(k, 1000, 1.0);
  /* a's parent is -1 and b nests in a: b's loss makes a incomplete too */
  ASSERT_U64_EQ(hist_count(&a), 0);
  ASSERT_U64_EQ(hist_count(&b), 0);
  ASSERT_U64_EQ(hist_count(&c), 0);
  ASSERT_U64_EQ(atomic_load(&a.timing_dropped), 1);
  ASSERT_U64_EQ(atomic_load(&b.timing_dropped), 1);
  ASSERT_U64_EQ(atomic_load(&a.kernel_lost) + atomic_load(&b.kernel_lost), 2); /* dropped for lost records */
  ASSERT_U64_EQ(atomic_load(&c.timing_dropped), 0);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.calls_dropped, 2);
  ASSERT_U64_EQ(t.calls_timed, 0);
  ASSERT_TRUE(t.records_lost >= 2);
  /* the next window: records naming the last one's ids are ignored */
  ust__kt_open(k);
  uint64_t e2;
  const int s2 = ust__kt_begin(k, &e2);
  ust__kt_end(k, s2, &c, 0, 0);
  ust__kt_ext(k, 9, ea); /* stale: the old window's id */
  ust__kt_kernel(k, 9, 0, 100, 200, "late");
  /* a runtime launch that made a driver launch of its own: one kernel, the
   * runtime launch's id; complete */
  ust__kt_ext(k, 10, e2);
  ust__kt_launch(k, 10, UST__KT_LAUNCH_RUNTIME);
  ust__kt_ext(k, 11, e2);
  ust__kt_launch(k, 11, UST__KT_LAUNCH_DRIVER);
  ASSERT_U64_EQ(ust__kt_outstanding(k), 1);
  ust__kt_kernel(k, 10, 0, 300, 330, "k");
  ASSERT_U64_EQ(ust__kt_outstanding(k), 0);
  ust__kt_close(k);
  /* records in another client's clock of 2 ticks a ns: 30 ticks are 15 ns */
  ust__kt_conclude(k, 1000, 0.5);
  ASSERT_U64_EQ(hist_count(&c), 1);
  ASSERT_U64_EQ(hist_sum(&c), 15);
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.windows, 2);
  ASSERT_STR_EQ(t.names[0].name, "late"); /* its kernel ran: time no call claimed */
  ust__figs_free(&a);
  ust__figs_free(&b);
  ust__figs_free(&c);
  ust__kt_destroy(k);
}

typedef struct slot_hammer {
  ust__kt *k;
  ust__figs *figs;
  atomic_int *stop;
  atomic_long *all_taken;
  long taken;
} slot_hammer;

static void *hammer(void *arg) {
  slot_hammer *h = arg;
  while (!atomic_load(h->stop)) {
    uint64_t ext;
    const int s = ust__kt_begin(h->k, &ext);
    if (s >= 0) {
      h->taken++;
      ust__kt_end(h->k, s, h->figs, 0, 0);
      atomic_fetch_add(h->all_taken, 1);
    } else {
      sched_yield(); /* no window: let the worker (and, under Valgrind, everyone) run */
    }
  }
  return NULL;
}

TEST(kernel_windows_never_reuse_a_slot_in_flight) {
  /* Serving threads take and end slots while windows open and close: a
   * window concludes only once quiet, every call that took a slot is
   * concluded exactly once (ThreadSanitizer checks the handover). */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs f;
  ASSERT_INT_EQ(ust__figs_init(&f), 0);
  atomic_int stop = 0;
  atomic_long all_taken = 0;
  pthread_t th[4];
  slot_hammer h[4];
  for (int i = 0; i < 4; i++) {
    h[i] = (slot_hammer){k, &f, &stop, &all_taken, 0};
    pthread_create(&th[i], NULL, hammer, &h[i]);
  }
  for (int w = 0; w < 100; w++) {
    const long before = atomic_load(&all_taken);
    ust__kt_open(k);
    /* open until a call took a slot in it, however long the serving
     * threads take to be scheduled (a serialising checker such as Valgrind
     * runs one thread at a time; a loaded machine may not run them for a
     * while): every window sees a handover */
    while (atomic_load(&all_taken) == before)
      usleep(1000);
    ust__kt_close(k);
    while (!ust__kt_quiet(k)) {
    }
    ust__kt_conclude(k, 1, 1.0);
  }
  atomic_store(&stop, 1);
  long taken = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    taken += h[i].taken;
  }
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  /* no launches: every call concluded once, as one without kernels */
  ASSERT_U64_EQ(t.calls_empty, (uint64_t)taken);
  ASSERT_U64_EQ(t.calls_timed + t.calls_dropped, 0);
  ASSERT_TRUE(taken >= 100);
  ASSERT_U64_EQ(hist_count(&f), 0);
  ASSERT_U64_EQ(t.windows, 100);
  ust__figs_free(&f);
  ust__kt_destroy(k);
}

TEST(kernel_windows_keep_to_their_budget) {
  /* 10 000 kernels at 3 us of added launch cost each cost 30 ms; within 1 %
   * of host time the next window opens 3 s after this one did */
  ASSERT_U64_EQ(ust__kt_next_open(5000000000ull, 100000000ull, 10000, 3000.0, 0.01, 100000000ull),
                5000000000ull + 3000000000ull);
  /* few kernels: never closer than the window and the minimum gap */
  ASSERT_U64_EQ(ust__kt_next_open(0, 100000000ull, 10, 3000.0, 0.01, 100000000ull), 200000000ull);
  /* no budget: back to back but for the gap */
  ASSERT_U64_EQ(ust__kt_next_open(0, 100000000ull, 1000000, 3000.0, 0, 0), 100000000ull);
  /* the cost over the period stays within the budget */
  const uint64_t next = ust__kt_next_open(0, 50000000ull, 123457, 2500.0, 0.02, 0);
  ASSERT_TRUE(123457 * 2500.0 / (double)next <= 0.02 + 1e-12);
}

TEST(kernel_graph_replays_are_their_captured_calls) {
  /* Two calls captured into graph 7 (CUPTI's ids: the graph's id above the
   * node's index): the first added nodes 0 and 1, the second node 2; an
   * unbound op node 3. Its executable graph, instantiated at capture end, is
   * graph 8 with the same indices: replays carry 8:0..8:3. Graph 10's
   * executable 11 has a node 11:0 of a graph no captured call was seen in.
   * Two launches of graph 8 in a window: each runs each captured call once
   * more. An eager call beside them is timed as usual. */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs a, b, e;
  ASSERT_INT_EQ(ust__figs_init(&a), 0);
  ASSERT_INT_EQ(ust__figs_init(&b), 0);
  ASSERT_INT_EQ(ust__figs_init(&e), 0);
  const uint64_t g = 7ull << 32, x = 8ull << 32;
  const uint64_t na[] = {g | 0, g | 1}, nb[] = {g | 2};
  ASSERT_INT_EQ(ust__kt_graph_call(k, na, 2, 2, &a, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, nb, 1, 1, &b, 0), 0);
  ust__kt_open(k);
  uint64_t ext;
  const int s = ust__kt_begin(k, &ext);
  ust__kt_end(k, s, &e, 0, 0);
  for (uint32_t launch = 50; launch <= 51; launch++) {
    const uint64_t t = launch * 10000;
    ust__kt_launch(k, launch, UST__KT_LAUNCH_RUNTIME); /* cudaGraphLaunch, outside any call */
    ust__kt_kernel(k, launch, x | 0, t, t + 100, "a_first");
    ust__kt_kernel(k, launch, x | 1, t + 200, t + 250, "a_second");
    ust__kt_kernel(k, launch, x | 2, t + 300, t + 330, "b_only");
    ust__kt_kernel(k, launch, x | 3, t + 400, t + 470, "unbound_node");
  }
  ust__kt_launch(k, 52, UST__KT_LAUNCH_RUNTIME); /* another graph's launch */
  ust__kt_kernel(k, 52, 11ull << 32, 800000, 800020, "other_graph");
  ust__kt_kernel(k, 52, g | 0, 800100, 800120, "not_a_replay_id"); /* never reported as such; not counted */
  ust__kt_ext(k, 60, ext);
  ust__kt_launch(k, 60, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 60, 0, 900000, 900040, "eager");
  ust__kt_close(k);
  ASSERT_U64_EQ(ust__kt_outstanding(k), 0);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_U64_EQ(atomic_load(&a.replayed), 2);
  ASSERT_U64_EQ(hist_count(&a), 2);
  ASSERT_U64_EQ(hist_sum(&a), 2 * (100 + 50));
  ASSERT_U64_EQ(atomic_load(&a.kernel_span_ns), 2 * 250);
  ASSERT_U64_EQ(atomic_load(&a.kernels), 2 * 2); /* two nodes a replay */
  ASSERT_U64_EQ(atomic_load(&b.replayed), 2);
  ASSERT_U64_EQ(hist_sum(&b), 2 * 30);
  ASSERT_U64_EQ(hist_sum(&e), 40);
  ASSERT_U64_EQ(atomic_load(&e.replayed), 0);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.calls_replayed, 4);
  ASSERT_U64_EQ(t.calls_timed, 1);
  ASSERT_U64_EQ(t.kernel_ns, 2 * (100 + 50 + 30 + 70) + 20 + 20 + 40);
  ASSERT_U64_EQ(t.attributed_ns, 2 * (100 + 50 + 30) + 40);
  ASSERT_STR_EQ(t.names[0].name, "unbound_node");
  ASSERT_U64_EQ(t.names[0].ns, 2 * 70);
  ASSERT_INT_EQ(t.n_names, 3); /* with other_graph and not_a_replay_id */
  /* graph 8's unbound node ran in a graph a bound op was captured into;
   * 11 and 7 are no executable graph of one */
  ASSERT_U64_EQ(t.graph_unknown, 2);
  ASSERT_U64_EQ(t.graph_unknown_ns, 20 + 20);
  ust__figs_free(&a);
  ust__figs_free(&b);
  ust__figs_free(&e);
  ust__kt_destroy(k);
}

TEST(kernel_graph_replays_of_unseen_graphs_count_on_the_routes_that_run_their_kernels) {
  /* A graph captured before enable() (no captured call: graph 11's nodes
   * are unknown) runs kernels by name. Route a's eager call ran "gemv", b's
   * "gemv" and "fill"; a call the candidate served ran "cand" (not
   * production's: learned by no route). The graph's "gemv" counts on a and
   * b, its "fill" on b, "cand" and "other" on none; names are kept across
   * windows. Graphs understudy made while graph 40 was captured (ids 41..44:
   * a shadow's body) are its own: their kernels are neither unknown nor
   * unseen, whatever their names. */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs a, b;
  ASSERT_INT_EQ(ust__figs_init(&a), 0);
  ASSERT_INT_EQ(ust__figs_init(&b), 0);
  ust__kt_open(k);
  uint64_t ea, eb, ec;
  const int sa = ust__kt_begin(k, &ea);
  ust__kt_end(k, sa, &a, 0, 0);
  const int sb = ust__kt_begin(k, &eb);
  ust__kt_end(k, sb, &b, 0, 0);
  const int sc = ust__kt_begin(k, &ec);
  ust__kt_cancel(k, sc);
  const uint64_t unseen = 12ull << 32;
  ust__kt_graph_made(k, 40, 44);
  ust__kt_launch(k, 51, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 51, (43ull << 32) | 0, 600, 620, "gemv");
  ust__kt_kernel(k, 51, (44ull << 32) | 1, 700, 703, "compare");
  ust__kt_kernel(k, 50, unseen | 0, 100, 130, "gemv"); /* the replay's records before the eager ones */
  ust__kt_kernel(k, 50, unseen | 1, 200, 205, "fill");
  ust__kt_kernel(k, 50, unseen | 2, 300, 307, "cand");
  ust__kt_kernel(k, 50, unseen | 3, 400, 409, "other");
  ust__kt_launch(k, 50, UST__KT_LAUNCH_RUNTIME);
  ust__kt_ext(k, 11, ea);
  ust__kt_kernel(k, 11, 0, 1000, 1040, "gemv");
  ust__kt_ext(k, 12, eb);
  ust__kt_kernel(k, 12, 0, 2000, 2040, "gemv");
  ust__kt_ext(k, 13, eb);
  ust__kt_kernel(k, 13, 0, 2100, 2110, "fill");
  ust__kt_ext(k, 14, ec);
  ust__kt_kernel(k, 14, 0, 3000, 3020, "cand");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_U64_EQ(atomic_load(&a.unseen_kernels), 1);
  ASSERT_U64_EQ(atomic_load(&a.unseen_ns), 30);
  ASSERT_U64_EQ(atomic_load(&b.unseen_kernels), 2);
  ASSERT_U64_EQ(atomic_load(&b.unseen_ns), 30 + 5);
  ASSERT_U64_EQ(atomic_load(&a.replayed), 0);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.graph_unknown, 4);
  ASSERT_U64_EQ(t.graph_own, 2);
  ASSERT_U64_EQ(t.graph_own_ns, 20 + 3);
  /* a window of replays alone: the names learned before still count */
  ust__kt_open(k);
  ust__kt_launch(k, 60, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 60, unseen | 0, 5000, 5050, "gemv");
  ust__kt_kernel(k, 60, unseen | 2, 5100, 5110, "cand");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_U64_EQ(atomic_load(&a.unseen_kernels), 2);
  ASSERT_U64_EQ(atomic_load(&a.unseen_ns), 30 + 50);
  ASSERT_U64_EQ(atomic_load(&b.unseen_kernels), 3);
  ASSERT_U64_EQ(atomic_load(&b.unseen_ns), 30 + 5 + 50);
  ust__figs_free(&a);
  ust__figs_free(&b);
  ust__kt_destroy(k);
}

TEST(kernel_graphs_made_during_captures_are_understudys_own) {
  /* Captures 40 (made graphs up to 44, then up to 47), 10 (up to 12) and
   * 60 (up to 61), told out of order: ids 41..47, 11..12 and 61 are
   * understudy's own; 48, 13 and 62 are not (their kernels unknown). Then
   * 47 up to 60 joins 41..47, 48..60 and 61 into one, and 2 up to 70
   * swallows every range: 48 and 13 are own, 71 not. */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__kt_graph_made(k, 40, 44);
  ust__kt_graph_made(k, 60, 61);
  ust__kt_graph_made(k, 10, 12);
  ust__kt_graph_made(k, 40, 47);
  ust__kt_open(k);
  ust__kt_launch(k, 70, UST__KT_LAUNCH_RUNTIME);
  const uint32_t ids[] = {41, 45, 47, 11, 12, 61, 48, 13, 62, 40};
  for (uint32_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    ust__kt_kernel(k, 70, ((uint64_t)ids[i] << 32) | i, 1000 * (i + 1), 1000 * (i + 1) + 10 + i, "k");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.graph_own, 6);
  ASSERT_U64_EQ(t.graph_own_ns, 6 * 10 + 0 + 1 + 2 + 3 + 4 + 5);
  ASSERT_U64_EQ(t.graph_unknown, 4);
  ust__kt_graph_made(k, 47, 60);
  ust__kt_open(k);
  ust__kt_launch(k, 71, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 71, (48ull << 32) | 0, 100, 110, "k");
  ust__kt_kernel(k, 71, (55ull << 32) | 0, 200, 210, "k");
  ust__kt_kernel(k, 71, (13ull << 32) | 0, 300, 310, "k");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.graph_own, 6 + 2);
  ASSERT_U64_EQ(t.graph_unknown, 4 + 1);
  ust__kt_graph_made(k, 2, 70);
  ust__kt_open(k);
  ust__kt_launch(k, 72, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 72, (13ull << 32) | 0, 100, 110, "k");
  ust__kt_kernel(k, 72, (3ull << 32) | 0, 200, 210, "k");
  ust__kt_kernel(k, 72, (70ull << 32) | 0, 300, 310, "k");
  ust__kt_kernel(k, 72, (71ull << 32) | 0, 400, 410, "k");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.graph_own, 8 + 3);
  ASSERT_U64_EQ(t.graph_unknown, 5 + 1);
  ust__kt_destroy(k);
}

TEST(kernel_graphs_changed_in_place_count_on_the_captured_calls_they_change) {
  /* Calls a (nodes 7:0, 7:1) and b (7:2) captured into graph 7, whose
   * executable graph 30 CUPTI named; c (20:0) into graph 20, its executable
   * inferred as 21. A node set in 30 counts on its call; 30 updated whole
   * on each of its calls not counted yet; 21 updated on c; an unknown
   * executable graph or node on none; a call counts once, however often
   * its nodes change. */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs a, b, c;
  ASSERT_INT_EQ(ust__figs_init(&a), 0);
  ASSERT_INT_EQ(ust__figs_init(&b), 0);
  ASSERT_INT_EQ(ust__figs_init(&c), 0);
  const uint64_t g = 7ull << 32, h = 20ull << 32;
  const uint64_t na[] = {g | 0, g | 1}, nb[] = {g | 2}, nc[] = {h | 0};
  ASSERT_INT_EQ(ust__kt_graph_call(k, na, 2, 2, &a, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, nb, 1, 1, &b, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, nc, 1, 1, &c, 0), 0);
  ust__kt_graph_exec(k, 7, 30);
  ust__kt_exec_changed(k, 30, g | 1);
  ASSERT_U64_EQ(atomic_load(&a.graph_changed), 1);
  ASSERT_U64_EQ(atomic_load(&b.graph_changed), 0);
  ust__kt_exec_changed(k, 30, g | 0);
  ust__kt_exec_changed(k, 30, 0);
  ASSERT_U64_EQ(atomic_load(&a.graph_changed), 1);
  ASSERT_U64_EQ(atomic_load(&b.graph_changed), 1);
  ASSERT_U64_EQ(atomic_load(&c.graph_changed), 0);
  ust__kt_exec_changed(k, 21, 0);
  ASSERT_U64_EQ(atomic_load(&c.graph_changed), 1);
  ust__kt_exec_changed(k, 21, 0);
  ust__kt_exec_changed(k, 99, 0);
  ust__kt_exec_changed(k, 30, (5ull << 32) | 3);
  ASSERT_U64_EQ(atomic_load(&a.graph_changed) + atomic_load(&b.graph_changed) + atomic_load(&c.graph_changed), 3);
  ust__figs_free(&a);
  ust__figs_free(&b);
  ust__figs_free(&c);
  ust__kt_destroy(k);
}

TEST(kernel_graph_replays_missing_records_interleaved_captures_and_launches_inside_calls) {
  /* (1) a replay of a captured call whose kernel records did not all come is
   * dropped and counted, not timed from part of them; (2) graphs 20 and 21
   * captured at the same time (their calls interleave): the executable graph
   * after either need not be its own, so neither is followed, unless the
   * instantiation was seen; (3) a graph
   * launched inside a call of the window: its replayed nodes are their
   * captured call's, and the launching call (complete: its one launch ran
   * kernels) includes their time. */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs a, p, q, outer;
  ASSERT_INT_EQ(ust__figs_init(&a), 0);
  ASSERT_INT_EQ(ust__figs_init(&p), 0);
  ASSERT_INT_EQ(ust__figs_init(&q), 0);
  ASSERT_INT_EQ(ust__figs_init(&outer), 0);
  const uint64_t g = 7ull << 32, x = 8ull << 32;
  const uint64_t na[] = {g | 0, g | 1};
  ASSERT_INT_EQ(ust__kt_graph_call(k, na, 2, 2, &a, 0), 0);
  const uint64_t p0[] = {20ull << 32 | 0}, q0[] = {21ull << 32 | 0}, p1[] = {20ull << 32 | 1};
  ASSERT_INT_EQ(ust__kt_graph_call(k, p0, 1, 1, &p, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, q0, 1, 1, &q, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, p1, 1, 1, &p, 0), 0);
  ust__kt_graph_exec(k, 21, 22); /* known from CUPTI's resource callback: 22 is 21's, for certain */
  ust__kt_open(k);
  /* (1) launch 70 ran both of a's kernels, launch 71 lost one */
  ust__kt_launch(k, 70, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 70, x | 0, 1000, 1100, "a0");
  ust__kt_kernel(k, 70, x | 1, 1200, 1250, "a1");
  ust__kt_launch(k, 71, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 71, x | 0, 2000, 2100, "a0");
  /* (2) the executable graphs after 20 and 21 */
  ust__kt_launch(k, 72, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 72, 21ull << 32 | 0, 3000, 3010, "p_or_q");
  ust__kt_kernel(k, 72, 22ull << 32 | 0, 3100, 3110, "q_or_p");
  /* (3) a call of the window launches graph 8 */
  uint64_t ext;
  const int s = ust__kt_begin(k, &ext);
  ust__kt_ext(k, 73, ext);
  ust__kt_launch(k, 73, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 73, x | 0, 4000, 4100, "a0");
  ust__kt_kernel(k, 73, x | 1, 4200, 4250, "a1");
  ust__kt_end(k, s, &outer, 0, 0);
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_U64_EQ(atomic_load(&a.replayed), 2); /* launches 70 and 73 */
  ASSERT_U64_EQ(hist_sum(&a), 2 * 150);
  ASSERT_U64_EQ(atomic_load(&a.timing_dropped), 1); /* launch 71 */
  ASSERT_U64_EQ(atomic_load(&p.replayed), 0); /* 21's replays could be of 20's: not followed */
  ASSERT_U64_EQ(atomic_load(&q.replayed), 1); /* 22 is known to be 21's */
  ASSERT_U64_EQ(hist_count(&outer), 1);
  ASSERT_U64_EQ(hist_sum(&outer), 150);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.calls_replayed, 3);
  ASSERT_U64_EQ(t.calls_timed, 1);
  ASSERT_U64_EQ(t.calls_dropped, 1);
  ASSERT_U64_EQ(t.attributed_ns, 150 + 100 + 10 + 150); /* each kernel once, the outer call's too */
  ust__figs_free(&a);
  ust__figs_free(&p);
  ust__figs_free(&q);
  ust__figs_free(&outer);
  ust__kt_destroy(k);
}

TEST(kernel_graph_replays_follow_the_graph_whose_capture_made_graphs_of_its_own) {
  /* A captured shadow's parts take graph ids while graph 30 is captured
   * (31..45 here): its executable graph is 46, not 31 (seen on an H200).
   * ust__kt_graph_made says so; the rule holds only for a graph captured
   * alone, and what CUPTI's resource callback says beats it. */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs a, p, q;
  ASSERT_INT_EQ(ust__figs_init(&a), 0);
  ASSERT_INT_EQ(ust__figs_init(&p), 0);
  ASSERT_INT_EQ(ust__figs_init(&q), 0);
  const uint64_t na[] = {30ull << 32 | 0}, nb[] = {30ull << 32 | 3};
  ASSERT_INT_EQ(ust__kt_graph_call(k, na, 1, 1, &a, 0), 0); /* production, before the first part */
  ASSERT_INT_EQ(ust__kt_graph_call(k, nb, 1, 1, &a, 0), 0); /* after it */
  ust__kt_graph_made(k, 30, 40);
  ust__kt_graph_made(k, 30, 45); /* a later call's parts: the last one counts */
  /* graphs 50 and 51 captured at once, both making graphs of their own */
  const uint64_t p0[] = {50ull << 32 | 0}, q0[] = {51ull << 32 | 0}, p1[] = {50ull << 32 | 1};
  ASSERT_INT_EQ(ust__kt_graph_call(k, p0, 1, 1, &p, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, q0, 1, 1, &q, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, p1, 1, 1, &p, 0), 0);
  ust__kt_graph_made(k, 50, 60); /* 61 would be 50's; not followed: 51 was captured beside it */
  ust__kt_graph_exec(k, 51, 70); /* certain */
  ust__kt_graph_made(k, 50, 69); /* does not override it */
  ust__kt_open(k);
  ust__kt_launch(k, 80, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 80, 46ull << 32 | 0, 1000, 1100, "prod0");
  ust__kt_kernel(k, 80, 46ull << 32 | 11, 1150, 1190, "candidate_in_body"); /* the exec's own body node */
  ust__kt_kernel(k, 80, 46ull << 32 | 3, 1200, 1230, "prod1");
  ust__kt_launch(k, 81, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 81, 41ull << 32 | 0, 2000, 2010, "after_an_earlier_part"); /* 41 is not an executable graph of 30 */
  ust__kt_launch(k, 82, UST__KT_LAUNCH_RUNTIME);
  ust__kt_kernel(k, 82, 61ull << 32 | 0, 3000, 3010, "p_or_q");
  ust__kt_kernel(k, 82, 70ull << 32 | 0, 3100, 3120, "q");
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_U64_EQ(atomic_load(&a.replayed), 2); /* one launch ran both of a's calls */
  ASSERT_U64_EQ(hist_count(&a), 2);
  ASSERT_U64_EQ(hist_sum(&a), 100 + 30);
  ASSERT_U64_EQ(atomic_load(&p.replayed), 0);
  ASSERT_U64_EQ(atomic_load(&q.replayed), 1);
  ASSERT_U64_EQ(hist_sum(&q), 20);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.calls_replayed, 3);
  ASSERT_U64_EQ(t.attributed_ns, 100 + 30 + 20);
  ust__figs_free(&a);
  ust__figs_free(&p);
  ust__figs_free(&q);
  ust__kt_destroy(k);
}

TEST(kernel_launches_known_from_callbacks_join_without_external_ids) {
  /* Callbacks mode: the launch API's callback runs on the launching thread
   * and names the thread's current call; no external id is pushed. A
   * runtime launch that makes a driver launch of its own (two callbacks, one
   * kernel) is complete; a launch outside any call names none. Each launch
   * carries the launching thread's phase: kernel time is counted by it. */
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  ust__figs f;
  ASSERT_INT_EQ(ust__figs_init(&f), 0);
  ust__kt_open(k);
  ASSERT_INT_EQ(ust__kt_current(), -1);
  uint64_t ext;
  const int s = ust__kt_begin(k, &ext);
  ASSERT_INT_EQ(ust__kt_current(), s);
  ust__kt_launch_of(k, 70, ust__kt_current(), UST__KT_LAUNCH_RUNTIME, UST_PHASE_DECODE);
  ust__kt_launch_of(k, 71, ust__kt_current(), UST__KT_LAUNCH_DRIVER, UST_PHASE_DECODE);
  ust__kt_launch_of(k, 72, ust__kt_current(), UST__KT_LAUNCH_DRIVER, UST_PHASE_DECODE); /* a second kernel (cuBLAS's split-K) */
  ust__kt_end(k, s, &f, 0, 0);
  ASSERT_INT_EQ(ust__kt_current(), -1);
  ust__kt_launch_of(k, 73, ust__kt_current(), UST__KT_LAUNCH_RUNTIME, UST_PHASE_PREFILL); /* no call: its phase only */
  ASSERT_U64_EQ(ust__kt_outstanding(k), 2);
  ust__kt_kernel(k, 70, 0, 1000, 1300, "gemm");
  ust__kt_kernel(k, 72, 0, 1400, 1450, "splitk_reduce");
  ust__kt_kernel(k, 73, 0, 2000, 2100, "elsewhere");
  ASSERT_U64_EQ(ust__kt_outstanding(k), 0);
  ust__kt_close(k);
  ust__kt_conclude(k, 1000, 1.0);
  ASSERT_U64_EQ(hist_count(&f), 1);
  ASSERT_U64_EQ(hist_sum(&f), 300 + 50);
  ASSERT_U64_EQ(atomic_load(&f.kernel_span_ns), 450);
  ust__kt_totals t;
  ust__kt_totals_get(k, &t);
  ASSERT_U64_EQ(t.attributed_ns, 350);
  ASSERT_STR_EQ(t.names[0].name, "elsewhere");
  ASSERT_U64_EQ(t.phase_kernel_ns[UST_PHASE_DECODE], 350);
  ASSERT_U64_EQ(t.phase_attributed_ns[UST_PHASE_DECODE], 350);
  ASSERT_U64_EQ(t.phase_kernel_ns[UST_PHASE_PREFILL], 100);
  ASSERT_U64_EQ(t.phase_attributed_ns[UST_PHASE_PREFILL], 0);
  ASSERT_U64_EQ(t.phase_kernel_ns[UST_PHASE_UNKNOWN], 0);
  ust__figs_free(&f);
  ust__kt_destroy(k);
}
