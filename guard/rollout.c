/*
 * The rollout state machine: each route's mode (off, observe, shadow,
 * canary(p), live, rolled_back), how it changes (by hand, by the promotion
 * policy, by a verdict), and the state file that keeps it across restarts.
 *
 * A route follows its operator's mode until something gives it its own: a
 * per-key entry of the config, the state file, ust_set_route_mode, or a
 * transition of the policy. The table below holds those own modes by shape
 * key, for routes that exist and for keys not seen yet in this process (a
 * route takes its entry when it is created). It is what the state file
 * holds, written whole (temp file, fsync, rename) by the worker after a
 * transition, and at disable.
 *
 * Threading: the table, the last transitions and every operator's promotion
 * policy are guarded by one lock, a leaf (nothing else is taken under it;
 * messages are logged after it is released). The per-call path reads only
 * the routes' atomic words; a route's creation takes the lock once. The file
 * itself is read and written by plugin/state.c, outside the lock.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "dispatch/dispatch.h"
#include "guard/guard.h"
#include "plugin/engine.h"

typedef struct entry {
  char key[UST__ROUTE_KEY_MAX];
  int mode;           /* ust__mode */
  double canary;      /* canary share; 0 outside canary */
  char from[16];      /* the last transition: mode before, why, by whom, when */
  char reason[160];
  char by[16];        /* "config", "state", "manual", "policy", "verdict" */
  uint64_t unix_ms;
  uint64_t transitions;
  uint64_t seen_at_creation; /* transitions the entry had when its route took it */
  char cand[UST__QUALNAME_MAX + 16]; /* the candidate the mode was given for ("sha256:…", "torch_op:…"); "" any */
  char policy[16];    /* the policy's last look short of a transition: "held" or "dry_run" */
  char policy_note[160];
  UT_hash_handle hh;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *table;
static char *state_path;
static int dirty;
static ust__engine *eng;

/* Messages are logged after the lock is released: a log callback may call
 * back into understudy (a report takes the lock). One pending message per
 * thread, said by unlock(). */
static _Thread_local char pending[640];

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pending, sizeof pending, fmt, ap);
  va_end(ap);
}

static void unlock(void) {
  char msg[sizeof pending];
  memcpy(msg, pending, sizeof msg);
  pending[0] = '\0';
  pthread_mutex_unlock(&lock);
  if (msg[0] != '\0')
    ust__log(UST_LOG_INFO, "%s", msg);
}

static uint64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}


static double share_of(uint32_t q) { return q == UINT32_MAX ? 1.0 : (double)q / 4294967296.0; }

static uint64_t pack(int mode, double canary) { return (uint64_t)(mode + 1) | (uint64_t)ust__share_q32(canary) << 32; }

int ust__route_mode(const ust__route *r, uint32_t *canary_q32) {
  const ust__binding *b = r->binding;
  uint64_t v = atomic_load_explicit(&((ust__route *)r)->rollout, memory_order_acquire);
  int mode;
  uint32_t q;
  if (v & 0xff) {
    mode = (int)(v & 0xff) - 1;
    q = (uint32_t)(v >> 32);
  } else {
    mode = atomic_load_explicit(&b->op->mode, memory_order_relaxed);
    q = atomic_load_explicit(&((ust__operator *)b->op)->canary_q32, memory_order_relaxed);
  }
  if (mode >= UST__MODE_SHADOW && b->cand == NULL)
    mode = UST__MODE_OBSERVE; /* only the candidate's target binding runs it */
  else if (b->cand != NULL && atomic_load_explicit(&((ust__route *)r)->rolled_back, memory_order_relaxed))
    mode = UST__MODE_ROLLED_BACK;
  if (canary_q32 != NULL)
    *canary_q32 = q;
  return mode;
}

static entry *entry_get(const char *key) {
  entry *e = NULL;
  HASH_FIND_STR(table, key, e);
  if (e != NULL)
    return e;
  e = calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  snprintf(e->key, sizeof e->key, "%s", key);
  ust__hash_oom = 0;
  HASH_ADD_STR(table, key, e);
  if (ust__hash_oom) {
    free(e);
    return NULL;
  }
  return e;
}

/* The identity of r's candidate, as the state file keeps it. */
static void cand_id(const ust__route *r, char *buf, size_t cap) {
  const ust__candidate *c = r->binding->cand;
  if (c == NULL)
    snprintf(buf, cap, "%s", "");
  else if (c->kind == UST__CAND_NATIVE)
    snprintf(buf, cap, "sha256:%s", c->sha256);
  else
    snprintf(buf, cap, "torch_op:%s", c->torch_op);
}

/* Record a transition in the table (lock held). */
static void note(entry *e, int from, int to, double canary, const char *by, const char *reason) {
  snprintf(e->from, sizeof e->from, "%s", ust__mode_name(from));
  e->mode = to;
  e->canary = to == UST__MODE_CANARY ? canary : 0;
  snprintf(e->by, sizeof e->by, "%s", by);
  snprintf(e->reason, sizeof e->reason, "%s", reason != NULL ? reason : "");
  e->unix_ms = unix_ms();
  e->transitions++;
  e->policy[0] = e->policy_note[0] = '\0';
  dirty = 1;
}

/* Give r its own mode (lock held). Leaving rolled_back clears the flag; the
 * evidence stays for the report. */
static void apply(ust__route *r, int mode, double canary) {
  atomic_store_explicit(&r->stage_passes, 0, memory_order_relaxed);
  atomic_store_explicit(&r->rollout, pack(mode == UST__MODE_ROLLED_BACK ? UST__MODE_SHADOW : mode, canary),
                        memory_order_release);
  atomic_store(&r->rolled_back, mode == UST__MODE_ROLLED_BACK);
  atomic_fetch_add_explicit(&r->transitions, 1, memory_order_relaxed);
}

static int transition_locked(ust__route *r, int to, double canary, const char *by, const char *reason) {
  char key[512];
  ust__route_key_str(r, key, sizeof key);
  entry *e = entry_get(key);
  if (e == NULL)
    return ust__error(UST_ENOMEM, "rollout: out of memory");
  const int from = ust__route_mode(r, NULL);
  apply(r, to, canary);
  note(e, from, to, canary, by, reason);
  cand_id(r, e->cand, sizeof e->cand);
  say("%s: %s -> %s%s%s (%s)", key, ust__mode_name(from), ust__mode_name(to),
           reason != NULL && reason[0] ? ": " : "", reason != NULL ? reason : "", by);
  return 0;
}

/* r's entry, if the table has one (lock held). */
static entry *entry_of(const ust__route *r) {
  char key[512];
  ust__route_key_str(r, key, sizeof key);
  entry *e = NULL;
  HASH_FIND_STR(table, key, e);
  return e;
}

void ust__rollout_route_published(ust__route *r) {
  pthread_mutex_lock(&lock);
  entry *e = entry_of(r);
  /* ust__rollout_set_key ran between the route's creation and its
   * publication, found no route and changed only the entry */
  if (e != NULL && e->transitions > e->seen_at_creation)
    apply(r, e->mode, e->canary);
  unlock();
}

void ust__rollout_route_created(ust__route *r) {
  pthread_mutex_lock(&lock);
  entry *e = entry_of(r);
  if (e != NULL)
    e->seen_at_creation = e->transitions;
  char now[sizeof e->cand];
  cand_id(r, now, sizeof now);
  if (e != NULL && e->transitions > 0 && e->cand[0] != '\0' && strcmp(e->cand, now) != 0) {
    /* a promotion or rollback of another candidate: this one starts anew */
    char key[UST__ROUTE_KEY_MAX];
    ust__route_key_str(r, key, sizeof key);
    say("%s: its saved mode %s was for candidate %s, this process runs %s: not restored", key,
             ust__mode_name(e->mode), e->cand, now[0] ? now : "none");
    e = NULL;
  }
  if (e != NULL && e->transitions > 0) {
    apply(r, e->mode, e->canary);
    if (e->mode == UST__MODE_ROLLED_BACK && atomic_load(&r->evidence) == NULL) {
      ust__evidence *ev = calloc(1, sizeof *ev);
      if (ev != NULL) {
        snprintf(ev->reason, sizeof ev->reason, "restored");
        snprintf(ev->message, sizeof ev->message, "rolled back before this process started: %s", e->reason);
        ev->unix_ms = e->unix_ms;
        atomic_store(&r->evidence, ev);
      }
    }
  }
  unlock();
}

int ust__route_set_mode(ust__route *r, int mode, double canary, const char *by, const char *reason) {
  pthread_mutex_lock(&lock);
  int rc = transition_locked(r, mode, canary, by, reason);
  unlock();
  return rc;
}

/* The routes whose key string is key (one per key). */
static ust__route *route_by_key(const char *key) {
  ust__route_table *t = &eng->routes;
  char k[512];
  for (uint32_t i = 0; i < t->cap; i++) {
    ust__route *r = atomic_load_explicit(&t->slots[i], memory_order_acquire);
    if (r == NULL)
      continue;
    ust__route_key_str(r, k, sizeof k);
    if (strcmp(k, key) == 0)
      return r;
  }
  return NULL;
}

int ust__rollout_set_key(const char *key, int mode, double canary, const char *by, const char *reason) {
  pthread_mutex_lock(&lock);
  int rc = 0;
  ust__route *r = eng != NULL ? route_by_key(key) : NULL;
  if (r != NULL) {
    rc = transition_locked(r, mode, canary, by, reason);
  } else {
    entry *e = entry_get(key);
    if (e == NULL)
      rc = ust__error(UST_ENOMEM, "rollout: out of memory");
    else
      note(e, e->transitions ? e->mode : UST__MODE_OBSERVE, mode, canary, by, reason);
  }
  unlock();
  return rc;
}

void ust__rollout_rolled_back(ust__route *r, const char *reason) {
  char key[512];
  ust__route_key_str(r, key, sizeof key);
  pthread_mutex_lock(&lock);
  entry *e = entry_get(key);
  if (e != NULL) {
    /* the route's flag is already set; the mode it left is its own or its operator's */
    uint64_t v = atomic_load(&r->rollout);
    int from = v & 0xff ? (int)(v & 0xff) - 1 : atomic_load(&r->binding->op->mode);
    note(e, from, UST__MODE_ROLLED_BACK, 0, "verdict", reason);
    cand_id(r, e->cand, sizeof e->cand);
  }
  atomic_fetch_add_explicit(&r->transitions, 1, memory_order_relaxed);
  unlock();
}

/* p50 production over p50 candidate, from the route's histograms; 0 when
 * either is empty. */
double ust__route_speedup(ust__route *r) {
  ust__hist_snap *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  double s = 0;
  if (a != NULL && b != NULL) {
    ust__hist_snapshot(&r->hist, a);
    ust__hist_snapshot(&r->cand_hist, b);
    double tp = ust__hist_quantile(a, 0.5), tc = ust__hist_quantile(b, 0.5);
    s = tp > 0 && tc > 0 ? tp / tc : 0;
  }
  free(a);
  free(b);
  return s;
}

/* The promotion policy, after a passing verification of r's candidate. */
void ust__rollout_passed(ust__route *r, uint64_t stage) {
  ust__operator *op = r->binding->op;
  pthread_mutex_lock(&lock);
  if (atomic_load(&r->transitions) != stage) {
    unlock(); /* verified in an earlier stage */
    return;
  }
  const uint64_t passes = atomic_fetch_add_explicit(&r->stage_passes, 1, memory_order_relaxed) + 1;
  const ust__promotion p = op->promotion;
  int mode = ust__route_mode(r, NULL);
  if (!p.enabled || passes < (uint64_t)p.min_verified || (mode != UST__MODE_SHADOW && mode != UST__MODE_CANARY)) {
    unlock();
    return;
  }
  const double speedup = ust__route_speedup(r);
  const int to = mode == UST__MODE_SHADOW ? UST__MODE_CANARY : UST__MODE_LIVE;
  char key[512], why[160];
  ust__route_key_str(r, key, sizeof key);
  entry *e = entry_get(key);
  if (!(speedup >= p.min_speedup)) {
    if (e != NULL) {
      snprintf(e->policy, sizeof e->policy, "held");
      snprintf(e->policy_note, sizeof e->policy_note, "%llu passes in %s, speedup %.3g below %.3g",
               (unsigned long long)passes, ust__mode_name(mode), speedup, p.min_speedup);
    }
    unlock();
    return;
  }
  snprintf(why, sizeof why, "%llu passes in %s, speedup %.3g >= %.3g", (unsigned long long)passes,
           ust__mode_name(mode), speedup, p.min_speedup);
  if (p.dry_run) {
    if (e != NULL && strcmp(e->policy, "dry_run") != 0) {
      /* what it would do; the route's mode is unchanged */
      snprintf(e->policy, sizeof e->policy, "dry_run");
      snprintf(e->policy_note, sizeof e->policy_note, "would move to %s: %.120s", ust__mode_name(to), why);
      say("%s: would move %s -> %s (%s; dry run)", key, ust__mode_name(mode), ust__mode_name(to),
               why);
    }
    unlock();
    return;
  }
  transition_locked(r, to, p.canary, "policy", why);
  unlock();
}

/* ---- the report's view ----------------------------------------------------- */

cJSON *ust__rollout_json(ust__route *r) {
  cJSON *j = cJSON_CreateObject();
  uint32_t q = 0;
  int mode = ust__route_mode(r, &q);
  cJSON_AddStringToObject(j, "mode", ust__mode_name(mode));
  if (mode == UST__MODE_CANARY)
    cJSON_AddNumberToObject(j, "canary", share_of(q));
  cJSON_AddStringToObject(j, "set_by", (atomic_load(&r->rollout) & 0xff) || atomic_load(&r->rolled_back)
                                           ? "route" : "operator");
  /* Every tracked call outside capture that the candidate did not serve was
   * production's (its outputs, or its exception): derived, not counted per
   * call. Read in the order the counters grow, so it is never negative. */
  const uint64_t cand = atomic_load(&r->served_cand), cap_all = atomic_load(&r->captured),
                 calls = atomic_load(&r->calls);
  cJSON *sv = cJSON_AddObjectToObject(j, "served");
  cJSON_AddNumberToObject(sv, "production", (double)(calls - cap_all - cand));
  cJSON_AddNumberToObject(sv, "candidate", (double)cand);
  cJSON_AddNumberToObject(sv, "candidate_verified", (double)atomic_load(&r->served_cand_verified));
  cJSON_AddNumberToObject(sv, "unlearned", (double)atomic_load(&r->served_unlearned));
  const double captured = (double)atomic_load(&r->captured), cc = (double)atomic_load(&r->captured_cand);
  cJSON *cap = cJSON_AddObjectToObject(j, "captured");
  cJSON_AddNumberToObject(cap, "production", captured - cc);
  cJSON_AddNumberToObject(cap, "candidate", cc);
  cJSON_AddNumberToObject(j, "transitions", (double)atomic_load(&r->transitions));
  pthread_mutex_lock(&lock);
  entry *e = entry_of(r);
  if (e != NULL && e->transitions > 0) {
    cJSON *t = cJSON_AddObjectToObject(j, "last_transition");
    cJSON_AddStringToObject(t, "from", e->from);
    cJSON_AddStringToObject(t, "to", ust__mode_name(e->mode));
    cJSON_AddStringToObject(t, "by", e->by);
    cJSON_AddStringToObject(t, "reason", e->reason);
    cJSON_AddNumberToObject(t, "unix_ms", (double)e->unix_ms);
  }
  const ust__promotion p = r->binding->op->promotion;
  if (p.enabled && r->binding->cand != NULL) {
    cJSON *pr = cJSON_AddObjectToObject(j, "promotion");
    const uint64_t passes = atomic_load(&r->stage_passes);
    const char *state;
    if (mode == UST__MODE_LIVE)
      state = "live";
    else if (mode == UST__MODE_ROLLED_BACK)
      state = "rolled_back";
    else if (mode != UST__MODE_SHADOW && mode != UST__MODE_CANARY)
      state = "idle";
    else if (passes < (uint64_t)p.min_verified)
      state = "inconclusive";
    else if (e != NULL && e->policy[0] != '\0')
      state = e->policy;
    else
      state = "pending"; /* the minimum is reached; the next pass decides */
    cJSON_AddStringToObject(pr, "state", state);
    cJSON_AddNumberToObject(pr, "passes_in_stage", (double)passes);
    cJSON_AddNumberToObject(pr, "needed", p.min_verified);
    cJSON_AddNumberToObject(pr, "min_speedup", p.min_speedup);
    if (e != NULL && e->policy_note[0] != '\0')
      cJSON_AddStringToObject(pr, "note", e->policy_note);
  }
  unlock();
  return j;
}

/* ---- the state file ---------------------------------------------------------- */

/* One saved route, read back (plugin/state.c calls this per route). */
static int restore_row(void *ctx, const ust__state_row *row) {
  (void)ctx;
  entry *e = entry_get(row->key);
  if (e == NULL)
    return ust__error(UST_ENOMEM, "state file: out of memory");
  e->mode = row->mode;
  e->canary = row->mode == UST__MODE_CANARY ? row->canary : 0;
  snprintf(e->from, sizeof e->from, "%s", "restart");
  snprintf(e->by, sizeof e->by, "state");
  snprintf(e->reason, sizeof e->reason, "%s", row->reason);
  snprintf(e->cand, sizeof e->cand, "%s", row->candidate);
  e->unix_ms = row->unix_ms;
  e->transitions = 1;
  return 0;
}

/* One entry as the file gets it, copied out of the table. */
typedef struct saved {
  char key[UST__ROUTE_KEY_MAX];
  int mode;
  double canary;
  char reason[160];
  char cand[UST__QUALNAME_MAX + 16];
  uint64_t unix_ms;
} saved;

/* The table is copied under the lock and written outside it: a serving
 * thread creating a route never waits for the file's fsync. Writers take
 * turns (the worker, and disable). */
int ust__rollout_persist(void) {
  static pthread_mutex_t write_lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&write_lock);
  pthread_mutex_lock(&lock);
  if (!dirty || state_path == NULL) {
    unlock();
    pthread_mutex_unlock(&write_lock);
    return 0;
  }
  int n = 0;
  for (entry *e = table; e != NULL; e = e->hh.next)
    n += e->transitions > 0;
  saved *copy = calloc(n > 0 ? (size_t)n : 1, sizeof *copy);
  ust__state_row *rows = calloc(n > 0 ? (size_t)n : 1, sizeof *rows);
  char *path = ust__strdup(state_path);
  int rc = 0;
  if (copy == NULL || rows == NULL || path == NULL) {
    rc = ust__error(UST_ENOMEM, "state file: out of memory");
  } else {
    int i = 0;
    for (entry *e = table; e != NULL; e = e->hh.next) {
      if (e->transitions == 0)
        continue;
      memcpy(copy[i].key, e->key, sizeof copy[i].key);
      copy[i].mode = e->mode;
      copy[i].canary = e->canary;
      memcpy(copy[i].reason, e->reason, sizeof copy[i].reason);
      memcpy(copy[i].cand, e->cand, sizeof copy[i].cand);
      copy[i].unix_ms = e->unix_ms;
      rows[i] = (ust__state_row){copy[i].key, copy[i].mode, copy[i].canary, copy[i].reason, copy[i].cand,
                                 copy[i].unix_ms};
      i++;
    }
    dirty = 0;
  }
  unlock();
  if (rc == 0 && (rc = ust__state_write(path, rows, n)) != 0) {
    pthread_mutex_lock(&lock);
    dirty = 1; /* the next persist tries again */
    unlock();
  }
  free(copy);
  free(rows);
  free(path);
  pthread_mutex_unlock(&write_lock);
  return rc;
}

int ust__rollout_init(ust__engine *e) {
  pthread_mutex_lock(&lock);
  int rc = 0;
  eng = e;
  dirty = 0;
  const ust__config *c = &e->cfg;
  for (int i = 0; rc == 0 && i < c->n_ops; i++)
    for (int k = 0; rc == 0 && k < c->ops[i].n_routes; k++) {
      const ust__route_config *rcfg = &c->ops[i].routes[k];
      entry *x = entry_get(rcfg->key);
      if (x == NULL) {
        rc = ust__error(UST_ENOMEM, "rollout: out of memory");
        break;
      }
      note(x, UST__MODE_OBSERVE, rcfg->mode, rcfg->canary >= 0 ? rcfg->canary : c->ops[i].canary, "config",
           "set in the config");
    }
  dirty = 0; /* the config is not state */
  if (rc == 0 && c->state_path != NULL) {
    state_path = ust__strdup(c->state_path);
    rc = state_path == NULL ? ust__error(UST_ENOMEM, "out of memory") : ust__state_read(c->state_path, restore_row, NULL);
  }
  unlock();
  if (rc != 0)
    ust__rollout_shutdown();
  return rc;
}

void ust__rollout_shutdown(void) {
  pthread_mutex_lock(&lock);
  entry *e, *tmp;
  HASH_ITER(hh, table, e, tmp) {
    HASH_DEL(table, e);
    free(e);
  }
  free(state_path);
  state_path = NULL;
  eng = NULL;
  dirty = 0;
  unlock();
}

/* Operator settings that a reload changes: under the lock, so the policy
 * never reads a half-written one. */
void ust__rollout_set_operator(ust__operator *op, const ust__op_config *oc) {
  pthread_mutex_lock(&lock);
  op->promotion = oc->promotion;
  atomic_store(&op->canary_q32, ust__share_q32(oc->canary));
  atomic_store(&op->strict, oc->strict);
  atomic_store(&op->mode, oc->mode);
  unlock();
}
