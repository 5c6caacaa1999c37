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
        /* the views carry no data: a definition that reads sequence lengths
         * takes its bounds, exact where the sequences share their lengths,
         * as every Atrex-Bench shape's do */
        const int rc = ust__roofline_eval(&prog, &call, 0, w, &qr, &qw);
        ASSERT_TRUE(rc == 0 || (rc == UST__ROOF_BOUNDED && prog.reads_values));
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
      {"{\"vars\": {\"M\": \"rows(x)\"}, \"W\": \"M\", \"W_dtype\": \"x\", \"Q_read\": \"1\", \"Q_write\": \"1\", "
       "\"bound\": {\"M\": \"1\"}}",
       "'bindings[0].roofline.bound.M' names no var that reads sequence lengths"},
      {"{\"vars\": {\"S\": \"seqsum(l)\", \"P\": \"seqdot(l, l)\"}, \"W\": \"S\", \"W_dtype\": \"x\", "
       "\"Q_read\": \"P\", \"Q_write\": \"1\", \"bound\": {\"S\": \"P * 2\"}}",
       "'bindings[0].roofline.bound.S' (over the vars that read no lengths)"},
      {"{\"vars\": {\"S\": \"seqsum(l)\"}, \"W\": \"S\", \"W_dtype\": \"x\", \"Q_read\": \"1\", \"Q_write\": \"1\", "
       "\"bound\": [1]}",
       "'bindings[0].roofline.bound' must be an object"},
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

/* ---- varlen attention: floors from each sequence's lengths ------------------------
 *
 * A call view built here as the seam builds one, its length tensors in host
 * memory the view points at; the truth is counted here sequence by
 * sequence, with plain loops over the lengths. */

/* room for FA3's 34 arguments: the seam views a schema's first ones, which
 * hold every argument a roofline reads */
#define VC_ARGS 40

typedef struct varlen_call {
  ust__arg args[VC_ARGS];
  int64_t shapes[VC_ARGS][5];
} varlen_call;

static ust__arg *vc_tensor(varlen_call *c, int i, int dtype, int bits, int code, int ndim, const int64_t *shape,
                           void *data) {
  ust__arg *a = &c->args[i];
  a->kind = UST__ARG_TENSOR;
  a->dtype = dtype;
  a->t.dtype = (DLDataType){(uint8_t)code, (uint8_t)bits, 1};
  a->t.device = (DLDevice){kDLCPU, 0};
  a->t.ndim = ndim;
  memcpy(c->shapes[i], shape, (size_t)ndim * sizeof *shape);
  a->t.shape = c->shapes[i];
  a->t.data = data;
  return a;
}

static const ust__binding_def *binding_of(const ust__problem_set *set, const char *op) {
  for (int p = 0; p < set->n; p++)
    for (int b = 0; b < set->items[p].n_bindings; b++)
      if (strcmp(set->items[p].bindings[b].op, op) == 0)
        return &set->items[p].bindings[b];
  return NULL;
}

/* The binding's roofline over the call: ust__roofline_eval's answer, W (all
 * paths) and Q read and written. */
static int floor_of(const ust__binding_def *def, const char *const *names, const ust__call *call, double *w,
                    double *qr, double *qw) {
  ust__roofline_prog prog;
  if (ust__roofline_compile(&def->roofline, def->op, &prog) != 0)
    return -100;
  ust__roofline_resolve(&prog, call->nargs, names, def->op, NULL);
  double wp[UST__N_PATHS];
  const int rc = ust__roofline_eval(&prog, call, 0, wp, qr, qw);
  *w = 0;
  for (int p = 0; p < UST__N_PATHS; p++)
    *w += wp[p];
  ust__roofline_free(&prog);
  return rc;
}

static int64_t cdiv64(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* _vllm_fa2_C::varlen_fwd's arguments, in its schema's order */
static const char *const fa2_names[] = {
    "q", "k", "v", "out", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "leftpad_k", "block_table", "alibi_slopes",
    "max_seqlen_q", "max_seqlen_k", "p_dropout", "softmax_scale", "zero_tensors", "is_causal", "window_size_left",
    "window_size_right", "softcap", "return_softmax", "gen"};

/* A causal FA2 call over a paged bf16 cache of width blocks of bs tokens a
 * sequence: T new tokens of ns sequences, their offsets and key lengths
 * (host memory, borrowed). */
static ust__call fa2_call(varlen_call *c, int64_t T, int64_t Hq, int64_t Hk, int64_t D, int64_t bs, int64_t width,
                          int64_t ns, int32_t *cu_q, int32_t *cu_k, int32_t *used, int64_t mq, int64_t mk) {
  memset(c, 0, sizeof *c);
  const int64_t qs[3] = {T, Hq, D}, kc[4] = {ns * width, bs, Hk, D}, ncu[1] = {ns + 1}, nseq[1] = {ns},
                bt[2] = {ns, width};
  vc_tensor(c, 0, UST__DT_BF16, 16, kDLBfloat, 3, qs, NULL);
  vc_tensor(c, 1, UST__DT_BF16, 16, kDLBfloat, 4, kc, NULL);
  vc_tensor(c, 2, UST__DT_BF16, 16, kDLBfloat, 4, kc, NULL);
  vc_tensor(c, 3, UST__DT_BF16, 16, kDLBfloat, 3, qs, NULL);
  vc_tensor(c, 4, UST__DT_I32, 32, kDLInt, 1, ncu, cu_q);
  vc_tensor(c, 5, UST__DT_I32, 32, kDLInt, 1, ncu, cu_k);
  vc_tensor(c, 6, UST__DT_I32, 32, kDLInt, 1, nseq, used);
  vc_tensor(c, 8, UST__DT_I32, 32, kDLInt, 2, bt, NULL);
  c->args[7].kind = c->args[9].kind = c->args[20].kind = UST__ARG_NONE;
  c->args[10].kind = c->args[11].kind = c->args[16].kind = c->args[17].kind = UST__ARG_INT;
  c->args[10].i = mq;
  c->args[11].i = mk;
  c->args[16].i = -1;
  c->args[14].kind = c->args[15].kind = c->args[19].kind = UST__ARG_BOOL;
  c->args[15].i = 1; /* causal */
  c->args[12].kind = c->args[13].kind = c->args[18].kind = UST__ARG_DOUBLE;
  return (ust__call){.size = sizeof(ust__call), .nargs = 21, .args = c->args, .device = UST__DEV_CPU};
}

TEST(sequence_lengths_read_from_host_tensors) {
  /* the grammar */
  const char *good[] = {"seqsum(seq_lens)", "seqdot(diff(cu_seqlens_q), seqused_k|diff(cu_seqlens_k))",
                        "seqtri( diff(cu) )", "seqcdiv(seqused_k|diff(cu_k), k[1])", "seqcdiv(seq_lens, block_size)"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    ust__dim_prog p;
    ASSERT_INT_EQ(ust__dim_compile(good[i], &p), 0);
    ASSERT_TRUE(ust__dim_reads_values(&p));
  }
  const char *bad[] = {"seqsum()", "seqsum(a, b)", "seqdot(a)", "seqsum(a|b|c)", "seqsum(a|)", "seqsum(diff())",
                       "seqcdiv(a, rows(b))", "seqcdiv(a)", "seqtri(a[0])", "seqsum(a"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ust__dim_prog p;
    ASSERT_INT_EQ(ust__dim_compile(bad[i], &p), UST_EPROBLEM);
    ASSERT_STR_CONTAINS(ust_last_error(), bad[i]);
  }
  /* a key never reads values */
  ust__problem pr;
  ASSERT_INT_EQ(ust__problem_parse("{\"schema_version\": 1, \"operator\": \"x\", \"bindings\": [{\"op\": \"a::b\", "
                                   "\"key\": {\"S\": \"seqsum(lens)\"}}]}", "k.json", &pr), UST_EPROBLEM);
  ASSERT_STR_CONTAINS(ust_last_error(), "'bindings[0].key.S'");

  /* lengths 3, 0, 5 as offsets (int32) and as lengths (int64, every other
   * element: a strided view), a None source and a 2-D one */
  int32_t cu[4] = {0, 3, 3, 8};
  int64_t lens[6] = {2, -7, 4, -7, 1, -7};
  int64_t strides2[1] = {2};
  varlen_call c;
  memset(&c, 0, sizeof c);
  const int64_t n4[1] = {4}, n3[1] = {3}, two_d[2] = {2, 2};
  vc_tensor(&c, 0, UST__DT_I32, 32, kDLInt, 1, n4, cu);
  vc_tensor(&c, 1, UST__DT_I64, 64, kDLInt, 1, n3, lens)->t.strides = strides2;
  c.args[2].kind = UST__ARG_NONE;
  vc_tensor(&c, 3, UST__DT_I32, 32, kDLInt, 2, two_d, cu);
  c.args[4].kind = UST__ARG_INT;
  c.args[4].i = 2;
  const char *names[] = {"cu", "lens", "none", "flat", "bs"};
  ust__call call = {.size = sizeof call, .nargs = 5, .args = c.args, .device = UST__DEV_CPU};
  const struct {
    const char *expr;
    int64_t want;
  } cases[] = {
      {"seqsum(diff(cu))", 8},           {"seqsum(lens)", 7},
      {"seqtri(diff(cu))", 3 + 0 + 10},  {"seqdot(diff(cu), lens)", 3 * 2 + 0 * 4 + 5 * 1},
      {"seqcdiv(diff(cu), bs)", 2 + 0 + 3}, {"seqcdiv(lens, flat[1])", 1 + 2 + 1},
      {"seqsum(none|diff(cu))", 8},      {"seqsum(none)", 0},
      {"seqdot(diff(cu), none)", 0},     {"seqsum(flat)", -1},
      {"seqsum(bs)", -1},                {"seqdot(lens, diff(cu))", 2 * 3 + 4 * 0 + 1 * 5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ust__dim_prog p;
    ASSERT_INT_EQ(ust__dim_compile(cases[i].expr, &p), 0);
    ASSERT_INT_EQ(ust__dim_resolve(&p, 5, names), 0);
    const int64_t got = ust__dim_eval(&p, &call);
    if (got != cases[i].want)
      fprintf(stderr, "%s\n", cases[i].expr);
    ASSERT_INT_EQ(got, cases[i].want);
  }
  ust__dim_prog p;
  ASSERT_INT_EQ(ust__dim_compile("seqdot(diff(cu), lengths)", &p), 0);
  ASSERT_INT_EQ(ust__dim_resolve(&p, 5, names), -1);
  ASSERT_STR_EQ(ust__dim_missing(&p), "lengths");
  /* falling offsets make no lengths */
  cu[2] = 1;
  ASSERT_INT_EQ(ust__dim_compile("seqsum(diff(cu))", &p), 0);
  ASSERT_INT_EQ(ust__dim_resolve(&p, 5, names), 0);
  ASSERT_INT_EQ(ust__dim_eval(&p, &call), -1);
  cu[2] = 3;
  /* lengths on a GPU, or a view without data pointers: not read */
  c.args[0].t.device.device_type = kDLCUDA;
  ASSERT_INT_EQ(ust__dim_eval(&p, &call), UST__DIM_UNREAD);
  c.args[0].t.device.device_type = kDLCPU;
  c.args[0].t.data = NULL;
  ASSERT_INT_EQ(ust__dim_eval(&p, &call), UST__DIM_UNREAD);
}

/* A mixed batch of NS_MIXED sequences (decodes, a chunk of prefill, a
 * whole prompt): its offsets and lengths as FA2 takes them; T, the longest
 * query and the longest key. */
enum { NS_MIXED = 6 };
static const int64_t mixed_lq[NS_MIXED] = {1, 1, 1, 5, 128, 1}, mixed_lk[NS_MIXED] = {37, 4096, 900, 300, 128, 1};
static void mixed_batch(int32_t *cu_q, int32_t *cu_k, int32_t *used, int64_t *T, int64_t *mq, int64_t *mk) {
  int64_t keys = 0;
  *T = *mq = *mk = 0;
  cu_q[0] = cu_k[0] = 0;
  for (int i = 0; i < NS_MIXED; i++) {
    *T += mixed_lq[i];
    keys += mixed_lk[i];
    *mq = mixed_lq[i] > *mq ? mixed_lq[i] : *mq;
    *mk = mixed_lk[i] > *mk ? mixed_lk[i] : *mk;
    cu_q[i + 1] = (int32_t)*T;
    cu_k[i + 1] = (int32_t)keys;
    used[i] = (int32_t)mixed_lk[i];
  }
}

/* vLLM's FA2 kernel on a mixed batch over a paged cache: each sequence's
 * query-key pairs (bottom-right causal), keys, values and block-table
 * entries. With the lengths where the host cannot read them the floor takes
 * its bounds (every query sees max_seqlen_k keys): the upper bound the
 * definition says, several times too high on such a batch. */
TEST(varlen_attention_floored_by_each_sequence) {
  ust__problem_set set;
  ASSERT_INT_EQ(ust__problems_load_dir(UST_SOURCE_DIR "/problems", &set), 0);
  const ust__binding_def *def = binding_of(&set, "_vllm_fa2_C::varlen_fwd");
  ASSERT_TRUE(def != NULL);
  enum { NS = NS_MIXED };
  const int64_t *lq = mixed_lq, *lk = mixed_lk;
  const int64_t Hq = 32, Hk = 8, D = 128, bs = 16, E = 2;
  int64_t T, mq, mk, blocks = 0, keys = 0, pairs = 0;
  int32_t cu_q[NS + 1], cu_k[NS + 1], used[NS];
  mixed_batch(cu_q, cu_k, used, &T, &mq, &mk);
  for (int i = 0; i < NS; i++) {
    keys += lk[i];
    blocks += cdiv64(lk[i], bs);
    pairs += lq[i] * lk[i] - lq[i] * (lq[i] - 1) / 2;
  }
  const int64_t width = cdiv64(mk, bs);
  varlen_call c;
  ust__call call = fa2_call(&c, T, Hq, Hk, D, bs, width, NS, cu_q, cu_k, used, mq, mk);

  const double w_true = 2.0 * Hq * (D + D) * (double)pairs;
  const double qr_true = (double)(T * Hq * D * E + keys * Hk * (D + D) * E + 4 * (NS + 1) + 4 * NS + 4 * blocks);
  const double qw_true = (double)(T * Hq * D * E);
  double w, qr, qw;
  ASSERT_INT_EQ(floor_of(def, fa2_names, &call, &w, &qr, &qw), 0);
  ASSERT_DBL_NEAR(w, w_true, 0);
  ASSERT_DBL_NEAR(qr, qr_true, 0);
  ASSERT_DBL_NEAR(qw, qw_true, 0);
  /* the same batch with its lengths on the device: the bound */
  c.args[4].t.device.device_type = c.args[5].t.device.device_type = c.args[6].t.device.device_type = kDLCUDA;
  double wb, qrb, qwb;
  ASSERT_INT_EQ(floor_of(def, fa2_names, &call, &wb, &qrb, &qwb), UST__ROOF_BOUNDED);
  const double tri_low = (double)T * ((double)T / NS - 1) / 2; /* equal query lengths drop the fewest pairs */
  ASSERT_DBL_NEAR(wb, 2.0 * Hq * (D + D) * ((double)(T * mk) - tri_low), 1e-3);
  ASSERT_DBL_NEAR(qrb, (double)(T * Hq * D * E + NS * mk * Hk * (D + D) * E + 4 * (NS + 1) + 4 * NS + 4 * NS * width),
                  1e-3);
  ASSERT_TRUE(wb >= w_true && qrb >= qr_true && qwb == qw_true);
  fprintf(stderr, "mixed batch of %d: W %.4g exact, %.4g bounded (%.1fx); Q_read %.4g, %.4g (%.1fx)\n", NS, w_true, wb,
          wb / w_true, qr_true, qrb, qrb / qr_true);
  ust__problems_free(&set);
}

/* The same mixed batch with its lengths on the device: the call's floor is
 * deferred, its lengths copied (here by memcpy, as the timer's copy in
 * stream order would) into a staging area, and resolved from there: each
 * sequence's floor, as with host lengths, not the bound. The copy holds
 * only what the roofline reads: cu_seqlens_q and seqused_k, once each
 * (seqused_k is read by three vars; cu_seqlens_k is its alternative). */
TEST(varlen_floor_deferred_reads_the_lengths_copied_from_the_device) {
  ust__problem_set set;
  ASSERT_INT_EQ(ust__problems_load_dir(UST_SOURCE_DIR "/problems", &set), 0);
  const ust__binding_def *def = binding_of(&set, "_vllm_fa2_C::varlen_fwd");
  ASSERT_TRUE(def != NULL);
  enum { NS = NS_MIXED };
  int64_t T, mq, mk;
  int32_t cu_q[NS + 1], cu_k[NS + 1], used[NS];
  mixed_batch(cu_q, cu_k, used, &T, &mq, &mk);
  varlen_call c;
  ust__call call = fa2_call(&c, T, 32, 8, 128, 16, cdiv64(mk, 16), NS, cu_q, cu_k, used, mq, mk);
  ust__roofline_prog prog;
  ASSERT_INT_EQ(ust__roofline_compile(&def->roofline, def->op, &prog), 0);
  ust__roofline_resolve(&prog, call.nargs, fa2_names, def->op, NULL);
  double exact[UST__N_PATHS], eqr, eqw;
  ASSERT_INT_EQ(ust__roofline_eval(&prog, &call, 0, exact, &eqr, &eqw), 0);
  ust__floor_defer d;
  ASSERT_INT_EQ(ust__roofline_defer(&prog, &call, 0, &d), -1); /* host lengths: read at the call */
  for (int a = 4; a <= 6; a++)
    c.args[a].t.device.device_type = kDLCUDA;
  double wb[UST__N_PATHS], qrb, qwb;
  ASSERT_INT_EQ(ust__roofline_eval(&prog, &call, 0, wb, &qrb, &qwb), UST__ROOF_BOUNDED);
  ASSERT_INT_EQ(ust__roofline_defer(&prog, &call, 0, &d), 0);
  ASSERT_INT_EQ(d.n_src, 2);
  ASSERT_TRUE(d.srcs[0].dev == cu_q && d.srcs[0].bytes == sizeof cu_q && d.srcs[0].at == 0);
  ASSERT_TRUE(d.srcs[1].dev == used && d.srcs[1].bytes == sizeof used && d.srcs[1].at == sizeof cu_q);
  unsigned char staged[UST__DEFER_BYTES];
  for (int i = 0; i < d.n_src; i++)
    memcpy(staged + d.srcs[i].at, d.srcs[i].dev, d.srcs[i].bytes);
  /* the device's lengths change after the copy: the copy's stand */
  used[1] = 1;
  double w[UST__N_PATHS], qr, qw;
  ASSERT_INT_EQ(ust__floor_resolve(&d, staged, w, &qr, &qw), 0);
  for (int p = 0; p < UST__N_PATHS; p++)
    ASSERT_DBL_NEAR(w[p], exact[p], 0);
  ASSERT_DBL_NEAR(qr, eqr, 0);
  ASSERT_DBL_NEAR(qw, eqw, 0);
  ASSERT_TRUE(wb[UST__PATH_BF16] > 2 * exact[UST__PATH_BF16]); /* what the bound would have said */
  /* copied lengths that make none (falling offsets): no floor */
  int32_t falling[NS + 1];
  memcpy(falling, cu_q, sizeof falling);
  falling[3] = 0;
  memcpy(staged, falling, sizeof falling);
  ASSERT_INT_EQ(ust__floor_resolve(&d, staged, w, &qr, &qw), -1);
  /* no seqused_k: cu_seqlens_k, its alternative, is copied instead */
  c.args[6].kind = UST__ARG_NONE;
  ASSERT_INT_EQ(ust__roofline_defer(&prog, &call, 0, &d), 0);
  ASSERT_TRUE(d.n_src == 2 && d.srcs[1].dev == cu_k);
  c.args[6].kind = UST__ARG_TENSOR;
  /* a strided view, or more lengths than a copy holds: the bound stands */
  int64_t two[1] = {2};
  c.args[6].t.strides = two;
  ASSERT_INT_EQ(ust__roofline_defer(&prog, &call, 0, &d), -1);
  c.args[6].t.strides = NULL;
  c.shapes[6][0] = UST__DEFER_BYTES / 4;
  ASSERT_INT_EQ(ust__roofline_defer(&prog, &call, 0, &d), -1);
  ust__roofline_free(&prog);
  ust__problems_free(&set);
}

/* Decode batches (one new token a sequence) over a paged cache: vLLM's
 * paged_attention_v1 with seq_lens, and FA2 with seqused_k, the batch's
 * lengths spread as a serving batch's are. */
TEST(decode_attention_floored_by_each_sequence) {
  ust__problem_set set;
  ASSERT_INT_EQ(ust__problems_load_dir(UST_SOURCE_DIR "/problems", &set), 0);
  enum { NB = 64 };
  const int64_t Hq = 32, Hk = 8, D = 128, bs = 16, E = 2;
  int32_t lens[NB], cu_q[NB + 1], cu_k[NB + 1];
  int64_t keys = 0, blocks = 0, mk = 0;
  cu_q[0] = cu_k[0] = 0;
  for (int i = 0; i < NB; i++) {
    lens[i] = 17 + (int32_t)((i * 7919) % 61) * (i % 8 == 0 ? 64 : 3); /* a few long, most short */
    keys += lens[i];
    blocks += cdiv64(lens[i], bs);
    mk = lens[i] > mk ? lens[i] : mk;
    cu_q[i + 1] = i + 1;
    cu_k[i + 1] = (int32_t)keys;
  }
  const int64_t width = cdiv64(mk, bs);

  /* _C::paged_attention_v1 */
  const ust__binding_def *def = binding_of(&set, "_C::paged_attention_v1");
  ASSERT_TRUE(def != NULL);
  const char *pa_names[] = {"out", "query", "key_cache", "value_cache", "num_kv_heads", "scale", "block_tables",
                            "seq_lens", "block_size", "max_seq_len", "alibi_slopes", "kv_cache_dtype", "k_scale",
                            "v_scale", "tp_rank", "blocksparse_local_blocks", "blocksparse_vert_stride",
                            "blocksparse_block_size", "blocksparse_head_sliding_step"};
  varlen_call c;
  memset(&c, 0, sizeof c);
  const int64_t qs[3] = {NB, Hq, D}, kc[5] = {NB * width, Hk, D / 8, bs, 8}, vc[4] = {NB * width, Hk, D, bs},
                bt[2] = {NB, width}, nseq[1] = {NB}, one[1] = {1};
  vc_tensor(&c, 0, UST__DT_BF16, 16, kDLBfloat, 3, qs, NULL);
  vc_tensor(&c, 1, UST__DT_BF16, 16, kDLBfloat, 3, qs, NULL);
  vc_tensor(&c, 2, UST__DT_BF16, 16, kDLBfloat, 5, kc, NULL);
  vc_tensor(&c, 3, UST__DT_BF16, 16, kDLBfloat, 4, vc, NULL);
  c.args[4].kind = UST__ARG_INT;
  c.args[4].i = Hk;
  c.args[5].kind = UST__ARG_DOUBLE;
  vc_tensor(&c, 6, UST__DT_I32, 32, kDLInt, 2, bt, NULL);
  vc_tensor(&c, 7, UST__DT_I32, 32, kDLInt, 1, nseq, lens);
  c.args[8].kind = c.args[9].kind = UST__ARG_INT;
  c.args[8].i = bs;
  c.args[9].i = mk;
  c.args[10].kind = UST__ARG_NONE;
  c.args[11].kind = UST__ARG_OTHER;
  vc_tensor(&c, 12, UST__DT_F32, 32, kDLFloat, 1, one, NULL);
  vc_tensor(&c, 13, UST__DT_F32, 32, kDLFloat, 1, one, NULL);
  for (int i = 14; i < 19; i++)
    c.args[i].kind = UST__ARG_INT;
  ust__call call = {.size = sizeof call, .nargs = 19, .args = c.args, .device = UST__DEV_CPU};
  double w, qr, qw;
  ASSERT_INT_EQ(floor_of(def, pa_names, &call, &w, &qr, &qw), 0);
  ASSERT_DBL_NEAR(w, (double)((4 * Hq * D + 2) * keys), 0);
  ASSERT_DBL_NEAR(qr, (double)(NB * Hq * D * E + 2 * keys * Hk * D * E + 4 * blocks + 4 * NB), 0);
  ASSERT_DBL_NEAR(qw, (double)(NB * Hq * D * E), 0);
  c.args[7].t.data = NULL; /* the view a live call has: no data pointers */
  double wb, qrb, qwb;
  ASSERT_INT_EQ(floor_of(def, pa_names, &call, &wb, &qrb, &qwb), UST__ROOF_BOUNDED);
  ASSERT_DBL_NEAR(wb, (double)((4 * Hq * D + 2) * NB * mk), 0);
  fprintf(stderr, "paged_attention_v1, decode batch of %d (keys %lld, longest %lld): W %.1fx, Q %.1fx too high "
          "when bounded\n", NB, (long long)keys, (long long)mk, wb / w, (qrb + qwb) / (qr + qw));
  ASSERT_TRUE(wb / w > 2);

  /* _vllm_fa2_C::varlen_fwd on the same batch, seqused_k given */
  def = binding_of(&set, "_vllm_fa2_C::varlen_fwd");
  call = fa2_call(&c, NB, Hq, Hk, D, bs, width, NB, cu_q, cu_k, lens, 1, mk);
  ASSERT_INT_EQ(floor_of(def, fa2_names, &call, &w, &qr, &qw), 0);
  ASSERT_DBL_NEAR(w, 2.0 * Hq * (D + D) * (double)keys, 0);
  ASSERT_DBL_NEAR(qr, (double)(NB * Hq * D * E + keys * Hk * (D + D) * E + 4 * (NB + 1) + 4 * NB + 4 * blocks), 0);
  c.args[4].t.data = c.args[5].t.data = c.args[6].t.data = NULL;
  ASSERT_INT_EQ(floor_of(def, fa2_names, &call, &wb, &qrb, &qwb), UST__ROOF_BOUNDED);
  ASSERT_DBL_NEAR(wb, 2.0 * Hq * (D + D) * (double)(NB * mk), 0);
  fprintf(stderr, "FA2, the same batch: W %.1fx, Q %.1fx too high when bounded\n", wb / w, (qrb + qwb) / (qr + qw));
  ust__problems_free(&set);
}

/* The index of argument name in names[0..n). */
static int arg_at(const char *const *names, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0)
      return i;
  fprintf(stderr, "no argument %s\n", name);
  exit(1);
}

/* FA3 (paged, seqused_k), the MLA decode kernel (seq_lens) and the vision
 * encoders' wrapper (cu_seqlens, non-causal) read their lengths too. */
TEST(varlen_definitions_read_their_lengths) {
  ust__problem_set set;
  ASSERT_INT_EQ(ust__problems_load_dir(UST_SOURCE_DIR "/problems", &set), 0);
  varlen_call c;
  double w, qr, qw;

  /* FA3: three sequences (2, 1, 1 new tokens; 700, 33, 9 keys), causal */
  const char *fa3[] = {"q", "k", "v", "k_new", "v_new", "q_v", "out", "cu_seqlens_q", "cu_seqlens_k",
                       "cu_seqlens_k_new", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k", "page_table",
                       "kv_batch_idx", "leftpad_k", "rotary_cos", "rotary_sin", "seqlens_rotary", "q_descale",
                       "k_descale", "v_descale", "softmax_scale", "is_causal", "window_size_left", "window_size_right",
                       "softcap", "is_rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin",
                       "s_aux"};
  const int n3 = (int)(sizeof fa3 / sizeof fa3[0]);
  int32_t cq[4] = {0, 2, 3, 4}, used[3] = {700, 33, 9};
  const int64_t Hq = 16, Hk = 4, D = 64, ps = 64, width = 11, T = 4;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < n3; i++)
    c.args[i].kind = UST__ARG_NONE;
  const int64_t qs[3] = {T, Hq, D}, kc[4] = {3 * width, ps, Hk, D}, n4[1] = {4}, n3s[1] = {3}, pt[2] = {3, width};
  vc_tensor(&c, arg_at(fa3, n3, "q"), UST__DT_BF16, 16, kDLBfloat, 3, qs, NULL);
  vc_tensor(&c, arg_at(fa3, n3, "k"), UST__DT_BF16, 16, kDLBfloat, 4, kc, NULL);
  vc_tensor(&c, arg_at(fa3, n3, "v"), UST__DT_BF16, 16, kDLBfloat, 4, kc, NULL);
  vc_tensor(&c, arg_at(fa3, n3, "cu_seqlens_q"), UST__DT_I32, 32, kDLInt, 1, n4, cq);
  vc_tensor(&c, arg_at(fa3, n3, "seqused_k"), UST__DT_I32, 32, kDLInt, 1, n3s, used);
  vc_tensor(&c, arg_at(fa3, n3, "page_table"), UST__DT_I32, 32, kDLInt, 2, pt, NULL);
  const char *ints[] = {"max_seqlen_q", "max_seqlen_k", "window_size_left", "window_size_right", "num_splits",
                        "sm_margin"};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    c.args[arg_at(fa3, n3, ints[i])].kind = UST__ARG_INT;
  c.args[arg_at(fa3, n3, "max_seqlen_q")].i = 2;
  c.args[arg_at(fa3, n3, "max_seqlen_k")].i = 700;
  c.args[arg_at(fa3, n3, "is_causal")].kind = UST__ARG_BOOL;
  c.args[arg_at(fa3, n3, "is_causal")].i = 1;
  ust__call call = {.size = sizeof call, .nargs = n3, .args = c.args, .device = UST__DEV_CPU};
  const int64_t pairs = (2 * 700 - 1) + 33 + 9, keys = 742, blocks = 11 + 1 + 1;
  ASSERT_INT_EQ(floor_of(binding_of(&set, "_vllm_fa3_C::fwd"), fa3, &call, &w, &qr, &qw), 0);
  ASSERT_DBL_NEAR(w, 2.0 * Hq * (D + D) * pairs, 0);
  ASSERT_DBL_NEAR(qr, (double)(T * Hq * D * 2 + keys * Hk * (D + D) * 2 + 4 * 4 + 4 * 3 + 4 * blocks), 0);
  ASSERT_DBL_NEAR(qw, (double)(T * Hq * D * 2), 0);

  /* the MLA decode kernel: four sequences over 64-token pages */
  const char *mla[] = {"out", "lse", "q_nope", "q_pe", "kv_c_and_k_pe_cache", "seq_lens", "page_table", "workspace",
                       "scale", "num_kv_splits"};
  const int nm = (int)(sizeof mla / sizeof mla[0]);
  int32_t lens[4] = {1000, 65, 64, 1};
  const int64_t B = 4, H = 16, R = 512, Pr = 64, NP = 16;
  memset(&c, 0, sizeof c);
  const int64_t qn[3] = {B, H, R}, qp[3] = {B, H, Pr}, cache[3] = {B * NP, ps, R + Pr}, nb[1] = {B}, ptab[2] = {B, NP},
                lse[2] = {B, H}, ws[1] = {1 << 20};
  vc_tensor(&c, 0, UST__DT_BF16, 16, kDLBfloat, 3, qn, NULL);
  vc_tensor(&c, 1, UST__DT_F32, 32, kDLFloat, 2, lse, NULL);
  vc_tensor(&c, 2, UST__DT_BF16, 16, kDLBfloat, 3, qn, NULL);
  vc_tensor(&c, 3, UST__DT_BF16, 16, kDLBfloat, 3, qp, NULL);
  vc_tensor(&c, 4, UST__DT_BF16, 16, kDLBfloat, 3, cache, NULL);
  vc_tensor(&c, 5, UST__DT_I32, 32, kDLInt, 1, nb, lens);
  vc_tensor(&c, 6, UST__DT_I32, 32, kDLInt, 2, ptab, NULL);
  vc_tensor(&c, 7, UST__DT_U8, 8, kDLUInt, 1, ws, NULL);
  c.args[8].kind = UST__ARG_DOUBLE;
  c.args[9].kind = UST__ARG_INT;
  call = (ust__call){.size = sizeof call, .nargs = nm, .args = c.args, .device = UST__DEV_CPU};
  const int64_t ctx = 1000 + 65 + 64 + 1, pages = 16 + 2 + 1 + 1;
  ASSERT_INT_EQ(floor_of(binding_of(&set, "_C::sm100_cutlass_mla_decode"), mla, &call, &w, &qr, &qw), 0);
  ASSERT_DBL_NEAR(w, 2.0 * H * ctx * (2 * R + Pr), 0);
  ASSERT_DBL_NEAR(qr, (double)(B * H * R * 2 + B * H * Pr * 2 + ctx * (R + Pr) * 2 + 4 * B + 4 * pages), 0);
  ASSERT_DBL_NEAR(qw, (double)(B * H * R * 2 + B * H * 4), 0);

  /* the vision encoders' wrapper: three images of 1024, 256 and 64 patches */
  const char *vit[] = {"q", "k", "v", "batch_size", "is_rocm_aiter", "fa_version", "scale", "cu_seqlens",
                       "max_seqlen"};
  int32_t cu[4] = {0, 1024, 1280, 1344};
  const int64_t Hv = 16, Dh = 80, Tv = 1344;
  memset(&c, 0, sizeof c);
  const int64_t qv[4] = {1, Tv, Hv, Dh}, ncu[1] = {4}, one[1] = {1};
  for (int i = 0; i < 3; i++)
    vc_tensor(&c, i, UST__DT_BF16, 16, kDLBfloat, 4, qv, NULL);
  c.args[3].kind = c.args[5].kind = UST__ARG_INT;
  c.args[3].i = 1;
  c.args[4].kind = UST__ARG_BOOL;
  c.args[6].kind = UST__ARG_NONE;
  vc_tensor(&c, 7, UST__DT_I32, 32, kDLInt, 1, ncu, cu);
  vc_tensor(&c, 8, UST__DT_I32, 32, kDLInt, 1, one, NULL);
  call = (ust__call){.size = sizeof call, .nargs = 9, .args = c.args, .device = UST__DEV_CPU};
  const double sq = 1024.0 * 1024 + 256.0 * 256 + 64.0 * 64;
  ASSERT_INT_EQ(floor_of(binding_of(&set, "vllm::flash_attn_maxseqlen_wrapper"), vit, &call, &w, &qr, &qw), 0);
  ASSERT_DBL_NEAR(w, 2.0 * Hv * (Dh + Dh) * sq, 0);
  /* with cu_seqlens on the device, the images are taken as equal: a lower bound */
  c.args[7].t.data = NULL;
  double wb;
  ASSERT_INT_EQ(floor_of(binding_of(&set, "vllm::flash_attn_maxseqlen_wrapper"), vit, &call, &wb, &qr, &qw),
                UST__ROOF_BOUNDED);
  ASSERT_DBL_NEAR(wb, 2.0 * Hv * (Dh + Dh) * (double)Tv * Tv / 3, 1e-3);
  ASSERT_TRUE(wb < w);
  ust__problems_free(&set);
}
