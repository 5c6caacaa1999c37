/*
 * The report's account of where a candidate comes from and which
 * implementation serves each route (plugin/report.c calls these): the
 * candidate's source as configured, a route's served_by, and what the
 * candidate called inside its own runs (its fallback to torch).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "plugin/engine.h"

static cJSON *add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v); }

const char *ust__report_cand_label(const ust__cand *c) { return c->label[0] != '\0' ? c->label : c->name; }

/* Where the candidate comes from (candidate.source, as configured) and the
 * key dimensions it is for (candidate.when). */
void ust__report_source(cJSON *jc, const ust__cand *c) {
  cJSON *src = c->source_json != NULL ? cJSON_Parse(c->source_json) : NULL;
  if (src != NULL)
    cJSON_AddItemToObject(jc, "source", src);
  else
    cJSON_AddNullToObject(jc, "source");
  if (c->n_when > 0) {
    cJSON *w = cJSON_AddObjectToObject(jc, "when");
    for (int k = 0; k < c->n_when; k++)
      add_num(w, c->when_dim[k], (double)c->when_value[k]);
  }
}

/* What the route's candidate called inside its own runs (its sampled runs
 * in this process): torch's ops by name, and the share of its work the
 * bound ops among them did, by the roofline's W (FLOPs) and Q (bytes):
 * work done outside the candidate, null where unknown. */
cJSON *ust__report_fallback(const ust__route_snap *s) {
  const ust__fallback_snap *f = &s->fallback;
  cJSON *j = cJSON_CreateObject();
  add_num(j, "runs", (double)f->runs);
  add_num(j, "runs_calling_ops", (double)f->runs_calling);
  add_num(j, "aten_calls", (double)f->aten_calls);
  add_num(j, "other_calls", (double)f->other_calls);
  cJSON *ops = cJSON_AddObjectToObject(j, "ops");
  for (int i = 0; i < f->n_ops; i++)
    add_num(ops, f->op[i], (double)f->op_calls[i]);
  add_num(j, "bound_calls", (double)f->bound_calls);
  const int known = f->bound_unscored == 0 && f->own_flops > 0;
  if (known)
    add_num(j, "work_share", (double)f->bound_flops / (double)f->own_flops);
  else
    cJSON_AddNullToObject(j, "work_share");
  if (f->bound_unscored == 0 && f->own_bytes > 0)
    add_num(j, "bytes_share", (double)f->bound_bytes / (double)f->own_bytes);
  else
    cJSON_AddNullToObject(j, "bytes_share");
  /* its kernels, where the kernel tracer saw its runs whole (null: none) */
  if (f->kernel_runs > 0) {
    cJSON *k = cJSON_AddObjectToObject(j, "kernels");
    add_num(k, "runs", (double)f->kernel_runs);
    add_num(k, "kernels", (double)f->kernels);
    add_num(k, "kernels_in_ops", (double)f->op_kernels);
    add_num(k, "kernel_ns", (double)f->kernel_ns);
    add_num(k, "kernel_ns_in_ops", (double)f->op_ns);
    if (f->kernel_ns > 0)
      add_num(k, "time_share", (double)f->op_ns / (double)f->kernel_ns);
    else
      cJSON_AddNullToObject(k, "time_share");
  } else {
    cJSON_AddNullToObject(j, "kernels");
  }
  return j;
}

/* Whether the route's candidate runs on it: it has one, and the route's key
 * is inside the candidate's "when". */
static int cand_runs(const ust__route_snap *s) {
  return s->binding->cand != NULL && ust__route_when_holds(s->binding, &s->k);
}

const char *ust__report_served_now(const ust__route_snap *s) {
  const int mode = s->rollout.mode, runs = cand_runs(s);
  if (runs && s->rollout.qualified && mode == UST__MODE_LIVE)
    return "candidate";
  if (runs && s->rollout.qualified && mode == UST__MODE_CANARY)
    return "both";
  return "production";
}

/* The C++ runtime's demangler, where the library has one (a build with the
 * torch bridge); weak: a build without it names kernels as the tracer did. */
extern char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status) __attribute__((weak));

/* A kernel's name as torch.profiler shows it: demangled where it is a
 * mangled C++ name and the demangler is there. */
static cJSON *kernel_name_json(const char *name) {
  if (__cxa_demangle != NULL && strncmp(name, "_Z", 2) == 0) {
    int status = 0;
    char *plain = __cxa_demangle(name, NULL, NULL, &status);
    if (plain != NULL && status == 0) {
      cJSON *j = cJSON_CreateString(plain);
      free(plain);
      return j;
    }
    free(plain);
  }
  return cJSON_CreateString(name);
}

/* Which implementation serves a route: production (the bound op), the
 * candidate (named), or both (canary); and, where the candidate does not
 * run on the route, why. */
cJSON *ust__report_served_by(const ust__route_snap *s) {
  const ust__binding *b = s->binding;
  const ust__cand *c = b->cand;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "production", b->display);
  /* the kernels production ran for the route, where the kernel tracer saw its calls */
  cJSON *kn = cJSON_AddArrayToObject(j, "production_kernels");
  for (int i = 0; i < UST__FIGS_KERNEL_NAMES && s->figs.kernel_names[i] != NULL; i++)
    cJSON_AddItemToArray(kn, kernel_name_json(s->figs.kernel_names[i]));
  if (c != NULL)
    cJSON_AddStringToObject(j, "candidate", ust__report_cand_label(c));
  else
    cJSON_AddNullToObject(j, "candidate");
  const int runs = cand_runs(s);
  cJSON_AddStringToObject(j, "now", ust__report_served_now(s));
  if (c != NULL && !runs)
    cJSON_AddStringToObject(j, "why", "the route's key is outside the candidate's 'when'");
  const ust__fallback_snap *f = &s->fallback;
  if (f->runs > 0 && f->runs_calling > 0) {
    /* a candidate that calls torch inside its runs, labelled with how much */
    char label[160];
    const int n = snprintf(label, sizeof label, "calls torch: %.3g aten calls per run",
                           (double)f->aten_calls / (double)f->runs);
    int m = n;
    if (f->bound_unscored == 0 && f->own_flops > 0 && m > 0 && (size_t)m < sizeof label)
      m += snprintf(label + m, sizeof label - (size_t)m, ", %.3g%% of its work in bound ops",
                    100.0 * (double)f->bound_flops / (double)f->own_flops);
    if (f->kernel_runs > 0 && f->kernel_ns > 0 && m > 0 && (size_t)m < sizeof label)
      snprintf(label + m, sizeof label - (size_t)m, ", %.3g%% of its kernel time in theirs",
               100.0 * (double)f->op_ns / (double)f->kernel_ns);
    cJSON_AddStringToObject(j, "fallback", label);
  }
  return j;
}
