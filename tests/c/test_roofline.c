/* Hardware profiles and T_SOL, against the Atrex-Bench roofline.json files
 * (tests/data/atrex-bench: the benchmark's own figures are the ground truth). */
#include <dirent.h>
#include <math.h>

#include <cjson/cJSON.h>

#include "plugin/plugin.h"
#include "dispatch/dispatch.h"
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

/* ---- the definitions in problems/ against roofline.json ---------------------
 *
 * Each Atrex-Bench shape's kwargs are laid onto the argument tensors of the
 * dispatcher op the operator binds, as the serving framework would call it;
 * the binding's roofline then has to give the benchmark's W and Q exactly. */

typedef struct call_builder {
  ust__arg args[8];
  int64_t shapes[8][8];
  int nargs;
} call_builder;

static void tensor(call_builder *cb, int i, int ndim, const int64_t *shape) {
  ust__arg *a = &cb->args[i];
  memset(a, 0, sizeof *a);
  a->kind = UST__ARG_TENSOR;
  a->dtype = UST__DT_BF16;
  a->t.ndim = ndim;
  a->t.dtype = (DLDataType){kDLBfloat, 16, 1};
  memcpy(cb->shapes[i], shape, sizeof(int64_t) * (size_t)ndim);
  a->t.shape = cb->shapes[i];
}

static void scalar(call_builder *cb, int i) {
  memset(&cb->args[i], 0, sizeof cb->args[i]);
  cb->args[i].kind = UST__ARG_DOUBLE;
}

static double kw(const cJSON *shape, const char *name) {
  return cJSON_GetObjectItem(cJSON_GetObjectItem(shape, "input_kwargs"), name)->valuedouble;
}

static void build_rms_norm(const cJSON *s, call_builder *cb) { /* _C::rms_norm(result!, input, weight, epsilon) */
  int64_t t = (int64_t)kw(s, "token_count"), h = (int64_t)kw(s, "hidden_size");
  tensor(cb, 0, 2, (int64_t[]){t, h});
  tensor(cb, 1, 2, (int64_t[]){t, h});
  tensor(cb, 2, 1, (int64_t[]){h});
  scalar(cb, 3);
  cb->nargs = 4;
}

static void build_fused_add(const cJSON *s, call_builder *cb) { /* (input!, residual!, weight, epsilon) */
  int64_t t = (int64_t)kw(s, "token_count"), h = (int64_t)kw(s, "hidden_size");
  tensor(cb, 0, 2, (int64_t[]){t, h});
  tensor(cb, 1, 2, (int64_t[]){t, h});
  tensor(cb, 2, 1, (int64_t[]){h});
  scalar(cb, 3);
  cb->nargs = 4;
}

static void build_silu_and_mul(const cJSON *s, call_builder *cb) { /* (result!, input): input [..., 2d] */
  const cJSON *shape = cJSON_GetObjectItem(cJSON_GetObjectItem(s, "input_kwargs"), "shape");
  int64_t dims[8];
  int n = cJSON_GetArraySize(shape);
  for (int i = 0; i < n; i++)
    dims[i] = (int64_t)cJSON_GetArrayItem(shape, i)->valuedouble;
  tensor(cb, 1, n, dims);
  dims[n - 1] /= 2;
  tensor(cb, 0, n, dims);
  cb->nargs = 2;
}

static const struct {
  const char *atrex, *problem, *op;
  const char *names[8];
  void (*build)(const cJSON *, call_builder *);
} cases[] = {
    {"rms_norm", "rms_norm", "_C::rms_norm", {"result", "input", "weight", "epsilon"}, build_rms_norm},
    {"fused_add_rms_norm", "fused_add_rms_norm", "_C::fused_add_rms_norm", {"input", "residual", "weight", "epsilon"},
     build_fused_add},
    {"silu_and_mul", "silu_and_mul", "_C::silu_and_mul", {"result", "input"}, build_silu_and_mul},
};

static cJSON *load_json(const char *path) {
  size_t len = 0;
  char *text = ust__read_file(path, &len);
  if (text == NULL) {
    fprintf(stderr, "%s cannot be read\n", path);
    exit(1);
  }
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (j == NULL) {
    fprintf(stderr, "%s is not JSON\n", path);
    exit(1);
  }
  return j;
}

TEST(roofline_definitions_reproduce_atrex) {
  ust__problem_set set;
  ASSERT_INT_EQ(ust__problems_load_dir(UST_SOURCE_DIR "/problems", &set), 0);
  int checked = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const ust__problem *p = ust__problems_find(&set, cases[c].problem);
    ASSERT_TRUE(p != NULL);
    const ust__binding_def *def = NULL;
    for (int b = 0; b < p->n_bindings; b++)
      if (strcmp(p->bindings[b].op, cases[c].op) == 0)
        def = &p->bindings[b];
    ASSERT_TRUE(def != NULL && def->roofline.present);
    ust__roofline_prog prog;
    ASSERT_INT_EQ(ust__roofline_compile(&def->roofline, p->path, &prog), 0);
    int nargs = 0;
    while (nargs < 8 && cases[c].names[nargs] != NULL)
      nargs++;
    ust__roofline_resolve(&prog, nargs, cases[c].names);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/atrex-bench/%s/shapes.json", UST_SOURCE_DIR, cases[c].atrex);
    cJSON *shapes = load_json(path);
    snprintf(path, sizeof path, "%s/tests/data/atrex-bench/%s/roofline.json", UST_SOURCE_DIR, cases[c].atrex);
    cJSON *roof = load_json(path);
    const cJSON *s;
    cJSON_ArrayForEach(s, shapes) {
      call_builder cb;
      memset(&cb, 0, sizeof cb);
      cases[c].build(s, &cb);
      ust__call call = {.size = sizeof call, .nargs = cb.nargs, .args = cb.args, .device = UST__DEV_CUDA};
      double w[UST__N_PATHS], qr, qw;
      ASSERT_INT_EQ(ust__roofline_eval(&prog, &call, w, &qr, &qw), 0);
      const cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(roof, "shapes"), s->string);
      ASSERT_TRUE(want != NULL);
      const double ww = cJSON_GetObjectItem(cJSON_GetObjectItem(want, "semantic_W_flops"), "bf16")->valuedouble;
      const double wr = cJSON_GetObjectItem(want, "semantic_Q_read_bytes")->valuedouble;
      const double wq = cJSON_GetObjectItem(want, "semantic_Q_write_bytes")->valuedouble;
      if (w[UST__PATH_BF16] != ww || qr != wr || qw != wq) {
        fprintf(stderr, "%s shape %s: W %.17g Qr %.17g Qw %.17g; roofline.json %.17g %.17g %.17g\n", cases[c].atrex,
                s->string, w[UST__PATH_BF16], qr, qw, ww, wr, wq);
        ASSERT_TRUE(0);
      }
      checked++;
    }
    cJSON_Delete(shapes);
    cJSON_Delete(roof);
    ust__roofline_free(&prog);
  }
  fprintf(stderr, "%d shapes reproduced exactly\n", checked);
  ASSERT_TRUE(checked == 56 + 19 + 37);
  ust__problems_free(&set);
}

TEST(roofline_definition_errors_name_field) {
  const struct {
    const char *roofline, *needle;
  } bad[] = {
      {"{\"vars\": {\"M\": \"rows(x)\"}, \"W\": \"M * Q\", \"W_dtype\": \"x\", \"Q_read\": \"M\", \"Q_write\": \"M\"}",
       "'bindings[0].roofline.W': expression 'M * Q': unknown name"},
      {"{\"vars\": {\"M\": \"rows(x\"}, \"W\": \"M\", \"W_dtype\": \"x\", \"Q_read\": \"M\", \"Q_write\": \"M\"}",
       "'bindings[0].roofline.vars.M'"},
      {"{\"vars\": {}, \"W\": \"1\", \"Q_read\": \"1\", \"Q_write\": \"1\"}", "'bindings[0].roofline.W_dtype'"},
      {"{\"vars\": {}, \"W\": \"1\", \"W_dtype\": \"x\", \"Q_read\": \"1\"}", "'bindings[0].roofline.Q_write'"},
      {"{\"vars\": {}, \"W\": \"1\", \"W_dtype\": \"x\", \"Q_read\": \"1\", \"Q_write\": \"1\", \"Qw\": 1}",
       "unknown field 'bindings[0].roofline.Qw'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": [{\"op\": \"a::b\", \"key\": {\"M\": \"rows(x)\"},"
             " \"roofline\": %s}]}",
             bad[i].roofline);
    ust__problem p;
    ASSERT_INT_EQ(ust__problem_parse(text, "r.json", &p), UST_EPROBLEM);
    ASSERT_STR_CONTAINS(ust_last_error(), "r.json");
    ASSERT_STR_CONTAINS(ust_last_error(), bad[i].needle);
  }
}
