/* Config and problem-definition errors, the shipped definitions, the engine
 * lifecycle without torch. */
#include <cjson/cJSON.h>
#include <unistd.h>

#include "plugin/plugin.h"
#include "tests/c/runner.h"

TEST(config_defaults) {
  ust__config c;
  ASSERT_INT_EQ(ust__config_parse(NULL, &c), 0);
  ASSERT_INT_EQ(c.default_mode, UST__MODE_OBSERVE);
  ASSERT_DBL_NEAR(c.default_sample, 1.0 / 16, 0);
  ASSERT_INT_EQ(c.all_operators, 1);
  ASSERT_INT_EQ(c.max_routes, 4096);
  ust__config_free(&c);
  ASSERT_INT_EQ(ust__config_parse("{\"defaults\": {\"mode\": \"off\", \"sample\": 0.5},"
                                  " \"operators\": {\"gemm\": \"observe\", \"silu\": {\"sample\": 0.1}},"
                                  " \"report\": {\"path\": \"/tmp/r.json\", \"interval_s\": 2}}",
                                  &c),
                0);
  ASSERT_INT_EQ(c.all_operators, 0);
  ASSERT_INT_EQ(c.n_ops, 2);
  ASSERT_STR_EQ(c.ops[0].name, "gemm");
  ASSERT_INT_EQ(c.ops[0].mode, UST__MODE_OBSERVE);
  ASSERT_DBL_NEAR(c.ops[0].sample, 0.5, 0);
  ASSERT_STR_EQ(c.ops[1].name, "silu");
  ASSERT_INT_EQ(c.ops[1].mode, UST__MODE_OFF);
  ASSERT_DBL_NEAR(c.ops[1].sample, 0.1, 0);
  ASSERT_STR_EQ(c.report_path, "/tmp/r.json");
  ASSERT_DBL_NEAR(c.report_interval_s, 2.0, 0);
  ust__config_free(&c);
}

TEST(config_errors_name_field) {
  struct {
    const char *json;
    const char *want;
  } cases[] = {
      {"{", "not valid JSON"},
      {"[]", "top level must be a JSON object"},
      {"{\"modes\": 1}", "unknown field 'modes'"},
      {"{\"operators\": {\"gemm\": {\"mode\": \"obsrve\"}}}", "'operators.gemm.mode' is 'obsrve'"},
      {"{\"operators\": {\"gemm\": {\"sampel\": 1}}}", "unknown field 'operators.gemm.sampel'"},
      {"{\"operators\": {\"gemm\": {\"sample\": 2}}}", "'operators.gemm.sample' must be a number in [0, 1]"},
      {"{\"operators\": {\"gemm\": 3}}", "'operators.gemm' must be a mode string"},
      {"{\"operators\": []}", "'operators' must be an object"},
      {"{\"defaults\": {\"mode\": 1}}", "'defaults.mode' must be a string"},
      {"{\"report\": {\"path\": \"\"}}", "'report.path' must be a non-empty string"},
      {"{\"report\": {\"interval_s\": -1}}", "'report.interval_s' must be a number >= 0"},
      {"{\"report\": {\"every\": 1}}", "unknown field 'report.every'"},
      {"{\"max_routes\": 0}", "'max_routes' must be an integer"},
      {"{\"log_level\": \"loud\"}", "'log_level' must be one of"},
      {"{\"version\": 2}", "'version' must be 1"},
      {"{\"operators\": {\"gemm\": {\"mode\": \"live\"}}}", "'operators.gemm' is in mode live but names no 'candidate'"},
      {"{\"operators\": {\"gemm\": {\"canary\": 1.5}}}", "'operators.gemm.canary' must be a fraction of calls in (0, 1)"},
      {"{\"operators\": {\"gemm\": {\"strict\": 1}}}", "'operators.gemm.strict' must be true or false"},
      {"{\"operators\": {\"gemm\": {\"promotion\": {\"min_verified\": 0}}}}",
       "'operators.gemm.promotion.min_verified' must be an integer"},
      {"{\"operators\": {\"gemm\": {\"promotion\": {\"dry\": true}}}}", "unknown field 'operators.gemm.promotion.dry'"},
      {"{\"operators\": {\"gemm\": {\"promotion\": {}}}}", "'operators.gemm.promotion' needs a 'candidate'"},
      {"{\"operators\": {\"gemm\": {\"routes\": {\"aten::mm\": \"observe\"}}}}",
       "'operators.gemm.routes.aten::mm' is not a shape key"},
      {"{\"operators\": {\"gemm\": {\"routes\": {\"aten::mm|cpu|f32,f32|M=1,K=1,N=1\": {\"canary\": 0.5}}}}}",
       "'operators.gemm.routes.aten::mm|cpu|f32,f32|M=1,K=1,N=1' needs a 'mode'"},
      {"{\"operators\": {\"gemm\": {\"routes\": {\"aten::mm|cpu|f32,f32|M=1,K=1,N=1\": \"canary\"}}}}",
       "is in mode canary but the operator names no 'candidate'"},
      {"{\"state\": {}}", "'state' needs a 'path'"},
      {"{\"defaults\": {\"mode\": \"live\"}}", "'defaults.mode' cannot be live"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ust__config c;
    ASSERT_INT_EQ(ust__config_parse(cases[i].json, &c), UST_ECONFIG);
    ASSERT_STR_CONTAINS(ust_last_error(), cases[i].want);
  }
}

TEST(problem_errors_name_field) {
  struct {
    const char *json;
    const char *want;
  } cases[] = {
      {"{", "p.json: not valid JSON"},
      {"{\"schema_version\": 2}", "p.json: 'schema_version' must be 1"},
      {"{\"schema_version\": 1, \"operator\": \"Bad-Name\"}", "p.json: 'operator' must be a name"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": []}", "p.json: 'bindings' must be a non-empty list"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"extra\": 1}", "p.json: unknown field 'extra'"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": [{\"op\": \"mm\", \"key\": {}}]}",
       "p.json: 'bindings[0].op' must be a dispatcher op name"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": [{\"op\": \"aten::mm\"}]}",
       "p.json: 'bindings[0].key' must be an object"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": [{\"op\": \"aten::mm\", \"key\": {\"M\": \"self[\"}}]}",
       "p.json: 'bindings[0].key.M': 'self[' is not a dimension"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": [{\"op\": \"aten::mm\", \"key\": {\"M\": \"self[0]\"}, \"wrties\": []}]}",
       "p.json: unknown field 'bindings[0].wrties'"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": [{\"op\": \"aten::mm\", \"overloads\": [\"\", \"\"], \"key\": {}}]}",
       "'bindings[0].overloads' lists '' twice"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bucket\": {\"M\": \"log\"}, \"bindings\": [{\"op\": \"aten::mm\", \"key\": {\"M\": \"self[0]\"}}]}",
       "p.json: 'bucket.M' must be \"exact\" or \"pow2\""},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"bucket\": {\"Q\": \"pow2\"}, \"bindings\": [{\"op\": \"aten::mm\", \"key\": {\"M\": \"self[0]\"}}]}",
       "p.json: 'bucket.Q' names no key dimension"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"hosted_in\": [], \"bindings\": []}",
       "p.json: 'hosted_in' must be a list of 1 to"},
      {"{\"schema_version\": 1, \"operator\": \"x\", \"hosted_in\": [\"gdn\"], \"bindings\": []}",
       "p.json: 'hosted_in[0]' must be a dispatcher op name"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ust__problem p;
    ASSERT_INT_EQ(ust__problem_parse(cases[i].json, "p.json", &p), UST_EPROBLEM);
    ASSERT_STR_CONTAINS(ust_last_error(), cases[i].want);
  }
}

TEST(problems_shipped_load) {
  ust__problem_set set;
  ASSERT_INT_EQ(ust__problems_load_dir(UST_SOURCE_DIR "/problems", &set), 0);
  const char *required[] = {"gemm", "sdpa", "grouped_mm", "rms_norm", "silu", "topk"};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
    const ust__problem *p = ust__problems_find(&set, required[i]);
    ASSERT_STR_EQ(p != NULL ? p->name : NULL, required[i]);
  }
  const ust__problem *g = ust__problems_find(&set, "gemm");
  int mm_out = 0;
  for (int b = 0; b < g->n_bindings; b++)
    for (int o = 0; o < g->bindings[b].n_overloads; o++)
      mm_out |= strcmp(g->bindings[b].op, "aten::mm") == 0 && strcmp(g->bindings[b].overloads[o], "out") == 0;
  ASSERT_INT_EQ(mm_out, 1);
  ust__problems_free(&set);
  ASSERT_INT_EQ(ust__problems_load_dir("/nonexistent/dir", &set), UST_EPROBLEM);
  ASSERT_STR_CONTAINS(ust_last_error(), "'/nonexistent/dir' cannot be opened");
}

TEST(engine_unknown_operator) {
  ASSERT_INT_EQ(ust_enable("{\"operators\": {\"gemmm\": \"observe\"}}", UST_SOURCE_DIR "/problems"), UST_ECONFIG);
  ASSERT_STR_CONTAINS(ust_last_error(), "'operators.gemmm': no operator named 'gemmm'");
  ASSERT_INT_EQ(ust_is_enabled(), 0);
  ASSERT_INT_EQ(ust_enable("{}", NULL), UST_ECONFIG);
  ASSERT_STR_CONTAINS(ust_last_error(), "'problems_dir' is not set");
  ASSERT_INT_EQ(ust_disable(), 0);
}

TEST(engine_report_roundtrip) {
  char path[] = "/tmp/ust-report-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_INT_GE(fd, 0);
  close(fd);
  char cfg[512];
  snprintf(cfg, sizeof cfg, "{\"operators\": {\"gemm\": \"observe\", \"topk\": \"off\"}, \"report\": {\"path\": \"%s\"}}",
           path);
  ASSERT_INT_EQ(ust_enable(cfg, UST_SOURCE_DIR "/problems"), 0);
  ASSERT_INT_EQ(ust_enable(cfg, UST_SOURCE_DIR "/problems"), UST_ESTATE);
  ASSERT_INT_EQ(ust_set_mode("topk", "observe"), 0);
  ASSERT_INT_EQ(ust_set_mode("silu", "observe"), UST_ENOTFOUND);
  ASSERT_INT_EQ(ust_set_mode("topk", "loud"), UST_EINVAL);
  char *json = NULL;
  ASSERT_INT_EQ(ust_report_json(&json), 0);
  cJSON *r = cJSON_Parse(json);
  ust_free(json);
  ASSERT_STR_EQ(cJSON_GetStringValue(cJSON_GetObjectItem(r, "schema")), "understudy.report");
  cJSON *ops = cJSON_GetObjectItem(r, "operators");
  ASSERT_INT_EQ(cJSON_GetArraySize(ops), 2);
  ASSERT_STR_EQ(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ops, 0), "name")), "gemm");
  ASSERT_STR_EQ(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ops, 1), "name")), "topk");
  ASSERT_STR_EQ(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ops, 1), "mode")), "observe");
  cJSON_Delete(r);
  ASSERT_INT_EQ(ust_disable(), 0);
  ASSERT_INT_EQ(ust_is_enabled(), 0);
  char *text = ust__read_file(path, UST__FILE_MAX, NULL);
  ASSERT_STR_CONTAINS(text, "\"schema\"");
  r = cJSON_Parse(text);
  ASSERT_STR_EQ(cJSON_GetStringValue(cJSON_GetObjectItem(r, "schema")), "understudy.report");
  ASSERT_INT_EQ(cJSON_IsObject(cJSON_GetObjectItem(r, "totals")), 1);
  ASSERT_INT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(r, "operators")), 2);
  cJSON_Delete(r);
  free(text);
  unlink(path);
}

TEST(error_names) {
  ASSERT_STR_EQ(ust_err_name(UST_ECONFIG), "UST_ECONFIG");
  ASSERT_STR_EQ(ust_strerror(UST_ECONFIG), "invalid config");
  ASSERT_STR_EQ(ust_strerror(12345), "unknown error");
  ASSERT_STR_EQ(ust_strerror(UST_OK), "success");
}
