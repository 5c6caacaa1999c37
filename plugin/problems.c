/* Operator definitions: one JSON file per operator in problems/. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dispatch/dispatch.h"
#include "plugin/plugin.h"
#include "scorer/scorer.h"

#define PERR(...) ust__error(UST_EPROBLEM, __VA_ARGS__)

static int valid_name(const char *s) {
  if (s[0] == '\0')
    return 0;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
      return 0;
  return 1;
}

static int only_keys(const cJSON *obj, const char *path, const char *where, const char *const *allowed) {
  for (const cJSON *it = obj->child; it != NULL; it = it->next) {
    const char *const *a = allowed;
    while (*a != NULL && strcmp(*a, it->string) != 0)
      a++;
    if (*a == NULL)
      return PERR("%s: unknown field '%s%s'", path, where, it->string);
  }
  return 0;
}

/* "roofline": {"vars": {NAME: dimension}, "W": expr, "W_dtype": ARG,
 * "W_tf32": bool (optional: a matrix product torch may run in TF32), "Q_read": expr, "Q_write": expr, "estimate": text (optional: where W or Q
 * is not exact, how it approximates), "bound": {NAME: expr} (optional: for a
 * var that reads sequence lengths, its value where they cannot be read, over
 * the vars that read none)}; every expression is compiled here so that a
 * bad one is refused with the file and field. */
static int parse_roofline(const cJSON *rl, const char *path, int bi, ust__roofline_def *r) {
  static const char *const keys[] = {"vars", "W", "W_dtype", "W_tf32", "Q_read", "Q_write", "estimate", "bound", NULL};
  char where[64];
  snprintf(where, sizeof where, "bindings[%d].roofline.", bi);
  if (!cJSON_IsObject(rl))
    return PERR("%s: 'bindings[%d].roofline' must be an object {vars, W, W_dtype, Q_read, Q_write}", path, bi);
  int rc = only_keys(rl, path, where, keys);
  if (rc != 0)
    return rc;
  const cJSON *vars = cJSON_GetObjectItemCaseSensitive(rl, "vars");
  if (!cJSON_IsObject(vars) || cJSON_GetArraySize(vars) > UST__MAX_RVARS)
    return PERR("%s: 'bindings[%d].roofline.vars' must be an object of at most %d dimensions {NAME: dimension}",
                path, bi, UST__MAX_RVARS);
  const char *names[UST__MAX_RVARS], *plain[UST__MAX_RVARS];
  int reads[UST__MAX_RVARS];
  const cJSON *it;
  cJSON_ArrayForEach(it, vars) {
    ust__dim_def *d = &r->vars[r->n_vars];
    ust__dim_prog prog;
    if (!cJSON_IsString(it) || ust__copy_name(d->name, sizeof d->name, it->string) != 0 ||
        ust__copy_name(d->expr, sizeof d->expr, it->valuestring) != 0)
      return PERR("%s: 'bindings[%d].roofline.vars.%s' must be a string dimension", path, bi, it->string);
    if (ust__dim_compile(d->expr, &prog) != 0) {
      char why[400];
      snprintf(why, sizeof why, "%s", ust_last_error());
      return PERR("%s: 'bindings[%d].roofline.vars.%s': %s", path, bi, it->string, why);
    }
    reads[r->n_vars] = ust__dim_reads_values(&prog);
    plain[r->n_vars] = reads[r->n_vars] ? "" : d->name; /* what a bound may name */
    names[r->n_vars++] = d->name;
  }
  const cJSON *bounds = cJSON_GetObjectItemCaseSensitive(rl, "bound");
  if (bounds != NULL && !cJSON_IsObject(bounds))
    return PERR("%s: 'bindings[%d].roofline.bound' must be an object {VAR: expression} for the vars that read "
                "sequence lengths", path, bi);
  cJSON_ArrayForEach(it, bounds) {
    int v = 0;
    while (v < r->n_vars && strcmp(names[v], it->string) != 0)
      v++;
    if (v == r->n_vars || !reads[v])
      return PERR("%s: 'bindings[%d].roofline.bound.%s' names no var that reads sequence lengths (seqsum, seqdot, "
                  "seqtri, seqcdiv)", path, bi, it->string);
    if (!cJSON_IsString(it) || ust__copy_name(r->bound[v], UST__EXPR_MAX, it->valuestring) != 0)
      return PERR("%s: 'bindings[%d].roofline.bound.%s' must be an expression of at most %d characters", path, bi,
                  it->string, UST__EXPR_MAX - 1);
    ust__expr *prog = NULL;
    if (ust__expr_compile(r->bound[v], plain, r->n_vars, &prog) != 0) {
      char why[600];
      snprintf(why, sizeof why, "%s", ust_last_error());
      return PERR("%s: 'bindings[%d].roofline.bound.%s' (over the vars that read no lengths): %s", path, bi,
                  it->string, why);
    }
    ust__expr_free(prog);
  }
  static const char *const exprs[] = {"W", "Q_read", "Q_write"};
  char *dst[] = {r->w, r->q_read, r->q_write};
  for (int k = 0; k < 3; k++) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(rl, exprs[k]);
    if (!cJSON_IsString(e) || ust__copy_name(dst[k], UST__EXPR_MAX, e->valuestring) != 0)
      return PERR("%s: 'bindings[%d].roofline.%s' must be an expression of at most %d characters", path, bi,
                  exprs[k], UST__EXPR_MAX - 1);
    ust__expr *prog = NULL;
    if (ust__expr_compile(dst[k], names, r->n_vars, &prog) != 0) {
      char why[600];
      snprintf(why, sizeof why, "%s", ust_last_error());
      return PERR("%s: 'bindings[%d].roofline.%s': %s", path, bi, exprs[k], why);
    }
    ust__expr_free(prog);
  }
  const cJSON *wd = cJSON_GetObjectItemCaseSensitive(rl, "W_dtype");
  if (!cJSON_IsString(wd) || ust__copy_name(r->w_dtype, sizeof r->w_dtype, wd->valuestring) != 0)
    return PERR("%s: 'bindings[%d].roofline.W_dtype' must name the argument whose dtype books W", path, bi);
  const cJSON *tf = cJSON_GetObjectItemCaseSensitive(rl, "W_tf32");
  if (tf != NULL && !cJSON_IsBool(tf))
    return PERR("%s: 'bindings[%d].roofline.W_tf32' must be true (a matrix product: float32 W runs on the tf32 "
                "path when torch allows TF32) or false", path, bi);
  r->w_tf32 = cJSON_IsTrue(tf);
  const cJSON *est = cJSON_GetObjectItemCaseSensitive(rl, "estimate");
  if (est != NULL && (!cJSON_IsString(est) || est->valuestring[0] == '\0' ||
                      ust__copy_name(r->estimate, sizeof r->estimate, est->valuestring) != 0))
    return PERR("%s: 'bindings[%d].roofline.estimate' must be a text of 1 to %d characters saying how W or Q "
                "approximates", path, bi, UST__EXPR_MAX - 1);
  r->present = 1;
  return 0;
}

static int parse_binding(const cJSON *jb, const char *path, int bi, const cJSON *bucket, ust__binding_def *b) {
  char where[64];
  snprintf(where, sizeof where, "bindings[%d].", bi);
  static const char *const keys[] = {"op",  "overloads",        "writes",   "overwrites",
                                     "key", "compared_returns", "roofline", NULL};
  if (!cJSON_IsObject(jb))
    return PERR("%s: 'bindings[%d]' must be an object {op, overloads, writes, key}", path, bi);
  int rc = only_keys(jb, path, where, keys);
  if (rc != 0)
    return rc;
  const cJSON *op = cJSON_GetObjectItemCaseSensitive(jb, "op");
  if (!cJSON_IsString(op) || strstr(op->valuestring, "::") == NULL || strchr(op->valuestring, '.') != NULL ||
      ust__copy_name(b->op, sizeof b->op, op->valuestring) != 0)
    return PERR("%s: 'bindings[%d].op' must be a dispatcher op name 'namespace::name' without overload", path, bi);
  const cJSON *ovs = cJSON_GetObjectItemCaseSensitive(jb, "overloads");
  if (ovs == NULL) {
    b->n_overloads = 1;
    b->overloads[0][0] = '\0';
  } else {
    if (!cJSON_IsArray(ovs) || cJSON_GetArraySize(ovs) < 1 || cJSON_GetArraySize(ovs) > UST__MAX_OVERLOADS)
      return PERR("%s: 'bindings[%d].overloads' must be a list of 1 to %d overload names (\"\" is the default)",
                  path, bi, UST__MAX_OVERLOADS);
    const cJSON *it;
    cJSON_ArrayForEach(it, ovs) {
      if (!cJSON_IsString(it) || ust__copy_name(b->overloads[b->n_overloads], UST__NAME_MAX, it->valuestring) != 0)
        return PERR("%s: 'bindings[%d].overloads' holds a non-string or too long name", path, bi);
      for (int j = 0; j < b->n_overloads; j++)
        if (strcmp(b->overloads[j], it->valuestring) == 0)
          return PERR("%s: 'bindings[%d].overloads' lists '%s' twice", path, bi, it->valuestring);
      b->n_overloads++;
    }
  }
  const cJSON *wr = cJSON_GetObjectItemCaseSensitive(jb, "writes");
  if (wr != NULL) {
    if (!cJSON_IsArray(wr) || cJSON_GetArraySize(wr) > UST__MAX_WRITES)
      return PERR("%s: 'bindings[%d].writes' must be a list of at most %d argument names", path, bi, UST__MAX_WRITES);
    const cJSON *it;
    cJSON_ArrayForEach(it, wr) {
      if (!cJSON_IsString(it) || ust__copy_name(b->writes[b->n_writes], UST__NAME_MAX, it->valuestring) != 0)
        return PERR("%s: 'bindings[%d].writes' holds a non-string or too long name", path, bi);
      b->n_writes++;
    }
  }
  const cJSON *ow = cJSON_GetObjectItemCaseSensitive(jb, "overwrites");
  if (ow != NULL) {
    if (!cJSON_IsArray(ow) || cJSON_GetArraySize(ow) > UST__MAX_WRITES)
      return PERR("%s: 'bindings[%d].overwrites' must be a list of at most %d argument names", path, bi,
                  UST__MAX_WRITES);
    const cJSON *it;
    cJSON_ArrayForEach(it, ow) {
      if (!cJSON_IsString(it) || ust__copy_name(b->overwrites[b->n_overwrites], UST__NAME_MAX, it->valuestring) != 0)
        return PERR("%s: 'bindings[%d].overwrites' holds a non-string or too long name", path, bi);
      int listed = 0;
      for (int w = 0; w < b->n_writes && !listed; w++)
        listed = strcmp(b->writes[w], it->valuestring) == 0;
      if (!listed)
        return PERR("%s: 'bindings[%d].overwrites' names '%s', which its 'writes' does not list (an argument the op "
                    "overwrites is one it writes)",
                    path, bi, it->valuestring);
      b->n_overwrites++;
    }
  }
  b->compared_returns = -1;
  const cJSON *cr = cJSON_GetObjectItemCaseSensitive(jb, "compared_returns");
  if (cr != NULL) {
    if (!cJSON_IsNumber(cr) || cr->valuedouble < 0 || cr->valuedouble > 64 ||
        cr->valuedouble != (double)(int)cr->valuedouble)
      return PERR("%s: 'bindings[%d].compared_returns' must be an integer in [0, 64]", path, bi);
    b->compared_returns = (int)cr->valuedouble;
  }
  const cJSON *rl = cJSON_GetObjectItemCaseSensitive(jb, "roofline");
  if (rl != NULL && (rc = parse_roofline(rl, path, bi, &b->roofline)) != 0)
    return rc;
  const cJSON *key = cJSON_GetObjectItemCaseSensitive(jb, "key");
  if (key == NULL || !cJSON_IsObject(key) || cJSON_GetArraySize(key) > UST__MAX_DIMS)
    return PERR("%s: 'bindings[%d].key' must be an object of at most %d dimensions {NAME: expression}", path, bi,
                UST__MAX_DIMS);
  const cJSON *it;
  cJSON_ArrayForEach(it, key) {
    ust__dim_def *d = &b->dims[b->n_dims];
    if (!cJSON_IsString(it) || ust__copy_name(d->name, sizeof d->name, it->string) != 0 ||
        ust__copy_name(d->expr, sizeof d->expr, it->valuestring) != 0)
      return PERR("%s: 'bindings[%d].key.%s' must be a string expression", path, bi, it->string);
    ust__dim_prog prog;
    if (ust__dim_compile(d->expr, &prog) != 0) {
      char why[400];
      snprintf(why, sizeof why, "%s", ust_last_error());
      return PERR("%s: 'bindings[%d].key.%s': %s", path, bi, it->string, why);
    }
    if (ust__dim_reads_values(&prog))
      return PERR("%s: 'bindings[%d].key.%s': '%s' reads tensor values, which a key (built on every call) does "
                  "not: sequence lengths are for roofline vars", path, bi, it->string, d->expr);
    const cJSON *bk = bucket != NULL ? cJSON_GetObjectItemCaseSensitive(bucket, d->name) : NULL;
    d->bucket = bk != NULL && strcmp(bk->valuestring, "pow2") == 0 ? UST__BUCKET_POW2 : UST__BUCKET_EXACT;
    b->n_dims++;
  }
  return 0;
}

int ust__problem_parse(const char *text, const char *path, ust__problem *p) {
  memset(p, 0, sizeof *p);
  cJSON *root = ust__json_parse(text, path, UST_EPROBLEM);
  if (root == NULL)
    return UST_EPROBLEM;
  int rc = 0;
  static const char *const keys[] = {"schema_version", "operator", "description", "bindings", "bucket", "compare",
                                     "atrex", "hosted_in", NULL};
  const cJSON *v;
  if (!cJSON_IsObject(root)) {
    rc = PERR("%s: the top level must be an object", path);
    goto out;
  }
  if ((rc = only_keys(root, path, "", keys)) != 0)
    goto out;
  v = cJSON_GetObjectItemCaseSensitive(root, "schema_version");
  if (!cJSON_IsNumber(v) || v->valuedouble != 1) {
    rc = PERR("%s: 'schema_version' must be 1", path);
    goto out;
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "operator");
  if (!cJSON_IsString(v) || !valid_name(v->valuestring) || ust__copy_name(p->name, sizeof p->name, v->valuestring) != 0) {
    rc = PERR("%s: 'operator' must be a name of lower-case letters, digits and '_'", path);
    goto out;
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "description");
  if (v != NULL) {
    if (!cJSON_IsString(v)) {
      rc = PERR("%s: 'description' must be a string", path);
      goto out;
    }
    if ((p->description = ust__strdup(v->valuestring)) == NULL) {
      rc = PERR("%s: out of memory", path);
      goto out;
    }
  }
  /* "atrex": how shape keys map onto Atrex-Bench kwargs; read by the Python
   * exporter, only its type is checked here. */
  v = cJSON_GetObjectItemCaseSensitive(root, "atrex");
  if (v != NULL && !cJSON_IsObject(v)) {
    rc = PERR("%s: 'atrex' must be an object {operator, bindings}", path);
    goto out;
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "compare");
  if (v != NULL && (!cJSON_IsString(v) || (p->compare = ust__cmp_kind_parse(v->valuestring)) < 0)) {
    rc = PERR("%s: 'compare' must be \"allclose\", \"exact\" or \"set\"", path);
    goto out;
  }
  const cJSON *bucket = cJSON_GetObjectItemCaseSensitive(root, "bucket");
  if (bucket != NULL) {
    if (!cJSON_IsObject(bucket)) {
      rc = PERR("%s: 'bucket' must be an object {DIM: \"exact\" | \"pow2\"}", path);
      goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, bucket) {
      if (!cJSON_IsString(it) || (strcmp(it->valuestring, "exact") != 0 && strcmp(it->valuestring, "pow2") != 0)) {
        rc = PERR("%s: 'bucket.%s' must be \"exact\" or \"pow2\"", path, it->string);
        goto out;
      }
    }
  }
  const cJSON *hosted = cJSON_GetObjectItemCaseSensitive(root, "hosted_in");
  if (hosted != NULL) {
    if (!cJSON_IsArray(hosted) || cJSON_GetArraySize(hosted) < 1 || cJSON_GetArraySize(hosted) > UST__MAX_OVERLOADS) {
      rc = PERR("%s: 'hosted_in' must be a list of 1 to %d dispatcher ops the operator runs inside", path,
                UST__MAX_OVERLOADS);
      goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, hosted) {
      if (!cJSON_IsString(it) || strstr(it->valuestring, "::") == NULL ||
          ust__copy_name(p->hosted_in[p->n_hosted], sizeof p->hosted_in[0], it->valuestring) != 0) {
        rc = PERR("%s: 'hosted_in[%d]' must be a dispatcher op name 'namespace::name'", path, p->n_hosted);
        goto out;
      }
      p->n_hosted++;
    }
  }
  const cJSON *jbs = cJSON_GetObjectItemCaseSensitive(root, "bindings");
  if (!cJSON_IsArray(jbs) || (cJSON_GetArraySize(jbs) < 1 && p->n_hosted == 0)) {
    rc = PERR("%s: 'bindings' must be a non-empty list (or empty, with 'hosted_in' naming the ops the operator "
              "runs inside)", path);
    goto out;
  }
  p->n_bindings = cJSON_GetArraySize(jbs);
  p->bindings = calloc(p->n_bindings > 0 ? (size_t)p->n_bindings : 1, sizeof *p->bindings);
  if (p->bindings == NULL) {
    rc = ust__error(UST_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  for (int i = 0; i < p->n_bindings; i++)
    if ((rc = parse_binding(cJSON_GetArrayItem(jbs, i), path, i, bucket, &p->bindings[i])) != 0)
      goto out;
  if (bucket != NULL) {
    const cJSON *it;
    cJSON_ArrayForEach(it, bucket) {
      int known = 0;
      for (int i = 0; i < p->n_bindings; i++)
        for (int d = 0; d < p->bindings[i].n_dims; d++)
          known |= strcmp(p->bindings[i].dims[d].name, it->string) == 0;
      if (!known) {
        rc = PERR("%s: 'bucket.%s' names no key dimension of any binding", path, it->string);
        goto out;
      }
    }
  }
  if ((p->path = ust__strdup(path)) == NULL)
    rc = PERR("%s: out of memory", path);
out:
  cJSON_Delete(root);
  if (rc != 0)
    ust__problem_free(p);
  return rc;
}

void ust__problem_free(ust__problem *p) {
  if (p == NULL)
    return;
  free(p->path);
  free(p->description);
  free(p->bindings);
  memset(p, 0, sizeof *p);
}

void ust__problems_free(ust__problem_set *set) {
  if (set == NULL)
    return;
  for (int i = 0; i < set->n; i++)
    ust__problem_free(&set->items[i]);
  free(set->items);
  set->items = NULL;
  set->n = 0;
}

static int add_problem(const char *path, const char *text, int i, int n, void *ctx) {
  ust__problem_set *out = ctx;
  if (i == 0 && (out->items = calloc((size_t)n, sizeof *out->items)) == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  int rc = ust__problem_parse(text, path, &out->items[out->n]);
  if (rc != 0)
    return rc;
  for (int j = 0; j < out->n; j++)
    if (strcmp(out->items[j].name, out->items[out->n].name) == 0) {
      rc = PERR("%s: 'operator' '%s' is already defined by %s", path, out->items[out->n].name, out->items[j].path);
      ust__problem_free(&out->items[out->n]);
      return rc;
    }
  out->n++;
  return 0;
}

int ust__problems_load_dir(const char *dir, ust__problem_set *out) {
  memset(out, 0, sizeof *out);
  int rc = ust__load_json_dir(dir, "problems", add_problem, out);
  if (rc != 0)
    ust__problems_free(out);
  return rc;
}

const ust__problem *ust__problems_find(const ust__problem_set *set, const char *name) {
  for (int i = 0; i < set->n; i++)
    if (strcmp(set->items[i].name, name) == 0)
      return &set->items[i];
  return NULL;
}
