/*
 * The rollout state machine: each route's mode (off, observe, shadow,
 * canary(p), live, rolled_back), how it changes (by hand, by the promotion
 * policy, by a verdict), and the table of per-key modes that the state file
 * keeps across restarts.
 *
 * A route follows its operator's published policy until something gives it
 * its own mode: a per-key entry of the config, the state file, a manual set,
 * a transition of the policy, a verdict. The table holds those modes by shape
 * key, for routes that exist (each joined to its row once published) and for
 * keys not seen yet in this process (a route takes its row's mode when it is
 * created).
 *
 * Threading: every change and every read of a row happens under the engine's
 * lock for changes (borrowed), held briefly; messages are logged after it is
 * released (a log callback may call back into understudy). The per-call path
 * reads only the parts' atomic words.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard/guard.h"

typedef struct ust__rollout_entry {
  char key[UST__KEY_MAX];
  int mode;           /* ust__mode */
  double canary;      /* canary share; 0 outside canary */
  char from[16];      /* the last transition: mode before, why, by whom, when */
  char reason[160];
  char by[16];        /* "config", "state", "manual", "policy", "verdict" */
  uint64_t unix_ms;
  uint64_t transitions;
  char cand[UST__QUALNAME_MAX + 16]; /* the candidate the mode was given for ("" any) */
  char policy[16];    /* the policy's last look short of a transition: "testing", "rejected", "inconclusive",
                         "dry_run" */
  char policy_note[200];
  ust__route_rollout *part; /* the route of this key, once published */
  UT_hash_handle hh;
} entry;

struct ust__rollout {
  pthread_mutex_t *lock; /* the engine's lock for changes */
  ust__log_sink *log;
  entry *table;
  int n_entries;
  int dirty; /* a change is not saved yet */
};

static const char *const mode_names[] = {"off", "observe", "shadow", "canary", "live", "rolled_back"};

int ust__mode_parse_any(const char *s, int *mode, int allow_rolled_back) {
  for (int m = UST__MODE_OFF; m <= UST__MODE_ROLLED_BACK; m++)
    if (strcmp(s, mode_names[m]) == 0 && (m != UST__MODE_ROLLED_BACK || allow_rolled_back)) {
      *mode = m;
      return 0;
    }
  return -1;
}

int ust__mode_parse(const char *s, int *mode) { return ust__mode_parse_any(s, mode, 0); }

const char *ust__mode_name(int mode) {
  return mode >= UST__MODE_OFF && mode <= UST__MODE_ROLLED_BACK ? mode_names[mode] : "unknown";
}

/* Messages said under the lock are logged by unlock(), after it is
 * released: one pending message per thread. */
static _Thread_local char pending_msg[640];
static _Thread_local int pending_level;

__attribute__((format(printf, 2, 3))) static void say(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pending_msg, sizeof pending_msg, fmt, ap);
  va_end(ap);
  pending_level = level;
}

static void lock(ust__rollout *t) { pthread_mutex_lock(t->lock); }

static void unlock(ust__rollout *t) {
  char msg[sizeof pending_msg];
  memcpy(msg, pending_msg, sizeof msg);
  pending_msg[0] = '\0';
  pthread_mutex_unlock(t->lock);
  if (msg[0] != '\0')
    ust__log(t->log, pending_level, "%s", msg);
}

static double share_of(uint32_t q) { return q == UINT32_MAX ? 1.0 : (double)q / 4294967296.0; }

static uint64_t pack(int mode, double canary) { return (uint64_t)(mode + 1) | (uint64_t)ust__share_q32(canary) << 32; }

UST__HOT int ust__rollout_mode(const ust__route_rollout *p, uint32_t *canary_q32) {
  uint64_t v = atomic_load_explicit(&((ust__route_rollout *)p)->word, memory_order_acquire);
  int mode;
  uint32_t q;
  if (v & 0xff) {
    mode = (int)(v & 0xff) - 1;
    q = (uint32_t)(v >> 32);
  } else {
    const ust__policy *pol = atomic_load_explicit(p->policy, memory_order_acquire);
    mode = pol->mode;
    q = pol->canary_q32;
  }
  if (mode >= UST__MODE_SHADOW && p->cand == NULL)
    mode = UST__MODE_OBSERVE; /* only the candidate's target binding runs it */
  if (canary_q32 != NULL)
    *canary_q32 = q;
  return mode;
}

static entry *find(ust__rollout *t, const char *key) {
  entry *e = NULL;
  HASH_FIND_STR(t->table, key, e);
  return e;
}

static entry *find_or_add(ust__rollout *t, const char *key) {
  entry *e = find(t, key);
  if (e != NULL)
    return e;
  if ((e = calloc(1, sizeof *e)) == NULL)
    return NULL;
  snprintf(e->key, sizeof e->key, "%s", key);
  ust__hash_oom = 0;
  HASH_ADD_STR(t->table, key, e);
  if (ust__hash_oom) {
    free(e);
    return NULL;
  }
  t->n_entries++;
  return e;
}

/* A decision short of a move, which the state file keeps with its evidence. */
static int decided(const entry *e) {
  return strcmp(e->policy, "rejected") == 0 || strcmp(e->policy, "inconclusive") == 0 ||
         strcmp(e->policy, "dry_run") == 0;
}

static const char *cand_id(const ust__route_rollout *p) { return p->cand != NULL ? p->cand->id : ""; }

/* Record a transition in a row (lock held). */
static void note(ust__rollout *t, entry *e, int from, int to, double canary, const char *by, const char *reason) {
  snprintf(e->from, sizeof e->from, "%s", ust__mode_name(from));
  e->mode = to;
  e->canary = to == UST__MODE_CANARY ? canary : 0;
  snprintf(e->by, sizeof e->by, "%s", by);
  snprintf(e->reason, sizeof e->reason, "%s", reason != NULL ? reason : "");
  e->unix_ms = ust__unix_ms();
  e->transitions++;
  e->policy[0] = e->policy_note[0] = '\0';
  t->dirty = 1;
}

/* Give a route its own mode (lock held). */
static void apply(ust__route_rollout *p, int mode, double canary) {
  atomic_store_explicit(&p->stage_passes, 0, memory_order_relaxed);
  p->n_samples = 0; /* a new stage is judged on its own calls */
  atomic_store_explicit(&p->word, pack(mode, canary), memory_order_release);
  atomic_fetch_add_explicit(&p->transitions, 1, memory_order_relaxed);
}

static int transition_locked(ust__route_rollout *p, int to, double canary, const char *by, const char *reason) {
  entry *e = p->entry != NULL ? p->entry : find_or_add(p->table, p->key);
  if (e == NULL)
    return ust__error(UST_ENOMEM, "rollout: out of memory");
  const int from = ust__rollout_mode(p, NULL);
  apply(p, to, canary);
  note(p->table, e, from, to, canary, by, reason);
  snprintf(e->cand, sizeof e->cand, "%s", cand_id(p));
  say(UST_LOG_INFO, "%s: %s -> %s%s%s (%s)", p->key, ust__mode_name(from), ust__mode_name(to),
      reason != NULL && reason[0] ? ": " : "", reason != NULL ? reason : "", by);
  return 0;
}

int ust__rollout_create(pthread_mutex_t *lk, ust__log_sink *log, ust__rollout **out) {
  ust__rollout *t = calloc(1, sizeof *t);
  *out = t;
  if (t == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  t->lock = lk;
  t->log = log;
  return 0;
}

void ust__rollout_destroy(ust__rollout *t) {
  if (t == NULL)
    return;
  entry *e, *tmp;
  HASH_ITER(hh, t->table, e, tmp) {
    HASH_DEL(t->table, e);
    free(e);
  }
  free(t);
}

int ust__rollout_seed(ust__rollout *t, const char *key, int mode, double canary) {
  lock(t);
  entry *e = find_or_add(t, key);
  int rc = e == NULL ? ust__error(UST_ENOMEM, "rollout: out of memory") : 0;
  if (e != NULL) {
    const int dirty = t->dirty;
    note(t, e, UST__MODE_OBSERVE, mode, canary, "config", "set in the config");
    t->dirty = dirty; /* the config is not state */
  }
  unlock(t);
  return rc;
}

int ust__rollout_restore(ust__rollout *t, const ust__rollout_row *row) {
  if ((row->candidate == NULL || row->candidate[0] == '\0') && row->mode >= UST__MODE_SHADOW && row->mode >= 0) {
    ust__log(t->log, UST_LOG_WARN, "state file: the saved mode %s of %s names no candidate: not restored",
             ust__mode_name(row->mode), row->key);
    return 0;
  }
  lock(t);
  entry *e = find_or_add(t, row->key);
  int rc = e == NULL ? ust__error(UST_ENOMEM, "state file: out of memory") : 0;
  if (e != NULL && row->mode >= 0) {
    e->mode = row->mode;
    e->canary = row->mode == UST__MODE_CANARY ? row->canary : 0;
    snprintf(e->from, sizeof e->from, "%s", "restart");
    snprintf(e->by, sizeof e->by, "state");
    snprintf(e->reason, sizeof e->reason, "%s", row->reason);
    snprintf(e->cand, sizeof e->cand, "%s", row->candidate);
    e->unix_ms = row->unix_ms;
    e->transitions = 1;
  }
  if (e != NULL && row->decision != NULL && row->decision[0] != '\0') {
    /* the stage stays decided across the restart, its evidence with it */
    snprintf(e->policy, sizeof e->policy, "%s", row->decision);
    snprintf(e->policy_note, sizeof e->policy_note, "%s", row->evidence != NULL ? row->evidence : "");
    if (row->mode < 0)
      snprintf(e->cand, sizeof e->cand, "%s", row->candidate);
  }
  unlock(t);
  return rc;
}

void ust__rollout_route_init(ust__route_rollout *p, ust__rollout *t, const char *key, const ust__cand *cand,
                             _Atomic(const ust__policy *) *policy, ust__figs *figs) {
  memset(p, 0, sizeof *p);
  p->table = t;
  p->key = key;
  p->cand = cand;
  p->policy = policy;
  p->figs = figs;
  lock(t);
  entry *e = find(t, key);
  if (e != NULL)
    p->seen_at_init = e->transitions;
  if (e != NULL && e->transitions == 0 && e->policy[0] != '\0' && strcmp(e->cand, cand_id(p)) != 0)
    e->policy[0] = e->policy_note[0] = '\0'; /* another candidate's saved decision: this one is judged anew */
  if (e != NULL && e->transitions > 0 && e->cand[0] != '\0' && strcmp(e->cand, cand_id(p)) != 0) {
    /* a promotion or rollback of another candidate: this one starts anew */
    say(UST_LOG_INFO, "%s: its saved mode %s was for candidate %s, this process runs %s: not restored", key,
        ust__mode_name(e->mode), e->cand, cand != NULL ? cand->id : "none");
    e->policy[0] = e->policy_note[0] = '\0';
    e = NULL;
  }
  if (e != NULL && e->transitions > 0) {
    atomic_store_explicit(&p->word, pack(e->mode, e->canary), memory_order_relaxed);
    if (e->mode == UST__MODE_ROLLED_BACK) {
      ust__evidence *ev = calloc(1, sizeof *ev);
      if (ev != NULL) {
        snprintf(ev->reason, sizeof ev->reason, "restored");
        snprintf(ev->message, sizeof ev->message, "rolled back before this process started: %s", e->reason);
        ev->unix_ms = e->unix_ms;
        atomic_store(&p->evidence, ev);
      }
    }
  }
  unlock(t);
}

void ust__rollout_route_published(ust__route_rollout *p) {
  ust__rollout *t = p->table;
  lock(t);
  entry *e = find_or_add(t, p->key);
  if (e != NULL) {
    e->part = p;
    p->entry = e;
    /* a mode set for its key between init and now found no route */
    if (e->transitions > p->seen_at_init)
      apply(p, e->mode, e->canary);
  }
  unlock(t);
}

int ust__rollout_set(ust__route_rollout *p, int mode, double canary, const char *by, const char *reason) {
  lock(p->table);
  int rc = transition_locked(p, mode, canary, by, reason);
  unlock(p->table);
  return rc;
}

int ust__rollout_set_key(ust__rollout *t, const char *key, const char *cand, int mode, double canary,
                         const char *by, const char *reason, int max_keys) {
  lock(t);
  int rc = 0;
  entry *e = find(t, key);
  if (e != NULL && e->part != NULL) {
    rc = transition_locked(e->part, mode, canary, by, reason);
  } else if (e == NULL && t->n_entries >= max_keys) {
    rc = ust__error(UST_EFULL, "set_route_mode: %d shape keys have modes already; a key never seen takes no more",
                    t->n_entries);
  } else if (e == NULL && (e = find_or_add(t, key)) == NULL) {
    rc = ust__error(UST_ENOMEM, "rollout: out of memory");
  } else {
    note(t, e, e->transitions ? e->mode : UST__MODE_OBSERVE, mode, canary, by, reason);
    snprintf(e->cand, sizeof e->cand, "%s", cand != NULL ? cand : "");
  }
  unlock(t);
  return rc;
}

void ust__rollout_roll_back(ust__route_rollout *p, ust__evidence *ev) {
  ust__rollout *t = p->table;
  lock(t);
  const int from = ust__rollout_mode(p, NULL);
  if (from == UST__MODE_ROLLED_BACK || p->cand == NULL) { /* the first failure decided already */
    unlock(t);
    free(ev);
    return;
  }
  char why[400] = "a verified failure";
  if (ev != NULL) {
    if (ev->serving)
      ev->served_before_verdict = atomic_load(&p->served_cand) - ev->served_at;
    ev->prev = atomic_load(&p->evidence);
    snprintf(why, sizeof why, "%s%s%s%s%s", ev->reason, ev->output[0] ? " in " : "", ev->output,
             ev->message[0] ? ": " : "", ev->message);
    atomic_store(&p->evidence, ev); /* published before the mode: a report never shows one without the other */
  }
  apply(p, UST__MODE_ROLLED_BACK, 0);
  atomic_store(&p->qualified, 0); /* set back by hand, it qualifies again before it serves */
  entry *e = p->entry != NULL ? p->entry : find_or_add(t, p->key);
  if (e != NULL) {
    note(t, e, from, UST__MODE_ROLLED_BACK, 0, "verdict", why);
    snprintf(e->cand, sizeof e->cand, "%s", cand_id(p));
  }
  say(UST_LOG_WARN, "rolled back %s: %s", p->key, why);
  unlock(t);
}

int ust__rollout_qualified(const ust__route_rollout *p) {
  return atomic_load_explicit(&((ust__route_rollout *)p)->qualified, memory_order_acquire);
}

/* The A/A pairs kept (a ring of the newest UST__AA_KEPT). */
static int aa_kept(const ust__route_rollout *p) { return p->n_aa < p->cap_aa ? p->n_aa : p->cap_aa; }

/* Production's own spread on the route (ust__seq_aa_spread of its A/A
 * pairs), once UST__AA_MIN are in; -1 before. Kept until the next pair. */
static double aa_spread(ust__route_rollout *p) {
  const int n = aa_kept(p);
  if (n < UST__AA_MIN)
    return -1;
  if (p->aa_spread_at != p->n_aa) {
    p->aa_spread = ust__seq_aa_spread(p->aa, n);
    p->aa_spread_at = p->aa_spread >= 0 ? p->n_aa : -1; /* out of memory: tried again at the next look */
  }
  return p->aa_spread;
}

/* The policy as the test reads it: with A/A on (the candidate's
 * aa_sample), a decision waits for UST__AA_MIN pairs. */
static ust__seq_rule rule_of(const ust__promotion *pr, const ust__route_rollout *p) {
  const ust__seq_rule rule = {pr->alpha, pr->delta, pr->min_speedup, pr->max_samples,
                              p->cand != NULL && p->cand->aa_sample > 0 ? UST__AA_MIN : 0};
  return rule;
}

/* The test on the stage's samples now (the table's lock held). */
static int test_now(ust__route_rollout *p, const ust__promotion *pr, ust__seq_state *st) {
  const ust__seq_rule rule = rule_of(pr, p);
  const int k = ust__seq_kstar(&p->kstar, p->n_samples, pr->alpha / 2);
  return ust__seq_step(p->samples, p->n_samples, k, aa_spread(p), aa_kept(p), &rule, st);
}

/* "n 42: T_cand/T_prod median 0.912, 95 % sequence [0.874, 0.951], delta 0.05 (A/A 0.012, n 9), alpha 0.05" */
static void evidence_text(char *out, size_t cap, const ust__promotion *pr, const ust__route_rollout *p,
                          const ust__seq_verdict *v, const ust__seq_state *st) {
  char aa_text[48] = "";
  if (st->spread >= 0)
    snprintf(aa_text, sizeof aa_text, " (A/A %.3g, n %d)", st->spread, aa_kept(p));
  snprintf(out, cap, "n %d: T_cand/T_prod median %.4g, %.0f %% sequence [%.4g, %.4g], delta %.3g%s, alpha %.3g",
           v->n, exp(v->median), 100 * (1 - pr->alpha), exp(v->lower), exp(v->upper), st->delta_used, aa_text,
           pr->alpha);
}

void ust__rollout_aa(ust__route_rollout *p, double log_ratio) {
  if (!isfinite(log_ratio))
    return;
  lock(p->table);
  if (p->n_aa == p->cap_aa && p->cap_aa < UST__AA_KEPT) {
    const int cap = p->cap_aa ? p->cap_aa * 2 : 16;
    double *a = realloc(p->aa, (size_t)cap * sizeof *a);
    if (a != NULL) {
      p->aa = a;
      p->cap_aa = cap;
    }
  }
  /* the newest UST__AA_KEPT pairs, in a ring once full */
  if (p->cap_aa > 0)
    p->aa[p->n_aa % p->cap_aa] = log_ratio;
  if (p->n_aa < INT_MAX)
    p->n_aa++;
  unlock(p->table);
}

static void add_sample(ust__route_rollout *p, int max, double r) {
  if (!isfinite(r) || p->n_samples >= max)
    return;
  if (p->n_samples == p->cap_samples) {
    int cap = p->cap_samples ? p->cap_samples * 2 : 64;
    if (cap > max)
      cap = max;
    double *s = realloc(p->samples, (size_t)cap * sizeof *s);
    if (s == NULL)
      return; /* a sample fewer */
    p->samples = s;
    p->cap_samples = cap;
  }
  p->samples[p->n_samples++] = r;
}

/* A pass on copies qualifies the candidate unless the route was rolled
 * back (the table's lock held). */
static void qualify_locked(ust__route_rollout *p) {
  if (ust__rollout_mode(p, NULL) != UST__MODE_ROLLED_BACK)
    atomic_store_explicit(&p->qualified, 1, memory_order_release);
}

void ust__rollout_qualify(ust__route_rollout *p) {
  lock(p->table);
  qualify_locked(p);
  unlock(p->table);
}

void ust__rollout_passed(ust__route_rollout *p, uint64_t stage, int on_copies, double log_ratio) {
  ust__rollout *t = p->table;
  lock(t);
  if (on_copies)
    qualify_locked(p);
  if (atomic_load(&p->transitions) != stage) {
    unlock(t); /* verified in an earlier stage */
    return;
  }
  const uint64_t passes = atomic_fetch_add_explicit(&p->stage_passes, 1, memory_order_relaxed) + 1;
  const ust__promotion pr = atomic_load(p->policy)->promotion;
  const int mode = ust__rollout_mode(p, NULL);
  if (!pr.enabled || (mode != UST__MODE_SHADOW && mode != UST__MODE_CANARY)) {
    unlock(t);
    return;
  }
  add_sample(p, pr.max_samples, log_ratio);
  entry *e = p->entry != NULL ? p->entry : find_or_add(t, p->key);
  if (passes < (uint64_t)pr.min_verified ||
      (e != NULL && (strcmp(e->policy, "rejected") == 0 || strcmp(e->policy, "inconclusive") == 0))) {
    unlock(t); /* collecting; or this stage is decided */
    return;
  }
  const int to = mode == UST__MODE_SHADOW ? UST__MODE_CANARY : UST__MODE_LIVE;
  char why[200];
  if (pr.min_speedup <= 0) {
    snprintf(why, sizeof why, "%llu passes in %s (no speed gate)", (unsigned long long)passes, ust__mode_name(mode));
  } else {
    ust__seq_state st;
    const int d = test_now(p, &pr, &st);
    if (d == UST__SEQ_OPEN) {
      if (e != NULL && strcmp(e->policy, "testing") != 0) {
        snprintf(e->policy, sizeof e->policy, "testing");
        e->policy_note[0] = '\0';
      }
      unlock(t);
      return;
    }
    ust__seq_verdict v;
    ust__seq_judge(p->samples, p->n_samples, pr.alpha, st.c_fast, st.c_slow, &v);
    char ev[180];
    evidence_text(ev, sizeof ev, &pr, p, &v, &st);
    if (d != UST__SEQ_FASTER) {
      const char *state = d == UST__SEQ_SLOWER ? "rejected" : "inconclusive";
      char reason[64] = "the candidate is slower";
      if (d == UST__SEQ_INCONCLUSIVE) {
        const ust__seq_rule rule = rule_of(&pr, p);
        ust__seq_why_text(&st, &rule, p->n_samples, aa_kept(p), reason, sizeof reason);
      }
      if (e != NULL) {
        snprintf(e->policy, sizeof e->policy, "%s", state);
        if (d == UST__SEQ_INCONCLUSIVE) { /* the reason first: "A/A spread 0.12 > delta 0.05; n 400: ..." */
          if (snprintf(e->policy_note, sizeof e->policy_note, "%s; %s", reason, ev) >= (int)sizeof e->policy_note)
            e->policy_note[sizeof e->policy_note - 1] = '\0'; /* the evidence's tail cut */
        } else
          snprintf(e->policy_note, sizeof e->policy_note, "%s", ev);
        snprintf(e->cand, sizeof e->cand, "%s", cand_id(p)); /* the candidate it was taken on */
        t->dirty = 1; /* the decision and its evidence go to the state file */
      }
      say(UST_LOG_INFO, "%s: promotion %s: %s in %s (%s)", p->key, state, reason, ust__mode_name(mode), ev);
      unlock(t);
      return;
    }
    snprintf(why, sizeof why, "faster: %s", ev);
  }
  if (pr.dry_run) {
    if (e != NULL && strcmp(e->policy, "dry_run") != 0) {
      /* what it would do; the route's mode is unchanged */
      snprintf(e->policy, sizeof e->policy, "dry_run");
      snprintf(e->policy_note, sizeof e->policy_note, "would move to %s: %.170s", ust__mode_name(to), why);
      snprintf(e->cand, sizeof e->cand, "%s", cand_id(p));
      t->dirty = 1;
      say(UST_LOG_INFO, "%s: would move %s -> %s (%s; dry run)", p->key, ust__mode_name(mode), ust__mode_name(to),
          why);
    }
    unlock(t);
    return;
  }
  transition_locked(p, to, pr.canary, "policy", why);
  unlock(t);
}

UST__HOT void ust__rollout_served(ust__route_rollout *p, int notes, int capturing) {
  if (notes & UST__NOTE_SERVED_CANDIDATE) /* a capture serves nothing itself: its replays do */
    atomic_fetch_add_explicit(capturing ? &p->captured_cand : &p->served_cand, 1, memory_order_relaxed);
  if (notes & UST__NOTE_VERIFIED_SERVING)
    atomic_fetch_add_explicit(&p->served_cand_verified, 1, memory_order_relaxed);
  if (notes & UST__NOTE_UNLEARNED)
    atomic_fetch_add_explicit(&p->served_unlearned, 1, memory_order_relaxed);
}

void ust__rollout_snapshot(ust__route_rollout *p, ust__rollout_snap *o) {
  memset(o, 0, sizeof *o);
  uint32_t q = 0;
  o->mode = ust__rollout_mode(p, &q);
  o->canary = share_of(q);
  o->own = (atomic_load(&p->word) & 0xff) != 0;
  o->qualified = atomic_load(&p->qualified);
  o->served_cand = atomic_load(&p->served_cand);
  o->served_cand_verified = atomic_load(&p->served_cand_verified);
  o->served_unlearned = atomic_load(&p->served_unlearned);
  o->captured_cand = atomic_load(&p->captured_cand);
  o->transitions = atomic_load(&p->transitions);
  o->stage_passes = atomic_load(&p->stage_passes);
  o->evidence = atomic_load(&p->evidence);
  const ust__promotion pr = atomic_load(p->policy)->promotion;
  lock(p->table);
  const entry *e = p->entry;
  if (e != NULL && e->transitions > 0) {
    o->has_last = 1;
    snprintf(o->last_from, sizeof o->last_from, "%s", e->from);
    snprintf(o->last_to, sizeof o->last_to, "%s", ust__mode_name(e->mode));
    snprintf(o->last_by, sizeof o->last_by, "%s", e->by);
    snprintf(o->last_reason, sizeof o->last_reason, "%s", e->reason);
    o->last_unix_ms = e->unix_ms;
  }
  if (pr.enabled && p->cand != NULL) {
    const char *state;
    if (o->mode == UST__MODE_LIVE)
      state = "live";
    else if (o->mode == UST__MODE_ROLLED_BACK)
      state = "rolled_back";
    else if (o->mode != UST__MODE_SHADOW && o->mode != UST__MODE_CANARY)
      state = "idle";
    else if (e != NULL && decided(e))
      state = e->policy; /* this stage is decided (in this process, or before a restart) */
    else if (o->stage_passes < (uint64_t)pr.min_verified)
      state = "collecting";
    else if (e != NULL && e->policy[0] != '\0')
      state = e->policy;
    else
      state = "testing"; /* the minimum is reached; the next pass decides */
    ust__seq_state st;
    test_now(p, &pr, &st);
    o->promotion = pr;
    o->promotion_delta = st.delta_used;
    o->aa_spread = st.spread;
    o->aa_samples = aa_kept(p);
    if (pr.min_speedup > 0 && p->n_samples > 0)
      ust__seq_judge(p->samples, p->n_samples, pr.alpha, st.c_fast, st.c_slow, &o->promotion_test);
    snprintf(o->promotion_state, sizeof o->promotion_state, "%s", state);
    if (e != NULL)
      snprintf(o->promotion_note, sizeof o->promotion_note, "%s", e->policy_note);
    o->promotion_needed = pr.min_verified;
    o->promotion_min_speedup = pr.min_speedup;
  }
  unlock(p->table);
}

void ust__rollout_route_free(ust__route_rollout *p) {
  free(p->samples);
  p->samples = NULL;
  p->n_samples = p->cap_samples = 0;
  free(p->aa);
  p->aa = NULL;
  p->n_aa = p->cap_aa = 0;
  for (ust__evidence *e = atomic_load(&p->evidence), *prev; e != NULL; e = prev) {
    prev = e->prev;
    free(e);
  }
  atomic_store(&p->evidence, NULL);
}

int ust__rollout_take_changes(ust__rollout *t, ust__rollout_row **rows_out, int *n_out) {
  *rows_out = NULL;
  *n_out = 0;
  lock(t);
  if (!t->dirty) {
    unlock(t);
    return 0;
  }
  int n = 0;
  size_t strings = 0;
  for (entry *e = t->table; e != NULL; e = e->hh.next)
    if (e->transitions > 0 || decided(e)) {
      n++;
      strings += strlen(e->key) + strlen(e->reason) + strlen(e->cand) + strlen(e->policy) + strlen(e->policy_note) + 5;
    }
  ust__rollout_row *rows = malloc((size_t)(n > 0 ? n : 1) * sizeof *rows + strings);
  if (rows == NULL) {
    unlock(t);
    return ust__error(UST_ENOMEM, "state file: out of memory");
  }
  char *at = (char *)(rows + (n > 0 ? n : 1));
  int i = 0;
#define KEEP(field, src)                                                                            \
  do {                                                                                              \
    size_t len_ = strlen(src) + 1;                                                                  \
    memcpy(at, src, len_);                                                                          \
    rows[i].field = at;                                                                             \
    at += len_;                                                                                     \
  } while (0)
  for (entry *e = t->table; e != NULL; e = e->hh.next) {
    if (e->transitions == 0 && !decided(e))
      continue;
    KEEP(key, e->key);
    KEEP(reason, e->reason);
    KEEP(candidate, e->cand);
    KEEP(decision, decided(e) ? e->policy : "");
    KEEP(evidence, decided(e) ? e->policy_note : "");
    rows[i].mode = e->transitions > 0 ? e->mode : -1; /* the config's mode stays the config's */
    rows[i].canary = e->canary;
    rows[i].unix_ms = e->unix_ms;
    i++;
  }
#undef KEEP
  t->dirty = 0;
  unlock(t);
  *rows_out = rows;
  *n_out = n;
  return 0;
}

void ust__rollout_unsaved(ust__rollout *t) {
  lock(t);
  t->dirty = 1;
  unlock(t);
}
