/* The JSON config: parsed strictly, every error names its JSON path. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plugin/plugin.h"
#include "plugin/verify.h"

static int level_parse(const char *s) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0)
      return i;
  return -1;
}

/* Fails with a message naming `path` unless every key of obj is in allowed. */
static int check_keys(const cJSON *obj, const char *path, const char *const *allowed) {
  for (const cJSON *it = obj->child; it != NULL; it = it->next) {
    int ok = 0;
    for (const char *const *a = allowed; *a != NULL; a++)
      if (strcmp(it->string, *a) == 0)
        ok = 1;
    if (!ok) {
      char list[256] = "";
      for (const char *const *a = allowed; *a != NULL; a++) {
        strncat(list, *a, sizeof list - strlen(list) - 1);
        if (a[1] != NULL)
          strncat(list, ", ", sizeof list - strlen(list) - 1);
      }
      return ust__error(UST_ECONFIG, "config: unknown field '%s%s%s' (expected one of: %s)", path,
                        *path ? "." : "", it->string, list);
    }
  }
  return 0;
}

/* v must be an object whose keys are all in allowed; the error lists them. */
static int section(const cJSON *v, const char *path, const char *const *allowed) {
  if (!cJSON_IsObject(v)) {
    char list[256] = "";
    for (const char *const *a = allowed; *a != NULL; a++) {
      strncat(list, *a, sizeof list - strlen(list) - 1);
      if (a[1] != NULL)
        strncat(list, ", ", sizeof list - strlen(list) - 1);
    }
    return ust__error(UST_ECONFIG, "config: '%s' must be an object {%s}", path, list);
  }
  return check_keys(v, path, allowed);
}

/* An integer in [lo, hi] into *out. */
static int parse_int(const cJSON *v, const char *path, int lo, int hi, int *out) {
  if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi || v->valuedouble != (double)(int)v->valuedouble)
    return ust__error(UST_ECONFIG, "config: '%s' must be an integer in [%d, %d]", path, lo, hi);
  *out = (int)v->valuedouble;
  return 0;
}

/* One of names (NULL-terminated): its index into *out. */
static int parse_choice(const cJSON *v, const char *path, const char *const *names, int *out) {
  for (int i = 0; names[i] != NULL && cJSON_IsString(v); i++)
    if (strcmp(v->valuestring, names[i]) == 0) {
      *out = i;
      return 0;
    }
  char list[128] = "";
  for (int i = 0; names[i] != NULL; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
  return ust__error(UST_ECONFIG, "config: '%s' must be one of %s", path, list);
}

static int parse_mode(const cJSON *v, const char *path, int *mode) {
  if (!cJSON_IsString(v))
    return ust__error(UST_ECONFIG, "config: '%s' must be a string (off, observe, shadow, canary, live)", path);
  if (ust__mode_parse(v->valuestring, mode) != 0)
    return ust__error(UST_ECONFIG, "config: '%s' is '%s'; expected off, observe, shadow, canary or live", path,
                      v->valuestring);
  return 0;
}

/* A fraction of calls in (0, 1): the canary's share. */
static int parse_fraction(const cJSON *v, const char *path, double *out) {
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0.0 || v->valuedouble >= 1.0)
    return ust__error(UST_ECONFIG, "config: '%s' must be a fraction of calls in (0, 1)", path);
  *out = v->valuedouble;
  return 0;
}

/* "promotion": {"min_verified": N, "min_speedup": X, "canary": P, "dry_run": B, "alpha": A, "delta": D,
 * "max_samples": N} */
static int parse_promotion(const cJSON *v, const char *path, ust__promotion *p) {
  static const char *const keys[] = {"min_verified", "min_speedup", "canary", "dry_run", "alpha", "delta",
                                     "max_samples", NULL};
  int rc = section(v, path, keys);
  if (rc != 0)
    return rc;
  char sub[UST__NAME_MAX + 64];
  const cJSON *x;
  p->enabled = 1;
  if ((x = cJSON_GetObjectItemCaseSensitive(v, "min_verified")) != NULL) {
    snprintf(sub, sizeof sub, "%s.min_verified", path);
    if ((rc = parse_int(x, sub, 1, 1 << 30, &p->min_verified)) != 0)
      return rc;
  }
  if ((x = cJSON_GetObjectItemCaseSensitive(v, "min_speedup")) != NULL) {
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0)
      return ust__error(UST_ECONFIG, "config: '%s.min_speedup' must be a number >= 0", path);
    p->min_speedup = x->valuedouble;
  }
  if ((x = cJSON_GetObjectItemCaseSensitive(v, "canary")) != NULL) {
    snprintf(sub, sizeof sub, "%s.canary", path);
    if ((rc = parse_fraction(x, sub, &p->canary)) != 0)
      return rc;
  }
  if ((x = cJSON_GetObjectItemCaseSensitive(v, "dry_run")) != NULL) {
    if (!cJSON_IsBool(x))
      return ust__error(UST_ECONFIG, "config: '%s.dry_run' must be true or false", path);
    p->dry_run = cJSON_IsTrue(x);
  }
  if ((x = cJSON_GetObjectItemCaseSensitive(v, "alpha")) != NULL) {
    if (!cJSON_IsNumber(x) || !(x->valuedouble > 0 && x->valuedouble < 0.5))
      return ust__error(UST_ECONFIG, "config: '%s.alpha' must be an error rate in (0, 0.5)", path);
    p->alpha = x->valuedouble;
  }
  if ((x = cJSON_GetObjectItemCaseSensitive(v, "delta")) != NULL) {
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble < 1))
      return ust__error(UST_ECONFIG, "config: '%s.delta' must be a relative difference in [0, 1)", path);
    p->delta = x->valuedouble;
  }
  if ((x = cJSON_GetObjectItemCaseSensitive(v, "max_samples")) != NULL) {
    snprintf(sub, sizeof sub, "%s.max_samples", path);
    if ((rc = parse_int(x, sub, 10, 100000, &p->max_samples)) != 0)
      return rc;
  }
  return 0;
}

/* "routes": {KEY: MODE or {"mode": MODE, "canary": P}}: modes of single
 * shape keys, as the report spells them. */
static int parse_routes(const cJSON *v, const char *path, ust__op_config *oc) {
  if (!cJSON_IsObject(v))
    return ust__error(UST_ECONFIG, "config: '%s' must be an object mapping shape keys to modes", path);
  int n = cJSON_GetArraySize(v);
  oc->routes = calloc(n > 0 ? (size_t)n : 1, sizeof *oc->routes);
  if (oc->routes == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  for (const cJSON *it = v->child; it != NULL; it = it->next) {
    ust__route_config *rc_ = &oc->routes[oc->n_routes];
    char sub[UST__NAME_MAX + 600];
    snprintf(sub, sizeof sub, "%s.%s", path, it->string);
    if (ust__copy_name(rc_->key, sizeof rc_->key, it->string) != 0 || strchr(it->string, '|') == NULL)
      return ust__error(UST_ECONFIG, "config: '%s' is not a shape key like \"aten::mm|cuda|bf16,bf16|M=8,K=64,N=64\"",
                        sub);
    rc_->canary = -1;
    int rc;
    if (cJSON_IsString(it)) {
      rc = parse_mode(it, sub, &rc_->mode);
    } else {
      static const char *const keys[] = {"mode", "canary", NULL};
      rc = section(it, sub, keys);
      const cJSON *m = cJSON_GetObjectItemCaseSensitive(it, "mode"), *c = cJSON_GetObjectItemCaseSensitive(it, "canary");
      char sub2[UST__NAME_MAX + 640];
      if (rc == 0 && m == NULL)
        rc = ust__error(UST_ECONFIG, "config: '%s' needs a 'mode'", sub);
      snprintf(sub2, sizeof sub2, "%s.mode", sub);
      if (rc == 0)
        rc = parse_mode(m, sub2, &rc_->mode);
      snprintf(sub2, sizeof sub2, "%s.canary", sub);
      if (rc == 0 && c != NULL)
        rc = parse_fraction(c, sub2, &rc_->canary);
    }
    if (rc != 0)
      return rc;
    oc->n_routes++;
  }
  return 0;
}

static int parse_sample(const cJSON *v, const char *path, double *sample) {
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0.0 ||
      v->valuedouble > 1.0)
    return ust__error(UST_ECONFIG, "config: '%s' must be a number in [0, 1]", path);
  *sample = v->valuedouble;
  return 0;
}

/* "sample_steady" of the section at path: a share no greater than the
 * section's sample. */
static int parse_steady(const cJSON *v, const char *path, double sample, double *steady) {
  char sub[UST__NAME_MAX + 48];
  snprintf(sub, sizeof sub, "%s.sample_steady", path);
  int rc = parse_sample(v, sub, steady);
  if (rc == 0 && *steady > sample)
    rc = ust__error(UST_ECONFIG, "config: '%s' (%g) must not be above '%s.sample' (%g): it is the share once a key "
                    "is steady", sub, *steady, path, sample);
  return rc;
}

static int parse_string(const cJSON *v, const char *path, char **out) {
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
    return ust__error(UST_ECONFIG, "config: '%s' must be a non-empty string", path);
  free(*out);
  *out = ust__strdup(v->valuestring);
  return *out == NULL ? ust__error(UST_ENOMEM, "config: out of memory") : 0;
}

/* ---- placeholders in paths ---------------------------------------------------------
 * Many processes (tensor-parallel ranks, a server's workers) often share one
 * config: {pid}, {rank} and {local_rank} give each its own report and state
 * file. A rank comes from the variables launchers set, the first one present:
 * torchrun's (and torch.distributed's env:// convention), OpenMPI's, MPICH's
 * (Hydra), Slurm's. */

static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
static const char *const local_rank_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                              "SLURM_LOCALID", NULL};

/* The first of vars set in the environment, as a decimal rank into buf. */
static int rank_from_env(const char *subject, const char *name, const char *const *vars, char *buf, size_t cap) {
  for (int i = 0; vars[i] != NULL; i++) {
    const char *v = getenv(vars[i]);
    if (v == NULL || v[0] == '\0')
      continue;
    size_t n = strspn(v, "0123456789");
    if (n == 0 || n > 9 || v[n] != '\0')
      return ust__error(UST_ECONFIG, "%s uses {%s}, but %s is '%.32s', not a rank (a whole number >= 0)",
                        subject, name, vars[i], v);
    snprintf(buf, cap, "%ld", strtol(v, NULL, 10));
    return 0;
  }
  return ust__error(UST_ECONFIG, "%s uses {%s}, but none of %s, %s, %s or %s is set in this process's "
                    "environment (the launcher sets them: torchrun, mpirun, srun); {pid} names every process apart",
                    subject, name, vars[0], vars[1], vars[2], vars[3]);
}

int ust__path_expand(const char *subject, const char *templ, char **out) {
  *out = NULL;
  size_t cap = strlen(templ) + 1, len = 0;
  char *buf = malloc(cap);
  if (buf == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  for (const char *p = templ; *p != '\0';) {
    char value[32];
    const char *piece = value;
    size_t n;
    if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
      piece = p, n = 1, p += 2;
    } else if (p[0] == '}') {
      free(buf);
      return ust__error(UST_ECONFIG, "%s has a single '}' at offset %d (write '}}' for a brace)", subject,
                        (int)(p - templ));
    } else if (p[0] == '{') {
      const char *end = strchr(p, '}');
      const int name_len = end != NULL ? (int)(end - p - 1) : 0;
      int rc = 0;
      if (end == NULL) {
        rc = ust__error(UST_ECONFIG, "%s has a '{' at offset %d that is never closed (write '{{' for a "
                        "brace)", subject, (int)(p - templ));
      } else if (name_len == 3 && strncmp(p + 1, "pid", 3) == 0) {
        snprintf(value, sizeof value, "%ld", (long)getpid());
      } else if (name_len == 4 && strncmp(p + 1, "rank", 4) == 0) {
        rc = rank_from_env(subject, "rank", rank_vars, value, sizeof value);
      } else if (name_len == 10 && strncmp(p + 1, "local_rank", 10) == 0) {
        rc = rank_from_env(subject, "local_rank", local_rank_vars, value, sizeof value);
      } else {
        rc = ust__error(UST_ECONFIG, "%s has an unknown placeholder '{%.*s}' (known: {pid}, {rank}, "
                        "{local_rank}; '{{' and '}}' for braces)", subject, name_len > 64 ? 64 : name_len, p + 1);
      }
      if (rc != 0) {
        free(buf);
        return rc;
      }
      n = strlen(value);
      p = end + 1;
    } else {
      n = strcspn(p, "{}");
      piece = p;
      p += n;
    }
    if (len + n + 1 > cap) {
      char *grown = realloc(buf, cap = 2 * (len + n + 1));
      if (grown == NULL) {
        free(buf);
        return ust__error(UST_ENOMEM, "config: out of memory");
      }
      buf = grown;
    }
    memcpy(buf + len, piece, n);
    buf[len += n] = '\0';
  }
  *out = buf;
  return 0;
}

int ust_expand_path(const char *templ, char **out) {
  ust__clear_error();
  if (out == NULL)
    return ust__error(UST_EINVAL, "expand_path: out is NULL");
  *out = NULL;
  if (templ == NULL)
    return ust__error(UST_EINVAL, "expand_path: the path is NULL");
  char subject[96];
  snprintf(subject, sizeof subject, "path '%.64s%s'", templ, strlen(templ) > 64 ? "..." : "");
  return ust__path_expand(subject, templ, out);
}

/* A path field: a non-empty string, its placeholders expanded. */
static int parse_path(const cJSON *v, const char *field, char **out) {
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
    return ust__error(UST_ECONFIG, "config: '%s' must be a non-empty string", field);
  char subject[64];
  snprintf(subject, sizeof subject, "config: '%s'", field);
  free(*out);
  return ust__path_expand(subject, v->valuestring, out);
}

/* "deps": {PATH: HEX, ...}: the pins of a native candidate's dependencies. */
static int parse_deps(const cJSON *d, const char *path, ust__cand_config *cc) {
  if (!cJSON_IsObject(d))
    return ust__error(UST_ECONFIG, "config: '%s.deps' must be an object mapping library paths to their SHA-256", path);
  const int n = cJSON_GetArraySize(d);
  if (n > UST__MAX_DEPS)
    return ust__error(UST_ECONFIG, "config: '%s.deps' pins %d libraries; at most %d", path, n, UST__MAX_DEPS);
  for (const cJSON *it = d->child; it != NULL; it = it->next) {
    char pin[65];
    if (it->string[0] != '/' || !cJSON_IsString(it) || ust__sha256_pin_parse(it->valuestring, pin) != 0)
      return ust__error(UST_ECONFIG, "config: '%s.deps.%s' must map an absolute path to its 64 hex digit SHA-256",
                        path, it->string);
    char *p = ust__strdup(it->string);
    if (p == NULL)
      return ust__error(UST_ENOMEM, "config: out of memory");
    cc->dep_path[cc->n_deps] = p;
    memcpy(cc->dep_sha256[cc->n_deps++], pin, sizeof pin);
  }
  return 0;
}

/* "candidate": {"native": PATH, "sha256": HEX, "deps": {...}, "target": OP} or
 * {"torch_op": "ns::name", "target": OP}. */
static int parse_candidate(const cJSON *c, const char *path, ust__cand_config *cc) {
  static const char *const keys[] = {"native", "sha256", "deps", "torch_op", "target", "qualify", "qualify_calls",
                                     NULL};
  int rc = section(c, path, keys);
  if (rc != 0)
    return rc;
  const cJSON *qualify = cJSON_GetObjectItemCaseSensitive(c, "qualify");
  const cJSON *qcalls = cJSON_GetObjectItemCaseSensitive(c, "qualify_calls");
  cc->qualify = UST__QUALIFY_HERE;
  cc->qualify_calls = 3;
  if (qualify != NULL) {
    if (!cJSON_IsString(qualify) || (strcmp(qualify->valuestring, "process") != 0 &&
                                     strcmp(qualify->valuestring, "here") != 0))
      return ust__error(UST_ECONFIG, "config: '%s.qualify' must be \"process\" (the candidate qualifies in a process "
                        "of its own before this one loads it) or \"here\"", path);
    if (strcmp(qualify->valuestring, "process") == 0) {
      if (cJSON_GetObjectItemCaseSensitive(c, "native") == NULL)
        return ust__error(UST_ECONFIG, "config: '%s.qualify' applies to native candidates only (a torch op runs in "
                          "this process)", path);
      cc->qualify = UST__QUALIFY_PROCESS;
    }
  }
  if (qcalls != NULL) {
    if (cc->qualify != UST__QUALIFY_PROCESS)
      return ust__error(UST_ECONFIG, "config: '%s.qualify_calls' applies only with \"qualify\": \"process\"", path);
    if (!cJSON_IsNumber(qcalls) || !(qcalls->valuedouble >= 1 && qcalls->valuedouble <= 1000000) ||
        qcalls->valuedouble != (double)(int)qcalls->valuedouble)
      return ust__error(UST_ECONFIG, "config: '%s.qualify_calls' must be a whole number of calls from 1 to 1000000",
                        path);
    cc->qualify_calls = (int)qcalls->valuedouble;
  }
  const cJSON *deps = cJSON_GetObjectItemCaseSensitive(c, "deps");
  if (deps != NULL && cJSON_GetObjectItemCaseSensitive(c, "native") == NULL)
    return ust__error(UST_ECONFIG, "config: '%s.deps' applies to native candidates only", path);
  if (deps != NULL && (rc = parse_deps(deps, path, cc)) != 0)
    return rc;
  const cJSON *native = cJSON_GetObjectItemCaseSensitive(c, "native");
  const cJSON *sha = cJSON_GetObjectItemCaseSensitive(c, "sha256");
  const cJSON *top = cJSON_GetObjectItemCaseSensitive(c, "torch_op");
  const cJSON *target = cJSON_GetObjectItemCaseSensitive(c, "target");
  char sub[UST__NAME_MAX + 64];
  if ((native == NULL) == (top == NULL))
    return ust__error(UST_ECONFIG, "config: '%s' needs exactly one of 'native' (a shared object) or 'torch_op'", path);
  if (native != NULL) {
    cc->kind = UST__CAND_NATIVE;
    snprintf(sub, sizeof sub, "%s.native", path);
    if ((rc = parse_string(native, sub, &cc->path)) != 0)
      return rc;
    if (sha == NULL || !cJSON_IsString(sha) || ust__sha256_pin_parse(sha->valuestring, cc->sha256) != 0)
      return ust__error(UST_ECONFIG,
                        "config: '%s.sha256' must be the 64 hex digits of the shared object's SHA-256 "
                        "(a native candidate is loaded only when it matches)", path);
  } else {
    cc->kind = UST__CAND_TORCH_OP;
    if (sha != NULL)
      return ust__error(UST_ECONFIG, "config: '%s.sha256' applies to native candidates only", path);
    if (!cJSON_IsString(top) || strstr(top->valuestring, "::") == NULL ||
        ust__copy_name(cc->torch_op, sizeof cc->torch_op, top->valuestring) != 0)
      return ust__error(UST_ECONFIG, "config: '%s.torch_op' must be a dispatcher op name like \"ns::name\"", path);
  }
  if (target != NULL && (!cJSON_IsString(target) || strstr(target->valuestring, "::") == NULL ||
                         ust__copy_name(cc->target, sizeof cc->target, target->valuestring) != 0))
    return ust__error(UST_ECONFIG, "config: '%s.target' must be a bound dispatcher op like \"aten::mm\"", path);
  return 0;
}

/* "guard": {"compare": KIND, "atol": X, "rtol": Y, "aa_sample": P, "deadline_ms": MS} */
static int parse_guard(const cJSON *g, const char *path, ust__op_config *oc) {
  static const char *const keys[] = {"compare", "atol", "rtol", "aa_sample", "deadline_ms", "max_slowdown", NULL};
  int rc = section(g, path, keys);
  if (rc != 0)
    return rc;
  const cJSON *v;
  if ((v = cJSON_GetObjectItemCaseSensitive(g, "compare")) != NULL &&
      (!cJSON_IsString(v) || (oc->compare = ust__cmp_kind_parse(v->valuestring)) < 0))
    return ust__error(UST_ECONFIG, "config: '%s.compare' must be \"allclose\", \"exact\" or \"set\"", path);
  const char *tol_names[2] = {"atol", "rtol"};
  double *tols[2] = {&oc->atol, &oc->rtol};
  for (int i = 0; i < 2; i++) {
    if ((v = cJSON_GetObjectItemCaseSensitive(g, tol_names[i])) == NULL)
      continue;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
      return ust__error(UST_ECONFIG, "config: '%s.%s' must be a number >= 0", path, tol_names[i]);
    *tols[i] = v->valuedouble;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(g, "aa_sample")) != NULL) {
    char sub[UST__NAME_MAX + 64];
    snprintf(sub, sizeof sub, "%s.aa_sample", path);
    if ((rc = parse_sample(v, sub, &oc->aa_sample)) != 0)
      return rc;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(g, "deadline_ms")) != NULL) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0 || v->valuedouble > 3.6e6)
      return ust__error(UST_ECONFIG, "config: '%s.deadline_ms' must be a number of milliseconds in (0, 3600000]",
                        path);
    oc->deadline_ms = v->valuedouble;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(g, "max_slowdown")) != NULL) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 1)
      return ust__error(UST_ECONFIG, "config: '%s.max_slowdown' must be a number >= 1", path);
    oc->max_slowdown = v->valuedouble;
  }
  return 0;
}

/* More operators than any definitions directory holds: refused before
 * anything is allocated for them. */
#define UST__MAX_CONFIG_OPS 4096

/* Operator names seen so far: a duplicate is found in constant time. */
typedef struct name_seen {
  char name[UST__NAME_MAX];
  UT_hash_handle hh;
} name_seen;

static int parse_operators_seen(const cJSON *ops, ust__config *cfg, name_seen **seen, name_seen *marks);

static int parse_operators(const cJSON *ops, ust__config *cfg) {
  if (!cJSON_IsObject(ops))
    return ust__error(UST_ECONFIG, "config: 'operators' must be an object mapping operator names to settings");
  int n = cJSON_GetArraySize(ops);
  if (n > UST__MAX_CONFIG_OPS)
    return ust__error(UST_ECONFIG, "config: 'operators' lists %d operators; at most %d are read", n,
                      UST__MAX_CONFIG_OPS);
  name_seen *seen = NULL, *marks = calloc(n > 0 ? (size_t)n : 1, sizeof *marks);
  if (marks == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  int rc = parse_operators_seen(ops, cfg, &seen, marks);
  HASH_CLEAR(hh, seen);
  free(marks);
  return rc;
}

static int parse_operators_seen(const cJSON *ops, ust__config *cfg, name_seen **seen, name_seen *marks) {
  int n = cJSON_GetArraySize(ops);
  cfg->ops = calloc(n > 0 ? (size_t)n : 1, sizeof *cfg->ops);
  if (cfg->ops == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  for (const cJSON *it = ops->child; it != NULL; it = it->next) {
    char path[UST__NAME_MAX + 32];
    snprintf(path, sizeof path, "operators.%s", it->string);
    ust__op_config *oc = &cfg->ops[cfg->n_ops];
    if (ust__copy_name(oc->name, sizeof oc->name, it->string) != 0 || it->string[0] == '\0')
      return ust__error(UST_ECONFIG, "config: operator name '%s' is empty or too long", it->string);
    name_seen *dup = NULL;
    HASH_FIND_STR(*seen, oc->name, dup);
    if (dup != NULL)
      return ust__error(UST_ECONFIG, "config: '%s' appears twice", path);
    name_seen *mark = &marks[cfg->n_ops];
    snprintf(mark->name, sizeof mark->name, "%s", oc->name);
    ust__hash_oom = 0;
    HASH_ADD_STR(*seen, name, mark);
    if (ust__hash_oom)
      return ust__error(UST_ENOMEM, "config: out of memory");
    oc->mode = cfg->default_mode;
    oc->sample = cfg->default_sample;
    oc->sample_steady = cfg->default_sample_steady;
    oc->steady_after = cfg->steady_after;
    oc->canary = 0.1;
    oc->promotion.min_verified = 100;
    oc->promotion.min_speedup = 1.0;
    oc->promotion.canary = 0.1;
    oc->promotion.alpha = 0.05;
    oc->promotion.delta = 0.05;
    oc->promotion.max_samples = 1000;
    oc->compare = -1;
    oc->atol = oc->rtol = -1;
    oc->deadline_ms = 10000;
    oc->max_slowdown = 25;
    oc->aa_sample = 1.0 / 32; /* production's own spread on each route, for the promotion's delta */
    int rc;
    if (cJSON_IsString(it)) {
      rc = parse_mode(it, path, &oc->mode);
    } else if (cJSON_IsObject(it)) {
      static const char *const keys[] = {"mode", "sample", "sample_steady", "candidate", "guard", "canary", "strict",
                                         "promotion", "routes", NULL};
      rc = check_keys(it, path, keys);
      const cJSON *v;
      char sub[UST__NAME_MAX + 48];
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "mode")) != NULL) {
        snprintf(sub, sizeof sub, "%s.mode", path);
        rc = parse_mode(v, sub, &oc->mode);
      }
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "sample")) != NULL) {
        snprintf(sub, sizeof sub, "%s.sample", path);
        rc = parse_sample(v, sub, &oc->sample);
        oc->sample_steady = oc->sample; /* a share asked for holds for every call, unless sample_steady says */
      }
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "sample_steady")) != NULL)
        rc = parse_steady(v, path, oc->sample, &oc->sample_steady);
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "candidate")) != NULL) {
        snprintf(sub, sizeof sub, "%s.candidate", path);
        rc = parse_candidate(v, sub, &oc->cand);
      }
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "guard")) != NULL) {
        snprintf(sub, sizeof sub, "%s.guard", path);
        rc = parse_guard(v, sub, oc);
      }
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "canary")) != NULL) {
        snprintf(sub, sizeof sub, "%s.canary", path);
        rc = parse_fraction(v, sub, &oc->canary);
      }
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "strict")) != NULL) {
        if (!cJSON_IsBool(v))
          rc = ust__error(UST_ECONFIG, "config: '%s.strict' must be true or false", path);
        oc->strict = cJSON_IsTrue(v);
      }
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "promotion")) != NULL) {
        snprintf(sub, sizeof sub, "%s.promotion", path);
        rc = parse_promotion(v, sub, &oc->promotion);
      }
      if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(it, "routes")) != NULL) {
        snprintf(sub, sizeof sub, "%s.routes", path);
        rc = parse_routes(v, sub, oc);
      }
    } else {
      rc = ust__error(UST_ECONFIG, "config: '%s' must be a mode string or an object {mode, sample, candidate, guard}",
                      path);
    }
    if (rc == 0 && oc->mode >= UST__MODE_SHADOW && oc->cand.kind == 0)
      rc = ust__error(UST_ECONFIG, "config: '%s' is in mode %s but names no 'candidate'", path,
                      ust__mode_name(oc->mode));
    for (int k = 0; rc == 0 && k < oc->n_routes; k++)
      if (oc->routes[k].mode >= UST__MODE_SHADOW && oc->cand.kind == 0)
        rc = ust__error(UST_ECONFIG, "config: '%s.routes.%s' is in mode %s but the operator names no 'candidate'",
                        path, oc->routes[k].key, ust__mode_name(oc->routes[k].mode));
    if (rc == 0 && oc->promotion.enabled && oc->cand.kind == 0)
      rc = ust__error(UST_ECONFIG, "config: '%s.promotion' needs a 'candidate' to promote", path);
    if (rc != 0) {
      cfg->n_ops++; /* so that config_free releases what this entry owns */
      return rc;
    }
    cfg->n_ops++;
  }
  return 0;
}

/* "metrics": {port, host, top_keys}. The Python package acts on it (an endpoint
 * of its own, or the host's Prometheus registry); the core only checks it, so
 * that a mistake is refused at enable like any other field. */
static int parse_metrics(const cJSON *m) {
  static const char *const keys[] = {"port", "host", "top_keys", NULL};
  int rc = section(m, "metrics", keys), n;
  if (rc != 0)
    return rc;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "port");
  if (v != NULL && (rc = parse_int(v, "metrics.port", 0, 65535, &n)) != 0)
    return rc;
  const cJSON *host = cJSON_GetObjectItemCaseSensitive(m, "host");
  if (host != NULL) {
    if (!cJSON_IsString(host) || host->valuestring[0] == '\0' || strlen(host->valuestring) > 255)
      return ust__error(UST_ECONFIG, "config: 'metrics.host' must be a non-empty string of at most 255 "
                                     "characters (the address the endpoint binds, e.g. \"127.0.0.1\")");
    if (v == NULL)
      return ust__error(UST_ECONFIG, "config: 'metrics.host' needs 'metrics.port' (the host is where the "
                                     "stand-alone endpoint binds)");
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(m, "top_keys")) != NULL &&
      (rc = parse_int(v, "metrics.top_keys", 1, 65536, &n)) != 0)
    return rc;
  return 0;
}

static int parse_root(const cJSON *root, ust__config *cfg) {
  static const char *const keys[] = {"version", "problems_dir", "report", "log_level", "max_routes",
                                     "defaults", "operators", "shadow", "hardware", "state", "disable_timeout_s",
                                     "metrics", "timer", NULL};
  if (!cJSON_IsObject(root))
    return ust__error(UST_ECONFIG, "config: the top level must be a JSON object");
  int rc = check_keys(root, "", keys);
  if (rc != 0)
    return rc;
  const cJSON *v;
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "version")) != NULL &&
      (!cJSON_IsNumber(v) || v->valuedouble != 1))
    return ust__error(UST_ECONFIG, "config: 'version' must be 1");
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "problems_dir")) != NULL &&
      (rc = parse_string(v, "problems_dir", &cfg->problems_dir)) != 0)
    return rc;
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "log_level")) != NULL) {
    if (!cJSON_IsString(v) || (cfg->log_level = level_parse(v->valuestring)) < 0)
      return ust__error(UST_ECONFIG, "config: 'log_level' must be one of error, warn, info, debug");
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "disable_timeout_s")) != NULL) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0 || v->valuedouble > 86400)
      return ust__error(UST_ECONFIG, "config: 'disable_timeout_s' must be a number of seconds in (0, 86400]");
    cfg->disable_timeout_s = v->valuedouble;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_routes")) != NULL) {
    /* about 17 KiB a route (two histograms of 976 buckets, the key, its row of the rollout table) */
    if ((rc = parse_int(v, "max_routes", 1, 65536, &cfg->max_routes)) != 0)
      return rc;
  }
  const cJSON *report = cJSON_GetObjectItemCaseSensitive(root, "report");
  if (report != NULL) {
    static const char *const rkeys[] = {"path", "interval_s", "window_s", NULL};
    if ((rc = section(report, "report", rkeys)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(report, "path")) != NULL &&
        (rc = parse_path(v, "report.path", &cfg->report_path)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(report, "interval_s")) != NULL) {
      if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return ust__error(UST_ECONFIG, "config: 'report.interval_s' must be a number >= 0");
      cfg->report_interval_s = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(report, "window_s")) != NULL) {
      if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 86400)
        return ust__error(UST_ECONFIG, "config: 'report.window_s' must be a number of seconds in [0, 86400]");
      cfg->report_window_s = v->valuedouble;
    }
  }
  const cJSON *hw = cJSON_GetObjectItemCaseSensitive(root, "hardware");
  if (hw != NULL) {
    static const char *const hkeys[] = {"dir", "profile", NULL};
    if ((rc = section(hw, "hardware", hkeys)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(hw, "dir")) != NULL &&
        (rc = parse_string(v, "hardware.dir", &cfg->hardware_dir)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(hw, "profile")) != NULL &&
        (rc = parse_string(v, "hardware.profile", &cfg->hardware_profile)) != 0)
      return rc;
  }
  const cJSON *state = cJSON_GetObjectItemCaseSensitive(root, "state");
  if (state != NULL) {
    static const char *const stkeys[] = {"path", NULL};
    if ((rc = section(state, "state", stkeys)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(state, "path")) == NULL)
      return ust__error(UST_ECONFIG, "config: 'state' needs a 'path' (the file the rollout state is kept in)");
    if ((rc = parse_path(v, "state.path", &cfg->state_path)) != 0)
      return rc;
  }
  const cJSON *shadow = cJSON_GetObjectItemCaseSensitive(root, "shadow");
  if (shadow != NULL) {
    static const char *const skeys[] = {"max_inflight", "graph_beside_max_mb", "graph_beside_launch", "graph_gate",
                                        "graph_host_start", NULL};
    if ((rc = section(shadow, "shadow", skeys)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(shadow, "max_inflight")) != NULL) {
      if ((rc = parse_int(v, "shadow.max_inflight", 1, 4096, &cfg->shadow_max_inflight)) != 0)
        return rc;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(shadow, "graph_beside_max_mb")) != NULL) {
      if ((rc = parse_int(v, "shadow.graph_beside_max_mb", 0, 65536, &cfg->shadow_graph_beside_mb)) != 0)
        return rc;
    }
    static const char *const launches[] = {"conditional", "device", NULL}; /* shadow_graph_beside_launch */
    if ((v = cJSON_GetObjectItemCaseSensitive(shadow, "graph_beside_launch")) != NULL &&
        (rc = parse_choice(v, "shadow.graph_beside_launch", launches, &cfg->shadow_graph_beside_launch)) != 0)
      return rc;
    static const char *const starts[] = {"replay", "kernel", NULL}; /* shadow_graph_start_kernel */
    if ((v = cJSON_GetObjectItemCaseSensitive(shadow, "graph_host_start")) != NULL &&
        (rc = parse_choice(v, "shadow.graph_host_start", starts, &cfg->shadow_graph_start_kernel)) != 0)
      return rc;
    static const char *const gates[] = {"device", "replay", NULL}; /* shadow_graph_gate_replay */
    if ((v = cJSON_GetObjectItemCaseSensitive(shadow, "graph_gate")) != NULL &&
        (rc = parse_choice(v, "shadow.graph_gate", gates, &cfg->shadow_graph_gate_replay)) != 0)
      return rc;
  }
  const cJSON *timer = cJSON_GetObjectItemCaseSensitive(root, "timer");
  if (timer != NULL) {
    static const char *const tkeys[] = {"kind", "window_ms", "budget", "launch_cost_us", "cupti_path",
                                        "correlation", NULL};
    if ((rc = section(timer, "timer", tkeys)) != 0)
      return rc;
    static const char *const kinds[] = {"auto", "cupti", "events", NULL}; /* UST__TIMER_* */
    if ((v = cJSON_GetObjectItemCaseSensitive(timer, "kind")) != NULL &&
        (rc = parse_choice(v, "timer.kind", kinds, &cfg->timer_kind)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(timer, "window_ms")) != NULL) {
      if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 600000)
        return ust__error(UST_ECONFIG, "config: 'timer.window_ms' must be a number of milliseconds in [1, 600000]");
      cfg->timer_window_ms = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(timer, "budget")) != NULL) {
      if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 1)
        return ust__error(UST_ECONFIG, "config: 'timer.budget' must be a share of host time in [0, 1] "
                                       "(0: windows back to back)");
      cfg->timer_budget = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(timer, "launch_cost_us")) != NULL) {
      if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 1000)
        return ust__error(UST_ECONFIG, "config: 'timer.launch_cost_us' must be a number of microseconds in [0, 1000]");
      cfg->timer_launch_cost_us = v->valuedouble;
    }
    static const char *const correlations[] = {"records", "callbacks", NULL}; /* timer_callbacks */
    if ((v = cJSON_GetObjectItemCaseSensitive(timer, "correlation")) != NULL &&
        (rc = parse_choice(v, "timer.correlation", correlations, &cfg->timer_callbacks)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(timer, "cupti_path")) != NULL &&
        (rc = parse_string(v, "timer.cupti_path", &cfg->cupti_path)) != 0)
      return rc;
  }
  /* CUPTI's kernel tracing fails every launch of a graph that holds a
   * kernel able to launch graphs from the device ("unspecified launch
   * failure", the context lost; CUDA 13.0 on an H200, torch's profiler) */
  if (cfg->shadow_graph_beside_launch && cfg->timer_kind != UST__TIMER_EVENTS)
    return ust__error(UST_ECONFIG, "config: 'shadow.graph_beside_launch' device needs 'timer.kind' events: CUPTI's "
                                   "kernel tracing fails graphs whose kernels launch graphs from the device");
  const cJSON *defaults = cJSON_GetObjectItemCaseSensitive(root, "defaults");
  if (defaults != NULL) {
    static const char *const dkeys[] = {"mode", "sample", "sample_steady", "steady_after", "key_every", "key_after",
                                        NULL};
    if ((rc = section(defaults, "defaults", dkeys)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(defaults, "mode")) != NULL &&
        (rc = parse_mode(v, "defaults.mode", &cfg->default_mode)) != 0)
      return rc;
    if (cfg->default_mode >= UST__MODE_SHADOW)
      return ust__error(UST_ECONFIG, "config: 'defaults.mode' cannot be %s: it needs a candidate, named per "
                                     "operator in 'operators.NAME.candidate'", ust__mode_name(cfg->default_mode));
    if ((v = cJSON_GetObjectItemCaseSensitive(defaults, "sample")) != NULL) {
      if ((rc = parse_sample(v, "defaults.sample", &cfg->default_sample)) != 0)
        return rc;
      cfg->default_sample_steady = cfg->default_sample; /* as for an operator's sample */
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(defaults, "sample_steady")) != NULL &&
        (rc = parse_steady(v, "defaults", cfg->default_sample, &cfg->default_sample_steady)) != 0)
      return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(defaults, "steady_after")) != NULL) {
      if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e15 ||
          v->valuedouble != floor(v->valuedouble))
        return ust__error(UST_ECONFIG, "config: 'defaults.steady_after' must be a whole number of calls in [0, 1e15]");
      cfg->steady_after = (uint64_t)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(defaults, "key_every")) != NULL) {
      if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1) || v->valuedouble > 65535 ||
          v->valuedouble != floor(v->valuedouble))
        return ust__error(UST_ECONFIG, "config: 'defaults.key_every' must be a whole number of calls in [1, 65535] "
                                       "(1: every call keyed)");
      cfg->key_every = (uint32_t)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(defaults, "key_after")) != NULL) {
      if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e15 ||
          v->valuedouble != floor(v->valuedouble))
        return ust__error(UST_ECONFIG, "config: 'defaults.key_after' must be a whole number of calls in [0, 1e15]");
      cfg->key_after = (uint64_t)v->valuedouble;
    }
  }
  const cJSON *metrics = cJSON_GetObjectItemCaseSensitive(root, "metrics");
  if (metrics != NULL && (rc = parse_metrics(metrics)) != 0)
    return rc;
  const cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "operators");
  cfg->all_operators = ops == NULL;
  if (ops != NULL && (rc = parse_operators(ops, cfg)) != 0)
    return rc;
  return 0;
}

int ust__config_parse(const char *json, ust__config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->report_interval_s = 10.0;
  cfg->report_window_s = 60.0;
  cfg->log_level = UST_LOG_WARN;
  cfg->default_mode = UST__MODE_OBSERVE;
  cfg->default_sample = 1.0 / 16;
  /* once a key has had 4096 calls (about 256 of them timed in a thread's
   * warm-up, 64 past it: each keyed one), 1 in 256 */
  cfg->default_sample_steady = 1.0 / 256;
  cfg->steady_after = 4096;
  /* past a thread's first 4096 calls, an observed operator without a
   * candidate keys 1 call in 64 (at random): the others cost its hop alone.
   * A keyed call among tallied ones finds its view, key, route and counters
   * cold: several microseconds of a decode step where a tallied call costs
   * tenths (README, "Keying a sample of the calls") */
  cfg->key_every = 64;
  cfg->key_after = 4096;
  cfg->max_routes = 4096;
  cfg->shadow_max_inflight = 64;
  cfg->shadow_graph_beside_mb = 16;
  cfg->shadow_graph_beside_launch = 0; /* an IF node: "device" fails under CUPTI's tracing (above) */
  cfg->shadow_graph_gate_replay = 1;
  cfg->shadow_graph_start_kernel = 0; /* nothing added to the graph: a closed gate costs least */
  cfg->disable_timeout_s = 30;
  /* events by default: once CUPTI traced API calls, every later launch of
   * the process stays slower (see README, "Kernel-level timing") */
  cfg->timer_kind = UST__TIMER_EVENTS;
  cfg->timer_window_ms = 100;
  cfg->timer_budget = 0.01;
  cfg->timer_launch_cost_us = 10.0;
  /* the tracer, when asked for, joins launches through callbacks: on an
   * H200 it left +2.5 us per call after its windows against +8.7 us with
   * API records (benchmarks/overhead.py), which also crashed libcupti 13.0
   * while flushed mid-window */
  cfg->timer_callbacks = 1;
  cfg->all_operators = 1;
  if (json == NULL || json[0] == '\0')
    return 0;
  cJSON *root = ust__json_parse(json, "config", UST_ECONFIG);
  if (root == NULL) {
    ust__config_free(cfg);
    return UST_ECONFIG;
  }
  int rc = parse_root(root, cfg);
  cJSON_Delete(root);
  /* modes given to single shape keys are routes: no more than max_routes
   * of them (each a row of the rollout table and the state file) */
  long n_routes = 0;
  for (int i = 0; rc == 0 && i < cfg->n_ops; i++)
    n_routes += cfg->ops[i].n_routes;
  if (rc == 0 && n_routes > cfg->max_routes)
    rc = ust__error(UST_ECONFIG, "config: %ld shape keys under the operators' 'routes', more than 'max_routes' (%d)",
                    n_routes, cfg->max_routes);
  if (rc != 0) {
    ust__config_free(cfg);
    return rc;
  }
  return 0;
}

void ust__config_free(ust__config *cfg) {
  if (cfg == NULL)
    return;
  free(cfg->problems_dir);
  free(cfg->report_path);
  free(cfg->hardware_dir);
  free(cfg->hardware_profile);
  free(cfg->state_path);
  free(cfg->cupti_path);
  cfg->hardware_dir = cfg->hardware_profile = cfg->state_path = cfg->cupti_path = NULL;
  for (int i = 0; cfg->ops != NULL && i < cfg->n_ops; i++) {
    free(cfg->ops[i].cand.path);
    for (int k = 0; k < cfg->ops[i].cand.n_deps; k++)
      free(cfg->ops[i].cand.dep_path[k]);
    free(cfg->ops[i].routes);
  }
  free(cfg->ops);
  cfg->problems_dir = cfg->report_path = NULL;
  cfg->ops = NULL;
  cfg->n_ops = 0;
}

/* Fields of the config a reload may change: per operator. */
static const char *const reloadable[] = {"mode", "canary", "strict", "promotion", "routes", NULL};

/* The config as JSON with the reloadable fields taken out (an operator
 * given as a mode string becomes an empty object). */
static cJSON *config_fixed_part(const char *json) {
  cJSON *root = ust__json_parse(json != NULL && json[0] ? json : "{}", "reload", UST_ECONFIG);
  if (root == NULL)
    return NULL;
  cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "operators");
  if (!cJSON_IsObject(ops))
    return root; /* nothing reloadable in it: compared whole */
  for (cJSON *it = ops->child, *next; it != NULL; it = next) {
    next = it->next; /* replacing it frees it */
    if (cJSON_IsString(it)) {
      cJSON_ReplaceItemInObjectCaseSensitive(ops, it->string, cJSON_CreateObject());
      continue;
    }
    for (int k = 0; reloadable[k] != NULL; k++)
      cJSON_DeleteItemFromObjectCaseSensitive(it, reloadable[k]);
  }
  return root;
}

/* The path of the first difference between two JSON values, into path. */
static int first_difference(const cJSON *a, const cJSON *b, char *path, size_t cap) {
  if (cJSON_Compare(a, b, 1))
    return 0;
  if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
    const cJSON *sides[2][2] = {{a, b}, {b, a}};
    for (int s = 0; s < 2; s++)
      for (const cJSON *x = sides[s][0]->child; x != NULL; x = x->next) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(sides[s][1], x->string);
        size_t n = strlen(path);
        snprintf(path + n, cap - n, "%s%s", n ? "." : "", x->string);
        if (y == NULL || first_difference(s == 0 ? x : y, s == 0 ? y : x, path, cap))
          return 1;
        path[n] = '\0';
      }
  }
  return 1;
}

int ust__config_reload_check(const char *running, const char *next) {
  cJSON *was = config_fixed_part(running), *now = was != NULL ? config_fixed_part(next) : NULL;
  char path[256] = "";
  int rc = 0;
  if (was == NULL || now == NULL)
    rc = UST_ECONFIG; /* the parser said why */
  else if (first_difference(was, now, path, sizeof path))
    rc = ust__error(UST_ECONFIG, "reload: '%s' differs from the running config; a reload changes only operators' "
                    "mode, canary, strict, promotion and routes", path[0] ? path : "(top level)");
  cJSON_Delete(was);
  cJSON_Delete(now);
  return rc;
}
