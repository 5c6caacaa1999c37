/* The process context: the one object that lives as long as the process
 * (plugin/engine.h says what it holds), and the API entry points that need
 * nothing but it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "plugin/engine.h"
#include "understudy/candidate.h"

static ust__ctx context = {
    .life = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .reload = PTHREAD_MUTEX_INITIALIZER,
    .log = UST__LOG_SINK_INIT,
    .compare = {PTHREAD_MUTEX_INITIALIZER, NULL, &context.log},
};

ust__ctx *ust__ctx_get(void);
ust__ctx *ust__ctx_get(void) { return &context; }

const char *ust_torch_version(void) {
  const ust__seam_i *seam = ust__seam();
  return seam != NULL ? seam->torch_version : "";
}

uint32_t ust_abi_version(void) { return UST_ABI_VERSION; }
uint32_t ust_candidate_abi_version(void) { return UST_CANDIDATE_ABI_VERSION; }

int ust_confine_qualifying_process(void) { return ust__confine_signals(); }

void ust_set_log(ust_log_cb cb, void *user, int max_level) { ust__log_sink_set(&context.log, cb, user, max_level); }

ust__hook *ust__ctx_hook(ust__ctx *c, const ust__binding *b);

/* Hooks are registered once per op for the life of the process and never
 * removed: torch's (de)registration is not atomic against threads that are
 * dispatching, so a kernel that was ever reachable stays. Called by enable
 * (under `life`). */
ust__hook *ust__ctx_hook(ust__ctx *c, const ust__binding *b) {
  ust__hook *h = NULL;
  HASH_FIND_STR(c->hooks, b->display, h);
  if (h != NULL)
    return h;
  if ((h = aligned_alloc(_Alignof(ust__hook), sizeof *h)) == NULL) { /* its head on a line of its own */
    ust__error(UST_ENOMEM, "out of memory for the hook of %s", b->display);
    return NULL;
  }
  memset(h, 0, sizeof *h);
  /* its line is its interceptor's, set as it is registered; bound by
   * enable, after the registration */
  snprintf(h->display, sizeof h->display, "%s", b->display);
  if (c->seam->register_hook(h, b->qualname, b->overload, b->display) != 0) {
    free(h);
    return NULL;
  }
  ust__hash_oom = 0;
  HASH_ADD_STR(c->hooks, display, h);
  if (ust__hash_oom) {
    /* registered, so never freed: it stays reachable from the dispatcher */
    ust__error(UST_ENOMEM, "out of memory for the hook registry");
    return NULL;
  }
  return h;
}

int ust_compare_sync(const DLTensor *p, const DLTensor *c, int kind, double atol, double rtol, void *stream,
                     ust_compare_result *out) {
  ust__clear_error();
  return ust__compare_sync(&context.compare, p, c, kind, atol, rtol, stream, out);
}
