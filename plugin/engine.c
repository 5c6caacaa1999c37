/* The engine: enable, disable, runtime mode changes, reload, reports, the
 * worker thread. The process context it lives in is plugin/context.c. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plugin/engine.h"

ust__ctx *ust__ctx_get(void);

/* ---- references ------------------------------------------------------------------ */

static void engine_free(ust__engine *e);

/* The enabled engine with a reference taken, or NULL; no error set (the
 * replay hooks ask at every replay, enabled or not). Takes the lock for
 * changes briefly. */
static ust__engine *engine_peek(ust__ctx *c) {
  pthread_mutex_lock(&c->lock);
  ust__engine *e = c->engine;
  if (e != NULL)
    atomic_fetch_add(&e->refs, 1);
  pthread_mutex_unlock(&c->lock);
  return e;
}

/* engine_peek's, or NULL with the error set, naming what. */
static ust__engine *engine_ref(ust__ctx *c, const char *what) {
  ust__engine *e = engine_peek(c);
  if (e == NULL)
    ust__error(UST_ESTATE, "%s: understudy is not enabled", what);
  return e;
}

static void engine_unref(ust__engine *e) {
  if (e != NULL && atomic_fetch_sub(&e->refs, 1) == 1)
    engine_free(e);
}

/* ---- policies ---------------------------------------------------------------------- */

/* A new immutable policy, kept until the engine is freed (readers may hold
 * any published one); NULL when memory ran out. */
static const ust__policy *policy_new(ust__engine *e, const ust__policy *p, int has_cand) {
  ust__policy_node *n = malloc(sizeof *n);
  if (n == NULL)
    return NULL;
  n->policy = *p;
  /* only an operator that observes without a candidate keys a sample of its
   * calls: any other routes each call by its key */
  n->policy.key_every = p->mode == UST__MODE_OBSERVE && !has_cand ? e->cfg.key_every : 1;
  n->policy.key_after = e->cfg.key_after;
  n->policy.sample_q32 = ust__share_q32(p->sample);
  n->policy.steady_q32 = ust__share_q32(p->sample_steady);
  if (n->policy.steady_q32 >= n->policy.sample_q32) { /* one share throughout */
    n->policy.steady_q32 = n->policy.sample_q32;
    n->policy.steady_after = UINT64_MAX;
  }
  n->policy.canary_q32 = ust__share_q32(p->canary);
  n->next = e->policies;
  e->policies = n;
  return &n->policy;
}

/* Publish an operator's policy, and its bindings' tally words with it. */
static void policy_publish(ust__engine *e, ust__engine_op *eo, const ust__policy *pub) {
  atomic_store(&eo->op.policy, pub);
  const uint64_t word = ust__tally_word(pub, e->gen);
  for (int i = 0; i < e->n_bindings; i++)
    if (e->bindings[i].op == &eo->op) {
      atomic_store(&e->bindings[i].tally, word);
      if (e->bindings[i].hook != NULL)
        ust__hook_republish(e->bindings[i].hook, &e->bindings[i]);
    }
}

static ust__policy policy_of(const ust__op_config *oc) {
  ust__policy p;
  memset(&p, 0, sizeof p);
  p.mode = oc->mode;
  p.sample = oc->sample;
  p.sample_steady = oc->sample_steady;
  p.steady_after = oc->steady_after;
  p.canary = oc->canary;
  p.strict = oc->strict;
  p.promotion = oc->promotion;
  return p;
}

/* ---- the worker ---------------------------------------------------------------------- */

/* The rollout table's unsaved changes into the state file. */
static int persist(ust__engine *e) {
  if (e->cfg.state_path == NULL)
    return 0;
  ust__rollout_row *rows = NULL;
  int n = 0;
  int rc = ust__rollout_take_changes(e->router.rollout, &rows, &n);
  if (rc == 0 && rows != NULL && (rc = ust__state_write(e->cfg.state_path, rows, n)) != 0)
    ust__rollout_unsaved(e->router.rollout); /* the next round tries again */
  free(rows);
  return rc;
}

static void finish_disable(ust__engine *e, int *rc);

/* The calls in flight that may read e's bindings: those counted in each
 * bound hook's epoch of its binding (disable moved the epochs on). */
static long engine_inflight(ust__engine *e) {
  long n = 0;
  for (int i = 0; i < e->n_bindings; i++)
    if (e->bindings[i].hook != NULL)
      n += ust__hook_inflight(e->bindings[i].hook, e->bindings[i].hook_epoch);
  return n;
}
static void watch_exit(void);

/* Candidates that qualified in their own process on a route: loaded here. */
static void load_qualified(ust__engine *e) {
  for (int i = 0; i < e->n_ops; i++) {
    ust__candidate *lc = &e->ops[i].candidate;
    char why[600];
    if (lc->proc != NULL && !lc->refusal_said && ust__procrun_lost(lc->proc, why, sizeof why)) {
      lc->refusal_said = 1;
      ust__log(&e->ctx->log, UST_LOG_WARN, "operator '%s': candidate %s refused in its qualifying process: %s",
               e->ops[i].op.name, lc->cand.name, why);
      continue;
    }
    if (lc->proc == NULL || lc->dl != NULL)
      continue;
    int rc = ust__candidate_load_here(lc);
    ust__procrun_usage u;
    ust__procrun_get_usage(lc->proc, &u);
    if (rc == 1)
      ust__log(&e->ctx->log, UST_LOG_INFO, "operator '%s': candidate %s qualified in its own process on a route "
               "(there: peak RSS %.1f MiB, CPU %.2f s); loaded into this process", e->ops[i].op.name, lc->cand.name,
               (double)u.peak_rss_kb / 1024.0, (double)u.cpu_us / 1e6);
  }
}

static void *worker_main(void *arg) {
  ust__engine *e = arg;
  double interval = e->cfg.report_interval_s;
  uint64_t next_report = ust__now_ns() + (uint64_t)(interval * 1e9);
  const double window = e->cfg.report_window_s;
  uint64_t next_window = ust__now_ns() + (uint64_t)(window * 1e9);
  int state_warned = 0;
  uint64_t state_retry_at = 0, state_backoff_ns = 0;
  pthread_mutex_lock(&e->worker_lock);
  while (!e->worker_stop) {
    if (e->reaping && engine_inflight(e) == 0)
      break;
    pthread_mutex_unlock(&e->worker_lock);
    ust__timers_harvest(e->router.timers);
    /* candidate calls past their deadline, still inside: their routes
     * rolled back now, not when (or if) the calls return */
    uint64_t next_deadline = UINT64_MAX;
    ust__router_sweep(&e->router, ust__now_ns(), &next_deadline);
    int shadow_pending = ust__shadow_harvest(e->router.shadow);
    ust__graphs_tick(e->router.graphs);
    load_qualified(e);
    /* a failing state file is said once, and again after it worked; it is
     * retried after 0.1 s, then twice as long each time, up to a minute */
    uint64_t now = ust__now_ns();
    if (now >= state_retry_at) {
      if (persist(e) != 0) {
        if (!state_warned)
          ust__log(&e->ctx->log, UST_LOG_WARN, "%s (retried while the state is unsaved)", ust_last_error());
        state_warned = 1;
        state_backoff_ns = state_backoff_ns == 0 ? 100000000u : state_backoff_ns * 2;
        if (state_backoff_ns > 60000000000ull)
          state_backoff_ns = 60000000000ull;
        state_retry_at = now + state_backoff_ns;
      } else {
        state_warned = 0;
        state_backoff_ns = 0;
      }
    }
    if (window > 0 && now >= next_window) {
      ust__window_rotate(e);
      next_window = now + (uint64_t)(window * 1e9);
    }
    if (e->cfg.report_path != NULL && interval > 0 && now >= next_report) {
      if (ust__report_write_file(e, e->cfg.report_path) != 0)
        ust__log(&e->ctx->log, UST_LOG_WARN, "periodic report: %s", ust_last_error());
      next_report = now + (uint64_t)(interval * 1e9);
    }
    /* Device timings, and captured shadows' rings while a gate is open, are
     * polled every 2 ms (a gate opens within 0.1 s of its route's change);
     * a host-only build only wakes for reports. */
    const int polling = ust__timers_used(e->router.timers) || shadow_pending > 0 || ust__graphs_open(e->router.graphs) > 0;
    uint64_t wait_ns = polling ? 2000000u : 100000000u;
    const uint64_t after = ust__now_ns();
    if (next_deadline != UINT64_MAX) { /* awake when the next call in flight passes its deadline */
      const uint64_t until = next_deadline > after ? next_deadline - after + 1000000u : 0;
      if (until < wait_ns)
        wait_ns = until;
    }
    static pthread_once_t device_exits = PTHREAD_ONCE_INIT; /* after the CUDA runtime's own (see stop_worker_at_exit) */
    if (polling)
      pthread_once(&device_exits, watch_exit);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + wait_ns;
    ts.tv_sec += (time_t)(t / 1000000000u);
    ts.tv_nsec = (long)(t % 1000000000u);
    pthread_mutex_lock(&e->worker_lock);
    if (!e->worker_stop && !e->reaping)
      pthread_cond_timedwait(&e->worker_cond, &e->worker_lock, &ts);
    else if (e->reaping)
      usleep(1000); /* waiting for the calls disable could not wait for */
  }
  const int reaping = e->reaping;
  e->worker_done = 1;
  pthread_cond_broadcast(&e->worker_cond);
  pthread_mutex_unlock(&e->worker_lock);
  if (reaping) {
    /* the last calls left: what disable left to do (this thread is detached) */
    int rc = 0;
    finish_disable(e, &rc);
    ust__log(&e->ctx->log, UST_LOG_INFO, "disabled, after the last intercepted call returned");
    engine_unref(e);
  }
  return NULL;
}

/* ---- building and freeing ---------------------------------------------------------------- */

static void engine_free(ust__engine *e) {
  if (e == NULL)
    return;
  ust__timers_destroy(e->router.timers);
  e->router.timers = NULL; /* the shadows concluded below read no staged lengths (ust__timers_stage_floor) */
  ust__graphs_destroy(e->router.graphs);
  ust__shadow_pool_destroy(e->router.shadow);
  HASH_CLEAR(hh, e->ops_by_name);
  HASH_CLEAR(hh, e->bindings_by_name);
  ust__router_free(&e->router);
  ust__rollout_destroy(e->router.rollout);
  free(e->config_json);
  for (int i = 0; e->bindings != NULL && i < e->n_bindings; i++)
    ust__roofline_free(&e->bindings[i].roofline);
  free(e->bindings);
  for (int i = 0; e->ops != NULL && i < e->n_ops; i++)
    ust__candidate_unload(&e->ops[i].candidate);
  free(e->ops);
  for (ust__policy_node *n = e->policies, *next; n != NULL; n = next) {
    next = n->next;
    free(n);
  }
  ust__problems_free(&e->problems);
  ust__hw_free(&e->hw.set);
  ust__config_free(&e->cfg);
  pthread_mutex_destroy(&e->worker_lock);
  pthread_mutex_destroy(&e->window_lock);
  ust__window_base_free(e->window_base[0]);
  ust__window_base_free(e->window_base[1]);
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
  if ((e->ops = calloc(n > 0 ? (size_t)n : 1, sizeof *e->ops)) == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  int nb = 0;
  for (int i = 0; i < n; i++) {
    ust__engine_op *eo = &e->ops[i];
    const ust__problem *p = c->all_operators ? &e->problems.items[i] : ust__problems_find(&e->problems, c->ops[i].name);
    memcpy(eo->op.name, p->name, sizeof eo->op.name);
    eo->op.def_path = p->path;
    eo->problem = p;
    ust__policy pol;
    if (c->all_operators) {
      memset(&pol, 0, sizeof pol);
      pol.mode = c->default_mode;
      pol.sample = c->default_sample;
      pol.sample_steady = c->default_sample_steady;
      pol.steady_after = c->steady_after;
    } else {
      pol = policy_of(&c->ops[i]);
    }
    const ust__policy *pub = policy_new(e, &pol, !c->all_operators && c->ops[i].cand.kind != 0);
    if (pub == NULL)
      return ust__error(UST_ENOMEM, "out of memory");
    atomic_init(&eo->op.policy, pub);
    HASH_ADD_STR(e->ops_by_name, op.name, eo);
    if (ust__hash_oom)
      return ust__error(UST_ENOMEM, "out of memory");
    e->n_ops = i + 1; /* from here on engine_free releases this operator's candidate */
    if (!c->all_operators && c->ops[i].cand.kind != 0) {
      int rc = ust__candidate_load(&c->ops[i], p, &eo->candidate);
      if (rc != 0)
        return rc;
      eo->op.cand = &eo->candidate.cand;
    }
    for (int b = 0; b < p->n_bindings; b++)
      nb += p->bindings[b].n_overloads;
  }
  if (nb > 65535)
    return ust__error(UST_ECONFIG, "config: %d dispatcher bindings; at most 65535 are supported", nb);
  const size_t n_alloc = nb > 0 ? (size_t)nb : 1;
  if ((e->bindings = aligned_alloc(_Alignof(ust__binding), n_alloc * sizeof *e->bindings)) == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  memset(e->bindings, 0, n_alloc * sizeof *e->bindings);
  for (int i = 0; i < n; i++) {
    ust__engine_op *eo = &e->ops[i];
    const ust__problem *p = eo->problem;
    for (int bd = 0; bd < p->n_bindings; bd++) {
      const ust__binding_def *def = &p->bindings[bd];
      for (int o = 0; o < def->n_overloads; o++) {
        ust__binding *b = &e->bindings[e->n_bindings];
        b->index = e->n_bindings;
        b->op = &eo->op;
        b->def = def;
        b->router = &e->router;
        atomic_init(&b->resolved, 0);
        atomic_init(&b->tally, ust__tally_word(atomic_load(&eo->op.policy), e->gen));
        snprintf(b->qualname, sizeof b->qualname, "%s", def->op);
        snprintf(b->overload, sizeof b->overload, "%s", def->overloads[o]);
        snprintf(b->display, sizeof b->display, "%s%s%s", def->op, def->overloads[o][0] ? "." : "",
                 def->overloads[o]);
        ust__binding *dup = NULL;
        HASH_FIND_STR(e->bindings_by_name, b->display, dup);
        if (dup != NULL)
          return ust__error(UST_ECONFIG, "%s: '%s' is already bound by operator '%s' (%s)", p->path, b->display,
                            dup->op->name, dup->op->def_path);
        if (eo->op.cand != NULL && strcmp(eo->op.cand->target, b->display) == 0)
          b->cand = eo->op.cand;
        HASH_ADD_STR(e->bindings_by_name, display, b);
        if (ust__hash_oom)
          return ust__error(UST_ENOMEM, "out of memory");
        b->n_dims = def->n_dims;
        for (int d = 0; d < def->n_dims; d++) {
          if (ust__dim_compile(def->dims[d].expr, &b->dims[d]) != 0)
            return ust__error(UST_EPROBLEM, "%s: %s", p->path, ust_last_error());
          b->dims[d].bucket = def->dims[d].bucket;
        }
        ust__binding_keys_set(b);
        char where[UST__DISPLAY_MAX + 300];
        snprintf(where, sizeof where, "%s (%s)", p->path, b->display);
        e->n_bindings++;
        if (ust__roofline_compile(&def->roofline, where, &b->roofline) != 0)
          return UST_EPROBLEM;
      }
    }
  }
  return 0;
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

static int restore_row(void *ctx, const ust__rollout_row *row) { return ust__rollout_restore(ctx, row); }

/* The router's parts: routes, timers, the shadow pool (its verdicts into the
 * router's sink), the rollout table with the config's per-key modes, then
 * the state file's (which win). */
static int build_router(ust__engine *e) {
  ust__ctx *c = e->ctx;
  ust__router *r = &e->router;
  r->hw = &e->hw;
  r->log = &c->log;
  r->seam = c->seam;
  e->hw.log = &c->log;
  int rc = ust__router_init(r, e->cfg.max_routes);
  r->graph_beside_max = (uint64_t)e->cfg.shadow_graph_beside_mb << 20;
  r->graph_beside_launch = e->cfg.shadow_graph_beside_launch;
  r->graph_start_kernel = e->cfg.shadow_graph_start_kernel;
  if (rc == 0) {
    const ust__timer_opts topts = {
        .kind = e->cfg.timer_kind,
        .window_ns = (uint64_t)(e->cfg.timer_window_ms * 1e6),
        .budget = e->cfg.timer_budget,
        .launch_cost_ns = e->cfg.timer_launch_cost_us * 1e3,
        .cupti_path = e->cfg.cupti_path,
        .callbacks = e->cfg.timer_callbacks,
        .profiler_active = c->seam != NULL ? c->seam->profiler_active : NULL,
        .hold_deadline_ns = e->cfg.timer_hold == 0 ? (uint64_t)(e->cfg.timer_hold_deadline_us * 1e3) : 0,
    };
    rc = ust__timers_create(1024, &topts, &c->log, &r->timers);
    if (rc == 0)
      r->tracer = ust__timers_may_trace(r->timers);
  }
  if (rc == 0)
    rc = ust__shadow_pool_create(e->cfg.shadow_max_inflight, &c->log, &ust__router_sink, r, &r->shadow);
  if (rc == 0)
    rc = ust__graphs_create(r->shadow, &ust__router_sink, r, &r->graphs);
  if (rc == 0)
    rc = ust__rollout_create(&c->lock, &c->log, &r->rollout);
  for (int i = 0; rc == 0 && i < e->cfg.n_ops; i++)
    for (int k = 0; rc == 0 && k < e->cfg.ops[i].n_routes; k++) {
      const ust__route_config *rc_ = &e->cfg.ops[i].routes[k];
      rc = ust__rollout_seed(r->rollout, rc_->key, rc_->mode, rc_->canary >= 0 ? rc_->canary : e->cfg.ops[i].canary);
    }
  if (rc == 0 && e->cfg.state_path != NULL)
    rc = ust__state_read(e->cfg.state_path, restore_row, r->rollout);
  return rc;
}

static int engine_create(ust__ctx *c, const char *config_json, const char *problems_dir, ust__engine **out) {
  ust__engine *e = calloc(1, sizeof *e);
  *out = NULL;
  if (e == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  static atomic_uint_fast64_t gens;
  e->gen = atomic_fetch_add(&gens, 1) + 1;
  e->ctx = c;
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->worker_lock, NULL);
  pthread_mutex_init(&e->window_lock, NULL);
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
    rc = build_router(e);
  if (rc == 0 && (e->config_json = ust__strdup(config_json ? config_json : "")) == NULL)
    rc = ust__error(UST_ENOMEM, "out of memory");
  if (rc != 0) {
    engine_free(e);
    return rc;
  }
  e->started_unix_ms = ust__unix_ms();
  e->started_ns = ust__now_ns();
  *out = e;
  return 0;
}

/* The process's hook of an op, registered with the dispatcher the first
 * time any engine binds it. */
ust__hook *ust__ctx_hook(ust__ctx *c, const ust__binding *b);

/* Torch-op candidates resolved now; ops defined later are resolved at their
 * first call (counted as waiting until then). */
static void resolve_candidates(ust__engine *e) {
  for (int i = 0; i < e->n_ops; i++) {
    ust__cand *cand = e->ops[i].op.cand;
    if (cand == NULL || cand->kind != UST__CAND_TORCH_OP || e->ctx->seam == NULL)
      continue;
    void *h = e->ctx->seam->resolve_op(cand->torch_op, cand->torch_overload);
    atomic_store(&cand->seam_op, h);
    if (h == NULL)
      ust__log(&e->ctx->log, UST_LOG_WARN, "candidate op %s%s%s of operator '%s' is not defined in this process yet: "
               "its calls wait for it", cand->torch_op, cand->torch_overload[0] ? "." : "", cand->torch_overload,
               e->ops[i].op.name);
  }
}

/* Temp files of understudy's own naming left beside path by a process that
 * died mid-write (PATH.tmp.XXXXXX, ust__write_file_atomic): removed. The
 * folder's flock, which a process writing a report there holds from its
 * temp file to the rename (plugin/report.c), keeps another running
 * process's report from being taken for one. */
static void clean_stale_temps(ust__ctx *c, const char *path) {
  if (path == NULL)
    return;
  char dir[4096];
  const char *slash = strrchr(path, '/');
  const char *base = slash != NULL ? slash + 1 : path;
  snprintf(dir, sizeof dir, "%.*s", slash != NULL ? (int)(slash - path) : 1, slash != NULL ? path : ".");
  if (dir[0] == '\0')
    snprintf(dir, sizeof dir, "/");
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  while (flock(dirfd(d), LOCK_EX) != 0 && errno == EINTR) {
  }
  const size_t blen = strlen(base);
  int removed = 0;
  for (struct dirent *ent; (ent = readdir(d)) != NULL;) {
    const char *n = ent->d_name;
    if (strlen(n) != blen + 11 || strncmp(n, base, blen) != 0 || strncmp(n + blen, ".tmp.", 5) != 0)
      continue;
    char full[8192];
    snprintf(full, sizeof full, "%s/%s", dir, n);
    struct stat st;
    if (lstat(full, &st) == 0 && S_ISREG(st.st_mode) && unlink(full) == 0)
      removed++;
  }
  closedir(d);
  if (removed > 0)
    ust__log(&c->log, UST_LOG_INFO, "removed %d temp file%s left beside %s by an earlier process", removed,
             removed == 1 ? "" : "s", path);
}

/* ---- fork ------------------------------------------------------------------------- */

/* A child forked while understudy is enabled has none of the engine's
 * threads (the worker, a metrics server), and any lock another thread held
 * stays held in it. Its calls pass through: the engine is left behind (never
 * freed, never written from: the parent's report and state stay the
 * parent's), the context's locks start afresh, and enable() there starts a
 * new engine of the child's own. Runs in the child, single-threaded. */
static void child_after_fork(void) {
  ust__ctx *c = ust__ctx_get();
  pthread_mutex_init(&c->life, NULL);
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->reload, NULL);
  pthread_mutex_init(&c->log.lock, NULL);
  pthread_mutex_init(&c->compare.lock, NULL);
  ust__engine *e = c->engine;
  c->engine = NULL;
  for (int i = 0; e != NULL && i < e->n_bindings; i++)
    if (e->bindings[i].hook != NULL)
      ust__hook_detach(e->bindings[i].hook);
  for (ust__hook *h = c->hooks; h != NULL; h = (ust__hook *)h->hh.next)
    ust__hook_after_fork(h);
  ust__fork_child();
}

static void watch_forks(void) { pthread_atfork(NULL, NULL, child_after_fork); }

/* ---- process exit ----------------------------------------------------------------- */

/* A process that exits with understudy enabled tears down what the worker
 * uses (the CUDA runtime, the driver's state, torch's statics) while the
 * worker may still be polling events or reading rings in it. At exit the
 * worker is stopped first: exit runs atexit handlers in reverse order of
 * registration, before the libraries' destructors, and this one is
 * registered at the first enable and again when the worker first finds the
 * device used (within 0.1 s of it; after the CUDA runtime's own handlers,
 * which it registers when first used). Nothing is freed and no report is
 * written (the Python side's exit handler writes the final one where one
 * was asked for); calls still made pass through as before, their figures
 * left unharvested. A worker that does not stop within a second is left
 * running; exit called on the worker itself waits for nothing. What it says
 * goes straight to stderr: the host's log callback may be gone by now (a
 * Python one is), or be the very frame that called exit. */
static void stop_worker_at_exit(void) {
  ust__ctx *c = ust__ctx_get();
  if (pthread_mutex_trylock(&c->life) != 0)
    return; /* an enable or a disable is under way on another thread */
  pthread_mutex_lock(&c->lock);
  ust__engine *e = c->engine;
  pthread_mutex_unlock(&c->lock);
  int joined = 0;
  if (e != NULL) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_mutex_lock(&e->worker_lock);
    if (e->worker_started && !pthread_equal(pthread_self(), e->worker)) {
      e->worker_stop = 1;
      pthread_cond_broadcast(&e->worker_cond);
      while (!e->worker_done && pthread_cond_timedwait(&e->worker_cond, &e->worker_lock, &ts) == 0) {
      }
      joined = e->worker_done;
      if (joined)
        e->worker_started = 0; /* a disable after this joins nothing */
    }
    pthread_mutex_unlock(&e->worker_lock);
    if (joined) {
      pthread_join(e->worker, NULL);
      static const char said[] = "understudy: process exit: the worker stopped (understudy was still enabled)\n";
      if (atomic_load(&c->log.max_level) >= UST_LOG_INFO)
        (void)!write(STDERR_FILENO, said, sizeof said - 1);
    }
  }
  pthread_mutex_unlock(&c->life);
}

static void watch_exit(void) { atexit(stop_worker_at_exit); }

/* ---- the API ---------------------------------------------------------------------- */

int ust_enable(const char *config_json, const char *problems_dir) {
  ust__clear_error();
  if (ust__in_intercepted_call())
    return ust__error(UST_ESTATE, "enable: called from inside an intercepted call");
  ust__ctx *c = ust__ctx_get();
  static pthread_once_t forks = PTHREAD_ONCE_INIT, exits = PTHREAD_ONCE_INIT;
  pthread_once(&forks, watch_forks);
  pthread_once(&exits, watch_exit);
  pthread_mutex_lock(&c->life);
  if (c->seam == NULL)
    c->seam = ust__seam();
  int rc = 0;
  ust__engine *e = NULL;
  pthread_mutex_lock(&c->lock);
  const int on = c->engine != NULL;
  pthread_mutex_unlock(&c->lock);
  if (on) {
    rc = ust__error(UST_ESTATE, "understudy is already enabled; call disable first");
    goto out;
  }
  if ((rc = engine_create(c, config_json, problems_dir, &e)) != 0)
    goto out;
  ust__log_set_level(&c->log, e->cfg.log_level);
  clean_stale_temps(c, e->cfg.report_path);
  clean_stale_temps(c, e->cfg.state_path);
  resolve_candidates(e);
  for (int i = 0; c->seam != NULL && i < e->n_bindings; i++) {
    ust__binding *b = &e->bindings[i];
    if ((b->hook = ust__ctx_hook(c, b)) == NULL) {
      rc = UST_ETORCH;
      goto fail;
    }
    /* a defined op's schema is read now: what its roofline cannot score is known at enable */
    if (!c->seam->resolve_binding(b))
      ust__log(&c->log, UST_LOG_INFO, "%s is not defined in this process yet; it is intercepted once it is",
               b->display);
  }
  if (pthread_create(&e->worker, NULL, worker_main, e) != 0) {
    rc = ust__error(UST_EINTERNAL, "cannot start the worker thread");
    goto fail;
  }
  e->worker_started = 1;
  pthread_mutex_lock(&c->lock);
  c->engine = e;
  pthread_mutex_unlock(&c->lock);
  /* published: calls through the hooks reach the engine from now on */
  for (int i = 0; i < e->n_bindings; i++)
    if (e->bindings[i].hook != NULL)
      ust__hook_attach(e->bindings[i].hook, &e->bindings[i]);
  ust__log(&c->log, UST_LOG_INFO, "enabled: %d operators, %d dispatcher bindings", e->n_ops, e->n_bindings);
  goto out;
fail:
  engine_free(e); /* no hook points at it: nothing else can see it */
out:
  pthread_mutex_unlock(&c->life);
  return rc;
}

int ust_disable(void) {
  ust__clear_error();
  if (ust__in_intercepted_call())
    return ust__error(UST_ESTATE, "disable: called from inside an intercepted call, which disable would wait for");
  ust__ctx *c = ust__ctx_get();
  pthread_mutex_lock(&c->life);
  pthread_mutex_lock(&c->lock);
  ust__engine *e = c->engine;
  c->engine = NULL;
  pthread_mutex_unlock(&c->lock);
  if (e == NULL) {
    pthread_mutex_unlock(&c->life);
    return 0;
  }
  /* Detach, then wait for every call that may have read a binding: the
   * hooks stay registered (torch's registration is not atomic against
   * dispatching threads) and pass calls through from now on. */
  for (int i = 0; i < e->n_bindings; i++)
    if (e->bindings[i].hook != NULL) {
      ust__hook_detach(e->bindings[i].hook);
      ust__binding_fold_tallies(&e->bindings[i]); /* tallied calls are not waited for */
    }
  const uint64_t deadline = ust__now_ns() + (uint64_t)(e->cfg.disable_timeout_s * 1e9);
  while (engine_inflight(e) != 0 && ust__now_ns() < deadline)
    usleep(50);
  int rc = 0;
  if (engine_inflight(e) != 0 && e->worker_started) {
    /* Calls are still inside (a candidate that does not return, say): the
     * worker finishes the disable when they leave; nothing waits here. */
    const long left = engine_inflight(e);
    pthread_mutex_lock(&e->worker_lock);
    e->reaping = 1;
    pthread_cond_signal(&e->worker_cond);
    pthread_mutex_unlock(&e->worker_lock);
    pthread_detach(e->worker);
    rc = ust__error(UST_ETIMEDOUT,
                    "disable: %ld intercepted call%s had not returned after %g s (a candidate that does not return?); "
                    "interception is off, and the final report is written when %s",
                    left, left == 1 ? "" : "s", e->cfg.disable_timeout_s, left == 1 ? "it returns" : "they return");
    ust__log(&c->log, UST_LOG_WARN, "%s", ust_last_error());
    pthread_mutex_unlock(&c->life);
    return rc;
  }
  if (engine_inflight(e) != 0) {
    /* no worker to hand the rest to: it was stopped at process exit */
    rc = ust__error(UST_ETIMEDOUT, "disable: intercepted calls had not returned after %g s, and the process is "
                    "exiting: understudy is left as it is", e->cfg.disable_timeout_s);
    pthread_mutex_unlock(&c->life);
    return rc;
  }
  pthread_mutex_lock(&e->worker_lock);
  e->worker_stop = 1;
  pthread_cond_signal(&e->worker_cond);
  pthread_mutex_unlock(&e->worker_lock);
  if (e->worker_started)
    pthread_join(e->worker, NULL);
  finish_disable(e, &rc);
  ust__log(&c->log, UST_LOG_INFO, "disabled");
  engine_unref(e);
  pthread_mutex_unlock(&c->life);
  return rc;
}

/* Once no call can reach e: pending figures in, the final report, the state. */
static void finish_disable(ust__engine *e, int *rc) {
  ust__timers_harvest_all_sync(e->router.timers);
  ust__shadow_harvest_all_sync(e->router.shadow);
  ust__graphs_tick(e->router.graphs);
  ust__graphs_close(e->router.graphs);
  if (e->cfg.report_path != NULL)
    *rc = ust__report_write_file(e, e->cfg.report_path);
  int rs = persist(e);
  if (*rc == 0)
    *rc = rs;
}

int ust_is_enabled(void) {
  ust__ctx *c = ust__ctx_get();
  pthread_mutex_lock(&c->lock);
  int on = c->engine != NULL;
  pthread_mutex_unlock(&c->lock);
  return on;
}

/* The control plane takes no call from inside an intercepted call (a
 * candidate, or a production kernel, calling back on its thread): a
 * candidate must neither change how it is served (promote itself) nor read
 * or flush what is known of it. Returns the error, or 0. */
static int refused_inside(const char *what) {
  if (!ust__in_intercepted_call())
    return 0;
  return ust__error(UST_ESTATE, "%s: called from inside an intercepted call (a candidate or a kernel serving one): "
                    "refused, nothing changed", what);
}

int ust_set_mode(const char *operator_name, const char *mode) {
  ust__clear_error();
  if (refused_inside("set_mode") != 0)
    return UST_ESTATE;
  if (operator_name == NULL || mode == NULL)
    return ust__error(UST_EINVAL, "set_mode: operator and mode are required");
  int m;
  if (ust__mode_parse(mode, &m) != 0)
    return ust__error(UST_EINVAL, "set_mode: mode '%s' is not one of off, observe, shadow, canary, live", mode);
  ust__ctx *c = ust__ctx_get();
  pthread_mutex_lock(&c->lock);
  ust__engine *e = c->engine;
  int rc = 0;
  ust__engine_op *eo = NULL;
  if (e != NULL)
    HASH_FIND_STR(e->ops_by_name, operator_name, eo);
  if (e == NULL) {
    rc = ust__error(UST_ESTATE, "set_mode: understudy is not enabled");
  } else if (eo == NULL) {
    rc = ust__error(UST_ENOTFOUND, "set_mode: no enabled operator is named '%s'", operator_name);
  } else if (m >= UST__MODE_SHADOW && eo->op.cand == NULL) {
    rc = ust__error(UST_ESTATE, "set_mode: operator '%s' has no candidate; %s needs one in the config",
                    operator_name, mode);
  } else {
    ust__policy p = *atomic_load(&eo->op.policy);
    p.mode = m;
    const ust__policy *pub = policy_new(e, &p, eo->op.cand != NULL);
    if (pub == NULL)
      rc = ust__error(UST_ENOMEM, "set_mode: out of memory");
    else
      policy_publish(e, eo, pub);
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int ust_set_route_mode(const char *route_key, const char *mode, double canary) {
  ust__clear_error();
  if (refused_inside("set_route_mode") != 0)
    return UST_ESTATE;
  if (route_key == NULL || mode == NULL || strchr(route_key, '|') == NULL)
    return ust__error(UST_EINVAL, "set_route_mode: a shape key (as the report spells it) and a mode are required");
  int m;
  if (ust__mode_parse(mode, &m) != 0)
    return ust__error(UST_EINVAL, "set_route_mode: mode '%s' is not one of off, observe, shadow, canary, live", mode);
  if (m == UST__MODE_CANARY && !(canary > 0 && canary < 1))
    return ust__error(UST_EINVAL, "set_route_mode: canary share %g is not in (0, 1)", canary);
  if (strlen(route_key) >= UST__KEY_MAX)
    return ust__error(UST_EINVAL, "set_route_mode: the shape key is too long");
  ust__engine *e = engine_ref(ust__ctx_get(), "set_route_mode");
  if (e == NULL)
    return UST_ESTATE;
  /* the key names its binding first: "ns::op[.overload]|..." */
  char display[UST__DISPLAY_MAX];
  size_t n = (size_t)(strchr(route_key, '|') - route_key);
  snprintf(display, sizeof display, "%.*s", (int)(n < sizeof display ? n : sizeof display - 1), route_key);
  ust__binding *b = NULL;
  HASH_FIND_STR(e->bindings_by_name, display, b);
  int rc;
  if (b == NULL)
    rc = ust__error(UST_ENOTFOUND, "set_route_mode: '%s' is not a bound dispatcher op", display);
  else if (m >= UST__MODE_SHADOW && b->cand == NULL)
    rc = ust__error(UST_ESTATE, "set_route_mode: %s has no candidate targeting it; %s needs one", display, mode);
  else if ((rc = ust__rollout_set_key(e->router.rollout, route_key, b->cand != NULL ? b->cand->id : "", m, canary,
                                      "manual", "set by ust_set_route_mode", e->cfg.max_routes * 2)) == 0)
    ust__clear_error();
  engine_unref(e);
  return rc;
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
  if (refused_inside("reload") != 0)
    return UST_ESTATE;
  ust__ctx *c = ust__ctx_get();
  ust__config next, prev;
  int rc = ust__config_parse(config_json, &next);
  if (rc != 0)
    return rc;
  ust__engine *e = engine_ref(c, "reload");
  if (e == NULL) {
    ust__config_free(&next);
    return UST_ESTATE;
  }
  /* reloads take turns; the running text is read under the lock */
  pthread_mutex_lock(&c->reload);
  pthread_mutex_lock(&c->lock);
  char *running = ust__strdup(e->config_json);
  pthread_mutex_unlock(&c->lock);
  if (running == NULL)
    rc = ust__error(UST_ENOMEM, "reload: out of memory");
  else
    rc = ust__config_reload_check(running, config_json);
  /* the running config's routes, against which a reload's are changes (a
   * route rolled back or promoted since keeps its mode unless the reload
   * asks for another): without them the reload is refused, not applied as
   * if every route had changed */
  memset(&prev, 0, sizeof prev);
  if (rc == 0 && ust__config_parse(running, &prev) != 0)
    rc = ust__error(UST_ENOMEM, "reload: out of memory reading the running config");
  free(running);
  /* everything it needs allocated before anything changes: the config's
   * text and the operators' policies; then policies published under the
   * lock, then per-key modes where they changed */
  char *copy = NULL;
  const ust__policy **pubs = NULL; /* per operator of next; NULL: not the engine's */
  if (rc == 0 && ((copy = ust__strdup(config_json != NULL ? config_json : "")) == NULL ||
                  (pubs = calloc((size_t)next.n_ops + 1, sizeof *pubs)) == NULL))
    rc = ust__error(UST_ENOMEM, "reload: out of memory");
  pthread_mutex_lock(&c->lock);
  for (int i = 0; rc == 0 && i < next.n_ops; i++) {
    ust__engine_op *eo = NULL;
    HASH_FIND_STR(e->ops_by_name, next.ops[i].name, eo);
    ust__policy p = policy_of(&next.ops[i]);
    if (eo != NULL && (pubs[i] = policy_new(e, &p, eo->op.cand != NULL)) == NULL) /* kept with the engine's until it ends */
      rc = ust__error(UST_ENOMEM, "reload: out of memory");
  }
  for (int i = 0; rc == 0 && i < next.n_ops; i++) {
    ust__engine_op *eo = NULL;
    HASH_FIND_STR(e->ops_by_name, next.ops[i].name, eo);
    if (pubs[i] != NULL)
      policy_publish(e, eo, pubs[i]);
  }
  if (rc == 0) {
    free(e->config_json);
    e->config_json = copy;
    copy = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  free(copy);
  free(pubs);
  for (int i = 0; rc == 0 && i < next.n_ops; i++) {
    ust__engine_op *eo = NULL;
    HASH_FIND_STR(e->ops_by_name, next.ops[i].name, eo);
    for (int k = 0; eo != NULL && k < next.ops[i].n_routes; k++) {
      const ust__route_config *rcfg = &next.ops[i].routes[k];
      const double canary = rcfg->canary >= 0 ? rcfg->canary : next.ops[i].canary;
      if (route_config_unchanged(&prev, next.ops[i].name, rcfg->key, rcfg->mode, canary))
        continue;
      if (ust__rollout_set_key(e->router.rollout, rcfg->key, eo->op.cand != NULL ? eo->op.cand->id : "", rcfg->mode,
                               canary, "config", "set by a config reload", e->cfg.max_routes * 2) != 0)
        ust__log(&c->log, UST_LOG_WARN, "reload: %s", ust_last_error());
    }
  }
  ust__config_free(&prev);
  if (rc == 0)
    ust__clear_error();
  pthread_mutex_unlock(&c->reload);
  engine_unref(e);
  ust__config_free(&next);
  return rc;
}

int ust_report_write(const char *path) {
  ust__clear_error();
  if (refused_inside("report") != 0)
    return UST_ESTATE;
  ust__engine *e = engine_ref(ust__ctx_get(), "report");
  if (e == NULL)
    return UST_ESTATE;
  int rc;
  if (path == NULL && e->cfg.report_path == NULL)
    rc = ust__error(UST_EINVAL, "report: no path given and no 'report.path' configured");
  else
    rc = ust__report_write_file(e, path != NULL ? path : e->cfg.report_path);
  engine_unref(e);
  return rc;
}

int ust_report_json(char **out) {
  ust__clear_error();
  if (out == NULL)
    return ust__error(UST_EINVAL, "report: out is NULL");
  *out = NULL;
  if (refused_inside("report") != 0)
    return UST_ESTATE;
  ust__engine *e = engine_ref(ust__ctx_get(), "report");
  if (e == NULL)
    return UST_ESTATE;
  cJSON *j = ust__report_build(e);
  *out = j != NULL ? cJSON_PrintUnformatted(j) : NULL;
  cJSON_Delete(j);
  engine_unref(e);
  return *out == NULL ? ust__error(UST_ENOMEM, "report: out of memory") : 0;
}

int ust_metrics_read(ust_metrics *m, const char *report_json, char **out) {
  ust__clear_error();
  if (m == NULL || out == NULL)
    return ust__error(UST_EINVAL, "metrics: a reader and out are required");
  *out = NULL;
  if (refused_inside("metrics") != 0)
    return UST_ESTATE;
  if (report_json != NULL)
    return ust__metrics_read_report(m, report_json, out);
  ust__engine *e = engine_ref(ust__ctx_get(), "metrics");
  if (e == NULL)
    return UST_ESTATE;
  const int rc = ust__metrics_read_engine(m, e, out);
  engine_unref(e);
  return rc;
}

unsigned long long ust_graph_capture_id(void *stream) { return ust__graph_capture_id(stream); }

unsigned long long ust_graph_capture_hosted(void *stream) {
  ust__engine *e = engine_peek(ust__ctx_get());
  const unsigned long long id = e != NULL && e->cfg.shadow_graph_gate_replay
                                    ? ust__graphs_capture_hosted(e->router.graphs, stream)
                                    : ust__graph_capture_id(stream);
  engine_unref(e);
  return id;
}

int ust_graph_bind(void *graph, unsigned long long capture, void *exec) {
  ust__clear_error();
  ust__engine *e = engine_peek(ust__ctx_get());
  const int n = e != NULL && e->cfg.shadow_graph_gate_replay
                    ? ust__graphs_bind(e->router.graphs, graph, capture, exec)
                    : 0;
  if (n < 0) /* its shadows started by the host stay closed there: said here, counted on their routes */
    ust__log(&e->ctx->log, UST_LOG_WARN, "graph: replays of an executable graph not gated: %s", ust_last_error());
  engine_unref(e);
  return n;
}

int ust_graph_replay(void *exec, void *stream) {
  ust__engine *e = engine_peek(ust__ctx_get());
  const int n = e != NULL ? ust__graphs_replay(e->router.graphs, exec, stream) : 0;
  engine_unref(e);
  return n > 0;
}

void ust_graph_replayed(void *exec, void *stream) {
  ust__engine *e = engine_peek(ust__ctx_get());
  if (e != NULL)
    ust__graphs_replayed(e->router.graphs, exec, stream);
  engine_unref(e);
}

int ust_graph_unseen(void) {
  ust__engine *e = engine_peek(ust__ctx_get());
  const int counted = e != NULL && e->router.graphs != NULL;
  if (counted)
    ust__graphs_unseen(e->router.graphs);
  engine_unref(e);
  return counted;
}

int ust_graph_exposed(unsigned long long capture) {
  ust__engine *e = engine_peek(ust__ctx_get());
  const int n = e != NULL ? ust__graphs_exposed(e->router.graphs, capture) : 0;
  if (n > 0)
    ust__log(&e->ctx->log, UST_LOG_WARN,
             "graph: the graph of capture %llu was handed out (its raw handle), so its kernels may be changed in place "
             "unseen: its %d captured calls with a candidate run production alone in its replays",
             capture, n);
  engine_unref(e);
  return n;
}

void ust_graph_unbind(void *exec) {
  ust__engine *e = engine_peek(ust__ctx_get());
  if (e != NULL)
    ust__graphs_unbind(e->router.graphs, exec);
  engine_unref(e);
}

int ust_flush_sync(void) {
  ust__clear_error();
  if (refused_inside("flush") != 0)
    return UST_ESTATE;
  ust__engine *e = engine_ref(ust__ctx_get(), "flush");
  if (e == NULL)
    return 0;
  ust__timers_harvest_all_sync(e->router.timers);
  ust__shadow_harvest_all_sync(e->router.shadow);
  ust__graphs_tick(e->router.graphs);
  engine_unref(e);
  return 0;
}
