/* The guard's comparison on the host, the config of candidates, native
 * candidate loading through the engine, and the shadow slot pool. */
#include <math.h>

#include <cjson/cJSON.h>

#include "dispatch/dispatch.h"
#include "guard/guard.h"
#include "plugin/plugin.h"
#include "plugin/verify.h"
#include "tests/c/runner.h"

static double max_abs(const ust__cmp_stats *s) { return ust__bits_to_double(s->max_abs_bits); }
static double max_rel(const ust__cmp_stats *s) { return ust__bits_to_double(s->max_rel_bits); }

/* Every input class of the element rule, written out by hand: the expected
 * figures below follow from the rule as documented, not from the code. */
TEST(compare_rule_cases) {
  const double inf = INFINITY, nan = NAN;
  /*                 0     1      2    3    4    5     6     7    8     9 */
  double p[10] = {1.0, 2.0, 10.0, 1.0, 1.0, nan, inf, inf, nan, 0.0};
  double c[10] = {1.005, 2.5, 10.4, nan, inf, nan, inf, -inf, 3.0, 0.002};
  ust__cmp_stats s;
  ust__compare_host(p, c, UST__DT_F64, 10, UST__CMP_ALLCLOSE, 1e-2, 5e-2, &s);
  /* 0: |d| 0.005 <= 0.01 + 0.05: pass. 1: 0.5 > 0.11: mismatch. 2: 0.4 <=
   * 0.51: pass. 3, 4: non-finite where production is finite: mismatch, bad.
   * 5: both NaN, 6: the same infinity: agree. 7: the other infinity, 8: a
   * finite value where production is NaN: mismatch. 9: 0.002 <= 0.01: pass. */
  ASSERT_U64_EQ(s.n, 10);
  ASSERT_U64_EQ(s.mismatches, 5); /* 1, 3, 4, 7, 8 */
  ASSERT_U64_EQ(s.nonfinite_prod, 4);
  ASSERT_U64_EQ(s.nonfinite_cand, 5);
  ASSERT_U64_EQ(s.nonfinite_bad, 2);
  ASSERT_INT_EQ(ust__cmp_first_mismatch(&s), 1);
  ASSERT_TRUE(fabs(max_abs(&s) - 0.5) < 1e-12);           /* finite pairs only */
  ASSERT_TRUE(fabs(max_rel(&s) - 0.25) < 1e-12);          /* 0.5 / 2; p = 0 has no relative error */
  ASSERT_TRUE(fabs(s.sum_sq_diff - (0.005 * 0.005 + 0.25 + 0.16 + 0.002 * 0.002)) < 1e-12);
  ASSERT_TRUE(fabs(s.sum_sq_prod - (1 + 4 + 100 + 1 + 1 + 0)) < 1e-12);

  /* exact: any difference is a mismatch, NaN equals NaN, -0 equals 0 */
  double pe[4] = {1.0, nan, 0.0, 2.0}, ce[4] = {1.0, nan, -0.0, nextafter(2.0, 3.0)};
  ust__compare_host(pe, ce, UST__DT_F64, 4, UST__CMP_EXACT, 1.0, 1.0, &s);
  ASSERT_U64_EQ(s.mismatches, 1);
  ASSERT_INT_EQ(ust__cmp_first_mismatch(&s), 3);

  /* nothing compared: no mismatch, first index -1 */
  ust__compare_host(pe, ce, UST__DT_F64, 0, UST__CMP_ALLCLOSE, 0, 0, &s);
  ASSERT_U64_EQ(s.n, 0);
  ASSERT_INT_EQ(ust__cmp_first_mismatch(&s), -1);
}

/* Every float16 bit pattern decodes as the compiler's own _Float16 does. */
TEST(compare_f16_decoding_all_patterns) {
  for (uint32_t h = 0; h < 65536; h++) {
    uint16_t bits = (uint16_t)h;
    _Float16 f;
    memcpy(&f, &bits, sizeof f);
    const double want = (double)f;
    ust__cmp_stats s;
    ust__compare_host(&bits, &bits, UST__DT_F16, 1, UST__CMP_ALLCLOSE, 0, 0, &s);
    if (!isfinite(want)) {
      ASSERT_U64_EQ(s.nonfinite_prod, 1);
      ASSERT_U64_EQ(s.mismatches, 0); /* the same NaN or infinity on both sides */
    } else if (s.nonfinite_prod != 0 || s.sum_sq_prod != want * want) {
      fprintf(stderr, "f16 pattern 0x%04x: decoded square %.17g, expected %.17g\n", (unsigned)h, s.sum_sq_prod,
              want * want);
      ASSERT_TRUE(0);
    }
  }
  /* bf16 is the upper half of a float32 */
  float x = -3.140625f; /* exactly representable in bf16 */
  uint32_t fb;
  memcpy(&fb, &x, sizeof fb);
  uint16_t b = (uint16_t)(fb >> 16), b2 = (uint16_t)(b + 1);
  ust__cmp_stats s;
  ust__compare_host(&b, &b2, UST__DT_BF16, 1, UST__CMP_ALLCLOSE, 0, 0, &s);
  ASSERT_TRUE(s.sum_sq_prod == (double)x * x);
  ASSERT_U64_EQ(s.mismatches, 1);
  ASSERT_TRUE(max_abs(&s) == 0.015625); /* one bf16 ulp at 3.14 */
}

TEST(compare_integers_exactly) {
  int64_t p[5] = {0, -5, INT64_MAX, 7, 1000}, c[5] = {0, -5, INT64_MAX, 8, 997};
  ust__cmp_stats s;
  ust__compare_host(p, c, UST__DT_I64, 5, UST__CMP_ALLCLOSE, 100, 100, &s); /* tolerances do not apply */
  ASSERT_U64_EQ(s.mismatches, 2);
  ASSERT_INT_EQ(ust__cmp_first_mismatch(&s), 3);
  ASSERT_TRUE(max_abs(&s) == 3.0);
  uint8_t bp[3] = {1, 0, 1}, bc[3] = {1, 1, 1};
  ust__compare_host(bp, bc, UST__DT_BOOL, 3, UST__CMP_ALLCLOSE, 0, 0, &s);
  ASSERT_U64_EQ(s.mismatches, 1);
  ASSERT_INT_EQ(ust__cmp_first_mismatch(&s), 1);
}

TEST(config_candidate_fields) {
  ust__config c;
  const char *ok = "{\"shadow\": {\"max_inflight\": 8, \"graph_beside_max_mb\": 0, \"graph_beside_launch\": "
                   "\"conditional\"}, \"operators\": {\"rms_norm\": {\"mode\": \"shadow\","
                   " \"candidate\": {\"native\": \"x.so\", \"sha256\": \"" "ABCDEF0123456789abcdef0123456789"
                   "abcdef0123456789abcdef0123456789\", \"target\": \"_C::rms_norm\"},"
                   " \"guard\": {\"compare\": \"exact\", \"atol\": 0.5, \"aa_sample\": 0.25}},"
                   " \"gemm\": {\"mode\": \"observe\", \"candidate\": {\"torch_op\": \"ns::mm.out\"}}}}";
  ASSERT_INT_EQ(ust__config_parse(ok, &c), 0);
  ASSERT_INT_EQ(c.shadow_max_inflight, 8);
  ASSERT_INT_EQ(c.shadow_graph_beside_mb, 0);
  ASSERT_INT_EQ(c.shadow_graph_beside_launch, 0);
  ASSERT_INT_EQ(c.ops[0].mode, UST__MODE_SHADOW);
  ASSERT_INT_EQ(c.ops[0].cand.kind, UST__CAND_NATIVE);
  ASSERT_TRUE(strcmp(c.ops[0].cand.sha256, "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789") == 0);
  ASSERT_INT_EQ(c.ops[0].compare, UST__CMP_EXACT);
  ASSERT_TRUE(c.ops[0].atol == 0.5 && c.ops[0].rtol < 0 && c.ops[0].aa_sample == 0.25);
  ASSERT_INT_EQ(c.ops[1].cand.kind, UST__CAND_TORCH_OP);
  ust__config_free(&c);
  ASSERT_INT_EQ(ust__config_parse("{}", &c), 0);
  ASSERT_INT_EQ(c.shadow_graph_beside_mb, 16);
  ASSERT_INT_EQ(c.shadow_graph_beside_launch, 0); /* an IF node */
  ASSERT_INT_EQ(c.shadow_graph_gate_replay, 1);     /* the host gates the replays it sees */
  ASSERT_INT_EQ(c.shadow_graph_start_kernel, 0);    /* and starts a shadow behind the replay */
  ust__config_free(&c);
  ASSERT_INT_EQ(ust__config_parse("{\"shadow\": {\"graph_host_start\": \"kernel\"}}", &c), 0);
  ASSERT_INT_EQ(c.shadow_graph_start_kernel, 1);
  ust__config_free(&c);
  ASSERT_INT_EQ(ust__config_parse("{\"shadow\": {\"graph_beside_launch\": \"device\", \"graph_gate\": \"device\"}}",
                                  &c),
                0);
  ASSERT_INT_EQ(c.shadow_graph_beside_launch, 1);
  ASSERT_INT_EQ(c.shadow_graph_gate_replay, 0);
  ust__config_free(&c);

  struct {
    const char *json, *needle;
  } bad[] = {
      {"{\"operators\": {\"rms_norm\": \"shadow\"}}", "'operators.rms_norm' is in mode shadow but names no 'candidate'"},
      {"{\"defaults\": {\"mode\": \"shadow\"}}", "'defaults.mode' cannot be shadow"},
      {"{\"operators\": {\"r\": {\"candidate\": {\"native\": \"x.so\"}}}}", "'operators.r.candidate.sha256' must be"},
      {"{\"operators\": {\"r\": {\"candidate\": {\"native\": \"x.so\", \"torch_op\": \"a::b\"}}}}", "exactly one of"},
      {"{\"operators\": {\"r\": {\"candidate\": {\"torch_op\": \"nonamespace\"}}}}", "'operators.r.candidate.torch_op'"},
      {"{\"operators\": {\"r\": {\"candidate\": {\"torch_op\": \"a::b\", \"sha256\": \"00\"}}}}", "native candidates only"},
      {"{\"operators\": {\"r\": {\"candidate\": {\"torch_op\": \"a::b\", \"path\": \"x\"}}}}", "'operators.r.candidate.path'"},
      {"{\"operators\": {\"r\": {\"guard\": {\"compare\": \"fuzzy\"}}}}", "'operators.r.guard.compare'"},
      {"{\"operators\": {\"r\": {\"guard\": {\"atol\": -1}}}}", "'operators.r.guard.atol' must be a number >= 0"},
      {"{\"operators\": {\"r\": {\"guard\": {\"aa_sample\": 2}}}}", "'operators.r.guard.aa_sample'"},
      {"{\"shadow\": {\"max_inflight\": 0}}", "'shadow.max_inflight' must be an integer"},
      {"{\"shadow\": {\"graph_beside_max_mb\": -1}}", "'shadow.graph_beside_max_mb' must be an integer"},
      {"{\"shadow\": {\"graph_beside_launch\": \"host\"}}", "'shadow.graph_beside_launch' must be one of conditional, device"},
      {"{\"shadow\": {\"graph_beside_launch\": 1}}", "'shadow.graph_beside_launch' must be one of conditional, device"},
      {"{\"shadow\": {\"graph_gate\": \"host\"}}", "'shadow.graph_gate' must be one of device, replay"},
      {"{\"shadow\": {\"graph_host_start\": \"node\"}}", "'shadow.graph_host_start' must be one of replay, kernel"},
      {"{\"shadow\": {\"graph_beside_launch\": \"device\"}, \"timer\": {\"kind\": \"cupti\"}}",
       "'shadow.graph_beside_launch' device needs 'timer.kind' events"},
      {"{\"timer\": {\"kind\": \"auto\"}, \"shadow\": {\"graph_beside_launch\": \"device\"}}",
       "'shadow.graph_beside_launch' device needs 'timer.kind' events"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT_INT_EQ(ust__config_parse(bad[i].json, &c), UST_ECONFIG);
    ASSERT_STR_CONTAINS(ust_last_error(), bad[i].needle);
  }
}

#define CPU_CANDIDATE UST_BINARY_DIR "/candidates/librms_norm_cpu.so"

static int pin_of(const char *path, char hex[65]) {
  size_t len = 0;
  char *bytes = ust__read_file(path, UST__FILE_MAX << 6, &len);
  if (bytes == NULL)
    return -1;
  ust__sha256_hex(bytes, len, hex);
  free(bytes);
  return 0;
}

TEST(engine_loads_pinned_native_candidate) {
  char pin[65], cfg[1024];
  if (pin_of(CPU_CANDIDATE, pin) != 0) {
    fprintf(stderr, "%s is not built\n", CPU_CANDIDATE);
    ASSERT_TRUE(0);
  }
  snprintf(cfg, sizeof cfg,
           "{\"operators\": {\"rms_norm\": {\"mode\": \"shadow\", \"candidate\": {\"native\": \"%s\", \"sha256\": \"%s\"}}}}",
           CPU_CANDIDATE, pin);
  ASSERT_INT_EQ(ust_enable(cfg, UST_SOURCE_DIR "/problems"), 0);
  char *json = NULL;
  ASSERT_INT_EQ(ust_report_json(&json), 0);
  cJSON *rep = cJSON_Parse(json);
  ust_free(json);
  const cJSON *op = cJSON_GetArrayItem(cJSON_GetObjectItem(rep, "operators"), 0);
  const cJSON *cand = cJSON_GetObjectItem(op, "candidate");
  ASSERT_TRUE(cand != NULL);
  ASSERT_TRUE(strcmp(cJSON_GetObjectItem(cand, "name")->valuestring, "rms_norm_cpu") == 0);
  ASSERT_TRUE(strcmp(cJSON_GetObjectItem(cand, "target")->valuestring, "_C::rms_norm") == 0);
  ASSERT_TRUE(strcmp(cJSON_GetObjectItem(cand, "sha256")->valuestring, pin) == 0);
  ASSERT_TRUE(strcmp(cJSON_GetObjectItem(op, "mode")->valuestring, "shadow") == 0);
  cJSON_Delete(rep);
  ASSERT_INT_EQ(ust_set_mode("rms_norm", "observe"), 0);
  ASSERT_INT_EQ(ust_set_mode("rms_norm", "shadow"), 0);
  ASSERT_INT_EQ(ust_disable(), 0);

  /* a wrong pin, and a target the candidate does not stand in for */
  char wrong[65];
  memcpy(wrong, pin, sizeof wrong);
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  snprintf(cfg, sizeof cfg,
           "{\"operators\": {\"rms_norm\": {\"mode\": \"shadow\", \"candidate\": {\"native\": \"%s\", \"sha256\": \"%s\"}}}}",
           CPU_CANDIDATE, wrong);
  ASSERT_INT_EQ(ust_enable(cfg, UST_SOURCE_DIR "/problems"), UST_ECONFIG);
  ASSERT_STR_CONTAINS(ust_last_error(), "'operators.rms_norm.candidate.native'");
  ASSERT_STR_CONTAINS(ust_last_error(), pin);
  ASSERT_INT_EQ(ust_is_enabled(), 0);
  snprintf(cfg, sizeof cfg,
           "{\"operators\": {\"rms_norm\": {\"mode\": \"shadow\", \"candidate\": {\"native\": \"%s\", \"sha256\": \"%s\","
           " \"target\": \"aten::_fused_rms_norm\"}}}}",
           CPU_CANDIDATE, pin);
  ASSERT_INT_EQ(ust_enable(cfg, UST_SOURCE_DIR "/problems"), UST_ECONFIG);
  ASSERT_STR_CONTAINS(ust_last_error(), "stands in for '_C::rms_norm'");
  /* a shared object without the entry point */
  char libpin[65];
  const char *plain = UST_BINARY_DIR "/candidates/libust_dep.so"; /* a library, not a candidate */
  if (pin_of(plain, libpin) == 0) {
    snprintf(cfg, sizeof cfg,
             "{\"operators\": {\"rms_norm\": {\"mode\": \"shadow\", \"candidate\": {\"native\": \"%s\", \"sha256\": \"%s\"}}}}",
             plain, libpin);
    ASSERT_INT_EQ(ust_enable(cfg, UST_SOURCE_DIR "/problems"), UST_ECONFIG);
    ASSERT_STR_CONTAINS(ust_last_error(), "exports no ust_candidate_get()");
  }
}

static int sink_failed_calls, sink_concluded_calls, sink_skipped;
static void sink_failed(void *ctx, void *route, ust__evidence *ev) {
  (void)ctx;
  (void)route;
  sink_failed_calls++;
  free(ev);
}
static void sink_concluded(void *ctx, void *route, const ust__verdict *v) {
  (void)ctx;
  (void)route;
  sink_concluded_calls++;
  sink_skipped += v->kind == UST__VERDICT_SKIPPED;
}
static const ust__verdict_sink_i test_sink = {sink_failed, sink_concluded};

TEST(shadow_pool_bounds_inflight) {
  ust__shadow_pool *pool = NULL;
  ASSERT_INT_EQ(ust__shadow_pool_create(2, NULL, &test_sink, NULL, &pool), 0);
  ust__verify v;
  memset(&v, 0, sizeof v);
  ust__cand cand;
  memset(&cand, 0, sizeof cand);
  ust__slot_route sr = {&v, &v, &cand, 0, 0, 0, 0};
  void *a = ust__shadow_acquire(pool, &sr), *b = ust__shadow_acquire(pool, &sr), *c = ust__shadow_acquire(pool, &sr);
  ASSERT_TRUE(a != NULL && b != NULL && c == NULL);
  ASSERT_U64_EQ(atomic_load(&v.calls), 2);
  ASSERT_U64_EQ(atomic_load(&v.skipped_by[UST__SKIP_NO_SLOT]), 1); /* no slot: counted skipped, for that reason */
  /* production raised: the sampled call is skipped and the slot is free
   * again; shadow call numbers are never handed out twice */
  ust__shadow_abandon(a, UST__DEV_CPU, NULL);
  ASSERT_U64_EQ(atomic_load(&v.skipped_by[UST__SKIP_ERROR]), 1);
  ASSERT_INT_EQ(sink_concluded_calls, 1);
  c = ust__shadow_acquire(pool, &sr);
  ASSERT_TRUE(c != NULL);
  ASSERT_U64_EQ(atomic_load(&v.calls), 3);
  /* an internal error: skipped too */
  ust__shadow_abandon(b, UST__DEV_CPU, NULL);
  ust__shadow_abandon(c, UST__DEV_CPU, NULL);
  ust__verify_snap snap;
  ust__verify_snapshot(&v, &snap); /* skipped: the sum of its reasons */
  ASSERT_U64_EQ(snap.skipped, 4);
  ASSERT_U64_EQ(snap.skipped_by[UST__SKIP_ERROR], 3);
  ASSERT_U64_EQ(snap.skipped_by[UST__SKIP_NO_SLOT], 1);
  ASSERT_INT_EQ(sink_concluded_calls, 3);
  ASSERT_INT_EQ(sink_skipped, 3);
  ASSERT_INT_EQ(sink_failed_calls, 0);
  ust__shadow_pool_destroy(pool);
}
