/* Regression tests for defects found by review of the core, each named after
 * what went wrong. */
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plugin/plugin.h"
#include "tests/c/runner.h"

#define PROBLEMS UST_SOURCE_DIR "/problems"

#define NEAR(a, b, tol)                                                                                   \
  do {                                                                                                    \
    double a_ = (a), b_ = (b);                                                                            \
    if (!(a_ - b_ <= (tol) && b_ - a_ <= (tol))) {                                                        \
      fprintf(stderr, "%s:%d: %s == %s failed: %.17g != %.17g\n", __FILE__, __LINE__, #a, #b, a_, b_);     \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)

/* An operator given as a mode string (the README's quick-start form) was
 * replaced in the config tree while the loop that compared configs still
 * followed it: reload() read freed memory. */
TEST(reload_accepts_operators_given_as_mode_strings) {
  const char *cfg = "{\"operators\": {\"silu\": \"observe\", \"gemm\": \"observe\", \"topk\": {\"mode\": \"off\"}}}";
  ASSERT_INT_EQ(ust_enable(cfg, PROBLEMS), 0);
  if (ust_reload(cfg) != 0)
    fprintf(stderr, "reload: %s\n", ust_last_error());
  ASSERT_INT_EQ(ust_reload(cfg), 0);
  ASSERT_INT_EQ(ust_reload("{\"operators\": {\"silu\": \"off\", \"gemm\": \"observe\", \"topk\": \"observe\"}}"), 0);
  char *json = NULL;
  ASSERT_INT_EQ(ust_report_json(&json), 0);
  ASSERT_STR_CONTAINS(json, "\"name\":\"silu\",\"mode\":\"off\"");
  ASSERT_STR_CONTAINS(json, "\"name\":\"topk\",\"mode\":\"observe\"");
  ust_free(json);
  /* a fixed field still refuses, naming it */
  ASSERT_INT_EQ(ust_reload("{\"operators\": {\"silu\": \"observe\", \"gemm\": \"observe\", \"topk\": \"off\"}, "
                           "\"max_routes\": 8}"),
                UST_ECONFIG);
  ASSERT_STR_CONTAINS(ust_last_error(), "'max_routes' differs");
  ASSERT_INT_EQ(ust_disable(), 0);
}

/* A message built from the thread's last error passed the destination
 * buffer as a source of the same vsnprintf. */
TEST(error_message_may_quote_the_last_error) {
  ust__error(UST_EIO, "cannot read 'a.json': No such file");
  ASSERT_INT_EQ(ust__error(UST_ECONFIG, "%s: %s", "config", ust_last_error()), UST_ECONFIG);
  ASSERT_TRUE(strcmp(ust_last_error(), "config: cannot read 'a.json': No such file") == 0 ||
              (fprintf(stderr, "got \"%s\"\n", ust_last_error()), 0));
  ust__error(UST_EIO, "x");
  ust__error(UST_EIO, "[%s] [%s]", ust_last_error(), ust_last_error());
  ASSERT_TRUE(strcmp(ust_last_error(), "[x] [x]") == 0 || (fprintf(stderr, "got \"%s\"\n", ust_last_error()), 0));
}

static int sink_calls;
static char sink_seen[4096];
static void sink(int level, const char *msg, void *user) {
  (void)level;
  *(int *)user += 1;
  size_t n = strlen(sink_seen);
  snprintf(sink_seen + n, sizeof sink_seen - n, "%s\n", msg);
}

/* enable() reset the log sink to stderr, dropping the one the host had
 * installed before it. */
TEST(enable_keeps_the_hosts_log_sink) {
  ust_set_log(sink, &sink_calls, UST_LOG_DEBUG);
  ASSERT_INT_EQ(ust_enable("{\"log_level\": \"info\", \"operators\": {\"silu\": \"observe\"}}", PROBLEMS), 0);
  ASSERT_INT_EQ(ust_disable(), 0);
  printf("the host's sink received %d messages:\n%s", sink_calls, sink_seen);
  ASSERT_TRUE(sink_calls > 0);
  ASSERT_STR_CONTAINS(sink_seen, "enabled: 1 operators");
  /* the config's level still applies: warn drops info messages */
  sink_calls = 0;
  ASSERT_INT_EQ(ust_enable("{\"log_level\": \"warn\", \"operators\": {\"silu\": \"observe\"}}", PROBLEMS), 0);
  ASSERT_INT_EQ(ust_disable(), 0);
  ASSERT_INT_EQ(sink_calls, 0);
  ust_set_log(NULL, NULL, UST_LOG_WARN);
}

/* (uint32_t)(p * 2^32 + 0.5) is out of range for p within 2^-33 of 1: a
 * share of almost 1 became 0. */
TEST(shares_near_one_stay_near_one) {
  const double almost = 1.0 - 0x1p-33;
  ASSERT_U64_EQ(ust__share_q32(almost), UINT32_MAX);
  ASSERT_U64_EQ(ust__share_q32(1.0), UINT32_MAX);
  ASSERT_U64_EQ(ust__share_q32(0.5), 1u << 31);
  ASSERT_U64_EQ(ust__share_q32(0.0), 0);
  ASSERT_U64_EQ(ust__share_q32(-1.0), 0);
  ASSERT_U64_EQ(ust__share_q32(0x1p-40), 0);
}

/* ust_report_derive: the derived figures of a report from its additive ones,
 * checked against arithmetic done here. Buckets may come in any order and
 * repeat (as a careless merge leaves them). */
TEST(report_derive_from_additive_figures) {
  /* two shapes of one operator: 3 calls timed 100, 100, 300 ns (buckets 6,
   * 6, 20) of 6 calls; 1 call of 1000 ns of 1 */
  uint32_t b100 = ust__hist_index(100), b300 = ust__hist_index(300), b1000 = ust__hist_index(1000);
  char json[2048];
  snprintf(json, sizeof json,
           "{\"schema\": \"understudy.report\", \"version\": 1, \"histogram\": {\"scheme\": \"%s\"},"
           " \"operators\": [{\"name\": \"a\", \"shapes\": ["
           "  {\"key\": \"k1\", \"phase\": \"decode\", \"calls\": 6, \"captured\": 0, \"timing_dropped\": 7,"
           "   \"kernel_lost\": 2, \"pair_failed\": 1, \"hold_expired\": 3, \"kernel_timed\": 2, \"kernels\": 5,"
           "   \"latency_ns\": {\"sum\": 500, \"buckets\": [[%u, 1], [%u, 1], [%u, 1]]}},"
           "  {\"key\": \"k2\", \"phase\": \"decode\", \"calls\": 1, \"captured\": 0,"
           "   \"latency_ns\": {\"sum\": 1000, \"buckets\": [[%u, 1]]}}]}], \"totals\": {}}",
           UST__HIST_SCHEME, b300, b100, b100, b1000);
  char *out = NULL;
  ASSERT_INT_EQ(ust_report_derive(json, &out), 0);
  cJSON *r = cJSON_Parse(out);
  ust_free(out);
  ASSERT_TRUE(r != NULL);
  cJSON *op = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "operators"), 0);
  cJSON *k1 = cJSON_GetArrayItem(cJSON_GetObjectItem(op, "shapes"), 0);
  cJSON *k2 = cJSON_GetArrayItem(cJSON_GetObjectItem(op, "shapes"), 1);
  /* the p50 of 3 values is the 2nd (rank ceil(1.5) = 2): the bucket of 100 */
  const double rep100 = (double)ust__hist_lower(b100) + (double)(ust__hist_width(b100) - 1) / 2.0;
  NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(k1, "latency_ns"), "p50")->valuedouble, rep100, 0);
  ASSERT_INT_EQ(cJSON_GetObjectItem(k1, "timed")->valueint, 3);
  /* the samples dropped, by why: of the 7 without a figure, 2 lost kernel
   * records and 1 a failed pair; the rest had no timer */
  cJSON *dropped = cJSON_GetObjectItem(k1, "dropped");
  ASSERT_INT_EQ(cJSON_GetObjectItem(dropped, "no_timer")->valueint, 4);
  ASSERT_INT_EQ(cJSON_GetObjectItem(dropped, "kernel_records_lost")->valueint, 2);
  ASSERT_INT_EQ(cJSON_GetObjectItem(dropped, "pair_failed")->valueint, 1);
  ASSERT_INT_EQ(cJSON_GetObjectItem(dropped, "hold_expired")->valueint, 3);
  /* 2 calls timed by their kernels ran 5: 2.5 a call; none timed so: null */
  NEAR(cJSON_GetObjectItem(k1, "kernels_per_call")->valuedouble, 2.5, 0);
  ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(k2, "kernels_per_call")));
  /* device time: the timed sum scaled to all calls: 500 * 6 / 3 = 1000; k2 1000 */
  NEAR(cJSON_GetObjectItem(k1, "est_device_time_ns")->valuedouble, 1000.0, 0);
  NEAR(cJSON_GetObjectItem(k1, "weight")->valuedouble, 0.5, 1e-15);
  NEAR(cJSON_GetObjectItem(k2, "weight")->valuedouble, 0.5, 1e-15);
  NEAR(cJSON_GetObjectItem(op, "weight")->valuedouble, 1.0, 1e-15);
  NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "totals"), "est_device_time_ns")->valuedouble, 2000.0,
                  0);
  cJSON_Delete(r);
  /* another histogram scheme is refused, naming both */
  ASSERT_INT_EQ(ust_report_derive("{\"histogram\": {\"scheme\": \"log10\"}, \"operators\": []}", &out), UST_EINVAL);
  ASSERT_STR_CONTAINS(ust_last_error(), "histogram scheme 'log10'");
}

static int count_row(void *ctx, const ust__rollout_row *row) {
  (void)row;
  ++*(int *)ctx;
  return 0;
}

/* The state file was written whatever its size, and enable reads at most
 * UST__FILE_MAX bytes: a table grown past it made a state file the next
 * enable refused. Now the write is refused and the previous file kept. */
TEST(state_file_is_never_written_larger_than_enable_reads) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/ust-state-bound-%ld.json", (long)getpid());
  enum { N_SMALL = 3, N_BIG = 40000 };
  static char keys[N_BIG][500];
  static ust__rollout_row rows[N_BIG];
  for (int i = 0; i < N_BIG; i++) {
    snprintf(keys[i], sizeof keys[i], "aten::silu|cpu|f32|N=%d|%0460d", i, 0);
    rows[i] = (ust__rollout_row){keys[i], UST__MODE_SHADOW, 0, "set by a test", "sha256:00", 1};
  }
  ASSERT_INT_EQ(ust__state_write(path, rows, N_SMALL), 0);
  size_t before_len = 0, after_len = 0;
  char *before = ust__read_file(path, UST__FILE_MAX, &before_len);
  ASSERT_TRUE(before != NULL);
  int rc = ust__state_write(path, rows, N_BIG); /* some 20 MB of rows */
  ASSERT_INT_EQ(rc, UST_EFULL);
  ASSERT_STR_CONTAINS(ust_last_error(), "over the 16777216 bytes enable reads back");
  char *after = ust__read_file(path, UST__FILE_MAX, &after_len);
  ASSERT_TRUE(after != NULL);
  ASSERT_INT_EQ((long long)after_len, (long long)before_len);
  ASSERT_TRUE(memcmp(before, after, before_len) == 0);
  int n = 0;
  ASSERT_INT_EQ(ust__state_read(path, count_row, &n), 0);
  ASSERT_INT_EQ(n, N_SMALL);
  /* the largest table that fits is written and read back whole */
  int fit = (int)(UST__FILE_MAX / 650);
  ASSERT_INT_EQ(ust__state_write(path, rows, fit), 0);
  n = 0;
  ASSERT_INT_EQ(ust__state_read(path, count_row, &n), 0);
  ASSERT_INT_EQ(n, fit);
  free(before);
  free(after);
  unlink(path);
}
