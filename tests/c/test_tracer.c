/* The kernel tracer's state machine (dispatch/timer_cupti.c, CUDA builds)
 * against a stand-in libcupti (tests/c/fake_cupti.c), without a GPU:
 * windows, both ways of joining kernels to calls, another client's clock,
 * standing down and resuming, calls whose kernels never came, buffers CUPTI
 * keeps past a tracer. The expected figures are the durations the test
 * gives the stand-in's kernels. Time is the stand-in's clock, which the
 * test moves: a window is open or due when the test says, however slowly
 * the machine runs. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <cupti.h>

#include "dispatch/dispatch.h"
#include "fake_cupti.h"
#include "figs_probe.h"
#include "runner.h"

typedef struct fake {
  void (*reset)(CUptiResult, double);
  void (*hold_kernels)(int);
  void (*keep_buffer)(int);
  void (*release_buffer)(void);
  int (*enabled)(int);
  int (*subscribed)(void);
  int (*edge_gaps)(void);
  uint32_t (*call)(int, const char *, uint64_t);
  uint32_t (*graph_kernel)(uint32_t, uint64_t, const char *, uint64_t);
  int (*take_buffers)(int);
  void (*return_buffers)(void);
  void (*instantiate)(uint32_t, uint32_t);
  fake_clock clock;
} fake;

static atomic_int profiler_on;
static int profiler_active(void) { return atomic_load(&profiler_on); }

static ust__cupti *tracer(int callbacks, fake *f) {
  const ust__timer_opts o = {.kind = UST__TIMER_CUPTI, .window_ns = 50000000, .budget = 0,
                             .launch_cost_ns = 10000, .cupti_path = UST_FAKE_CUPTI,
                             .profiler_active = profiler_active, .callbacks = callbacks};
  f->clock = fake_clock_install();
  ust__cupti *c = NULL;
  ASSERT_INT_EQ(ust__cupti_create(&o, NULL, &c), 0);
  ASSERT_INT_EQ(ust__cupti_present(c), 1);
  void *h = dlopen(UST_FAKE_CUPTI, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_TRUE(h != NULL);
  *(void **)&f->reset = dlsym(h, "fake_cupti_reset");
  *(void **)&f->hold_kernels = dlsym(h, "fake_cupti_hold_kernels");
  *(void **)&f->keep_buffer = dlsym(h, "fake_cupti_keep_buffer");
  *(void **)&f->release_buffer = dlsym(h, "fake_cupti_release_buffer");
  *(void **)&f->enabled = dlsym(h, "fake_cupti_enabled");
  *(void **)&f->subscribed = dlsym(h, "fake_cupti_subscribed");
  *(void **)&f->edge_gaps = dlsym(h, "fake_cupti_edge_gaps");
  *(void **)&f->call = dlsym(h, "fake_cupti_call");
  *(void **)&f->graph_kernel = dlsym(h, "fake_cupti_graph_kernel");
  *(void **)&f->take_buffers = dlsym(h, "fake_cupti_take_buffers");
  *(void **)&f->return_buffers = dlsym(h, "fake_cupti_return_buffers");
  *(void **)&f->instantiate = dlsym(h, "fake_cupti_instantiate");
  ASSERT_TRUE(f->reset && f->hold_kernels && f->keep_buffer && f->release_buffer && f->enabled && f->call &&
              f->subscribed && f->edge_gaps && f->graph_kernel && f->take_buffers && f->return_buffers && f->instantiate);
  return c;
}

typedef struct rig {
  fake f;
  ust__cupti *c;
  ust__figs a, b;
} rig;

static void rig_up(rig *r, int callbacks, CUptiResult subscribe, double ticks_per_ns) {
  r->c = tracer(callbacks, &r->f);
  r->f.reset(subscribe, ticks_per_ns);
  ASSERT_INT_EQ(ust__figs_init(&r->a), 0);
  ASSERT_INT_EQ(ust__figs_init(&r->b), 0);
}

static void rig_down(rig *r) {
  ust__cupti_destroy(r->c);
  ust__figs_free(&r->a);
  ust__figs_free(&r->b);
}

/* One call launching one kernel of ns (runtime or driver launch). */
static void timed(rig *r, ust__figs *figs, int runtime, const char *name, uint64_t ns) {
  const int s = ust__cupti_begin(r->c);
  ASSERT_TRUE(s >= 0);
  r->f.call(runtime, name, ns);
  ust__cupti_end(r->c, s, figs, 0, 0);
}

/* One window: call A launches two kernels (runtime) and makes another API
 * call, call B one (driver); a kernel outside any call. */
static void one_window(rig *r) {
  ASSERT_INT_EQ(ust__cupti_poll(r->c, 1, 0), 1);
  ASSERT_INT_EQ(ust__cupti_tracing(r->c), UST__TRACING_WINDOW);
  const int s = ust__cupti_begin(r->c);
  ASSERT_TRUE(s >= 0);
  r->f.call(1, "gemm", 1000);
  r->f.call(1, NULL, 0);
  r->f.call(1, "splitk", 300);
  ust__cupti_end(r->c, s, &r->a, 0, 0);
  timed(r, &r->b, 0, "triton_rms", 500);
  r->f.call(1, "unbound_mul", 700);
  ust__cupti_poll(r->c, 1, 1); /* a report: closes and concludes the window */
  ASSERT_INT_EQ(ust__cupti_tracing(r->c), UST__TRACING_BETWEEN);
}

static void check_window(rig *r, const char *correlation) {
  ASSERT_U64_EQ(hist_sum(&r->a), 1300);
  ASSERT_U64_EQ(hist_count(&r->a), 1);
  ASSERT_U64_EQ(hist_sum(&r->b), 500);
  ASSERT_U64_EQ(hist_count(&r->b), 1);
  ASSERT_U64_EQ(atomic_load(&r->a.kernel_timed), 1);
  ust__timer_status st;
  ust__cupti_status(r->c, &st);
  ASSERT_STR_EQ(st.kind, "cupti");
  ASSERT_STR_EQ(st.correlation, correlation);
  ASSERT_U64_EQ(st.totals.windows, 2); /* an empty one first */
  ASSERT_U64_EQ(st.totals.calls_timed, 2);
  ASSERT_U64_EQ(st.totals.kernels, 4);
  ASSERT_STR_EQ(st.totals.names[0].name, "unbound_mul");
}

TEST(tracer_times_calls_by_their_kernels_through_records) {
  rig r;
  rig_up(&r, 0, CUPTI_SUCCESS, 1.0);
  /* the subscription is asked for, not held: a profiler starting during the
   * window must find CUPTI free */
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  ASSERT_INT_EQ(r.f.subscribed(), 0);
  ust__cupti_poll(r.c, 1, 1);
  r.f.clock.advance(200000000); /* the next window is due (50 ms open, 100 ms apart) */
  one_window(&r);
  check_window(&r, "records");
  /* between windows nothing is traced */
  ASSERT_TRUE(!r.f.enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) && !r.f.enabled(CUPTI_ACTIVITY_KIND_RUNTIME));
  rig_down(&r);
}

TEST(tracer_times_calls_by_their_kernels_through_callbacks) {
  rig r;
  rig_up(&r, 1, CUPTI_SUCCESS, 1.0);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  /* callbacks: kernel records only, no API records, no external ids */
  ASSERT_TRUE(r.f.enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  ASSERT_TRUE(!r.f.enabled(CUPTI_ACTIVITY_KIND_RUNTIME) && !r.f.enabled(CUPTI_ACTIVITY_KIND_DRIVER) &&
              !r.f.enabled(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION));
  ASSERT_INT_EQ(r.f.subscribed(), 1); /* held through the window: the callbacks need it */
  ust__cupti_poll(r.c, 1, 1);
  ASSERT_INT_EQ(r.f.subscribed(), 0); /* and let go when it closes */
  r.f.clock.advance(200000000);
  const int prev = ust_set_phase(UST_PHASE_DECODE); /* the launching thread's phase, seen by the callbacks */
  one_window(&r);
  ust_set_phase(prev);
  check_window(&r, "callbacks");
  ust__timer_status st;
  ust__cupti_status(r.c, &st);
  ASSERT_U64_EQ(st.totals.phase_kernel_ns[UST_PHASE_DECODE], st.totals.kernel_ns);
  ASSERT_U64_EQ(st.totals.phase_attributed_ns[UST_PHASE_DECODE], st.totals.attributed_ns);
  ASSERT_TRUE(st.totals.kernel_ns > st.totals.attributed_ns && st.totals.attributed_ns > 0);
  /* the launch callbacks bracket the kernel records at both edges of each
   * window: no kernel can arrive without its launch's call and phase */
  ASSERT_INT_EQ(r.f.edge_gaps(), 0);
  rig_down(&r);
}

TEST(tracer_converts_records_in_another_clients_clock) {
  /* torch's profiler registers its own clock (TSC ticks, about 2.1 a ns):
   * the records' durations are converted by the ratio over the window */
  rig r;
  rig_up(&r, 0, CUPTI_SUCCESS, 2.1);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  /* a window long enough to know the ratio to 0.1 %: the clock's readings
   * around CUPTI's are 1 ms apart (its step) */
  r.f.clock.advance(5000000000ull);
  timed(&r, &r.a, 1, "gemm", 1300);
  timed(&r, &r.b, 0, "triton_rms", 500);
  ust__cupti_poll(r.c, 1, 1);
  ASSERT_DBL_NEAR((double)hist_sum(&r.a), 1300.0, 1300.0 * 0.02);
  ASSERT_DBL_NEAR((double)hist_sum(&r.b), 500.0, 500.0 * 0.02);
  ust__timer_status st;
  ust__cupti_status(r.c, &st);
  ASSERT_DBL_NEAR(st.ns_per_tick, 1 / 2.1, 0.01);
  rig_down(&r);
}

TEST(tracer_stands_down_for_the_profiler_and_resumes) {
  rig r;
  rig_up(&r, 0, CUPTI_SUCCESS, 1.0);
  atomic_store(&profiler_on, 1);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 0);
  ust__timer_status st;
  ust__cupti_status(r.c, &st);
  ASSERT_STR_EQ(st.state, "yielded");
  ASSERT_STR_EQ(st.why, "torch's profiler is recording");
  ASSERT_INT_EQ(ust__cupti_tracing(r.c), UST__TRACING_OFF); /* events time the calls */
  ASSERT_TRUE(!r.f.enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)); /* the profiler's CUPTI is left alone */
  atomic_store(&profiler_on, 0);
  r.f.clock.advance(1100000000); /* it asks again a second later */
  ust__cupti_poll(r.c, 1, 0);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  ASSERT_INT_EQ(ust__cupti_tracing(r.c), UST__TRACING_WINDOW);
  /* a profiler starting during a window closes it at the next poll */
  atomic_store(&profiler_on, 1);
  ust__cupti_poll(r.c, 1, 0);
  ASSERT_TRUE(ust__cupti_tracing(r.c) != UST__TRACING_WINDOW);
  ust__cupti_status(r.c, &st);
  ASSERT_U64_EQ(st.windows_cut, 1);
  atomic_store(&profiler_on, 0);
  rig_down(&r);
}

TEST(tracer_yields_to_an_injected_tool_not_to_an_idle_subscriber) {
  /* a subscriber is there (torch's profiler subscribed at its first trace
   * and stayed): while the profiler is idle the tracer goes ahead */
  rig r;
  rig_up(&r, 0, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, 1.0);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  ASSERT_INT_EQ(ust__cupti_tracing(r.c), UST__TRACING_WINDOW);
  ust__cupti_poll(r.c, 1, 1);
  /* Nsight injected into the process holds it: the tracer stands down */
  setenv("CUDA_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so", 1);
  r.f.clock.advance(200000000); /* the next window is due (50 ms open, 100 ms apart) */
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 0);
  ust__timer_status st;
  ust__cupti_status(r.c, &st);
  ASSERT_STR_EQ(st.state, "yielded");
  ASSERT_STR_EQ(st.why, "a CUDA tool injected into the process holds CUPTI");
  unsetenv("CUDA_INJECTION64_PATH");
  rig_down(&r);
}

TEST(tracer_drops_calls_whose_kernels_never_came) {
  /* kernels still queued when the window concludes (a report closing it):
   * the call is dropped and counted, not timed from a partial record */
  rig r;
  rig_up(&r, 0, CUPTI_SUCCESS, 1.0);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  r.f.hold_kernels(1);
  timed(&r, &r.a, 1, "queued_gemm", 1000);
  r.f.clock.step(50000000); /* the wait below reaches its end in 40 readings */
  ust__cupti_poll(r.c, 1, 1); /* waits at most 2 s for the kernel, then concludes */
  ASSERT_U64_EQ(hist_count(&r.a), 0);
  ASSERT_U64_EQ(atomic_load(&r.a.timing_dropped), 1);
  ust__timer_status st;
  ust__cupti_status(r.c, &st);
  ASSERT_U64_EQ(st.totals.calls_dropped, 1);
  ASSERT_TRUE(st.totals.records_lost >= 1);
  rig_down(&r);
}

TEST(tracer_buffers_outlive_the_tracer_they_were_handed_out_for) {
  /* CUPTI keeps a buffer past the tracer (and its window): a later tracer
   * never hands it out again while CUPTI has it, and reads it safely when it
   * comes back (AddressSanitizer checks the memory) */
  rig r;
  rig_up(&r, 0, CUPTI_SUCCESS, 1.0);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  r.f.keep_buffer(1);
  timed(&r, &r.a, 1, "kept", 1000);
  r.f.clock.step(50000000); /* the kept kernel never comes: the drain's 2 s in 40 readings */
  ust__cupti_poll(r.c, 1, 1);
  r.f.clock.step(1000000);
  ust__cupti_destroy(r.c);
  r.c = tracer(0, &r.f);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  r.f.release_buffer(); /* the old buffer comes back to the new tracer, late */
  timed(&r, &r.b, 1, "fresh", 400);
  ust__cupti_poll(r.c, 1, 1);
  ASSERT_U64_EQ(hist_sum(&r.b), 400);
  ASSERT_U64_EQ(hist_count(&r.b), 1);
  rig_down(&r);
}

TEST(tracer_times_graph_replays_of_captured_calls) {
  /* At capture the router hands the tracer the nodes a call added (CUDA
   * node handles; CUPTI gives their ids): graph 7's nodes 0 and 1. Replays
   * report the executable graph's: 8:0 and 8:1, one correlation id per
   * launch. Two launches in a window are two replayed calls of the route,
   * each timed by its two kernels; a node of a graph no call was captured
   * in (9:0) is unattributed. */
  rig r;
  rig_up(&r, 1, CUPTI_SUCCESS, 1.0);
  const uint64_t g = 7ull << 32, x = 8ull << 32;
  void *const nodes[] = {(void *)(uintptr_t)(g | 0), (void *)(uintptr_t)(g | 1)};
  uint64_t ids[2] = {0, 0};
  ASSERT_INT_EQ(ust__cupti_maps_graphs(r.c), 1);
  ASSERT_INT_EQ(ust__cupti_node_ids(r.c, nodes, 2, ids), 0);
  ASSERT_U64_EQ(ids[0], g | 0);
  ASSERT_U64_EQ(ids[1], g | 1);
  ASSERT_INT_EQ(ust__cupti_graph_call(r.c, ids, 2, 2, &r.a, 0), 0);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  for (int launch = 0; launch < 2; launch++) {
    const uint32_t corr = r.f.graph_kernel(0, x | 0, "gemm", 300);
    r.f.graph_kernel(corr, x | 1, "splitk", 200);
    r.f.graph_kernel(corr, (9ull << 32) | 0, "other_graph", 50);
  }
  ust__cupti_poll(r.c, 1, 1);
  ASSERT_U64_EQ(atomic_load(&r.a.replayed), 2);
  ASSERT_U64_EQ(hist_count(&r.a), 2);
  ASSERT_U64_EQ(hist_sum(&r.a), 2 * 500);
  /* graph 7 instantiated again later, as executable graph 12, while a
   * window holds the subscription: CUPTI's resource callback says so, and
   * its replays are graph 7's calls though 11 is not a captured graph */
  r.f.clock.advance(200000000);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  r.f.instantiate(7, 12);
  const uint32_t late = r.f.graph_kernel(0, 12ull << 32 | 0, "gemm", 300);
  r.f.graph_kernel(late, 12ull << 32 | 1, "splitk", 200);
  ust__cupti_poll(r.c, 1, 1);
  ASSERT_U64_EQ(atomic_load(&r.a.replayed), 3);
  ASSERT_U64_EQ(hist_sum(&r.a), 3 * 500);
  /* graph 30, captured with a shadow whose parts took ids up to 44 (the
   * router's probe graph is 44): its executable graph is 45 */
  const uint64_t g30 = 30ull << 32;
  void *const nodes30[] = {(void *)(uintptr_t)(g30 | 2)};
  ASSERT_INT_EQ(ust__cupti_node_ids(r.c, nodes30, 1, ids), 0);
  ASSERT_INT_EQ(ust__cupti_graph_call(r.c, ids, 1, 1, &r.b, 0), 0);
  ust__cupti_graph_made(r.c, (void *)(uintptr_t)30, (void *)(uintptr_t)44);
  r.f.clock.advance(200000000);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  r.f.graph_kernel(0, 45ull << 32 | 2, "rms_norm", 70);
  ust__cupti_poll(r.c, 1, 1);
  ASSERT_U64_EQ(atomic_load(&r.b.replayed), 1);
  ASSERT_U64_EQ(hist_sum(&r.b), 70);
  ust__timer_status st;
  ust__cupti_status(r.c, &st);
  ASSERT_U64_EQ(st.totals.calls_replayed, 4);
  ASSERT_U64_EQ(st.totals.attributed_ns, 3 * 500 + 70);
  ASSERT_U64_EQ(st.totals.kernel_ns, 2 * 550 + 500 + 70);
  ASSERT_STR_EQ(st.totals.names[0].name, "other_graph");
  rig_down(&r);
  /* a tracer that is off names no node: the router then maps nothing */
  const ust__timer_opts off = {.kind = UST__TIMER_EVENTS};
  ust__cupti *c = NULL;
  ASSERT_INT_EQ(ust__cupti_create(&off, NULL, &c), 0);
  ASSERT_INT_EQ(ust__cupti_maps_graphs(c), 0);
  ASSERT_INT_EQ(ust__cupti_node_ids(c, nodes, 2, ids), -1);
  ust__cupti_destroy(c);
}

/* Whether a tracer can ever open a window is known when it is made, and
 * stays: the router asks it only then (ust__timers_may_trace). */
TEST(tracer_is_present_only_when_cupti_was_asked_for_and_loaded) {
  ust__cupti *c = NULL;
  const ust__timer_opts events = {.kind = UST__TIMER_EVENTS, .cupti_path = UST_FAKE_CUPTI};
  ASSERT_INT_EQ(ust__cupti_create(&events, NULL, &c), 0);
  ASSERT_INT_EQ(ust__cupti_present(c), 0);
  ASSERT_INT_EQ(ust__cupti_poll(c, 1, 0), 0); /* asked to open a window: stays off */
  ASSERT_INT_EQ(ust__cupti_present(c), 0);
  ASSERT_INT_EQ(ust__cupti_tracing(c), UST__TRACING_OFF);
  ust__cupti_destroy(c);
  const ust__timer_opts autokind = {.kind = UST__TIMER_AUTO, .cupti_path = UST_FAKE_CUPTI, .window_ns = 50000000};
  ASSERT_INT_EQ(ust__cupti_create(&autokind, NULL, &c), 0);
  ASSERT_INT_EQ(ust__cupti_present(c), 1);
  ust__cupti_destroy(c);
  ASSERT_INT_EQ(ust__cupti_present(NULL), 0);
}

TEST(tracer_grows_its_buffers_and_cuts_a_crowded_window) {
  /* CUPTI asking for more buffers than the tracer keeps ready (many
   * threads, records faster than they come back) gets more, up to a bound;
   * a window whose buffers are mostly with CUPTI ends early (cut), and its
   * calls are still concluded */
  rig r;
  rig_up(&r, 1, CUPTI_SUCCESS, 1.0);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1);
  timed(&r, &r.a, 1, "gemm", 700);
  const int got = r.f.take_buffers(40); /* beyond the 16 kept ready */
  ASSERT_INT_EQ(got, 40);
  ASSERT_INT_EQ(ust__cupti_poll(r.c, 1, 0), 1); /* not crowded yet, nor due to close: open */
  ASSERT_INT_EQ(ust__cupti_tracing(r.c), UST__TRACING_WINDOW);
  const int more = r.f.take_buffers(40); /* past the bound: refused, counted */
  ASSERT_TRUE(more > 0 && more < 40);
  ust__cupti_poll(r.c, 1, 0);
  ASSERT_TRUE(ust__cupti_tracing(r.c) != UST__TRACING_WINDOW);
  r.f.return_buffers();
  ust__cupti_poll(r.c, 1, 1);
  ust__timer_status st;
  ust__cupti_status(r.c, &st);
  ASSERT_U64_EQ(st.windows_cut, 1);
  ASSERT_U64_EQ(st.buffers_short, (uint64_t)(40 - more));
  ASSERT_U64_EQ(hist_sum(&r.a), 700);
  rig_down(&r);
}
