/* Hardware profiles and the roofline floor T_SOL. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "scorer/scorer.h"

static const char *const path_names[UST__N_PATHS] = {"bf16", "fp16", "fp8_e4m3", "tf32", "fp32", "int8"};

const char *ust__path_name(int path) { return path >= 0 && path < UST__N_PATHS ? path_names[path] : "?"; }

int ust__path_parse(const char *name) {
  for (int i = 0; i < UST__N_PATHS; i++)
    if (strcmp(name, path_names[i]) == 0)
      return i;
  return -1;
}

#define HERR(...) ust__error(UST_EPROBLEM, __VA_ARGS__)

static int positive_number(const cJSON *v) { return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble > 0; }

/* The list field of root: device-name words (at least min_n of them). */
static int parse_words(const cJSON *root, const char *field, int min_n, const char *path,
                       char words[UST__HW_MAX_MATCH][64], int *n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field), *it;
  if (v == NULL && min_n == 0)
    return 0;
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < min_n || cJSON_GetArraySize(v) > UST__HW_MAX_MATCH)
    return HERR("%s: '%s' must be a list of %d to %d device-name words", path, field, min_n, UST__HW_MAX_MATCH);
  cJSON_ArrayForEach(it, v) {
    if (!cJSON_IsString(it) || it->valuestring[0] == '\0' || ust__copy_name(words[*n], 64, it->valuestring) != 0)
      return HERR("%s: '%s' holds an empty, non-string or too long entry", path, field);
    (*n)++;
  }
  return 0;
}

int ust__hw_parse(const char *text, const char *path, ust__hw_profile *out) {
  memset(out, 0, sizeof *out);
  cJSON *root = ust__json_parse(text, path, UST_EPROBLEM);
  if (root == NULL)
    return UST_EPROBLEM;
  int rc = 0;
  static const char *const keys[] = {"schema_version", "name", "match", "exclude", "p_peak", "b_peak", "source",
                                     NULL};
  if (!cJSON_IsObject(root)) {
    rc = HERR("%s: the top level must be an object", path);
    goto out;
  }
  for (const cJSON *it = root->child; it != NULL && rc == 0; it = it->next) {
    int known = 0;
    for (const char *const *k = keys; *k != NULL; k++)
      known |= strcmp(it->string, *k) == 0;
    if (!known)
      rc = HERR("%s: unknown field '%s' (expected schema_version, name, match, exclude, p_peak, b_peak, source)",
                path, it->string);
  }
  if (rc != 0)
    goto out;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "schema_version");
  if (!cJSON_IsNumber(v) || v->valuedouble != 1) {
    rc = HERR("%s: 'schema_version' must be 1", path);
    goto out;
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "name");
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0' || ust__copy_name(out->name, sizeof out->name, v->valuestring) != 0) {
    rc = HERR("%s: 'name' must be a non-empty string of at most 63 characters", path);
    goto out;
  }
  if ((rc = parse_words(root, "match", 1, path, out->match, &out->n_match)) != 0 ||
      (rc = parse_words(root, "exclude", 0, path, out->exclude, &out->n_exclude)) != 0)
    goto out;
  const cJSON *it;
  v = cJSON_GetObjectItemCaseSensitive(root, "p_peak");
  if (!cJSON_IsObject(v) || cJSON_GetArraySize(v) < 1) {
    rc = HERR("%s: 'p_peak' must be an object {path: FLOP/s} (paths: bf16, fp16, fp8_e4m3, tf32, fp32, int8)",
              path);
    goto out;
  }
  cJSON_ArrayForEach(it, v) {
    int p = ust__path_parse(it->string);
    if (p < 0) {
      rc = HERR("%s: 'p_peak.%s' is not a path (bf16, fp16, fp8_e4m3, tf32, fp32, int8)", path, it->string);
      goto out;
    }
    if (!positive_number(it)) {
      rc = HERR("%s: 'p_peak.%s' must be a positive number of FLOP/s", path, it->string);
      goto out;
    }
    out->p_peak[p] = it->valuedouble;
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "b_peak");
  if (!positive_number(v)) {
    rc = HERR("%s: 'b_peak' must be a positive number of bytes/s", path);
    goto out;
  }
  out->b_peak = v->valuedouble;
  v = cJSON_GetObjectItemCaseSensitive(root, "source");
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0') {
    rc = HERR("%s: 'source' must say where the figures come from", path);
    goto out;
  }
  out->source = ust__strdup(v->valuestring);
  out->path = ust__strdup(path);
  if (out->source == NULL || out->path == NULL)
    rc = ust__error(UST_ENOMEM, "out of memory");
out:
  cJSON_Delete(root);
  if (rc != 0) {
    free(out->source);
    free(out->path);
    out->source = out->path = NULL;
  }
  return rc;
}

static int add_profile(const char *path, const char *text, int i, int n, void *ctx) {
  ust__hw_set *out = ctx;
  if (i == 0 && (out->items = calloc((size_t)n, sizeof *out->items)) == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  int rc = ust__hw_parse(text, path, &out->items[out->n]);
  if (rc != 0)
    return rc;
  out->n++; /* owned by the set from here, freed with it on error too */
  for (int j = 0; j < out->n - 1; j++)
    if (strcmp(out->items[j].name, out->items[out->n - 1].name) == 0)
      return HERR("%s: profile name '%s' is already used by %s", path, out->items[j].name, out->items[j].path);
  return 0;
}

int ust__hw_load_dir(const char *dir, ust__hw_set *out) {
  memset(out, 0, sizeof *out);
  int rc = ust__load_json_dir(dir, "hardware profiles", add_profile, out);
  if (rc != 0)
    ust__hw_free(out);
  return rc;
}

void ust__hw_free(ust__hw_set *set) {
  if (set == NULL)
    return;
  for (int i = 0; i < set->n; i++) {
    free(set->items[i].source);
    free(set->items[i].path);
  }
  free(set->items);
  set->items = NULL;
  set->n = 0;
}

static int whole_word_in(const char *hay, const char *word) {
  size_t wl = strlen(word);
  for (const char *p = strstr(hay, word); p != NULL; p = strstr(p + 1, word)) {
    int before = p == hay || !isalnum((unsigned char)p[-1]);
    int after = !isalnum((unsigned char)p[wl]);
    if (before && after)
      return 1;
  }
  return 0;
}

int ust__host_cpu_name(char *buf, size_t cap) {
  if (cap == 0)
    return -1;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL)
    return -1;
  char line[512];
  int rc = -1;
  while (rc != 0 && fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    const char *v = strchr(line, ':');
    if (v == NULL)
      continue;
    v++;
    while (*v == ' ' || *v == '\t')
      v++;
    snprintf(buf, cap, "%s", v);
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
      buf[--n] = '\0';
    rc = n > 0 ? 0 : -1;
  }
  fclose(f);
  return rc;
}

const ust__hw_profile *ust__hw_pick(const ust__hw_set *set, const char *device_name) {
  if (set == NULL || device_name == NULL)
    return NULL;
  const ust__hw_profile *best = NULL;
  size_t best_len = 0;
  for (int i = 0; i < set->n; i++) {
    const ust__hw_profile *p = &set->items[i];
    int excluded = 0;
    for (int x = 0; x < p->n_exclude; x++)
      excluded |= whole_word_in(device_name, p->exclude[x]);
    for (int m = 0; m < p->n_match && !excluded; m++)
      if (whole_word_in(device_name, p->match[m]) && strlen(p->match[m]) > best_len) {
        best = p;
        best_len = strlen(p->match[m]);
      }
  }
  return best;
}

static int tsol(const ust__hw_profile *hw, const double w[UST__N_PATHS], double q_bytes, double *seconds, int quiet) {
  double compute = 0;
  for (int d = 0; d < UST__N_PATHS; d++) {
    if (w[d] == 0)
      continue;
    if (hw->p_peak[d] <= 0)
      return quiet ? UST_EINVAL
                   : ust__error(UST_EINVAL, "roofline: %s has no %s path for %g FLOPs", hw->name, ust__path_name(d),
                                w[d]);
    compute += w[d] / hw->p_peak[d];
  }
  const double memory = q_bytes / hw->b_peak;
  *seconds = compute > memory ? compute : memory;
  return 0;
}

int ust__roofline_tsol(const ust__hw_profile *hw, const double w[UST__N_PATHS], double q_bytes, double *seconds) {
  return tsol(hw, w, q_bytes, seconds, 0);
}

int ust__roofline_tsol_quiet(const ust__hw_profile *hw, const double w[UST__N_PATHS], double q_bytes,
                             double *seconds) {
  return tsol(hw, w, q_bytes, seconds, 1);
}

int ust__path_of_dtype(int dt) {
  switch (dt) {
  case UST__DT_BF16: return UST__PATH_BF16;
  case UST__DT_F16: return UST__PATH_FP16;
  case UST__DT_F8E4M3FN: case UST__DT_F8E5M2: case UST__DT_F8E4M3FNUZ: case UST__DT_F8E5M2FNUZ:
    return UST__PATH_FP8_E4M3;
  case UST__DT_F32: return UST__PATH_FP32;
  case UST__DT_I8: return UST__PATH_INT8;
  }
  return -1; /* fp64, wider integers: no peak in the profiles, so not scored */
}
