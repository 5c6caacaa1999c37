/* Lifecycle: enable, disable, runtime mode changes, the worker thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dispatch/backend.h"
#include "guard/guard.h"
#include "plugin/engine.h"

static pthread_mutex_t engine_lock = PTHREAD_MUTEX_INITIALIZER;
static ust__engine *engine; /* guarded by engine_lock */
static const ust__seam_i *seam;
static atomic_long inflight;
_Thread_local int ust__hash_oom;
static atomic_uint_fast64_t internal_errors;

void ust__count_internal_error(void) { atomic_fetch_add_explicit(&internal_errors, 1, memory_order_relaxed); }
uint64_t ust__internal_errors(void) { return atomic_load(&internal_errors); }

void ust__seam_install(const ust__seam_i *s) { seam = s; }
const char *ust_torch_version(void) { return seam != NULL ? seam->torch_version : ""; }
void ust__inflight_enter(void) { atomic_fetch_add_explicit(&inflight, 1, memory_order_acq_rel); }
void ust__inflight_leave(void) { atomic_fetch_sub_explicit(&inflight, 1, memory_order_acq_rel); }

static uint64_t unix_ms(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

static void *worker_main(void *arg) {
  ust__engine *e = arg;
  double interval = e->cfg.report_interval_s;
  uint64_t next_report = ust__now_ns() + (uint64_t)(interval * 1e9);
  int state_warned = 0;
  pthread_mutex_lock(&e->worker_lock);
  while (!e->worker_stop) {
    pthread_mutex_unlock(&e->worker_lock);
    ust__gpu_harvest();
    int shadow_pending = ust__shadow_harvest();
    /* a failing state file is said once, and again after it worked */
    if (ust__rollout_persist() != 0) {
      if (!state_warned)
        ust__log(UST_LOG_WARN, "%s (retried while the state is unsaved)", ust_last_error());
      state_warned = 1;
    } else {
      state_warned = 0;
    }
    uint64_t now = ust__now_ns();
    if (e->cfg.report_path != NULL && interval > 0 && now >= next_report) {
      if (ust__report_write_file(e, e->cfg.report_path) != 0)
        ust__log(UST_LOG_WARN, "periodic report: %s", ust_last_error());
      next_report = now + (uint64_t)(interval * 1e9);
    }
    /* Device timings are polled every 2 ms; a host-only build only wakes
     * for reports. */
    uint64_t wait_ns = ust__gpu_available() || shadow_pending > 0 ? 2000000u : 100000000u;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + wait_ns;
    ts.tv_sec += (time_t)(t / 1000000000u);
    ts.tv_nsec = (long)(t % 1000000000u);
    pthread_mutex_lock(&e->worker_lock);
    if (!e->worker_stop)
      pthread_cond_timedwait(&e->worker_cond, &e->worker_lock, &ts);
  }
  pthread_mutex_unlock(&e->worker_lock);
  return NULL;
}

static void engine_free(ust__engine *e) {
  if (e == NULL)
    return;
  HASH_CLEAR(hh, e->ops_by_name);
  HASH_CLEAR(hh, e->bindings_by_name);
  ust__routes_free(&e->routes);
  free(e->config_json);
  for (int i = 0; e->bindings != NULL && i < e->n_bindings; i++)
    ust__roofline_free(&e->bindings[i].roofline);
  free(e->bindings);
  for (int i = 0; e->cands != NULL && i < e->n_ops; i++)
    ust__candidate_unload(&e->cands[i]);
  free(e->cands);
  free(e->ops);
  ust__problems_free(&e->problems);
  ust__hw_free(&e->hw.set);
  ust__config_free(&e->cfg);
  pthread_mutex_destroy(&e->worker_lock);
  pthread_cond_destroy(&e->worker_cond);
  free(e);
}

static int build_operators(ust__engine *e) {
  const ust__config *c = &e->cfg;
  ust__hash_oom = 0;
  for (int i = 0; i < c->n_ops; i++)
    if (ust__problems_find(&e->problems, c->ops[i].name) == NULL)
      return ust__error(UST_ECONFIG, "config: 'operators.%s': no operator named '%s' is defined in %s",
                        c->ops[i].name, c->ops[i].name, c->problems_dir);
  int n = c->all_operators ? e->problems.n : c->n_ops;
  e->ops = calloc(n > 0 ? (size_t)n : 1, sizeof *e->ops);
  e->cands = calloc(n > 0 ? (size_t)n : 1, sizeof *e->cands);
  if (e->ops == NULL || e->cands == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  int nb = 0;
  for (int i = 0; i < n; i++) {
    ust__operator *op = &e->ops[i];
    const ust__problem *p = c->all_operators ? &e->problems.items[i] : ust__problems_find(&e->problems, c->ops[i].name);
    memcpy(op->name, p->name, sizeof op->name);
    op->problem = p;
    atomic_init(&op->mode, c->all_operators ? c->default_mode : c->ops[i].mode);
    op->sample = c->all_operators ? c->default_sample : c->ops[i].sample;
    op->sample_q32 = ust__share_q32(op->sample);
    if (!c->all_operators)
      ust__rollout_set_operator(op, &c->ops[i]);
    HASH_ADD_STR(e->ops_by_name, name, op);
    if (ust__hash_oom)
      return ust__error(UST_ENOMEM, "out of memory");
    e->n_ops = i + 1; /* from here on engine_free releases this operator's candidate */
    if (!c->all_operators && c->ops[i].cand.kind != 0) {
      int rc = ust__candidate_load(&c->ops[i], p, &e->cands[i]);
      if (rc != 0)
        return rc;
      op->cand = &e->cands[i];
    }
    for (int b = 0; b < p->n_bindings; b++)
      nb += p->bindings[b].n_overloads;
  }
  e->n_ops = n;
  if (nb > 65535)
    return ust__error(UST_ECONFIG, "config: %d dispatcher bindings; at most 65535 are supported", nb);
  e->bindings = calloc(nb > 0 ? (size_t)nb : 1, sizeof *e->bindings);
  if (e->bindings == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    const ust__problem *p = e->ops[i].problem;
    for (int bd = 0; bd < p->n_bindings; bd++) {
      const ust__binding_def *def = &p->bindings[bd];
      for (int o = 0; o < def->n_overloads; o++) {
        ust__binding *b = &e->bindings[e->n_bindings];
        b->index = e->n_bindings;
        b->op = &e->ops[i];
        b->def = def;
        b->routes = &e->routes;
        b->hw = &e->hw;
        b->cand = NULL;
        memcpy(b->qualname, def->op, sizeof b->qualname);
        memcpy(b->overload, def->overloads[o], sizeof b->overload);
        snprintf(b->display, sizeof b->display, "%s%s%s", b->qualname, b->overload[0] ? "." : "", b->overload);
        ust__binding *dup = NULL;
        HASH_FIND_STR(e->bindings_by_name, b->display, dup);
        if (dup != NULL)
          return ust__error(UST_ECONFIG, "%s: '%s' is already bound by operator '%s' (%s)", p->path, b->display,
                            dup->op->name, dup->op->problem->path);
        if (b->op->cand != NULL && strcmp(b->op->cand->target, b->display) == 0)
          b->cand = b->op->cand;
        HASH_ADD_STR(e->bindings_by_name, display, b);
        if (ust__hash_oom)
          return ust__error(UST_ENOMEM, "out of memory");
        b->n_dims = def->n_dims;
        for (int d = 0; d < def->n_dims; d++) {
          if (ust__dim_compile(def->dims[d].expr, &b->dims[d]) != 0)
            return ust__error(UST_EPROBLEM, "%s: %s", p->path, ust_last_error());
          b->dims[d].bucket = def->dims[d].bucket;
        }
        char where[UST__QUALNAME_MAX + 300];
        snprintf(where, sizeof where, "%s (%s)", p->path, b->display);
        if (ust__roofline_compile(&def->roofline, where, &b->roofline) != 0)
          return UST_EPROBLEM;
        e->n_bindings++;
      }
    }
  }
  return 0;
}

static void unregister_all(ust__engine *e) {
  for (int i = 0; i < e->n_bindings; i++) {
    if (e->bindings[i].seam_handle != NULL && seam != NULL)
      seam->unregister_binding(e->bindings[i].seam_handle);
    e->bindings[i].seam_handle = NULL;
  }
}

/* Hardware profiles: hardware.dir, else <problems_dir>/hardware when it
 * exists (without profiles nothing is scored); hardware.profile forces one. */
static int load_hardware(ust__engine *e) {
  const ust__config *c = &e->cfg;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", c->hardware_dir != NULL ? c->hardware_dir : "");
  if (c->hardware_dir == NULL) {
    snprintf(dir, sizeof dir, "%s/hardware", c->problems_dir);
    if (access(dir, F_OK) != 0) {
      if (c->hardware_profile != NULL)
        return ust__error(UST_ECONFIG, "config: 'hardware.profile' is set but there is no '%s'", dir);
      return 0;
    }
  }
  int rc = ust__hw_load_dir(dir, &e->hw.set);
  if (rc != 0)
    return rc;
  if (c->hardware_profile != NULL) {
    for (int i = 0; i < e->hw.set.n && e->hw.forced == NULL; i++)
      if (strcmp(e->hw.set.items[i].name, c->hardware_profile) == 0)
        e->hw.forced = &e->hw.set.items[i];
    if (e->hw.forced == NULL)
      e->hw.forced = ust__hw_pick(&e->hw.set, c->hardware_profile);
    if (e->hw.forced == NULL)
      return ust__error(UST_ECONFIG, "config: 'hardware.profile' is '%s', which no profile in %s names or matches",
                        c->hardware_profile, dir);
  }
  return 0;
}

static int engine_create(const char *config_json, const char *problems_dir, ust__engine **out) {
  ust__engine *e = calloc(1, sizeof *e);
  if (e == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  pthread_mutex_init(&e->worker_lock, NULL);
  pthread_cond_init(&e->worker_cond, NULL);
  int rc = ust__config_parse(config_json, &e->cfg);
  if (rc == 0 && problems_dir != NULL && problems_dir[0] != '\0') {
    free(e->cfg.problems_dir);
    if ((e->cfg.problems_dir = ust__strdup(problems_dir)) == NULL)
      rc = ust__error(UST_ENOMEM, "out of memory");
  }
  if (rc == 0 && e->cfg.problems_dir == NULL)
    rc = ust__error(UST_ECONFIG, "config: 'problems_dir' is not set and no problems directory was given");
  if (rc == 0)
    rc = ust__problems_load_dir(e->cfg.problems_dir, &e->problems);
  if (rc == 0)
    rc = load_hardware(e);
  if (rc == 0)
    rc = build_operators(e);
  if (rc == 0)
    rc = ust__routes_init(&e->routes, e->cfg.max_routes);
  if (rc == 0 && (rc = ust__rollout_init(e)) == 0 && (e->config_json = ust__strdup(config_json ? config_json : "")) == NULL)
    rc = ust__error(UST_ENOMEM, "out of memory");
  if (rc != 0) {
    ust__rollout_shutdown();
    engine_free(e);
    return rc;
  }
  e->started_unix_ms = unix_ms();
  *out = e;
  return 0;
}

int ust_enable(const char *config_json, const char *problems_dir) {
  ust__clear_error();
  pthread_mutex_lock(&engine_lock);
  int rc = 0;
  ust__engine *e = NULL;
  if (engine != NULL) {
    rc = ust__error(UST_ESTATE, "understudy is already enabled; call disable first");
    goto out;
  }
  if ((rc = engine_create(config_json, problems_dir, &e)) != 0)
    goto out;
  ust__log_set_level(e->cfg.log_level);
  if ((rc = ust__gpu_init(1024)) != 0 || (rc = ust__shadow_init(e->cfg.shadow_max_inflight)) != 0)
    goto fail;
  atomic_store(&internal_errors, 0); /* the report counts this enabled period */
  for (int i = 0; seam != NULL && i < e->n_bindings; i++) {
    ust__binding *b = &e->bindings[i];
    if ((rc = seam->register_binding(b, &b->seam_handle)) != 0)
      goto fail;
    if (!seam->op_defined(b->qualname, b->overload))
      ust__log(UST_LOG_INFO, "%s is not defined in this process yet; it is intercepted once it is", b->display);
  }
  if (pthread_create(&e->worker, NULL, worker_main, e) != 0) {
    rc = ust__error(UST_EINTERNAL, "cannot start the worker thread");
    goto fail;
  }
  e->worker_started = 1;
  engine = e;
  ust__log(UST_LOG_INFO, "enabled: %d operators, %d dispatcher bindings", e->n_ops, e->n_bindings);
  goto out;
fail:
  unregister_all(e);
  ust__rollout_shutdown();
  ust__shadow_shutdown();
  ust__gpu_shutdown();
  engine_free(e);
out:
  pthread_mutex_unlock(&engine_lock);
  return rc;
}

int ust_disable(void) {
  ust__clear_error();
  pthread_mutex_lock(&engine_lock);
  ust__engine *e = engine;
  int rc = 0;
  if (e == NULL) {
    pthread_mutex_unlock(&engine_lock);
    return 0;
  }
  unregister_all(e);
  /* A call that looked up our kernel just before it was removed may not
   * have entered it yet; a short grace period covers that window, then the
   * in-flight count drains. */
  usleep(1000);
  while (atomic_load(&inflight) > 0)
    usleep(100);
  pthread_mutex_lock(&e->worker_lock);
  e->worker_stop = 1;
  pthread_cond_signal(&e->worker_cond);
  pthread_mutex_unlock(&e->worker_lock);
  if (e->worker_started)
    pthread_join(e->worker, NULL);
  ust__gpu_harvest_all_sync();
  ust__shadow_harvest_all_sync();
  if (e->cfg.report_path != NULL)
    rc = ust__report_write_file(e, e->cfg.report_path);
  int rs = ust__rollout_persist();
  if (rc == 0)
    rc = rs;
  ust__rollout_shutdown();
  ust__shadow_shutdown();
  ust__gpu_shutdown();
  engine = NULL;
  engine_free(e);
  pthread_mutex_unlock(&engine_lock);
  return rc;
}

int ust_is_enabled(void) {
  pthread_mutex_lock(&engine_lock);
  int on = engine != NULL;
  pthread_mutex_unlock(&engine_lock);
  return on;
}

int ust_set_mode(const char *operator_name, const char *mode) {
  ust__clear_error();
  if (operator_name == NULL || mode == NULL)
    return ust__error(UST_EINVAL, "set_mode: operator and mode are required");
  int m;
  if (ust__mode_parse(mode, &m) != 0)
    return ust__error(UST_EINVAL, "set_mode: mode '%s' is not one of off, observe, shadow, canary, live", mode);
  pthread_mutex_lock(&engine_lock);
  int rc = ust__error(UST_ESTATE, "set_mode: understudy is not enabled");
  if (engine != NULL) {
    ust__operator *op = NULL;
    HASH_FIND_STR(engine->ops_by_name, operator_name, op);
    if (op == NULL) {
      rc = ust__error(UST_ENOTFOUND, "set_mode: no enabled operator is named '%s'", operator_name);
    } else if (m >= UST__MODE_SHADOW && op->cand == NULL) {
      rc = ust__error(UST_ESTATE, "set_mode: operator '%s' has no candidate; %s needs one in the config",
                      operator_name, mode);
    } else {
      atomic_store(&op->mode, m);
      rc = 0;
      ust__clear_error();
    }
  }
  pthread_mutex_unlock(&engine_lock);
  return rc;
}

int ust_set_route_mode(const char *route_key, const char *mode, double canary) {
  ust__clear_error();
  if (route_key == NULL || mode == NULL || strchr(route_key, '|') == NULL)
    return ust__error(UST_EINVAL, "set_route_mode: a shape key (as the report spells it) and a mode are required");
  int m;
  if (ust__mode_parse(mode, &m) != 0)
    return ust__error(UST_EINVAL, "set_route_mode: mode '%s' is not one of off, observe, shadow, canary, live", mode);
  if (m == UST__MODE_CANARY && !(canary > 0 && canary < 1))
    return ust__error(UST_EINVAL, "set_route_mode: canary share %g is not in (0, 1)", canary);
  if (strlen(route_key) >= 512)
    return ust__error(UST_EINVAL, "set_route_mode: the shape key is too long");
  pthread_mutex_lock(&engine_lock);
  int rc = ust__error(UST_ESTATE, "set_route_mode: understudy is not enabled");
  if (engine != NULL) {
    /* the key names its binding first: "ns::op[.overload]|..." */
    char display[UST__QUALNAME_MAX + UST__NAME_MAX];
    size_t n = (size_t)(strchr(route_key, '|') - route_key);
    snprintf(display, sizeof display, "%.*s", (int)(n < sizeof display ? n : sizeof display - 1), route_key);
    ust__binding *b = NULL;
    HASH_FIND_STR(engine->bindings_by_name, display, b);
    if (b == NULL)
      rc = ust__error(UST_ENOTFOUND, "set_route_mode: '%s' is not a bound dispatcher op", display);
    else if (m >= UST__MODE_SHADOW && b->cand == NULL)
      rc = ust__error(UST_ESTATE, "set_route_mode: %s has no candidate targeting it; %s needs one", display, mode);
    else if ((rc = ust__rollout_set_key(route_key, m, canary, "manual", "set by ust_set_route_mode")) == 0)
      ust__clear_error();
  }
  pthread_mutex_unlock(&engine_lock);
  return rc;
}

/* Fields of the config a reload may change: per operator. */
static const char *const reloadable[] = {"mode", "canary", "strict", "promotion", "routes", NULL};

/* The config as JSON with the reloadable fields taken out (an operator
 * given as a mode string becomes an empty object). */
static cJSON *config_fixed_part(const char *json) {
  cJSON *root = cJSON_Parse(json != NULL && json[0] ? json : "{}");
  if (root == NULL)
    return NULL;
  cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "operators");
  for (cJSON *it = ops != NULL ? ops->child : NULL, *next; it != NULL; it = next) {
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

/* 1 when the running config (prev) gives key of operator op the same mode and share. */
static int route_config_unchanged(const ust__config *prev, const char *op, const char *key, int mode, double canary) {
  for (int i = 0; i < prev->n_ops; i++) {
    if (strcmp(prev->ops[i].name, op) != 0)
      continue;
    for (int k = 0; k < prev->ops[i].n_routes; k++) {
      const ust__route_config *r = &prev->ops[i].routes[k];
      const double c = r->canary >= 0 ? r->canary : prev->ops[i].canary;
      if (strcmp(r->key, key) == 0)
        return r->mode == mode && (mode != UST__MODE_CANARY || c == canary);
    }
  }
  return 0;
}

int ust_reload(const char *config_json) {
  ust__clear_error();
  ust__config next;
  int rc = ust__config_parse(config_json, &next);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&engine_lock);
  if (engine == NULL) {
    rc = ust__error(UST_ESTATE, "reload: understudy is not enabled");
    goto out;
  }
  cJSON *was = config_fixed_part(engine->config_json), *now = config_fixed_part(config_json);
  char path[256] = "";
  if (was == NULL || now == NULL)
    rc = ust__error(UST_ENOMEM, "reload: out of memory");
  else if (first_difference(was, now, path, sizeof path))
    rc = ust__error(UST_ECONFIG, "reload: '%s' differs from the running config; a reload changes only operators' "
                    "mode, canary, strict, promotion and routes", path[0] ? path : "(top level)");
  cJSON_Delete(was);
  cJSON_Delete(now);
  /* Per-key entries apply only where they changed: a route rolled back or
   * promoted since keeps its mode unless the reload asks for another. */
  ust__config prev;
  if (rc == 0 && ust__config_parse(engine->config_json, &prev) != 0)
    memset(&prev, 0, sizeof prev);
  for (int i = 0; rc == 0 && i < next.n_ops; i++) {
    ust__operator *op = NULL;
    HASH_FIND_STR(engine->ops_by_name, next.ops[i].name, op);
    if (op != NULL)
      ust__rollout_set_operator(op, &next.ops[i]);
    for (int k = 0; op != NULL && k < next.ops[i].n_routes; k++) {
      const ust__route_config *rcfg = &next.ops[i].routes[k];
      const double canary = rcfg->canary >= 0 ? rcfg->canary : next.ops[i].canary;
      if (route_config_unchanged(&prev, next.ops[i].name, rcfg->key, rcfg->mode, canary))
        continue;
      if (ust__rollout_set_key(rcfg->key, rcfg->mode, canary, "config", "set by a config reload") != 0)
        ust__log(UST_LOG_WARN, "reload: %s", ust_last_error());
    }
  }
  if (rc == 0)
    ust__config_free(&prev);
  if (rc == 0) {
    char *copy = ust__strdup(config_json != NULL ? config_json : "");
    if (copy != NULL) {
      free(engine->config_json);
      engine->config_json = copy;
    }
  }
out:
  pthread_mutex_unlock(&engine_lock);
  ust__config_free(&next);
  return rc;
}

int ust_report_write(const char *path) {
  ust__clear_error();
  pthread_mutex_lock(&engine_lock);
  int rc;
  if (engine == NULL)
    rc = ust__error(UST_ESTATE, "report: understudy is not enabled");
  else if (path == NULL && engine->cfg.report_path == NULL)
    rc = ust__error(UST_EINVAL, "report: no path given and no 'report.path' configured");
  else
    rc = ust__report_write_file(engine, path != NULL ? path : engine->cfg.report_path);
  pthread_mutex_unlock(&engine_lock);
  return rc;
}

int ust_report_json(char **out) {
  ust__clear_error();
  if (out == NULL)
    return ust__error(UST_EINVAL, "report: out is NULL");
  *out = NULL;
  pthread_mutex_lock(&engine_lock);
  int rc = 0;
  if (engine == NULL) {
    rc = ust__error(UST_ESTATE, "report: understudy is not enabled");
  } else {
    cJSON *j = ust__report_build(engine);
    *out = j != NULL ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (*out == NULL)
      rc = ust__error(UST_ENOMEM, "report: out of memory");
  }
  pthread_mutex_unlock(&engine_lock);
  return rc;
}

int ust_flush_sync(void) {
  pthread_mutex_lock(&engine_lock);
  if (engine != NULL) {
    ust__gpu_harvest_all_sync();
    ust__shadow_harvest_all_sync();
  }
  pthread_mutex_unlock(&engine_lock);
  return 0;
}
