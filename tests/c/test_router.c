/* Key dimensions, route keys, the route table and the sampling rule. */
#include <pthread.h>
#include <unistd.h>

#if defined(UST_GPU_CUDA) && defined(UST_TEST_TRACER)
#include <cupti.h>
#include <dlfcn.h>

#include "tests/c/fake_cupti.h"
#endif

#include "dispatch/dispatch.h"
#include "guard/gate.h"
#include "tests/c/runner.h"

TEST(dim_compile_grammar) {
  ust__dim_prog p;
  ASSERT_INT_EQ(ust__dim_compile("self[0]", &p), 0);
  ASSERT_INT_EQ(p.kind, UST__DIM_SIZE);
  ASSERT_INT_EQ(p.dim, 0);
  ASSERT_TRUE(strcmp(p.arg, "self") == 0);
  ASSERT_INT_EQ(ust__dim_compile("mat2[-1]", &p), 0);
  ASSERT_INT_EQ(p.dim, -1);
  ASSERT_INT_EQ(ust__dim_compile("rows(input)", &p), 0);
  ASSERT_INT_EQ(p.kind, UST__DIM_ROWS);
  ASSERT_INT_EQ(ust__dim_compile("numel(x)", &p), 0);
  ASSERT_INT_EQ(p.kind, UST__DIM_NUMEL);
  ASSERT_INT_EQ(ust__dim_compile("len(normalized_shape)", &p), 0);
  ASSERT_INT_EQ(p.kind, UST__DIM_LEN);
  ASSERT_INT_EQ(ust__dim_compile("is_causal", &p), 0);
  ASSERT_INT_EQ(p.kind, UST__DIM_SCALAR);
  const char *bad[] = {"", "self[", "self[x]", "self[0]x", "rows()", "1abc", "a b", "self[99]", "rows(a+b)"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT_INT_EQ(ust__dim_compile(bad[i], &p), UST_EPROBLEM);
    ASSERT_STR_CONTAINS(ust_last_error(), "is not a dimension");
  }
}

static int64_t shape_a[3] = {4, 6, 8};
static int64_t shape_b[2] = {8, 5};

static void make_call(ust__call *c, ust__arg *args, int dtype_a) {
  memset(args, 0, 4 * sizeof *args);
  args[0].kind = UST__ARG_TENSOR;
  args[0].dtype = dtype_a;
  args[0].t.ndim = 3;
  args[0].t.shape = shape_a;
  args[1].kind = UST__ARG_TENSOR;
  args[1].dtype = UST__DT_F32;
  args[1].t.ndim = 2;
  args[1].t.shape = shape_b;
  args[2].kind = UST__ARG_INT;
  args[2].i = 7;
  args[3].kind = UST__ARG_NONE;
  memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  c->nargs = 4;
  c->args = args;
  c->device = UST__DEV_CPU;
}

TEST(dim_eval_and_bucket) {
  ust__arg args[4];
  ust__call c;
  make_call(&c, args, UST__DT_F32);
  struct {
    const char *expr;
    int arg;
    int64_t want;
  } cases[] = {{"a[0]", 0, 4}, {"a[-1]", 0, 8}, {"a[2]", 0, 8}, {"a[3]", 0, -1}, {"rows(a)", 0, 24},
               {"numel(a)", 0, 192}, {"b[1]", 1, 5}, {"k", 2, 7}, {"k[0]", 2, -1}, {"opt", 3, -1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ust__dim_prog p;
    ASSERT_INT_EQ(ust__dim_compile(cases[i].expr, &p), 0);
    p.arg_index = cases[i].arg;
    ASSERT_INT_EQ(ust__dim_eval(&p, &c), cases[i].want);
  }
  ust__dim_prog p;
  ust__dim_compile("a[0]", &p);
  p.arg_index = -1;
  ASSERT_INT_EQ(ust__dim_eval(&p, &c), -1);
  int64_t in[] = {0, 1, 2, 3, 4, 5, 127, 128, 129, 1000, (int64_t)1 << 40};
  int64_t out[] = {0, 1, 2, 4, 4, 8, 128, 128, 256, 1024, (int64_t)1 << 40};
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
    ASSERT_INT_EQ(ust__dim_bucket(UST__BUCKET_POW2, in[i]), out[i]);
    ASSERT_INT_EQ(ust__dim_bucket(UST__BUCKET_EXACT, in[i]), in[i]);
  }
}

/* A router as the engine builds one, for tests: its table, a rollout table
 * under a lock of its own, host timers, an operator with a policy. */
typedef struct fixture {
  pthread_mutex_t lock;
  ust__router r;
  ust__policy pol;
  ust__operator op;
} fixture;

/* One call standing for w calls served by production, as the bridge drives
 * it (a settled call has no end); its route. */
static ust__route *serve_calls(ust__binding *b, const ust__call *c, unsigned w, int *plan) {
  ust__call_state st;
  const int settled = ust__call_settle(b, c, w, &st);
  if (plan != NULL)
    *plan = settled ? UST__PLAN_PASS : st.plan;
  if (settled)
    return st.route;
  ust__decision d;
  ust__decision_start(&d, st.plan, st.flags);
  ust__decision_next(&d, UST__EV_OK);
  ust__call_end(c, &st, &d);
  return st.route;
}

static ust__route *serve_call(ust__binding *b, const ust__call *c, int *plan) { return serve_calls(b, c, 1, plan); }

static void fixture_init(fixture *f, int max_routes, double sample) {
  memset(f, 0, sizeof *f);
  pthread_mutex_init(&f->lock, NULL);
  ASSERT_INT_EQ(ust__router_init(&f->r, max_routes), 0);
  ASSERT_INT_EQ(ust__rollout_create(&f->lock, NULL, &f->r.rollout), 0);
  ASSERT_INT_EQ(ust__timers_create(16, NULL, NULL, &f->r.timers), 0);
  f->pol.mode = UST__MODE_OBSERVE;
  f->pol.sample = sample;
  f->pol.sample_q32 = ust__share_q32(sample);
  f->pol.steady_q32 = f->pol.sample_q32; /* one share throughout, as the engine makes it without a steady share */
  f->pol.steady_after = UINT64_MAX;
  strcpy(f->op.name, "test");
  atomic_init(&f->op.policy, &f->pol);
}

static void fixture_free(fixture *f) {
  ust__router_free(&f->r);
  ust__rollout_destroy(f->r.rollout);
  ust__timers_destroy(f->r.timers);
}

static void make_binding(ust__binding *b, fixture *f, ust__binding_def *def, int index) {
  memset(b, 0, sizeof *b);
  memset(def, 0, sizeof *def);
  b->index = index;
  b->op = &f->op;
  b->def = def;
  b->router = &f->r;
  strcpy(b->display, "test::op");
  def->n_dims = b->n_dims = 2;
  strcpy(def->dims[0].name, "M");
  strcpy(def->dims[1].name, "N");
  ust__dim_compile("a[0]", &b->dims[0]);
  ust__dim_compile("b[1]", &b->dims[1]);
  b->dims[0].bucket = UST__BUCKET_POW2;
  const char *names[] = {"a", "b", "k", "opt"};
  ust__binding_resolve(b, 4, names, 0, 0);
}

TEST(route_key_distinguishes) {
  fixture f;
  fixture_init(&f, 16, 0.0625);
  ust__binding b0, b1;
  ust__binding_def d0, d1;
  make_binding(&b0, &f, &d0, 0);
  make_binding(&b1, &f, &d1, 1);
  ust__arg args[4];
  ust__call c;
  ust__route_key k1, k2, k3, k4;
  make_call(&c, args, UST__DT_F32);
  ust__route_key_make(&b0, &c, &k1);
  ASSERT_INT_EQ(k1.dims[0], 4);
  ASSERT_INT_EQ(k1.dims[1], 5);
  ASSERT_INT_EQ(k1.n_dtypes, 2);
  shape_a[0] = 3; /* buckets to 4: same route */
  ust__route_key_make(&b0, &c, &k2);
  shape_a[0] = 4;
  make_call(&c, args, UST__DT_BF16);
  ust__route_key_make(&b0, &c, &k3);
  make_call(&c, args, UST__DT_F32);
  ust__route_key_make(&b1, &c, &k4);
  ust__route *r1 = ust__routes_get(&f.r, &k1, &b0);
  ASSERT_TRUE(r1 != NULL);
  ASSERT_TRUE(ust__routes_get(&f.r, &k2, &b0) == r1);
  ust__route *r3 = ust__routes_get(&f.r, &k3, &b0);
  ust__route *r4 = ust__routes_get(&f.r, &k4, &b1);
  ASSERT_TRUE(r3 != NULL && r3 != r1);
  ASSERT_TRUE(r4 != NULL && r4 != r1 && r4 != r3);
  ASSERT_INT_EQ(atomic_load(&f.r.routes.count), 3);
  ASSERT_STR_CONTAINS(r3->key_str, "test::op|cpu|bf16,f32|M=4,N=5");
  fixture_free(&f);
}

TEST(a_call_finds_the_route_its_key_names) {
  /* The observed call builds its key's head in registers and hashes it as it
   * goes; the route it finds is the one the key, made and hashed word by
   * word, finds: up to eight dtypes and past them (the head's second word, its
   * cut-off), a phase, a CUDA device, a binding index of two bytes, a dim
   * past its tensor's rank (-1). Nothing is timed (sample 0): such calls are
   * settled, the fixture's timers (the host's) never reached; once every
   * call is timed none is. */
  fixture f;
  fixture_init(&f, 64, 0);
  ust__binding b;
  ust__binding_def d;
  make_binding(&b, &f, &d, 0x1234);
  ust__arg args[11];
  ust__call c;
  make_call(&c, args, UST__DT_BF16);
  const int dts[] = {UST__DT_F16, UST__DT_F32, UST__DT_BF16, UST__DT_F16, UST__DT_F32, UST__DT_BF16, UST__DT_F16};
  for (int i = 4; i < 11; i++) {
    args[i] = args[1];
    args[i].dtype = dts[i - 4];
  }
  int64_t shape_short[1] = {9};
  const int nargs[] = {4, 6, 10, 11};
  for (int device = UST__DEV_CPU; device <= UST__DEV_CUDA; device++)
    for (int phase = UST_PHASE_UNKNOWN; phase <= UST_PHASE_DECODE; phase++)
      for (size_t v = 0; v < sizeof nargs / sizeof nargs[0]; v++) {
        const int n = nargs[v];
        c.device = device;
        c.phase = phase;
        c.nargs = n;
        args[1].t.shape = n == 6 ? shape_short : shape_b; /* b[1] past a rank of 1: -1 */
        args[1].t.ndim = n == 6 ? 1 : 2;
        ust__route_key k;
        ust__route_key_make(&b, &c, &k);
        const int tensors = n - 2 < UST__MAX_KEY_TENSORS ? n - 2 : UST__MAX_KEY_TENSORS; /* not the int, the None */
        ASSERT_INT_EQ(k.n_dtypes, tensors);
        ASSERT_INT_EQ(k.binding, 0x1234);
        ASSERT_INT_EQ(k.device, device);
        ASSERT_INT_EQ(k.phase, phase);
        ASSERT_INT_EQ(k.dtypes[0], UST__DT_BF16);
        ASSERT_INT_EQ(k.dtypes[tensors - 1], tensors == 2 ? UST__DT_F32 : dts[tensors - 3]);
        ASSERT_INT_EQ(k.dims[1], n == 6 ? -1 : 5);
        ust__route *by_key = ust__routes_get(&f.r, &k, &b);
        ASSERT_TRUE(by_key != NULL);
        ust__call_state st;
        ASSERT_INT_EQ(ust__call_settle(&b, &c, 1, &st), 1);
        ASSERT_TRUE(st.route == by_key);
      }
  /* 10 and 11 arguments make one key: a ninth tensor is past the key's eight */
  ASSERT_INT_EQ(atomic_load(&f.r.routes.count), 2 * 3 * 3);
  /* every call timed (host timing only: the CPU): none is settled */
  f.pol.sample_q32 = UINT32_MAX;
  c.device = UST__DEV_CPU;
  ust__call_state st;
  ASSERT_INT_EQ(ust__call_settle(&b, &c, 1, &st), 0);
  ASSERT_INT_EQ(st.timing, 1);
  ust__decision dn;
  ust__decision_start(&dn, st.plan, st.flags);
  ust__decision_next(&dn, UST__EV_OK);
  ust__call_end(&c, &st, &dn);
  fixture_free(&f);
}

/* A fixture whose one observed binding keys 1 call in every at random past
 * a thread's first after calls, under engine number engine: its tally word
 * as the engine publishes it with the policy. */
static void keying_binding(fixture *f, ust__binding *b, ust__binding_def *d, uint32_t every, uint64_t after,
                           uint64_t engine) {
  fixture_init(f, 16, 0.0625);
  f->pol.key_every = every;
  f->pol.key_after = after;
  make_binding(b, f, d, 0);
  atomic_store(&b->tally, ust__tally_word(&f->pol, engine));
}

TEST(admit_keys_each_call_at_random_past_a_threads_warm_up) {
  /* An operator observing without a candidate (key_every 16): a thread's
   * first key_after calls under an engine are keyed one by one; later ones
   * each with probability 1/16, standing for 16 calls, whatever the calls
   * around them (every 16th call of a period-16 pattern is keyed 1 time in
   * 16 too, where a fixed stride would key all or none of them). */
  fixture f;
  ust__binding b;
  ust__binding_def d;
  keying_binding(&f, &b, &d, 16, 100, 7);
  ust__thread t;
  memset(&t, 0, sizeof t);
  for (int i = 0; i < 100; i++)
    ASSERT_INT_EQ(ust__binding_admit(&b, &t), 1);
  long keyed = 0, keyed_16th = 0, tallied = 0;
  for (long i = 0; i < 160000; i++) {
    const int w = ust__binding_admit(&b, &t);
    ASSERT_TRUE(w == UST__ADMIT_TALLY || w == 16);
    keyed += w == 16;
    keyed_16th += w == 16 && i % 16 == 15;
    if (w == UST__ADMIT_TALLY) {
      ust__binding_tallied(&b, 1);
      tallied++;
    }
  }
  /* binomial: 10,000 +- 97 (sd) over all, 625 +- 24 over the 16th calls; 5 sd */
  ASSERT_TRUE(keyed > 10000 - 485 && keyed < 10000 + 485);
  ASSERT_TRUE(keyed_16th > 625 - 121 && keyed_16th < 625 + 121);
  ASSERT_INT_EQ((long)atomic_load(&b.tallied), tallied);
  ASSERT_INT_EQ(keyed + tallied, 160000);
  /* a new engine: the thread's warm-up again; also the 65,535th after it
   * (a 16-bit number would name it as the last), and the last numbers
   * before the word's 48 bits wrap, and the first after (never to 0) */
  const uint64_t engines[] = {8, 8 + 65535, (1ull << 48) - 2, (1ull << 48) - 1};
  for (int e = 0; e < 4; e++) {
    atomic_store(&b.tally, ust__tally_word(&f.pol, engines[e]));
    ASSERT_TRUE((atomic_load(&b.tally) >> 16) != 0);
    for (int i = 0; i < 100; i++)
      ASSERT_INT_EQ(ust__binding_admit(&b, &t), 1);
    ASSERT_TRUE(ust__binding_admit(&b, &t) != 1); /* past it: tallied, or keyed standing for 16 */
  }
  /* a candidate's operator (key_every 1) keys every call; one that is off passes them */
  f.pol.key_every = 1;
  ASSERT_INT_EQ(ust__tally_word(&f.pol, 9), 0);
  atomic_store(&b.tally, 0);
  for (int i = 0; i < 1000; i++)
    ASSERT_INT_EQ(ust__binding_admit(&b, &t), 1);
  f.pol.mode = UST__MODE_OFF;
  f.pol.key_every = 16;
  ASSERT_INT_EQ(ust__binding_admit(&b, &t), UST__ADMIT_PASS); /* the word 0: the policy says off */
  /* off's own word (key_every 0) passes every call without the policy: one
   * that says observe again is not read until its word is published */
  const uint64_t off = ust__tally_word(&f.pol, 9);
  ASSERT_TRUE(off != 0 && (off & 0xffffu) == 0);
  atomic_store(&b.tally, off);
  f.pol.mode = UST__MODE_OBSERVE;
  for (int i = 0; i < 1000; i++)
    ASSERT_INT_EQ(ust__binding_admit(&b, &t), UST__ADMIT_PASS);
  fixture_free(&f);
}

TEST(admit_keys_every_call_while_the_thread_captures_a_graph) {
  /* Past the warm-up at 1 in 4, a thread that says it began a capture
   * (ust_graph_capture_begun) keys each call one by one until it says the
   * capture ended, a nested capture included; its countdown resumes after.
   * The count is the thread's own and never goes below none. */
  fixture f;
  ust__binding b;
  ust__binding_def d;
  keying_binding(&f, &b, &d, 4, 0, 3);
  ust__thread *t = ust__thread_state();
  const ust__thread saved = *t;
  memset(t, 0, sizeof *t);
  const int w0 = ust__binding_admit(&b, t); /* the thread's countdown drawn under this engine */
  ASSERT_TRUE(w0 == UST__ADMIT_TALLY || w0 == 4);
  t->key_gap = 8; /* seven calls from the next one drawn: each would be tallied outside the capture */
  ASSERT_INT_EQ(ust_graph_capture_ended(), 0); /* none under way: stays 0 */
  ASSERT_INT_EQ(ust_graph_capture_begun(), 1);
  ASSERT_INT_EQ(ust_graph_capture_begun(), 2);
  for (int i = 0; i < 1000; i++)
    ASSERT_INT_EQ(ust__binding_admit(&b, t), 1);
  ASSERT_INT_EQ(ust_graph_capture_ended(), 1);
  for (int i = 0; i < 1000; i++)
    ASSERT_INT_EQ(ust__binding_admit(&b, t), 1);
  ASSERT_INT_EQ(ust_graph_capture_ended(), 0);
  ASSERT_INT_EQ(ust_graph_capture_ended(), 0);
  for (int i = 0; i < 7; i++) /* the countdown resumes where the capture found it */
    ASSERT_INT_EQ(ust__binding_admit(&b, t), UST__ADMIT_TALLY);
  ASSERT_INT_EQ(ust__binding_admit(&b, t), 4);
  long tallied = 0;
  for (int i = 0; i < 4000; i++) {
    const int w = ust__binding_admit(&b, t);
    ASSERT_TRUE(w == UST__ADMIT_TALLY || w == 4);
    tallied += w == UST__ADMIT_TALLY;
  }
  /* 3,000 +- 27 (sd); 5 sd */
  ASSERT_TRUE(tallied > 3000 - 137 && tallied < 3000 + 137);
  *t = saved;
  fixture_free(&f);
}

#if defined(UST_GPU_CUDA) && defined(UST_TEST_TRACER)
/* Keyed calls of one admission run from a thread's countdown (1 in 8): how
 * many of n were keyed, each asserted to be tallied or keyed for 8. */
static long keyed_of(ust__binding *b, ust__thread *t, long n) {
  long keyed = 0;
  for (long i = 0; i < n; i++) {
    const int w = ust__binding_admit(b, t);
    ASSERT_TRUE(w == UST__ADMIT_TALLY || w == 8);
    keyed += w == 8;
  }
  return keyed;
}

TEST(admit_keys_every_call_inside_a_tracer_window) {
  /* A router holding the kernel tracer (a stand-in libcupti): past the
   * warm-up at 1 in 8, its thread keys 1 call in 8 at random between
   * windows, and every call one by one while a window is open, so that each
   * call's kernels are its route's; once the window closed, 1 in 8 again. */
  fixture f;
  ust__binding b;
  ust__binding_def d;
  keying_binding(&f, &b, &d, 8, 0, 11);
  ust__timers_destroy(f.r.timers);
  fake_clock_install(); /* the window closes when the test harvests it, not by the time it took */
  const ust__timer_opts o = {.kind = UST__TIMER_CUPTI, .window_ns = 50000000, .budget = 0,
                             .launch_cost_ns = 10000, .cupti_path = UST_FAKE_CUPTI, .callbacks = 1};
  ASSERT_INT_EQ(ust__timers_create(16, &o, NULL, &f.r.timers), 0);
  void *lib = dlopen(UST_FAKE_CUPTI, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_TRUE(lib != NULL);
  void (*reset)(CUptiResult, double);
  *(void **)&reset = dlsym(lib, "fake_cupti_reset");
  ASSERT_TRUE(reset != NULL);
  reset(CUPTI_SUCCESS, 1.0);
  ASSERT_INT_EQ(ust__timers_may_trace(f.r.timers), 1);
  f.r.tracer = ust__timers_may_trace(f.r.timers);
  ust__thread t;
  memset(&t, 0, sizeof t);
  ASSERT_TRUE(ust__timers_tracing(f.r.timers) != UST__TRACING_WINDOW);
  /* 1,000 +- 30 (sd) of 8,000; 5 sd */
  long k = keyed_of(&b, &t, 8000);
  ASSERT_TRUE(k > 1000 - 150 && k < 1000 + 150);
  /* a CUDA call timed by events (none on a machine without a GPU) marks
   * the timers used: the next poll opens a window */
  const int token = ust__timers_begin(f.r.timers, 0, NULL, NULL);
  if (token >= 0)
    ust__timers_cancel(f.r.timers, token);
  ust__timers_harvest(f.r.timers);
  ASSERT_INT_EQ(ust__timers_tracing(f.r.timers), UST__TRACING_WINDOW);
  for (int i = 0; i < 2000; i++)
    ASSERT_INT_EQ(ust__binding_admit(&b, &t), 1);
  ust__timers_harvest_all_sync(f.r.timers); /* the window closed, its records drained */
  ASSERT_TRUE(ust__timers_tracing(f.r.timers) != UST__TRACING_WINDOW);
  k = keyed_of(&b, &t, 8000);
  ASSERT_TRUE(k > 1000 - 150 && k < 1000 + 150);
  fixture_free(&f);
}
#endif

TEST(hook_admit_tallies_on_the_hook_alone_and_enters_the_gate_for_the_rest) {
  /* as the interceptor serves calls: past the thread's warm-up, a call
   * tallied on the hook's word alone (ust__thread_tallies, ust__line_tally:
   * not entered, the binding unread, its tally counted on the hook and
   * reported as the binding's); every other call admitted with
   * ust__hook_admit: counted in flight on the hook's gate (in the epoch it
   * read) and on its thread until ust__hook_release. No binding, understudy's
   * own work or a tracked call around it pass it on; a tracked call
   * collecting its callees' floors makes it nested; else the admission
   * (warm-up keyed, then keyed at random; one the tally would take keyed
   * standing for itself). */
  fixture f;
  ust__binding b;
  ust__binding_def d;
  keying_binding(&f, &b, &d, 16, 3, 5);
  ust__hook *h = aligned_alloc(_Alignof(ust__hook), sizeof *h);
  ASSERT_TRUE(h != NULL);
  memset(h, 0, sizeof *h);
  /* as a hook is registered: its line the interceptor's (a line of its own here) */
  ust__hook_line line = {.word = UST__TALLY_OFF, .tallied = 0};
  h->head.line = &line;
  ust__thread *t = ust__thread_state();
  const ust__thread saved = *t;
  memset(t, 0, sizeof *t);
  ust__entry e;
  ASSERT_U64_EQ(ust__line_word(&line), UST__TALLY_OFF); /* not bound: nothing to enter */
  ASSERT_INT_EQ(ust__hook_admit(h, &e), UST__ADMIT_PASS); /* admitted all the same: passed on */
  ASSERT_TRUE(e.thread == t && e.binding == NULL);
  ASSERT_INT_EQ(t->depth, 1);
  ASSERT_INT_EQ(ust__in_intercepted_call(), 1);
  ASSERT_INT_EQ(h->head.inflight[0], 1);
  ust__hook_release(&e);
  ASSERT_INT_EQ(t->depth, 0);
  ASSERT_INT_EQ(ust__in_intercepted_call(), 0);
  ASSERT_INT_EQ(h->head.inflight[0], 0);
  b.hook = h;
  ust__hook_attach(h, &b);
  ASSERT_INT_EQ(b.hook_epoch, 0);
  ASSERT_TRUE(ust__line_word(&line) != UST__TALLY_OFF);
  ASSERT_U64_EQ(line.word, atomic_load(&b.tally));
  /* passed on inside understudy's own work and inside a tracked call, the
   * warm-up untouched; nested while a tracked call collects its callees */
  t->own_work = 1;
  ASSERT_INT_EQ(ust__thread_tallies(ust__line_word(&line), t), 0);
  ASSERT_INT_EQ(ust__hook_admit(h, &e), UST__ADMIT_PASS);
  ASSERT_TRUE(e.binding == &b && t->depth == 1);
  ust__hook_release(&e);
  t->own_work = 0;
  t->call_depth = 2;
  ASSERT_INT_EQ(ust__thread_tallies(ust__line_word(&line), t), 0);
  ASSERT_INT_EQ(ust__hook_admit(h, &e), UST__ADMIT_PASS);
  ust__hook_release(&e);
  ust__nested callees;
  memset(&callees, 0, sizeof callees);
  t->nested = &callees;
  t->call_depth = 1;
  ASSERT_INT_EQ(ust__hook_admit(h, &e), UST__ADMIT_NESTED);
  ASSERT_TRUE(e.binding == &b);
  ust__hook_release(&e);
  t->nested = NULL;
  t->call_depth = 0;
  ASSERT_U64_EQ(ust__binding_tallied_count(&b), 0);
  for (int i = 0; i < 3; i++) { /* the thread's warm-up: each keyed */
    ASSERT_INT_EQ(ust__thread_tallies(ust__line_word(&line), t), 0);
    ASSERT_INT_EQ(ust__hook_admit(h, &e), 1);
    ASSERT_TRUE(e.binding == &b && h->head.inflight[0] == 1);
    ust__hook_release(&e);
  }
  ASSERT_INT_EQ(h->head.inflight[0], 0);
  /* the operator set off: its calls pass on reading the hook alone; back on */
  const uint64_t word = atomic_load(&b.tally);
  atomic_store(&b.tally, UST__TALLY_OFF);
  ust__hook_republish(h, &b);
  ASSERT_U64_EQ(ust__line_word(&line), UST__TALLY_OFF);
  atomic_store(&b.tally, word);
  ust__hook_republish(h, &b);
  ASSERT_TRUE(ust__line_word(&line) != UST__TALLY_OFF);
  /* inside a held (keyed) call, as the interceptor serves them: the calls
   * its own check tallies not entered, off the countdown and counted on the
   * hook's line; the rest admitted, entered, the drawn ones keyed; a
   * call the admission would tally (one the interceptor's check did not
   * take) keyed, standing for itself */
  t->key_gap = 1; /* the next call the one drawn */
  ust__entry held;
  ASSERT_INT_EQ(ust__hook_admit(h, &held), 16);
  ASSERT_TRUE(held.binding == &b && h->head.inflight[0] == 1);
  long keyed = 0, tallied = 0;
  for (long i = 0; i < 16000; i++) {
    if (ust__thread_tallies(ust__line_word(&line), t)) {
      const int64_t gap = t->key_gap;
      ust__line_tally(&line, t);
      ASSERT_TRUE(t->key_gap == gap - 1 && t->depth == 1 && h->head.inflight[0] == 1);
      tallied++;
      continue;
    }
    ASSERT_INT_EQ(t->key_gap, 1); /* the one drawn */
    ASSERT_INT_EQ(ust__hook_admit(h, &e), 16);
    ASSERT_TRUE(e.binding == &b);
    ASSERT_INT_EQ(t->depth, 2);
    ASSERT_INT_EQ(h->head.inflight[0], 2);
    keyed++;
    ust__hook_release(&e);
  }
  ASSERT_U64_EQ(ust__binding_tallied_count(&b), (uint64_t)tallied);
  ASSERT_INT_EQ(keyed + tallied, 16000);
  /* 1,000 +- 31 (sd) keyed; 5 sd */
  ASSERT_TRUE(keyed > 1000 - 155 && keyed < 1000 + 155);
  t->key_gap = 100;
  ASSERT_INT_EQ(ust__thread_tallies(ust__line_word(&line), t), 1);
  ASSERT_INT_EQ(ust__hook_admit(h, &e), 1);
  ASSERT_TRUE(e.binding == &b && h->head.inflight[0] == 2 && t->key_gap == 99);
  ust__hook_release(&e);
  /* detached with the held call in flight: the old epoch drains as it is
   * released; calls after it count in the new epoch and pass on; the
   * binding's tallies folded onto it */
  const unsigned old = ust__hook_detach(h);
  ust__binding_fold_tallies(&b);
  ASSERT_INT_EQ(old, 0);
  ASSERT_U64_EQ(ust__line_word(&line), UST__TALLY_OFF);
  ASSERT_INT_EQ(ust__hook_inflight(h, old), 1);
  ASSERT_INT_EQ(ust__hook_admit(h, &e), UST__ADMIT_PASS);
  ASSERT_TRUE(e.binding == NULL);
  ASSERT_INT_EQ(h->head.inflight[1], 1);
  ust__hook_release(&e);
  ust__hook_release(&held);
  ASSERT_INT_EQ(ust__hook_inflight(h, old), 0);
  ASSERT_INT_EQ(t->depth, 0);
  ASSERT_U64_EQ(atomic_load(&b.tallied), (uint64_t)tallied);
  ASSERT_U64_EQ(ust__binding_tallied_count(&b), (uint64_t)tallied);
  /* bound again (the next engine): its epoch, its count from the hook's now */
  ust__hook_attach(h, &b);
  ASSERT_INT_EQ(b.hook_epoch, 1);
  ASSERT_U64_EQ(ust__binding_tallied_count(&b), (uint64_t)tallied);
  /* a fork's child, forked inside two entered calls (other threads' calls
   * in flight too): its hooks count none; the two, released last, are not
   * taken off again, and the child's own calls count as any */
  ust__entry outer, inner;
  t->own_work = 1; /* entered, and passed on */
  ASSERT_INT_EQ(ust__hook_admit(h, &outer), UST__ADMIT_PASS);
  ASSERT_INT_EQ(ust__hook_admit(h, &inner), UST__ADMIT_PASS);
  t->own_work = 0;
  h->head.inflight[1] += 5;
  ust__hook_after_fork(h);
  ust__fork_child();
  ASSERT_INT_EQ(h->head.inflight[0], 0);
  ASSERT_INT_EQ(h->head.inflight[1], 0);
  t->call_depth = 2; /* entered */
  ASSERT_INT_EQ(ust__hook_admit(h, &e), UST__ADMIT_PASS);
  t->call_depth = 0;
  ASSERT_INT_EQ(h->head.inflight[1], 1);
  ust__hook_release(&e);
  ASSERT_INT_EQ(h->head.inflight[1], 0);
  ust__hook_release(&inner);
  ust__hook_release(&outer);
  ASSERT_INT_EQ(h->head.inflight[1], 0);
  ASSERT_INT_EQ(t->depth, 0);
  ASSERT_INT_EQ(t->forked, 0);
  t->own_work = 1;
  ASSERT_INT_EQ(ust__hook_admit(h, &e), UST__ADMIT_PASS);
  ASSERT_INT_EQ(h->head.inflight[1], 1);
  ust__hook_release(&e);
  ASSERT_INT_EQ(h->head.inflight[1], 0);
  *t = saved;
  free(h);
  fixture_free(&f);
}

/* A fixture with one binding and one call of it (make_call's, f32). */
typedef struct one_binding {
  fixture f;
  ust__binding b;
  ust__binding_def d;
  ust__arg args[4];
  ust__call c;
} one_binding;

static void one_binding_init(one_binding *o, int max_routes, double sample) {
  fixture_init(&o->f, max_routes, sample);
  make_binding(&o->b, &o->f, &o->d, 0);
  make_call(&o->c, o->args, UST__DT_F32);
}

TEST(a_call_standing_for_many_counts_them_and_is_timed_at_their_share) {
  /* A call keyed at random stands for w calls: its route counts w (w - 1 of
   * them estimated) and it is timed when one of the calls it stands for would
   * be: at a share of 1/16, each call standing for 16 is timed; at 1/64,
   * one in 4, exactly as the share rule takes 1/64 of the calls counted,
   * and the first, which stands for the key's first calls (timed whatever
   * the sampling; at 1/16 it is a sampled one). */
  const double shares[] = {1.0 / 16, 1.0 / 64};
  const uint64_t want_timed[] = {100, 25 + 1}, want_first[] = {0, 1};
  one_binding o;
  for (int v = 0; v < 2; v++) {
    one_binding_init(&o, 16, shares[v]);
    ust__route *r = NULL;
    for (int i = 0; i < 100; i++)
      r = serve_calls(&o.b, &o.c, 16, NULL);
    ASSERT_TRUE(r != NULL);
    ASSERT_INT_EQ(atomic_load(&r->figs.calls), 1600);
    ASSERT_INT_EQ(atomic_load(&r->figs.estimated), 1500);
    ASSERT_INT_EQ(atomic_load(&r->figs.hist.count), want_timed[v]);
    ASSERT_INT_EQ(atomic_load(&r->figs.first_timed), want_first[v]);
    fixture_free(&o.f);
  }
  /* one that finds the route table full: untracked, all the calls it stands for */
  one_binding_init(&o, 1, 0.0625);
  ASSERT_TRUE(serve_calls(&o.b, &o.c, 16, NULL) != NULL);
  shape_a[0] = 64; /* another key: the table holds one */
  ASSERT_TRUE(serve_calls(&o.b, &o.c, 16, NULL) == NULL);
  shape_a[0] = 4;
  ASSERT_INT_EQ(atomic_load(&o.b.untracked), 16);
  fixture_free(&o.f);
}

TEST(route_table_full) {
  fixture f;
  fixture_init(&f, 3, 0.0625);
  ust__binding b;
  ust__binding_def d;
  make_binding(&b, &f, &d, 0);
  ust__route_key k;
  memset(&k, 0, sizeof k);
  for (int i = 0; i < 3; i++) {
    k.dims[0] = i;
    ASSERT_TRUE(ust__routes_get(&f.r, &k, &b) != NULL);
  }
  k.dims[0] = 99;
  ASSERT_TRUE(ust__routes_get(&f.r, &k, &b) == NULL);
  k.dims[0] = 1; /* existing routes are still found */
  ASSERT_TRUE(ust__routes_get(&f.r, &k, &b) != NULL);
  ASSERT_INT_EQ(atomic_load(&f.r.routes.count), 3);
  fixture_free(&f);
}

typedef struct thread_arg {
  ust__router *r;
  ust__binding *b;
  ust__route *seen[64];
} thread_arg;

static void *insert_many(void *p) {
  thread_arg *a = p;
  for (int round = 0; round < 200; round++)
    for (int i = 0; i < 64; i++) {
      ust__route_key k;
      memset(&k, 0, sizeof k);
      k.dims[0] = i;
      ust__route *r = ust__routes_get(a->r, &k, a->b);
      if (round == 0)
        a->seen[i] = r;
      else if (a->seen[i] != r)
        a->seen[i] = NULL;
      atomic_fetch_add(&r->figs.calls, 1);
    }
  return NULL;
}

TEST(route_table_threads) {
  fixture f;
  fixture_init(&f, 128, 0.0625);
  ust__binding b;
  ust__binding_def d;
  make_binding(&b, &f, &d, 0);
  pthread_t th[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){.r = &f.r, .b = &b};
    pthread_create(&th[i], NULL, insert_many, &args[i]);
  }
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  ASSERT_INT_EQ(atomic_load(&f.r.routes.count), 64);
  for (int i = 0; i < 64; i++) {
    ASSERT_TRUE(args[0].seen[i] != NULL);
    for (int j = 1; j < 4; j++)
      ASSERT_TRUE(args[j].seen[i] == args[0].seen[i]);
    ASSERT_U64_EQ(atomic_load(&args[0].seen[i]->figs.calls), 4 * 200);
  }
  fixture_free(&f);
}

typedef struct inserting {
  fixture *f;
  ust__binding *b;
  int n;
  atomic_int made; /* keys 0 .. made-1 have routes */
} inserting;

static void *insert_keys(void *p) {
  inserting *a = p;
  for (int i = 0; i < a->n; i++) {
    ust__route_key k;
    memset(&k, 0, sizeof k);
    k.dims[0] = i;
    ASSERT_TRUE(ust__routes_get(&a->f->r, &k, a->b) != NULL);
    atomic_store(&a->made, i + 1);
  }
  return NULL;
}

/* A report taken while new keys arrive holds every route made before it
 * began (a route is never left out of one report and back in the next). */
TEST(a_snapshot_holds_every_route_made_before_it) {
  enum { N = 4000 };
  fixture f;
  fixture_init(&f, N, 0.0625);
  ust__binding b;
  ust__binding_def d;
  make_binding(&b, &f, &d, 0);
  inserting a = {.f = &f, .b = &b, .n = N};
  pthread_t th;
  pthread_create(&th, NULL, insert_keys, &a);
  static unsigned char held[N];
  int snapshots = 0, missed = 0;
  for (int before = 0; before < N; snapshots++) {
    before = atomic_load(&a.made);
    ust__route_snap *snaps = NULL;
    int n = 0;
    ASSERT_INT_EQ(ust__routes_snapshot(&f.r, &snaps, &n), 0);
    memset(held, 0, sizeof held);
    for (int i = 0; i < n; i++)
      held[snaps[i].k.dims[0]] = 1;
    ust__routes_snapshot_free(snaps, n);
    for (int i = 0; i < before; i++)
      missed += !held[i];
  }
  pthread_join(th, NULL);
  printf("%d snapshots while %d keys arrived: %d routes made before a snapshot missing from it\n", snapshots, N,
         missed);
  ASSERT_INT_EQ(missed, 0);
  fixture_free(&f);
}

/* One f32 key of a binding of f's operator, and its calls. */
typedef struct one_key {
  ust__binding b;
  ust__binding_def d;
  ust__arg args[4];
  ust__call c;
} one_key;

/* n calls of k's key, each observed (plan PASS); the key's route. */
static ust__route *serve_key(fixture *f, one_key *k, int n) {
  make_binding(&k->b, f, &k->d, 0);
  make_call(&k->c, k->args, UST__DT_F32);
  ust__route *r = NULL;
  for (int i = 0; i < n; i++) {
    int plan;
    r = serve_call(&k->b, &k->c, &plan);
    ASSERT_INT_EQ(plan, UST__PLAN_PASS);
  }
  ASSERT_TRUE(r != NULL);
  return r;
}

TEST(sampling_exact_fraction) {
  /* Through the public path: a CPU call with sample 0.25 times exactly a
   * quarter of the calls, and the key's first UST__FIRST_TIMED calls (of
   * which call 4, the first sampled one, is not). */
  fixture f;
  fixture_init(&f, 4, 0.25);
  one_key k;
  ust__route *r = serve_key(&f, &k, 1000);
  ASSERT_U64_EQ(atomic_load(&r->figs.calls), 1000);
  ASSERT_U64_EQ(atomic_load(&r->figs.hist.count), 250 + UST__FIRST_TIMED);
  fixture_free(&f);
}

TEST(a_new_key_is_timed_whatever_the_sampling) {
  /* 1 in 64 sampled: a key called twice is timed twice, one called 64 times
   * UST__FIRST_TIMED + 1 times (its 64th call is the sampled one). */
  fixture f;
  fixture_init(&f, 4, 1.0 / 64);
  ust__binding b;
  ust__binding_def d;
  make_binding(&b, &f, &d, 0);
  ust__arg args[4];
  ust__call c;
  for (int k = 0; k < 2; k++) {
    make_call(&c, args, k == 0 ? UST__DT_F32 : UST__DT_F64);
    const int calls = k == 0 ? 2 : 64;
    ust__route *r = NULL;
    for (int i = 0; i < calls; i++)
      r = serve_call(&b, &c, NULL);
    ASSERT_TRUE(r != NULL);
    ASSERT_U64_EQ(atomic_load(&r->figs.hist.count), k == 0 ? 2 : UST__FIRST_TIMED + 1);
  }
  fixture_free(&f);
}

TEST(a_steady_key_is_sampled_at_the_steady_share) {
  /* 1 in 16 for a key's first 4,096 calls, 1 in 256 after: of 10,000 calls,
   * 3 first + 256 + 23 are timed, the 23 kept apart as the steady stratum. */
  fixture f;
  fixture_init(&f, 4, 1.0 / 16);
  f.pol.sample_steady = 1.0 / 256;
  f.pol.steady_q32 = ust__share_q32(f.pol.sample_steady);
  f.pol.steady_after = 4096;
  one_key k;
  ust__route *r = serve_key(&f, &k, 10000);
  ASSERT_U64_EQ(atomic_load(&r->figs.hist.count), UST__FIRST_TIMED + 256 + 23);
  ASSERT_U64_EQ(atomic_load(&r->figs.first_timed), UST__FIRST_TIMED);
  ASSERT_U64_EQ(atomic_load(&r->figs.steady_timed), 23);
  ASSERT_TRUE(atomic_load(&r->figs.steady_time_ns) > 0);
  fixture_free(&f);
}

/* Learned layouts were keyed by an int list's length only: calls that
 * differ in dim=[0] and dim=[1] shared one. */
TEST(call_signature_keys_int_list_values) {
  ust__arg args[4];
  ust__call c;
  make_call(&c, args, UST__DT_F32);
  args[2].kind = UST__ARG_INTLIST;
  args[2].i = 1;
  args[2].list[0] = 0;
  const uint64_t dim0 = ust__call_signature(&c);
  args[2].list[0] = 1;
  const uint64_t dim1 = ust__call_signature(&c);
  printf("signature dim=[0] %016llx, dim=[1] %016llx\n", (unsigned long long)dim0, (unsigned long long)dim1);
  ASSERT_TRUE(dim0 != 0 && dim1 != 0 && dim0 != dim1);
  /* a list longer than the view carries cannot be keyed exactly: no layout */
  args[2].i = UST__MAX_LIST + 1;
  ASSERT_U64_EQ(ust__call_signature(&c), 0);
}

/* A collective's Tensor[] (c10d::allreduce_): the view carries its first
 * tensor and its length; the key reads them, the list's dtype is part of
 * the route key, and no layout is learned for it (the other tensors are not
 * in the view). */
TEST(tensor_list_argument_keys_on_its_first_tensor) {
  fixture f;
  fixture_init(&f, 16, 0.0625);
  ust__arg args[4];
  ust__call c;
  make_call(&c, args, UST__DT_F32);
  args[0].kind = UST__ARG_TENSORLIST;
  args[0].dtype = UST__DT_BF16;
  args[0].i = 3;
  struct {
    const char *expr;
    int64_t want;
  } cases[] = {{"a[0]", 4}, {"a[-1]", 8}, {"rows(a)", 24}, {"numel(a)", 192}, {"len(a)", 3}, {"esize(a)", 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ust__dim_prog p;
    ASSERT_INT_EQ(ust__dim_compile(cases[i].expr, &p), 0);
    p.arg_index = 0;
    ASSERT_INT_EQ(ust__dim_eval(&p, &c), cases[i].want);
  }
  args[0].t.dtype.bits = 16;
  args[0].t.dtype.lanes = 1;
  ust__dim_prog p;
  ASSERT_INT_EQ(ust__dim_compile("esize(a)", &p), 0);
  p.arg_index = 0;
  ASSERT_INT_EQ(ust__dim_eval(&p, &c), 2);
  ASSERT_INT_EQ(ust__dim_compile("bytes(a)", &p), 0);
  p.arg_index = 0;
  ASSERT_INT_EQ(ust__dim_eval(&p, &c), 384);
  /* len() of a plain tensor is not a length */
  ASSERT_INT_EQ(ust__dim_compile("len(b)", &p), 0);
  p.arg_index = 1;
  ASSERT_INT_EQ(ust__dim_eval(&p, &c), -1);
  ust__binding b;
  ust__binding_def d;
  make_binding(&b, &f, &d, 0);
  ust__route_key k;
  ust__route_key_make(&b, &c, &k);
  ASSERT_INT_EQ(k.n_dtypes, 2);
  ASSERT_INT_EQ(k.dtypes[0], UST__DT_BF16);
  ASSERT_INT_EQ(k.dims[0], 4);
  ust__route *r = ust__routes_get(&f.r, &k, &b);
  ASSERT_TRUE(r != NULL);
  ASSERT_STR_CONTAINS(r->key_str, "test::op|cpu|bf16,f32|M=4,N=5");
  ASSERT_U64_EQ(ust__call_signature(&c), 0);
  fixture_free(&f);
}

typedef struct counting {
  ust__figs *f;
  atomic_int stop;
} counting;

/* Calls as the router counts them: the call first, a capture after. */
static void *count_calls(void *p) {
  counting *c = p;
  while (!atomic_load(&c->stop)) {
    atomic_fetch_add(&c->f->calls, 1);
    atomic_fetch_add(&c->f->captured, 1);
  }
  return NULL;
}

/* The report read calls before captured while they grow the other way
 * round: calls - captured could wrap. A snapshot reads captured first. */
TEST(figures_snapshot_never_has_more_captured_than_calls) {
  ust__figs f;
  ASSERT_INT_EQ(ust__figs_init(&f), 0);
  counting c = {&f, 0};
  pthread_t th;
  pthread_create(&th, NULL, count_calls, &c);
  uint64_t worst = 0;
  for (int i = 0; i < 50000; i++) {
    ust__figs_snap s;
    ASSERT_INT_EQ(ust__figs_snapshot(&f, &s), 0);
    if (s.captured > s.calls)
      fprintf(stderr, "captured %llu > calls %llu\n", (unsigned long long)s.captured, (unsigned long long)s.calls);
    ASSERT_TRUE(s.captured <= s.calls);
    if (s.calls - s.captured > worst)
      worst = s.calls - s.captured;
    ust__figs_snap_free(&s);
  }
  atomic_store(&c.stop, 1);
  pthread_join(th, NULL);
  printf("calls - captured at most %llu in a snapshot\n", (unsigned long long)worst);
  ust__figs_free(&f);
}

typedef struct stress {
  fixture *f;
  ust__binding *b;
  atomic_int stop;
  atomic_uint_fast64_t calls;
} stress;

static void *stress_calls(void *p) {
  stress *s = p;
  ust__arg args[4];
  ust__call c;
  make_call(&c, args, UST__DT_F32);
  while (!atomic_load(&s->stop)) {
    serve_call(s->b, &c, NULL);
    atomic_fetch_add(&s->calls, 1);
  }
  return NULL;
}

static void *stress_control(void *p) {
  stress *s = p;
  int i = 0;
  while (!atomic_load(&s->stop)) {
    ust__route_snap *snaps = NULL;
    int n = 0;
    ust__routes_snapshot(&s->f->r, &snaps, &n);
    for (int k = 0; k < n; k++) {
      ust__route_key key = snaps[k].k;
      ust__route *r = ust__routes_get(&s->f->r, &key, s->b);
      ust__rollout_set(&r->rollout, i % 2 ? UST__MODE_OFF : UST__MODE_OBSERVE, 0, "manual", "stress");
    }
    ust__routes_snapshot_free(snaps, n);
    ust__rollout_set_key(s->f->r.rollout, "test::op|cpu|f32,f32|M=4,N=5", NULL, UST__MODE_OBSERVE, 0, "manual",
                         "stress", 64);
    ust__rollout_row *rows = NULL;
    int nr = 0;
    ust__rollout_take_changes(s->f->r.rollout, &rows, &nr);
    free(rows);
    i++;
  }
  return NULL;
}

/* Calls, mode changes, snapshots and state saving at once: counts stay
 * exact (and the thread sanitizer build finds no race). */
TEST(control_plane_stress) {
  fixture f;
  fixture_init(&f, 16, 0.25);
  ust__binding b;
  ust__binding_def d;
  make_binding(&b, &f, &d, 0);
  stress s = {&f, &b, 0, 0};
  pthread_t th[4];
  for (int i = 0; i < 3; i++)
    pthread_create(&th[i], NULL, stress_calls, &s);
  pthread_create(&th[3], NULL, stress_control, &s);
  usleep(300000);
  atomic_store(&s.stop, 1);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  ust__route_snap *snaps = NULL;
  int n = 0;
  ASSERT_INT_EQ(ust__routes_snapshot(&f.r, &snaps, &n), 0);
  ASSERT_INT_EQ(n, 1);
  printf("%llu calls beside mode changes, snapshots and saves; %llu counted\n",
         (unsigned long long)atomic_load(&s.calls), (unsigned long long)snaps[0].figs.calls);
  ASSERT_U64_EQ(snaps[0].figs.calls, atomic_load(&s.calls));
  ust__routes_snapshot_free(snaps, n);
  fixture_free(&f);
}

/* The estimate's inputs for timed calls of which `first` were a key's first
 * and `steady` at the steady share. */
static ust__est_in est_in(double timed, double sum, double first, double first_sum, double steady, double steady_sum,
                          double calls, double captured, double steady_calls) {
  return (ust__est_in){.timed = timed, .timed_sum_ns = sum, .first_timed = first, .first_sum_ns = first_sum,
                       .steady_timed = steady, .steady_sum_ns = steady_sum, .calls = calls, .captured = captured,
                       .steady_calls = steady_calls};
}

TEST(device_time_estimate_leaves_first_calls_out) {
  /* A key's first 3 calls are timed whatever the sampling; the first took
   * 1 s (a kernel compiled), the others 1 us. Its 64 calls are estimated
   * from the 4 sampled ones alone; a key no sample reached, from its first. */
  const double first_sum = 1e9 + 2 * 1000, sampled_sum = 4 * 1000;
  ust__est_in in = est_in(7, first_sum + sampled_sum, 3, first_sum, 0, 0, 64, 0, 0);
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 64 * 1000.0, 1e-9);
  in.captured = 4;
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 60 * 1000.0, 1e-9);
  in = est_in(2, 3000, 2, 3000, 0, 0, 2, 0, 0);
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 3000.0, 1e-9);
  in = est_in(0, 0, 0, 0, 0, 0, 5, 0, 0);
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 0.0, 0);
}

TEST(device_time_estimate_weighs_each_sampling_stratum) {
  /* 10,000 calls; the first 4,096 sampled 1 in 16 (256 at 2 us, besides
   * 3 first calls of 1 s), the 5,904 after 1 in 256 (23 at 1 us). Each
   * stratum counts at its own mean: a mean over all 279 samples would give
   * the early calls' time to the late ones (19.2 ms instead of 14.1 ms). */
  const double first_sum = 3e9, early_sum = 256 * 2000.0, late_sum = 23 * 1000.0;
  ust__est_in in = est_in(3 + 256 + 23, first_sum + early_sum + late_sum, 3, first_sum, 23, late_sum, 10000, 0, 5904);
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 4096 * 2000.0 + 5904 * 1000.0, 1e-6);
  /* captured calls are not timed: taken from the early stratum first */
  in.captured = 96;
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 4000 * 2000.0 + 5904 * 1000.0, 1e-6);
  in.captured = 6000;
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 4000 * 1000.0, 1e-6);
  /* past steady_after, before the first steady sample: the early mean for all */
  in = est_in(3 + 256, first_sum + early_sum, 3, first_sum, 0, 0, 4100, 0, 4);
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 4100 * 2000.0, 1e-6);
  /* a key steady from its first call (steady_after 0): the steady mean for all */
  in = est_in(3 + 23, first_sum + late_sum, 3, first_sum, 23, late_sum, 5904, 0, 5904);
  ASSERT_DBL_NEAR(ust__est_device_time(&in), 5904 * 1000.0, 1e-6);
}

/* Replays 1..n of a site under gate word w, by the device's rule: how many
 * the candidate served and how many were verified. */
static void replay_counts(uint64_t w, int n, int *served, int *verified) {
  *served = *verified = 0;
  uint64_t s = 0;
  for (int i = 1; i <= n; i++) {
    const ust__gate_choice c = ust__gate_decide(ust__gate_unpack(w), (uint64_t)i, s);
    const unsigned runs = ust__gate_runs(c);
    s += (runs & UST__GATE_RUN_SERVE) != 0;
    *served += (runs & UST__GATE_RUN_SERVE) != 0;
    *verified += (runs & UST__GATE_RUN_VERIFY) != 0;
  }
}

/* n replays of a site beside the chain gated from the host: the host
 * enables the site's kernels only in the replays it verifies; enabled, the
 * kernels decide from the word they read (ust__gate_host_word) and their
 * own count of the replays they ran in. Counts the replays verified, those
 * the kernels ran in without verifying, and the times the host changed the
 * kernels' state. */
static void host_gated(uint64_t w, int n, int *verified, int *idle_runs, int *changes) {
  *verified = *idle_runs = *changes = 0;
  int on = 1; /* instantiated enabled */
  uint64_t dev_n = 0;
  for (int i = 1; i <= n; i++) {
    const int want = ust__gate_host_verify(w, (uint64_t)i);
    *changes += want != on;
    on = want;
    if (!on)
      continue;
    const ust__gate_choice c = ust__gate_decide(ust__gate_unpack(ust__gate_host_word(w)), ++dev_n, 0);
    *verified += c.verify;
    *idle_runs += !c.verify;
  }
}

TEST(a_replay_gated_from_the_host_verifies_what_the_device_would) {
  const double shares[] = {1.0, 0.5, 0.25, 1.0 / 16, 0.001, 0.0};
  for (size_t k = 0; k < sizeof shares / sizeof shares[0]; k++) {
    const uint32_t q = ust__share_q32(shares[k]);
    /* shadow, and canary as a site beside the chain sees it (verify-only) */
    const uint64_t words[] = {ust__gate_pack((ust__replay_gate){UST__GATE_SHADOW, q, 0}),
                              ust__gate_pack((ust__replay_gate){UST__GATE_CANARY, q, ust__share_q32(0.25)})};
    for (int j = 0; j < 2; j++) {
      int served, device_verified, verified, idle, changes;
      replay_counts(ust__gate_verify_only(words[j]), 4096, &served, &device_verified);
      host_gated(words[j], 4096, &verified, &idle, &changes);
      printf("share %.4f %s: the device verifies %d of 4096 replays, the host-gated site %d (kernels run "
             "idle %d times, %d changes of state)\n",
             shares[k], j ? "canary" : "shadow", device_verified, verified, idle, changes);
      ASSERT_INT_EQ(served, 0);
      ASSERT_INT_EQ(verified, device_verified);
      ASSERT_INT_EQ(idle, 0);
      ASSERT_TRUE(changes <= 2 * verified + 1);
    }
  }
  /* off (observe, rolled back, understudy disabled): the kernels never run */
  int verified, idle, changes;
  host_gated(0, 100, &verified, &idle, &changes);
  ASSERT_INT_EQ(verified + idle, 0);
  ASSERT_INT_EQ(changes, 1);
  ASSERT_U64_EQ(ust__gate_host_word(0), 0);
  ASSERT_U64_EQ(ust__gate_host_word(ust__gate_pack((ust__replay_gate){UST__GATE_SHADOW, 0, 0})), 0);
}

/* A binding with a torch-op candidate (modes past observe are a
 * candidate's) and an f32 call of it. */
static void candidate_binding(ust__binding *b, fixture *f, ust__binding_def *d, ust__cand *cand, ust__call *c,
                              ust__arg *args) {
  make_binding(b, f, d, 0);
  memset(cand, 0, sizeof *cand);
  cand->kind = UST__CAND_TORCH_OP;
  strcpy(cand->id, "torch_op:test::candidate");
  b->cand = cand;
  make_call(c, args, UST__DT_F32);
}

TEST(a_routes_gate_follows_its_mode_at_every_replay) {
  /* sample 0.5: observe runs nothing; shadow verifies half the replays;
   * canary 0.25 before a pass verifies every replay on copies, after it
   * serves a quarter and verifies half of those; live serves all; strict
   * live serves none (verified as in shadow); a paused shadow budget
   * leaves live serving and verifying its sample, shadow running nothing */
  fixture f;
  fixture_init(&f, 4, 0.5);
  ust__binding b;
  ust__binding_def d;
  ust__cand cand;
  ust__arg args[4];
  ust__call c;
  candidate_binding(&b, &f, &d, &cand, &c, args);
  ust__route *r = serve_call(&b, &c, NULL);
  ASSERT_TRUE(r != NULL);
  int served, verified;
  ASSERT_U64_EQ(ust__route_gate(r), 0);
  ASSERT_INT_EQ(ust__rollout_set(&r->rollout, UST__MODE_SHADOW, 0, "manual", "test"), 0);
  replay_counts(ust__route_gate(r), 1000, &served, &verified);
  ASSERT_INT_EQ(served, 0);
  ASSERT_INT_EQ(verified, 500);
  ASSERT_INT_EQ(ust__rollout_set(&r->rollout, UST__MODE_CANARY, 0.25, "manual", "test"), 0);
  ASSERT_TRUE(!ust__rollout_qualified(&r->rollout));
  replay_counts(ust__route_gate(r), 1000, &served, &verified);
  ASSERT_INT_EQ(served, 0);
  ASSERT_INT_EQ(verified, 1000);
  ust__rollout_qualify(&r->rollout);
  replay_counts(ust__route_gate(r), 1000, &served, &verified);
  ASSERT_INT_EQ(served, 250);
  ASSERT_INT_EQ(verified, 125);
  ASSERT_INT_EQ(ust__rollout_set(&r->rollout, UST__MODE_LIVE, 0, "manual", "test"), 0);
  replay_counts(ust__route_gate(r), 1000, &served, &verified);
  ASSERT_INT_EQ(served, 1000);
  ASSERT_INT_EQ(verified, 500);
  /* strict: a replay cannot wait for its verdict, so production serves */
  f.pol.strict = 1;
  replay_counts(ust__route_gate(r), 1000, &served, &verified);
  ASSERT_INT_EQ(served, 0);
  ASSERT_INT_EQ(verified, 500);
  f.pol.strict = 0;
  atomic_store(&r->verify.paused, 1);
  replay_counts(ust__route_gate(r), 1000, &served, &verified);
  ASSERT_INT_EQ(served, 1000);
  ASSERT_INT_EQ(verified, 500); /* served replays stay verified, as eager served calls */
  ASSERT_INT_EQ(ust__rollout_set(&r->rollout, UST__MODE_SHADOW, 0, "manual", "test"), 0);
  ASSERT_U64_EQ(ust__route_gate(r), 0);
  atomic_store(&r->verify.paused, 0);
  ASSERT_INT_EQ(ust__rollout_set(&r->rollout, UST__MODE_OBSERVE, 0, "manual", "test"), 0);
  ASSERT_U64_EQ(ust__route_gate(r), 0);
  /* rolled back from live: nothing runs, and a late pass does not qualify it again */
  ASSERT_INT_EQ(ust__rollout_set(&r->rollout, UST__MODE_LIVE, 0, "manual", "test"), 0);
  ASSERT_TRUE(ust__route_gate(r) != 0);
  ust__rollout_roll_back(&r->rollout, NULL);
  ust__rollout_qualify(&r->rollout);
  ASSERT_TRUE(!ust__rollout_qualified(&r->rollout));
  ASSERT_U64_EQ(ust__route_gate(r), 0);
  fixture_free(&f);
}

TEST(a_route_changed_in_place_under_a_graph_runs_production_alone_in_replays) {
  /* A live route's captured call (nodes 7:0, 7:1 of graph 7, whose
   * executable graph is 30) is changed in place (the tracer's callbacks:
   * ust__kt_exec_changed): from then on its replays run production alone,
   * whatever its mode; a route none of whose calls changed keeps its gate. */
  fixture f;
  fixture_init(&f, 4, 1.0);
  ust__binding b;
  ust__binding_def d;
  ust__cand cand;
  ust__arg args[4];
  ust__call c;
  candidate_binding(&b, &f, &d, &cand, &c, args);
  ust__route *r = serve_call(&b, &c, NULL);
  make_call(&c, args, UST__DT_F16);
  ust__route *other = serve_call(&b, &c, NULL);
  ASSERT_TRUE(r != NULL && other != NULL && r != other);
  ASSERT_INT_EQ(ust__rollout_set(&r->rollout, UST__MODE_LIVE, 0, "manual", "test"), 0);
  ASSERT_INT_EQ(ust__rollout_set(&other->rollout, UST__MODE_LIVE, 0, "manual", "test"), 0);
  ust__rollout_qualify(&r->rollout);
  ust__rollout_qualify(&other->rollout);
  int served, verified;
  replay_counts(ust__route_gate(r), 100, &served, &verified);
  ASSERT_INT_EQ(served, 100);
  ust__kt *k;
  ASSERT_INT_EQ(ust__kt_create(&k), 0);
  const uint64_t nodes[] = {7ull << 32 | 0, 7ull << 32 | 1}, kept[] = {8ull << 32 | 0};
  ASSERT_INT_EQ(ust__kt_graph_call(k, nodes, 2, 2, &r->figs, 0), 0);
  ASSERT_INT_EQ(ust__kt_graph_call(k, kept, 1, 1, &other->figs, 0), 0);
  ust__kt_graph_exec(k, 7, 30);
  ust__kt_exec_changed(k, 30, 7ull << 32 | 1);
  ASSERT_U64_EQ(ust__route_gate(r), 0);
  replay_counts(ust__route_gate(other), 100, &served, &verified);
  ASSERT_INT_EQ(served, 100);
  const int modes[] = {UST__MODE_SHADOW, UST__MODE_CANARY, UST__MODE_LIVE};
  for (int i = 0; i < 3; i++) {
    ASSERT_INT_EQ(ust__rollout_set(&r->rollout, modes[i], 0.5, "manual", "test"), 0);
    ust__rollout_qualify(&r->rollout);
    ASSERT_U64_EQ(ust__route_gate(r), 0);
  }
  ust__kt_destroy(k);
  fixture_free(&f);
}

TEST(a_captured_shadow_goes_beside_the_chain_within_its_bound) {
  /* A call beside the chain keeps device memory for its shadow, up to its
   * route's bound: the plan made before its first part puts a call that
   * would keep more in the chain; each buffer over the bound is refused
   * (NULL) without asking for memory; after the first part the plan stays. */
  ust__graph_call c;
  memset(&c, 0, sizeof c);
  c.beside = 1;
  c.kept_max = 1u << 20;
  ust__call_state st;
  memset(&st, 0, sizeof st);
  st.graph = &c;
  ASSERT_INT_EQ(ust__call_graph_beside(&st), 1);
  ust__call_graph_beside_plan(&st, 1u << 19);
  ASSERT_INT_EQ(ust__call_graph_beside(&st), 1);
  ASSERT_TRUE(ust__call_graph_alloc(&st, (1u << 20) + 1) == NULL);
  ASSERT_U64_EQ(c.kept, 0);
  ASSERT_STR_CONTAINS(ust_last_error(), "more than 1048576 bytes (shadow.graph_beside_max_mb)");
  /* no device here (or no site): no memory, nothing counted */
  ASSERT_TRUE(ust__call_graph_alloc(&st, 4096) == NULL);
  ASSERT_U64_EQ(c.kept, 0);
  ust__call_graph_beside_plan(&st, (1u << 20) + 1);
  ASSERT_INT_EQ(ust__call_graph_beside(&st), 0);
  ASSERT_TRUE(ust__call_graph_alloc(&st, 16) == NULL); /* in the chain: the caller's allocator */
  c.beside = 1;
  c.parts = 1;
  ust__call_graph_beside_plan(&st, (uint64_t)1 << 40);
  ASSERT_INT_EQ(ust__call_graph_beside(&st), 1);
  st.graph = NULL;
  ASSERT_INT_EQ(ust__call_graph_beside(&st), 0);
}
