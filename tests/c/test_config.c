/* Config and problem-definition errors, the shipped definitions, the engine
 * lifecycle without torch. */
#include <cjson/cJSON.h>
#include <math.h>
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

/* ---- the field table (plugin/config.c) against the parser ---------------------------- */

#define TABLE_KEY "aten::mm|cpu|f32,f32|M=1,K=1,N=1"
#define TABLE_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* A table path with its placeholders filled in: <name> is gemm, <key> a shape key. */
static void table_path(const char *sec, const char *name, char *out, size_t cap) {
  char in[256];
  snprintf(in, sizeof in, "%s%s%s", sec, *sec && name ? "." : "", name ? name : "");
  out[0] = '\0';
  for (const char *p = in; *p != '\0';) {
    const char *with = strncmp(p, "<name>", 6) == 0 ? "gemm" : strncmp(p, "<key>", 5) == 0 ? TABLE_KEY : NULL;
    size_t n = strlen(out);
    if (with != NULL) {
      snprintf(out + n, cap - n, "%s", with);
      p += with[0] == 'g' ? 6 : 5;
    } else {
      snprintf(out + n, cap - n, "%c", *p++);
    }
  }
}

/* Sets path (dotted) in root to v, making objects on the way; an object
 * value keeps an object already there. */
static void table_put(cJSON *root, const char *path, cJSON *v) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  cJSON *at = root;
  char *seg = buf;
  for (char *dot; (dot = strchr(seg, '.')) != NULL; seg = dot + 1) {
    *dot = '\0';
    cJSON *next = cJSON_GetObjectItemCaseSensitive(at, seg);
    if (!cJSON_IsObject(next)) {
      next = cJSON_CreateObject();
      if (cJSON_GetObjectItemCaseSensitive(at, seg) != NULL)
        cJSON_ReplaceItemInObjectCaseSensitive(at, seg, next);
      else
        cJSON_AddItemToObject(at, seg, next);
    }
    at = next;
  }
  cJSON *had = cJSON_GetObjectItemCaseSensitive(at, seg);
  if (cJSON_IsObject(v) && cJSON_IsObject(had))
    cJSON_Delete(v);
  else if (had != NULL)
    cJSON_ReplaceItemInObjectCaseSensitive(at, seg, v);
  else
    cJSON_AddItemToObject(at, seg, v);
}

/* A value f accepts: its default, else one from its range or choices. */
static cJSON *table_example(const ust__config_field *f) {
  if (f->def != NULL)
    return cJSON_Parse(f->def);
  switch (f->type) {
  case UST__FIELD_INTEGER:
  case UST__FIELD_COUNT:
  case UST__FIELD_NUMBER:
    return cJSON_CreateNumber(!f->lo_open ? f->lo : isinf(f->hi) ? f->lo + 1 : (f->lo + f->hi) / 2);
  case UST__FIELD_BOOL:
    return cJSON_CreateFalse();
  case UST__FIELD_CHOICE:
    return cJSON_CreateString(f->choices[0]);
  case UST__FIELD_MODE:
    return cJSON_CreateString("observe");
  case UST__FIELD_STRING:
  case UST__FIELD_PATH:
    return cJSON_CreateString(strcmp(f->name, "sha256") == 0     ? TABLE_SHA
                              : strcmp(f->name, "torch_op") == 0 ? "ns::candidate"
                              : strcmp(f->name, "target") == 0   ? "aten::mm"
                                                                 : "/tmp/ust-table-example");
  default:
    return cJSON_CreateObject();
  }
}

/* What a config needs around field f for f to be accepted and found: its
 * operator, a candidate for its parts and the promotion, a route's mode,
 * the state's path, the endpoint's port, "qualify": "process" for
 * qualify_calls. */
static cJSON *table_context(const ust__config_field *f) {
  cJSON *root = cJSON_CreateObject();
  const int in_op = strncmp(f->section, "operators.<name>", 16) == 0;
  if (in_op)
    table_put(root, "operators.gemm", cJSON_CreateObject());
  if (in_op && (strstr(f->section, ".candidate") != NULL || strstr(f->section, ".promotion") != NULL ||
                strcmp(f->name, "candidate") == 0 || strcmp(f->name, "promotion") == 0)) {
    if (strcmp(f->name, "torch_op") == 0) {
      table_put(root, "operators.gemm.candidate.torch_op", cJSON_CreateString("ns::candidate"));
    } else {
      table_put(root, "operators.gemm.candidate.native", cJSON_CreateString("/tmp/ust-table-example.so"));
      table_put(root, "operators.gemm.candidate.sha256", cJSON_CreateString(TABLE_SHA));
    }
    if (strncmp(f->name, "qualify_", 8) == 0) /* qualify_calls, _memory_mb, _cpu_s: with "process" alone */
      table_put(root, "operators.gemm.candidate.qualify", cJSON_CreateString("process"));
  }
  if (in_op && strstr(f->section, ".routes") != NULL)
    table_put(root, "operators.gemm.routes." TABLE_KEY ".mode", cJSON_CreateString("observe"));
  if (strcmp(f->section, "state") == 0 || (f->section[0] == '\0' && strcmp(f->name, "state") == 0))
    table_put(root, "state.path", cJSON_CreateString("/tmp/ust-table-state.json"));
  if (strcmp(f->section, "metrics") == 0 && strcmp(f->name, "host") == 0)
    table_put(root, "metrics.port", cJSON_CreateNumber(0));
  return root;
}

/* Where the parser keeps the fields of f's section, in c. */
static const void *table_base(const ust__config *c, const ust__config_field *f) {
  if (strncmp(f->section, "operators.<name>", 16) != 0)
    return c;
  const ust__op_config *oc = &c->ops[0];
  if (strstr(f->section, ".candidate") != NULL)
    return &oc->cand;
  if (strstr(f->section, ".promotion") != NULL)
    return &oc->promotion;
  if (strstr(f->section, ".routes") != NULL)
    return &oc->routes[0];
  return oc;
}

static int table_parse(cJSON *root, ust__config *c) {
  char *text = cJSON_PrintUnformatted(root);
  int rc = ust__config_parse(text, c);
  if (rc != 0)
    fprintf(stderr, "refused %s: %s\n", text, ust_last_error());
  free(text);
  return rc;
}

TEST(config_accepts_every_field_of_its_table_and_starts_from_its_defaults) {
  int n = 0;
  const ust__config_field *t = ust__config_fields(&n);
  ASSERT_INT_GE(n, 60);
  for (int i = 0; i < n; i++) {
    const ust__config_field *f = &t[i];
    char path[256];
    table_path(f->section, f->name, path, sizeof path);
    cJSON *with = table_context(f), *without = table_context(f);
    table_put(with, path, table_example(f));
    ust__config a, b;
    ASSERT_INT_EQ(table_parse(with, &a), 0);
    /* given as its default, a field leaves the parser where it started */
    if (f->def != NULL && f->size > 0) {
      ASSERT_INT_EQ(table_parse(without, &b), 0);
      if (memcmp((const char *)table_base(&a, f) + f->offset, (const char *)table_base(&b, f) + f->offset, f->size))
        fprintf(stderr, "%s: given as its default %s, it is not what the parser starts from\n", path, f->def);
      ASSERT_INT_EQ(memcmp((const char *)table_base(&a, f) + f->offset, (const char *)table_base(&b, f) + f->offset,
                           f->size), 0);
      ust__config_free(&b);
    }
    ust__config_free(&a);
    cJSON_Delete(with);
    cJSON_Delete(without);
  }
}

TEST(config_refuses_every_key_its_table_lacks_naming_the_keys_it_has) {
  int n = 0;
  const ust__config_field *t = ust__config_fields(&n);
  for (int i = 0; i < n; i++) {
    const ust__config_field *f = &t[i];
    if (i > 0 && strcmp(t[i - 1].section, f->section) == 0)
      continue; /* one try a section, at its first field */
    if (f->name[0] == '<')
      continue; /* a map's keys are the user's */
    char path[256], key[300], list[512] = "", want[1024];
    table_path(f->section, NULL, path, sizeof path);
    snprintf(key, sizeof key, "%s%snot_a_field", path, *path ? "." : "");
    for (int k = 0; k < n; k++)
      if (strcmp(t[k].section, f->section) == 0)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? ", " : "", t[k].name);
    snprintf(want, sizeof want, "config: unknown field '%s' (expected one of: %s)", key, list);
    cJSON *root = table_context(f);
    table_put(root, key, cJSON_CreateNumber(1));
    char *text = cJSON_PrintUnformatted(root);
    ust__config c;
    ASSERT_INT_EQ(ust__config_parse(text, &c), UST_ECONFIG);
    ASSERT_STR_EQ(ust_last_error(), want);
    free(text);
    cJSON_Delete(root);
  }
}

TEST(config_field_table_is_well_formed) {
  int n = 0;
  const ust__config_field *t = ust__config_fields(&n);
  int reloadable = 0;
  for (int i = 0; i < n; i++) {
    const ust__config_field *f = &t[i];
    char path[256], sec[256];
    snprintf(path, sizeof path, "%s%s%s", f->section, *f->section ? "." : "", f->name);
    ASSERT_TRUE(f->doc != NULL && f->doc[0] != '\0');
    ASSERT_TRUE(!(f->def != NULL && f->def_words != NULL));
    /* each section is an object of the table, its keys side by side */
    int parent = f->section[0] == '\0', together = 1;
    for (int k = 0; k < n; k++) {
      snprintf(sec, sizeof sec, "%s%s%s", t[k].section, *t[k].section ? "." : "", t[k].name);
      parent |= strcmp(sec, f->section) == 0 && (t[k].type == UST__FIELD_OBJECT ||
                                                 t[k].type == UST__FIELD_MODE_OR_OBJECT || t[k].type == UST__FIELD_MAP);
      if (k != i)
        ASSERT_TRUE(strcmp(sec, path) != 0); /* no field twice */
      if (k + 1 < i && strcmp(t[k].section, f->section) == 0 && strcmp(t[i - 1].section, f->section) != 0)
        together = 0;
    }
    if (!parent || !together)
      fprintf(stderr, "%s: its section is no object of the table, or its keys are apart\n", path);
    ASSERT_TRUE(parent && together);
    if (f->type == UST__FIELD_INTEGER || f->type == UST__FIELD_COUNT || f->type == UST__FIELD_NUMBER)
      ASSERT_TRUE(f->lo <= f->hi);
    if (f->type == UST__FIELD_CHOICE)
      ASSERT_TRUE(f->choices != NULL && f->choices[0] != NULL);
    reloadable += (f->flags & UST__FIELD_RELOADABLE) != 0;
    if (f->flags & UST__FIELD_RELOADABLE) /* the reload's refusal names them in words */
      ASSERT_STR_EQ(f->section, "operators.<name>");
  }
  ASSERT_INT_EQ(reloadable, 5);
  /* choices read by the table are the codes the rest of the core uses */
  int log_levels[] = {UST_LOG_ERROR, UST_LOG_WARN, UST_LOG_INFO, UST_LOG_DEBUG};
  for (int i = 0; i < n; i++) {
    if (strcmp(t[i].section, "") == 0 && strcmp(t[i].name, "log_level") == 0)
      for (int k = 0; k < 4; k++)
        ASSERT_INT_EQ(k, log_levels[k]);
    if (strcmp(t[i].section, "operators.<name>.guard") == 0 && strcmp(t[i].name, "compare") == 0)
      for (int k = 0; t[i].choices[k] != NULL; k++)
        ASSERT_INT_EQ(ust__cmp_kind_parse(t[i].choices[k]), k);
    if (strcmp(t[i].section, "timer") == 0 && strcmp(t[i].name, "kind") == 0) {
      ASSERT_STR_EQ(t[i].choices[UST__TIMER_AUTO], "auto");
      ASSERT_STR_EQ(t[i].choices[UST__TIMER_CUPTI], "cupti");
      ASSERT_STR_EQ(t[i].choices[UST__TIMER_EVENTS], "events");
    }
    if (strcmp(t[i].name, "qualify") == 0) {
      ASSERT_STR_EQ(t[i].choices[UST__QUALIFY_HERE], "here");
      ASSERT_STR_EQ(t[i].choices[UST__QUALIFY_PROCESS], "process");
    }
  }
}
