/* The report's recent window: every route's additive figures kept at the
 * last two window boundaries (plain readings, by key), and a window's
 * readings as the figures now less the older boundary's. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/engine.h"

typedef struct base_key {
  ust__reading r; /* r.key is the owned copy below */
  char *key;
  UT_hash_handle hh;
} base_key;

struct ust__window_base {
  base_key *keys; /* owned array of n */
  int n;
  base_key *by_key; /* uthash head over keys */
  double generated_unix_ms, timer_window_ns, timer_elapsed_ns;
};

void ust__window_base_free(ust__window_base *b) {
  if (b == NULL)
    return;
  HASH_CLEAR(hh, b->by_key);
  for (int i = 0; i < b->n; i++) {
    ust__reading_free(&b->keys[i].r);
    free(b->keys[i].key);
  }
  free(b->keys);
  free(b);
}

/* The figures of e's routes now, or NULL when memory ran out. */
static ust__window_base *take(ust__engine *e) {
  ust__route_snap *snaps = NULL;
  int nr = 0;
  ust__window_base *b = calloc(1, sizeof *b);
  if (b == NULL || ust__routes_snapshot(&e->router, &snaps, &nr) != 0)
    goto oom;
  b->keys = nr > 0 ? calloc((size_t)nr, sizeof *b->keys) : NULL;
  if (nr > 0 && b->keys == NULL)
    goto oom;
  for (int i = 0; i < nr; i++) {
    base_key *k = &b->keys[b->n];
    ust__reading_of_snap(e, &snaps[i], &k->r);
    b->n++;
    if ((k->key = strdup(snaps[i].key)) == NULL)
      goto oom;
    k->r.key = k->key;
    base_key *found = NULL;
    HASH_FIND_STR(b->by_key, k->key, found);
    if (found == NULL) /* out of memory leaves it out: its window then counts since enable */
      HASH_ADD_KEYPTR(hh, b->by_key, k->key, strlen(k->key), k);
  }
  ust__timer_status st;
  ust__timers_status(e->router.timers, &st);
  b->timer_window_ns = (double)st.totals.window_ns;
  b->timer_elapsed_ns = (double)(ust__now_ns() - e->started_ns);
  b->generated_unix_ms = (double)ust__unix_ms();
  ust__routes_snapshot_free(snaps, nr);
  return b;
oom:
  ust__routes_snapshot_free(snaps, nr);
  ust__window_base_free(b);
  return NULL;
}

void ust__window_rotate(ust__engine *e) {
  ust__window_base *now = take(e);
  if (now == NULL)
    return; /* out of memory: the window grows until the next rotation */
  pthread_mutex_lock(&e->window_lock);
  ust__window_base_free(e->window_base[0]);
  e->window_base[0] = e->window_base[1];
  e->window_base[1] = now;
  pthread_mutex_unlock(&e->window_lock);
}

static double less(double now, double then) { return now > then ? now - then : 0; }

/* A histogram less its earlier self, bucket by bucket, into out (owned). */
static int hist_less(const ust__hist_sparse *now, const ust__hist_sparse *then, ust__hist_sparse *out) {
  memset(out, 0, sizeof *out);
  out->sum = now->sum > then->sum ? now->sum - then->sum : 0;
  if (now->n == 0)
    return 0;
  out->index = malloc((size_t)now->n * sizeof *out->index);
  out->counts = malloc((size_t)now->n * sizeof *out->counts);
  if (out->index == NULL || out->counts == NULL) {
    ust__hist_sparse_free(out);
    return ust__error(UST_ENOMEM, "report: out of memory");
  }
  for (int i = 0, j = 0; i < now->n; i++) {
    while (j < then->n && then->index[j] < now->index[i])
      j++;
    const uint64_t before = j < then->n && then->index[j] == now->index[i] ? then->counts[j] : 0;
    if (now->counts[i] > before) {
      out->index[out->n] = now->index[i];
      out->counts[out->n++] = now->counts[i] - before;
      out->count += now->counts[i] - before;
    }
  }
  return 0;
}

/* w = now less then (NULL: zeros); the figures a window keeps cumulative
 * (how its captured calls stand under graphs) stay as they are now. */
static int reading_less(const ust__reading *now, const ust__reading *then, ust__reading *w) {
  static const ust__reading zero;
  if (then == NULL)
    then = &zero;
  *w = *now;
  memset(&w->lat, 0, sizeof w->lat);
  memset(&w->clat, 0, sizeof w->clat);
  if ((now->has_lat && hist_less(&now->lat, &then->lat, &w->lat) != 0) ||
      (now->has_clat && hist_less(&now->clat, &then->clat, &w->clat) != 0))
    return UST_ENOMEM;
  ust__reading_link(w);
  ust__derive_in *x = &w->in;
  const ust__derive_in *b = &then->in;
#define LESS(f) x->f = less(now->in.f, b->f)
  LESS(calls);
  LESS(captured);
  LESS(replayed);
  LESS(kernel_timed);
  LESS(held_timed);
  LESS(first_timed);
  LESS(first_time_ns);
  LESS(steady_timed);
  LESS(steady_time_ns);
  LESS(steady_calls);
  LESS(served_cand);
  LESS(roof_calls);
  LESS(roof_tsol_ns);
  LESS(roof_time_ns);
  LESS(cand_roof_calls);
  LESS(cand_roof_tsol_ns);
  LESS(cand_roof_time_ns);
  LESS(work_calls);
  LESS(flops);
  LESS(bytes);
  LESS(shadow_calls);
  LESS(verified);
  LESS(failed);
  LESS(unseen_kernels);
  LESS(graph_changed);
#undef LESS
  w->timing_dropped = less(now->timing_dropped, then->timing_dropped);
  w->roof_unscored = less(now->roof_unscored, then->roof_unscored);
  w->passed = less(now->passed, then->passed);
  w->skipped = less(now->skipped, then->skipped);
  w->unverifiable = less(now->unverifiable, then->unverifiable);
  return 0;
}

int ust__window_readings(ust__engine *e, const ust__reading *now, int n, double timer_window_ns,
                         double timer_elapsed_ns, ust__reading **out, int *n_out, double *since_unix_ms,
                         double *replay_scale) {
  *out = NULL;
  *n_out = 0;
  ust__reading *w = n > 0 ? calloc((size_t)n, sizeof *w) : NULL;
  if (n > 0 && w == NULL)
    return ust__error(UST_ENOMEM, "report: out of memory");
  int rc = 0, k = 0;
  pthread_mutex_lock(&e->window_lock);
  const ust__window_base *base = e->window_base[0] != NULL ? e->window_base[0] : e->window_base[1];
  for (int i = 0; i < n && rc == 0; i++) {
    const base_key *then = NULL;
    if (base != NULL)
      HASH_FIND_STR(base->by_key, now[i].key, then);
    const ust__reading *b = then != NULL ? &then->r : NULL;
    if (now[i].in.calls - (b ? b->in.calls : 0) <= 0 && now[i].in.replayed - (b ? b->in.replayed : 0) <= 0)
      continue; /* neither called nor replayed in the interval */
    if ((rc = reading_less(&now[i], b, &w[k])) == 0)
      k++;
    else
      ust__reading_free(&w[k]);
  }
  /* the tracer's windows within the interval: the scale of its replays */
  const double win = timer_window_ns - (base != NULL ? base->timer_window_ns : 0);
  const double elapsed = timer_elapsed_ns - (base != NULL ? base->timer_elapsed_ns : 0);
  *replay_scale = win > 0 && elapsed > win ? elapsed / win : 1.0;
  *since_unix_ms = base != NULL ? base->generated_unix_ms : (double)e->started_unix_ms;
  pthread_mutex_unlock(&e->window_lock);
  if (rc != 0) {
    ust__readings_free(w, k);
    return rc;
  }
  *out = w;
  *n_out = k;
  return 0;
}
