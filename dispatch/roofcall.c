/* A binding's roofline: its dimensions and W/Q expressions, compiled once,
 * evaluated against a call view; and the hardware profile a call's device
 * picks. */
#include <stdio.h>
#include <string.h>

#include "dispatch/dispatch.h"

int ust__roofline_compile(const ust__roofline_def *def, const char *where, ust__roofline_prog *out) {
  memset(out, 0, sizeof *out);
  out->w_dtype_index = -1;
  if (!def->present)
    return 0;
  const char *names[UST__MAX_RVARS];
  for (int i = 0; i < def->n_vars; i++) {
    if (ust__dim_compile(def->vars[i].expr, &out->vars[i]) != 0)
      return ust__error(UST_EPROBLEM, "%s: roofline.vars.%s: %s", where, def->vars[i].name, ust_last_error());
    names[i] = def->vars[i].name;
  }
  out->n_vars = def->n_vars;
  /* a bound is written over the vars that read no lengths: the others are
   * hidden from it (an empty name matches nothing) */
  const char *plain[UST__MAX_RVARS];
  for (int i = 0; i < def->n_vars; i++) {
    plain[i] = ust__dim_reads_values(&out->vars[i]) ? "" : names[i];
    out->reads_values |= ust__dim_reads_values(&out->vars[i]);
  }
  for (int i = 0; i < def->n_vars; i++) {
    if (def->bound[i][0] == '\0')
      continue;
    if (!ust__dim_reads_values(&out->vars[i])) {
      ust__roofline_free(out);
      return ust__error(UST_EPROBLEM, "%s: roofline.bound.%s: '%s' reads no lengths, so it needs no bound", where,
                        def->vars[i].name, def->vars[i].name);
    }
    if (ust__expr_compile(def->bound[i], plain, def->n_vars, &out->bound[i]) != 0) {
      char why[700];
      snprintf(why, sizeof why, "%s", ust_last_error());
      ust__roofline_free(out);
      return ust__error(UST_EPROBLEM, "%s: roofline.bound.%s (over the vars that read no lengths): %s", where,
                        def->vars[i].name, why);
    }
  }
  const char *texts[3] = {def->w, def->q_read, def->q_write};
  ust__expr **progs[3] = {&out->w, &out->q_read, &out->q_write};
  for (int k = 0; k < 3; k++)
    if (ust__expr_compile(texts[k], names, def->n_vars, progs[k]) != 0) {
      char why[700];
      snprintf(why, sizeof why, "%s", ust_last_error());
      ust__roofline_free(out);
      return ust__error(UST_EPROBLEM, "%s: %s", where, why);
    }
  snprintf(out->w_dtype, sizeof out->w_dtype, "%s", def->w_dtype);
  out->w_tf32 = def->w_tf32;
  out->present = 1;
  return 0;
}

void ust__roofline_resolve(ust__roofline_prog *p, int nargs, const char *const *names, const char *display,
                           ust__log_sink *log) {
  if (!p->present)
    return;
  p->unscorable[0] = '\0';
  for (int v = 0; v < p->n_vars; v++) {
    if (ust__dim_resolve(&p->vars[v], nargs, names) != 0) {
      const char *missing = ust__dim_missing(&p->vars[v]);
      if (p->unscorable[0] == '\0')
        snprintf(p->unscorable, sizeof p->unscorable, "its roofline names argument '%s', which the schema lacks",
                 missing);
      ust__log(log, UST_LOG_WARN, "%s: its roofline names argument '%s', which the schema lacks: calls are not scored",
               display, missing);
    }
  }
  p->w_dtype_index = ust__arg_lookup(p->w_dtype, nargs, names);
  if (p->w_dtype_index < 0) {
    if (p->unscorable[0] == '\0')
      snprintf(p->unscorable, sizeof p->unscorable, "its roofline's W_dtype names argument '%s', which the schema "
               "lacks", p->w_dtype);
    ust__log(log, UST_LOG_WARN, "%s: its roofline's W_dtype names argument '%s', which the schema lacks", display,
             p->w_dtype);
  }
}

/* W's path for a call: its dtype's, TF32 where allowed; -1 unknown. */
static int w_path(const ust__roofline_prog *p, const ust__call *call, int tf32) {
  if (p->w_dtype_index < 0 || p->w_dtype_index >= call->nargs || call->args[p->w_dtype_index].kind != UST__ARG_TENSOR)
    return -1;
  const int path = ust__path_of_dtype(call->args[p->w_dtype_index].dtype);
  return path == UST__PATH_FP32 && p->w_tf32 && tf32 ? UST__PATH_TF32 : path;
}

/* W (on path: -1 when unknown, an error unless W is 0), Q read and written
 * from the vars' values: 0, or -1. */
static int formulas(const ust__roofline_prog *p, const double *vals, int path, double w[UST__N_PATHS],
                    double *q_read, double *q_write) {
  double wv = 0;
  if (ust__expr_eval_quiet(p->w, vals, &wv) != 0 || ust__expr_eval_quiet(p->q_read, vals, q_read) != 0 ||
      ust__expr_eval_quiet(p->q_write, vals, q_write) != 0)
    return -1;
  for (int k = 0; k < UST__N_PATHS; k++)
    w[k] = 0;
  if (wv != 0) {
    if (path < 0)
      return -1;
    w[path] = wv;
  }
  return 0;
}

int ust__roofline_eval(const ust__roofline_prog *p, const ust__call *call, int tf32, double w[UST__N_PATHS],
                       double *q_read, double *q_write) {
  if (!p->present)
    return -1;
  double vals[UST__MAX_RVARS];
  int unread = 0;
  for (int v = 0; v < p->n_vars; v++) {
    int64_t x = ust__dim_eval(&p->vars[v], call);
    if (x == UST__DIM_UNREAD) {
      unread = 1;
      x = 0; /* its bound, below, once the others are known */
    } else if (x < 0) {
      return -1;
    }
    vals[v] = (double)x;
  }
  /* Lengths the host cannot read without waiting on the device: every var
   * that reads them takes its bound, so that they stay consistent with one
   * another (a call's pairs and its keys from the same assumption). */
  if (unread) {
    double bounds[UST__MAX_RVARS];
    for (int v = 0; v < p->n_vars; v++)
      if (ust__dim_reads_values(&p->vars[v]) &&
          (p->bound[v] == NULL || ust__expr_eval_quiet(p->bound[v], vals, &bounds[v]) != 0))
        return -1;
    for (int v = 0; v < p->n_vars; v++)
      if (ust__dim_reads_values(&p->vars[v]))
        vals[v] = bounds[v];
  }
  if (formulas(p, vals, w_path(p, call, tf32), w, q_read, q_write) != 0)
    return -1;
  return unread ? UST__ROOF_BOUNDED : 0;
}

/* The source of d holding argument src's values (added where new), or -1. */
static int defer_source(ust__floor_defer *d, const ust__seq_view *src, const ust__call *call) {
  for (int i = 0; i < d->n_src; i++)
    if (d->srcs[i].arg == src->arg)
      return i;
  const ust__arg *a = &call->args[src->arg];
  const int esize = src->wide ? 8 : 4;
  const int dev = a->t.device.device_type;
  const size_t at = d->n_src > 0 ? d->srcs[d->n_src - 1].at + d->srcs[d->n_src - 1].bytes : 0;
  const int64_t numel = a->t.shape[0];
  if (d->n_src == UST__DEFER_SOURCES || src->data == NULL || src->stride != esize ||
      (dev != kDLCUDA && dev != kDLROCM && dev != kDLCUDAManaged) || numel < 0 ||
      (size_t)numel * (size_t)esize > UST__DEFER_BYTES - at)
    return -1;
  d->srcs[d->n_src].dev = src->data;
  d->srcs[d->n_src].at = at;
  d->srcs[d->n_src].bytes = (size_t)numel * (size_t)esize;
  d->srcs[d->n_src].numel = numel;
  d->srcs[d->n_src].wide = src->wide;
  d->srcs[d->n_src].arg = src->arg;
  return d->n_src++;
}

int ust__roofline_defer(const ust__roofline_prog *p, const ust__call *call, int tf32, ust__floor_defer *d) {
  if (!p->present || !p->reads_values)
    return -1;
  d->prog = p;
  d->device = call->device_id;
  d->n_src = 0;
  d->path = w_path(p, call, tf32);
  for (int v = 0; v < p->n_vars; v++) {
    const ust__dim_prog *dp = &p->vars[v];
    if (!ust__dim_reads_values(dp)) {
      const int64_t x = ust__dim_eval(dp, call);
      if (x < 0)
        return -1;
      d->vals[v] = (double)x;
      continue;
    }
    d->div[v] = ust__dim_seq_divisor(dp, call);
    for (int k = 0; k < 2; k++) {
      d->src[v][k] = -1;
      d->offsets[v][k] = 0;
      if (k == 1 && dp->kind != UST__DIM_SEQDOT)
        continue;
      ust__seq_view src;
      const int rc = ust__dim_seq_source(dp, k, call, &src);
      if (rc < 0 || (rc == 0 && src.host))
        return -1; /* malformed, or read on the host already: no deferral */
      if (rc == 1)
        continue;
      const int i = defer_source(d, &src, call);
      if (i < 0)
        return -1;
      d->src[v][k] = (int8_t)i;
      d->offsets[v][k] = (int8_t)src.offsets;
    }
  }
  return 0;
}

int ust__floor_resolve(const ust__floor_defer *d, const unsigned char *staged, double w[UST__N_PATHS],
                       double *q_read, double *q_write) {
  const ust__roofline_prog *p = d->prog;
  double vals[UST__MAX_RVARS];
  for (int v = 0; v < p->n_vars; v++) {
    const ust__dim_prog *dp = &p->vars[v];
    if (!ust__dim_reads_values(dp)) {
      vals[v] = d->vals[v];
      continue;
    }
    ust__seq_view views[2];
    for (int k = 0; k < 2; k++) {
      const int i = d->src[v][k];
      if (i < 0)
        continue;
      views[k] = (ust__seq_view){.data = staged + d->srcs[i].at, .stride = d->srcs[i].wide ? 8 : 4,
                                 .n = d->srcs[i].numel - d->offsets[v][k], .wide = d->srcs[i].wide,
                                 .offsets = d->offsets[v][k], .host = 1, .arg = d->srcs[i].arg};
      if (views[k].n < 0)
        return -1;
    }
    const int64_t x = ust__dim_seq_value(dp, d->src[v][0] >= 0 ? &views[0] : NULL,
                                         d->src[v][1] >= 0 ? &views[1] : NULL, d->div[v]);
    if (x < 0)
      return -1;
    vals[v] = (double)x;
  }
  return formulas(p, vals, d->path, w, q_read, q_write);
}

void ust__roofline_free(ust__roofline_prog *p) {
  if (p == NULL)
    return;
  ust__expr_free(p->w);
  ust__expr_free(p->q_read);
  ust__expr_free(p->q_write);
  p->w = p->q_read = p->q_write = NULL;
  for (int v = 0; v < UST__MAX_RVARS; v++) {
    ust__expr_free(p->bound[v]);
    p->bound[v] = NULL;
  }
  p->present = 0;
}

const ust__hw_profile *ust__hw_for_call(ust__hw_ctx *hw, const ust__call *call) {
  if (hw == NULL)
    return NULL;
  if (hw->forced != NULL)
    return hw->forced;
  if (call->device == UST__DEV_CPU) {
    if (atomic_load_explicit(&hw->cpu_resolved, memory_order_acquire))
      return atomic_load_explicit(&hw->cpu, memory_order_relaxed);
    char name[256];
    const ust__hw_profile *p = ust__host_cpu_name(name, sizeof name) == 0 ? ust__hw_pick(&hw->set, name) : NULL;
    atomic_store_explicit(&hw->cpu, p, memory_order_relaxed);
    atomic_store_explicit(&hw->cpu_resolved, 1, memory_order_release);
    return p;
  }
  if (call->device != UST__DEV_CUDA || call->device_id < 0 || call->device_id >= UST__HW_MAX_DEVICES)
    return NULL;
  const int d = call->device_id;
  if (atomic_load_explicit(&hw->gpu_resolved[d], memory_order_acquire))
    return atomic_load_explicit(&hw->gpu[d], memory_order_relaxed);
  /* First call on this GPU: pick by its name. Two threads may both look;
   * they find the same profile. */
  char name[256] = "";
  const ust__hw_profile *p = NULL;
  if (ust__gpu_device_name(d, name, sizeof name) != 0)
    return NULL; /* asked again at the next scored call */
  p = ust__hw_pick(&hw->set, name);
  if (p == NULL)
    ust__log(hw->log, UST_LOG_WARN, "no hardware profile matches '%s': its calls are not scored (add one, or run "
                           "understudy calibrate)", name);
  atomic_store_explicit(&hw->gpu[d], p, memory_order_relaxed);
  atomic_store_explicit(&hw->gpu_resolved[d], 1, memory_order_release);
  return p;
}
