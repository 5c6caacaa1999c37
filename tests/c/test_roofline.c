/* Hardware profiles and T_SOL, against the Atrex-Bench roofline.json files
 * (tests/data/atrex-bench: the benchmark's own figures are the ground truth). */
#include <dirent.h>
#include <math.h>

#include <cjson/cJSON.h>

#include "plugin/plugin.h"
#include "scorer/scorer.h"
#include "tests/c/runner.h"

TEST(hardware_profiles_shipped_load) {
  ust__hw_set set;
  ASSERT_INT_EQ(ust__hw_load_dir(UST_SOURCE_DIR "/problems/hardware", &set), 0);
  ASSERT_TRUE(set.n >= 7);
  const struct {
    const char *device, *profile;
  } picks[] = {{"NVIDIA H200", "H200 SXM"}, {"NVIDIA H20", "H20"},      {"NVIDIA H100 80GB HBM3", "H100 SXM5"},
               {"NVIDIA B200", "B200 (HGX, 1000 W)"}, {"AMD Instinct MI300X", "MI300X"}, {"AMD Instinct MI325X", "MI325X"}};
  for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) {
    const ust__hw_profile *p = ust__hw_pick(&set, picks[i].device);
    ASSERT_TRUE(p != NULL);
    ASSERT_STR_CONTAINS(p->name, picks[i].profile);
    ASSERT_TRUE(p->b_peak > 0 && p->p_peak[UST__PATH_BF16] > 0);
  }
  ASSERT_TRUE(ust__hw_pick(&set, "NVIDIA GeForce RTX 4090") == NULL);
  ust__hw_free(&set);
}

TEST(hardware_profile_errors_name_field) {
  const struct {
    const char *json, *needle;
  } bad[] = {
      {"[]", "top level must be an object"},
      {"{\"schema_version\": 2}", "'schema_version' must be 1"},
      {"{\"schema_version\": 1, \"name\": \"X\", \"match\": [], \"p_peak\": {}, \"b_peak\": 1, \"source\": \"s\"}",
       "'match'"},
      {"{\"schema_version\": 1, \"name\": \"X\", \"match\": [\"X\"], \"p_peak\": {\"bf17\": 1}, \"b_peak\": 1,"
       " \"source\": \"s\"}", "'p_peak.bf17' is not a path"},
      {"{\"schema_version\": 1, \"name\": \"X\", \"match\": [\"X\"], \"p_peak\": {\"bf16\": -1}, \"b_peak\": 1,"
       " \"source\": \"s\"}", "'p_peak.bf16' must be a positive number"},
      {"{\"schema_version\": 1, \"name\": \"X\", \"match\": [\"X\"], \"p_peak\": {\"bf16\": 1}, \"b_peak\": 0,"
       " \"source\": \"s\"}", "'b_peak'"},
      {"{\"schema_version\": 1, \"name\": \"X\", \"match\": [\"X\"], \"p_peak\": {\"bf16\": 1}, \"b_peak\": 1}",
       "'source'"},
      {"{\"schema_version\": 1, \"nam\": \"X\"}", "unknown field 'nam'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ust__hw_profile p;
    ASSERT_INT_EQ(ust__hw_parse(bad[i].json, "bad.json", &p), UST_EPROBLEM);
    ASSERT_STR_CONTAINS(ust_last_error(), "bad.json");
    ASSERT_STR_CONTAINS(ust_last_error(), bad[i].needle);
  }
  ust__hw_set set;
  ASSERT_INT_EQ(ust__hw_load_dir("/nonexistent", &set), UST_EPROBLEM);
}

TEST(roofline_reproduces_atrex_sol) {
  ust__hw_set set;
  ASSERT_INT_EQ(ust__hw_load_dir(UST_SOURCE_DIR "/problems/hardware", &set), 0);
  const ust__hw_profile *h20 = ust__hw_pick(&set, "NVIDIA H20"), *xpu = ust__hw_pick(&set, "XPU-A");
  ASSERT_TRUE(h20 != NULL && xpu != NULL);
  const char *root = UST_SOURCE_DIR "/tests/data/atrex-bench";
  DIR *d = opendir(root);
  ASSERT_TRUE(d != NULL);
  int shapes = 0, ops = 0;
  double worst = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/roofline.json", root, e->d_name);
    size_t len = 0;
    char *text = ust__read_file(path, &len);
    if (text == NULL)
      continue;
    cJSON *j = cJSON_Parse(text);
    free(text);
    ASSERT_TRUE(j != NULL);
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItem(j, "shapes")) {
      double w[UST__N_PATHS] = {0};
      const cJSON *it;
      cJSON_ArrayForEach(it, cJSON_GetObjectItem(s, "semantic_W_flops")) {
        int p = ust__path_parse(it->string);
        if (p < 0) {
          fprintf(stderr, "%s: W bucket '%s' has no path\n", path, it->string);
          ASSERT_TRUE(0);
        }
        w[p] += it->valuedouble;
      }
      const double q = cJSON_GetObjectItem(s, "semantic_Q_read_bytes")->valuedouble +
                       cJSON_GetObjectItem(s, "semantic_Q_write_bytes")->valuedouble;
      const cJSON *sol = cJSON_GetObjectItem(s, "SOL_time_ms");
      const struct {
        const ust__hw_profile *hw;
        const char *key;
      } hws[] = {{h20, "H20"}, {xpu, "XPU-A"}};
      for (int h = 0; h < 2; h++) {
        double t = 0;
        ASSERT_INT_EQ(ust__roofline_tsol(hws[h].hw, w, q, &t), 0);
        const double want = cJSON_GetObjectItem(sol, hws[h].key)->valuedouble / 1e3;
        const double rel = fabs(t - want) / want;
        if (rel > worst)
          worst = rel;
        if (rel > 1e-6) {
          fprintf(stderr, "%s shape %s on %s: T_SOL %.9g s, roofline.json %.9g s\n", path, s->string, hws[h].key,
                  t, want);
          ASSERT_TRUE(0);
        }
      }
      shapes++;
    }
    cJSON_Delete(j);
    ops++;
  }
  closedir(d);
  fprintf(stderr, "%d operators, %d shapes, worst relative error %.3g\n", ops, shapes, worst);
  ASSERT_INT_EQ(ops, 22);
  ASSERT_TRUE(shapes > 300);
  /* W on a path the device lacks is an error, not a silent zero */
  double w[UST__N_PATHS] = {0};
  w[UST__PATH_TF32] = 1e12;
  double t;
  ASSERT_INT_EQ(ust__roofline_tsol(xpu, w, 0, &t), UST_EINVAL);
  ASSERT_STR_CONTAINS(ust_last_error(), "no tf32 path");
  ust__hw_free(&set);
}
