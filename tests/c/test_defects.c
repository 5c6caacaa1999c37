/* Regression tests for defects found by review of the core, each named after
 * what went wrong. */
#include <unistd.h>

#include "plugin/plugin.h"
#include "tests/c/runner.h"

#define PROBLEMS UST_SOURCE_DIR "/problems"

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
