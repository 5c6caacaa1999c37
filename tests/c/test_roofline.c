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
  /* other SKUs of the same chip are not the datasheet's SXM part */
  ASSERT_TRUE(ust__hw_pick(&set, "NVIDIA H100 PCIe") == NULL);
  ASSERT_TRUE(ust__hw_pick(&set, "NVIDIA H100 NVL") == NULL);
  ASSERT_TRUE(ust__hw_pick(&set, "NVIDIA H200 NVL") == NULL);
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
    char *text = ust__read_file(path, UST__FILE_MAX << 6, &len);
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
  ASSERT_INT_EQ(ops, 23);
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
 * Each operator definition with an "atrex" block says, per binding, how an
 * Atrex-Bench shape's kwargs lay onto the dispatcher op's arguments ("call":
 * tensor shapes and scalars as expressions over the kwargs). Every shape of
 * every such operator is built as a call view, and the binding's roofline
 * has to give the benchmark's W and Q exactly. Where the benchmark's
 * semantics differ from what a live call touches (it counts a whole KV cache
 * pool, leaves out an index output), the atrex block's "roofline" overrides
 * vars and expressions for this test only, and says so. An operator hosted
 * inside other ops (no dispatcher op of its own) carries a "formula" over the
 * kwargs instead, checked the same way. List kwargs are exposed as
 * NAME_len, NAME_rows (product of all but the last), NAME_last, NAME_numel
 * and NAME_0, NAME_1, ... */

#define MAX_KW 48

typedef struct kwvars {
  int n;
  char names[MAX_KW][64];
  const char *ptrs[MAX_KW];
  double vals[MAX_KW];
} kwvars;

static void kw_add(kwvars *v, const char *name, double x) {
  if (v->n == MAX_KW)
    return;
  snprintf(v->names[v->n], sizeof v->names[0], "%s", name);
  v->ptrs[v->n] = v->names[v->n];
  v->vals[v->n++] = x;
}

static void kw_collect(kwvars *v, const cJSON *obj) {
  const cJSON *it;
  cJSON_ArrayForEach(it, obj) {
    if (cJSON_IsNumber(it)) {
      kw_add(v, it->string, it->valuedouble);
    } else if (cJSON_IsBool(it)) {
      kw_add(v, it->string, cJSON_IsTrue(it));
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) > 0) {
      char name[64];
      double rows = 1, numel = 1;
      int n = cJSON_GetArraySize(it);
      for (int i = 0; i < n; i++) {
        double x = cJSON_GetArrayItem(it, i)->valuedouble;
        snprintf(name, sizeof name, "%s_%d", it->string, i);
        kw_add(v, name, x);
        numel *= x;
        if (i < n - 1)
          rows *= x;
      }
      const struct {
        const char *suffix;
        double x;
      } derived[] = {{"len", n}, {"rows", rows}, {"numel", numel},
                     {"last", cJSON_GetArrayItem(it, n - 1)->valuedouble}};
      for (size_t k = 0; k < sizeof derived / sizeof derived[0]; k++) {
        snprintf(name, sizeof name, "%s_%s", it->string, derived[k].suffix);
        kw_add(v, name, derived[k].x);
      }
    }
  }
}

static double kw_eval(const kwvars *v, const char *text) {
  ust__expr *e = NULL;
  double x = 0;
  if (ust__expr_compile(text, v->ptrs, v->n, &e) != 0 || ust__expr_eval(e, v->vals, &x) != 0) {
    fprintf(stderr, "call expression: %s\n", ust_last_error());
    exit(1);
  }
  ust__expr_free(e);
  return x;
}

static int dtype_of_name(const char *s, DLDataType *dl) {
  static const struct {
    const char *name;
    int id;
    DLDataType dl;
  } t[] = {{"bf16", UST__DT_BF16, {kDLBfloat, 16, 1}}, {"fp16", UST__DT_F16, {kDLFloat, 16, 1}},
           {"fp32", UST__DT_F32, {kDLFloat, 32, 1}},   {"fp8_e4m3", UST__DT_F8E4M3FN, {kDLFloat, 8, 1}},
           {"int32", UST__DT_I32, {kDLInt, 32, 1}},    {"int64", UST__DT_I64, {kDLInt, 64, 1}},
           {"uint8", UST__DT_U8, {kDLUInt, 8, 1}},     {"bool", UST__DT_BOOL, {kDLUInt, 8, 1}}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (strcmp(s, t[i].name) == 0) {
      *dl = t[i].dl;
      return t[i].id;
    }
  fprintf(stderr, "unknown dtype '%s' in an atrex call\n", s);
  exit(1);
}

typedef struct call_builder {
  ust__arg args[UST__MAX_ARGS];
  int64_t shapes[UST__MAX_ARGS][8];
  const char *names[UST__MAX_ARGS];
  int nargs;
} call_builder;

static void build_call(const cJSON *spec, const kwvars *v, call_builder *cb) {
  memset(cb, 0, sizeof *cb);
  const cJSON *a;
  cJSON_ArrayForEach(a, spec) {
    ust__arg *x = &cb->args[cb->nargs];
    cb->names[cb->nargs] = cJSON_GetObjectItem(a, "name")->valuestring;
    const cJSON *t = cJSON_GetObjectItem(a, "tensor"), *d;
    if (t != NULL) {
      x->kind = UST__ARG_TENSOR;
      x->dtype = dtype_of_name(cJSON_GetObjectItem(a, "dtype")->valuestring, &x->t.dtype);
      x->t.ndim = cJSON_GetArraySize(t);
      for (int i = 0; i < x->t.ndim; i++)
        cb->shapes[cb->nargs][i] = (int64_t)kw_eval(v, cJSON_GetArrayItem(t, i)->valuestring);
      x->t.shape = cb->shapes[cb->nargs];
    } else if ((d = cJSON_GetObjectItem(a, "double")) != NULL) {
      x->kind = UST__ARG_DOUBLE;
      x->f = kw_eval(v, d->valuestring);
    } else if ((d = cJSON_GetObjectItem(a, "int")) != NULL) {
      x->kind = UST__ARG_INT;
      x->i = (int64_t)kw_eval(v, d->valuestring);
    } else if (cJSON_GetObjectItem(a, "none") != NULL) {
      x->kind = UST__ARG_NONE;
    } else {
      x->kind = UST__ARG_OTHER;
    }
    cb->nargs++;
  }
}

static cJSON *load_json(const char *path) {
  size_t len = 0;
  char *text = ust__read_file(path, UST__FILE_MAX << 6, &len);
  if (text == NULL)
    return NULL;
  cJSON *j = cJSON_Parse(text);
  free(text);
  return j;
}

TEST(roofline_definitions_reproduce_atrex) {
  ust__problem_set set;
  ASSERT_INT_EQ(ust__problems_load_dir(UST_SOURCE_DIR "/problems", &set), 0);
  int checked = 0, operators = 0, bounded = 0;
  for (int pi = 0; pi < set.n; pi++) {
    const ust__problem *p = &set.items[pi];
    cJSON *file = load_json(p->path);
    ASSERT_TRUE(file != NULL);
    const cJSON *atrex = cJSON_GetObjectItem(file, "atrex");
    char path[1024];
    cJSON *shapes = NULL, *roof = NULL;
    if (atrex != NULL) {
      const char *name = cJSON_GetObjectItem(atrex, "operator")->valuestring;
      snprintf(path, sizeof path, "%s/tests/data/atrex-bench/%s/shapes.json", UST_SOURCE_DIR, name);
      shapes = load_json(path);
      snprintf(path, sizeof path, "%s/tests/data/atrex-bench/%s/roofline.json", UST_SOURCE_DIR, name);
      roof = load_json(path);
    }
    /* An operator hosted in other ops binds nothing: its atrex block's
     * "formula" gives W and Q over the benchmark's kwargs, checked the same
     * way; so does an operator whose bound ops each run part of what the
     * benchmark times (one GEMM of a whole MoE layer). */
    const cJSON *formula = atrex != NULL && roof != NULL ? cJSON_GetObjectItem(atrex, "formula") : NULL;
    if (p->n_hosted > 0)
      ASSERT_TRUE(p->n_bindings == 0 && (roof == NULL || formula != NULL));
    const cJSON *fs, *fshapes = formula != NULL ? shapes : NULL;
    int hosted_shapes = 0;
    cJSON_ArrayForEach(fs, fshapes) {
      kwvars v = {0};
      kw_collect(&v, cJSON_GetObjectItem(fs, "input_kwargs"));
      kw_collect(&v, cJSON_GetObjectItem(fs, "init_kwargs"));
      const cJSON *fv;
      cJSON_ArrayForEach(fv, cJSON_GetObjectItem(formula, "vars")) kw_add(&v, fv->string, kw_eval(&v, fv->valuestring));
      const cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(roof, "shapes"), fs->string);
      ASSERT_TRUE(want != NULL);
      const double w = kw_eval(&v, cJSON_GetObjectItem(formula, "W")->valuestring);
      const double qr = kw_eval(&v, cJSON_GetObjectItem(formula, "Q_read")->valuestring);
      const double qw = kw_eval(&v, cJSON_GetObjectItem(formula, "Q_write")->valuestring);
      const cJSON *ww = cJSON_GetObjectItem(want, "semantic_W_flops");
      const cJSON *wpath = cJSON_GetObjectItem(ww, cJSON_GetObjectItem(formula, "W_dtype")->valuestring);
      const double wr = cJSON_GetObjectItem(want, "semantic_Q_read_bytes")->valuedouble;
      const double wq = cJSON_GetObjectItem(want, "semantic_Q_write_bytes")->valuedouble;
      /* W on the formula's one path; an empty semantic_W_flops is W = 0 */
      const int n_w = cJSON_GetArraySize(ww);
      const int same = n_w <= 1 && (n_w == 0 || wpath != NULL) && w == (wpath != NULL ? wpath->valuedouble : 0) &&
                       qr == wr && qw == wq;
      if (!same) {
        fprintf(stderr, "%s (hosted) shape %s: W %.17g; Q_read %.17g (%.17g); Q_write %.17g (%.17g)\n", p->name,
                fs->string, w, qr, wr, qw, wq);
        ASSERT_TRUE(0);
      }
      hosted_shapes++;
      checked++;
    }
    if (hosted_shapes > 0) {
      if (p->n_hosted > 0)
        fprintf(stderr, "%s: hosted in %s%s, %d shapes reproduced from its formula\n", p->name, p->hosted_in[0],
                p->n_hosted > 1 ? " and others" : "", hosted_shapes);
      else
        fprintf(stderr, "%s: %d shapes reproduced from its formula over Atrex-Bench's kwargs\n", p->name,
                hosted_shapes);
      operators++;
    }
    const cJSON *bindings = atrex != NULL && roof != NULL ? cJSON_GetObjectItem(atrex, "bindings") : NULL;
    const cJSON *bj;
    cJSON_ArrayForEach(bj, bindings) {
      const cJSON *spec = cJSON_GetObjectItem(bj, "call");
      if (spec == NULL)
        continue;
      const ust__binding_def *def = NULL;
      for (int b = 0; b < p->n_bindings; b++)
        if (strcmp(p->bindings[b].op, bj->string) == 0)
          def = &p->bindings[b];
      ASSERT_TRUE(def != NULL && def->roofline.present);
      ust__roofline_def rdef = def->roofline;
      const cJSON *ov = cJSON_GetObjectItem(bj, "roofline");
      if (ov != NULL) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(ov, "vars")) {
          ASSERT_TRUE(rdef.n_vars < UST__MAX_RVARS);
          snprintf(rdef.vars[rdef.n_vars].name, sizeof rdef.vars[0].name, "%s", it->string);
          snprintf(rdef.vars[rdef.n_vars].expr, sizeof rdef.vars[0].expr, "%s", it->valuestring);
          rdef.n_vars++;
        }
        const char *fields[] = {"W", "Q_read", "Q_write"};
        char *dst[] = {rdef.w, rdef.q_read, rdef.q_write};
        for (int k = 0; k < 3; k++)
          if ((it = cJSON_GetObjectItem(ov, fields[k])) != NULL)
            snprintf(dst[k], UST__EXPR_MAX, "%s", it->valuestring);
        char *text = cJSON_PrintUnformatted(ov);
        fprintf(stderr, "%s (%s): Atrex-Bench's own semantics for %s\n", p->name, bj->string, text);
        cJSON_free(text);
      }
      ust__roofline_prog prog;
      ASSERT_INT_EQ(ust__roofline_compile(&rdef, p->path, &prog), 0);
      int resolved = 0;
      const cJSON *s;
      cJSON_ArrayForEach(s, shapes) {
        kwvars v = {0};
        kw_collect(&v, cJSON_GetObjectItem(s, "input_kwargs"));
        kw_collect(&v, cJSON_GetObjectItem(s, "init_kwargs"));
        call_builder cb;
        build_call(spec, &v, &cb);
        if (!resolved) {
          ust__roofline_resolve(&prog, cb.nargs, cb.names, p->name, NULL);
          resolved = 1;
        }
        ust__call call = {.size = sizeof call, .nargs = cb.nargs, .args = cb.args, .device = UST__DEV_CUDA};
        double w[UST__N_PATHS], qr, qw;
        ASSERT_INT_EQ(ust__roofline_eval(&prog, &call, 0, w, &qr, &qw), 0);
        const cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(roof, "shapes"), s->string);
        ASSERT_TRUE(want != NULL);
        double ww[UST__N_PATHS] = {0};
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(want, "semantic_W_flops")) ww[ust__path_parse(it->string)] =
            it->valuedouble;
        const double wr = cJSON_GetObjectItem(want, "semantic_Q_read_bytes")->valuedouble;
        const double wq = cJSON_GetObjectItem(want, "semantic_Q_write_bytes")->valuedouble;
        /* "bounds": {"W" | "Q_read" | "Q_write": "upper"}: a term the benchmark
         * took from random inputs (which expert ids, duplicate pairs collapsing),
         * which the definition bounds from above */
        const cJSON *bounds = cJSON_GetObjectItem(bj, "bounds");
        const int w_upper = bounds != NULL && cJSON_GetObjectItem(bounds, "W") != NULL;
        const int qr_upper = bounds != NULL && cJSON_GetObjectItem(bounds, "Q_read") != NULL;
        const int qw_upper = bounds != NULL && cJSON_GetObjectItem(bounds, "Q_write") != NULL;
        int same = (qr_upper ? qr >= wr : qr == wr) && (qw_upper ? qw >= wq : qw == wq);
        for (int d = 0; d < UST__N_PATHS; d++)
          same &= w_upper ? w[d] >= ww[d] && (w[d] > 0) == (ww[d] > 0) : w[d] == ww[d];
        if ((w_upper || qr_upper || qw_upper) && same)
          bounded++;
        if (!same) {
          fprintf(stderr, "%s (%s) shape %s: W", p->name, bj->string, s->string);
          for (int d = 0; d < UST__N_PATHS; d++)
            if (w[d] != 0 || ww[d] != 0)
              fprintf(stderr, " %s %.17g (roofline.json %.17g)", ust__path_name(d), w[d], ww[d]);
          fprintf(stderr, "; Q_read %.17g (%.17g); Q_write %.17g (%.17g)\n", qr, wr, qw, wq);
          ASSERT_TRUE(0);
        }
        checked++;
      }
      ust__roofline_free(&prog);
      operators++;
    }
    cJSON_Delete(shapes);
    cJSON_Delete(roof);
    cJSON_Delete(file);
  }
  fprintf(stderr, "%d bindings and hosted operators, %d shapes reproduced exactly (of them %d with a term bounded "
                  "from above where the benchmark drew random inputs)\n", operators, checked, bounded);
  ASSERT_TRUE(operators >= 23 && checked >= 358 && bounded >= 29);
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
      {"{\"vars\": {}, \"W\": \"1\", \"W_dtype\": \"x\", \"Q_read\": \"1\", \"Q_write\": \"1\", \"estimate\": 2}",
       "'bindings[0].roofline.estimate' must be a text"},
      {"{\"vars\": {}, \"W\": \"1\", \"W_dtype\": \"x\", \"Q_read\": \"1\", \"Q_write\": \"1\", \"estimate\": \"\"}",
       "'bindings[0].roofline.estimate' must be a text"},
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

/* int8 products (_int_mm) are booked on an int8 path, every 8-bit float on
 * the fp8 one, with the H100's and H200's datasheet figures (dense: the
 * sparse 3,958 TOPS halved); dtsize() reads the dtype an out_dtype argument
 * (a ScalarType, numbered as c10 numbers it) names. */
TEST(int8_and_fp8_products_have_their_paths) {
  ASSERT_INT_EQ(ust__path_parse("int8"), UST__PATH_INT8);
  ASSERT_STR_CONTAINS(ust__path_name(UST__PATH_INT8), "int8");
  ASSERT_INT_EQ(ust__path_of_dtype(UST__DT_I8), UST__PATH_INT8);
  ASSERT_INT_EQ(ust__path_of_dtype(UST__DT_F8E5M2), UST__PATH_FP8_E4M3);
  ASSERT_INT_EQ(ust__path_of_dtype(UST__DT_I32), -1);
  ASSERT_INT_EQ(ust__path_of_dtype(UST__DT_U8), -1);
  ust__hw_set set;
  ASSERT_INT_EQ(ust__hw_load_dir(UST_SOURCE_DIR "/problems/hardware", &set), 0);
  const char *devices[] = {"NVIDIA H100 80GB HBM3", "NVIDIA H200"};
  for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
    const ust__hw_profile *p = ust__hw_pick(&set, devices[i]);
    ASSERT_TRUE(p != NULL);
    ASSERT_DBL_NEAR(p->p_peak[UST__PATH_INT8], 3957.8e12 / 2, 1e3);
    ASSERT_DBL_NEAR(p->p_peak[UST__PATH_FP8_E4M3], 3957.8e12 / 2, 1e3);
    /* 2 * 4096^3 int8 operations, 4096^2 * (1 + 1 + 4) bytes: compute-bound */
    double w[UST__N_PATHS] = {0}, s = 0;
    w[UST__PATH_INT8] = 2.0 * 4096 * 4096 * 4096;
    ASSERT_INT_EQ(ust__roofline_tsol(p, w, 6.0 * 4096 * 4096, &s), 0);
    ASSERT_DBL_NEAR(s, w[UST__PATH_INT8] / (3957.8e12 / 2), 1e-12);
  }
  ust__hw_free(&set);

  ust__arg args[3];
  memset(args, 0, sizeof args);
  args[0].kind = UST__ARG_INT;
  args[1].kind = UST__ARG_NONE;
  args[2].kind = UST__ARG_DOUBLE;
  ust__call call = {.size = sizeof call, .nargs = 3, .args = args, .device = UST__DEV_CPU};
  const struct {
    int arg;
    int64_t scalar_type, want;
  } cases[] = {{0, 15, 2}, {0, 24, 1}, {0, 23, 1}, {0, 6, 4}, {0, 3, 4}, {0, 1, 1}, {0, 44, 1}, {0, 999, -1},
               {0, -1, -1}, {1, 0, 0}, {2, 0, -1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ust__dim_prog p;
    ASSERT_INT_EQ(ust__dim_compile("dtsize(out_dtype)", &p), 0);
    ASSERT_INT_EQ(p.kind, UST__DIM_DTSIZE);
    p.arg_index = cases[i].arg;
    args[0].i = cases[i].scalar_type;
    ASSERT_INT_EQ(ust__dim_eval(&p, &call), cases[i].want);
  }
}
