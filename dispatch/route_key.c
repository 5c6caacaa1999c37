/*
 * A call's shape key (dispatch/route_key.h builds it inline), as the report
 * spells it; a binding's key dimensions and argument names, resolved against
 * its op's schema.
 */
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/route_key.h"


void ust__route_key_make(const ust__binding *b, const ust__call *call, ust__route_key *key) {
  (void)key_build(b, call, key);
}

void ust__binding_keys_set(ust__binding *b) {
  for (int d = 0; d < b->n_dims; d++) {
    const ust__dim_prog *p = &b->dims[d];
    /* a size of an argument past the word's range reads through the evaluator */
    const int sized = p->kind == UST__DIM_SIZE && p->arg_index <= INT8_MAX;
    b->keys[d] = (ust__dim_key){(int8_t)(sized ? UST__DIM_SIZE : -1), (int8_t)p->dim,
                                (int8_t)(sized ? p->arg_index : -1), (int8_t)p->bucket};
  }
}

void ust__route_key_format(const ust__binding *b, const ust__route_key *k, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "%s|%s|", b->display, k->device == UST__DEV_CUDA ? "cuda" : "cpu");
  for (int i = 0; i < k->n_dtypes && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "", ust__dtype_name(k->dtypes[i]));
  if (n < cap)
    n += (size_t)snprintf(buf + n, cap - n, "|");
  for (int d = 0; d < b->n_dims && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s=%lld", d ? "," : "", b->def->dims[d].name, (long long)k->dims[d]);
  if (k->phase != UST_PHASE_UNKNOWN && n < cap)
    snprintf(buf + n, cap - n, "|%s", ust__phase_name(k->phase));
}

void ust__binding_resolve(ust__binding *b, int nargs, const char *const *names, uint32_t schema_writes,
                          uint32_t schema_outs) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&b->resolved, &expected, 1)) {
    while (atomic_load(&b->resolved) != 2)
      sched_yield();
    return;
  }
  b->n_arg_names = nargs < UST__MAX_ARGS ? nargs : UST__MAX_ARGS;
  for (int i = 0; i < b->n_arg_names; i++)
    ust__copy_name(b->arg_names[i], sizeof b->arg_names[i], names[i]);
  ust__roofline_resolve(&b->roofline, nargs, names, b->display, b->router->log);
  /* Schemas are not always truthful about what an op writes (custom ops
   * registered without alias annotations): the curated list adds to them. */
  b->writes_mask = schema_writes;
  for (int w = 0; w < b->def->n_writes; w++) {
    int i = ust__arg_lookup(b->def->writes[w], b->n_arg_names, names);
    if (i >= 0 && i < 32)
      b->writes_mask |= 1u << i;
  }
  /* out= arguments, and those the definition says the op writes whole
   * without reading */
  b->overwrites_mask = schema_outs & b->writes_mask;
  for (int w = 0; w < b->def->n_overwrites; w++) {
    int i = ust__arg_lookup(b->def->overwrites[w], b->n_arg_names, names);
    if (i >= 0 && i < 32)
      b->overwrites_mask |= 1u << i;
  }
  b->overwrites_mask &= b->writes_mask;
  for (int d = 0; d < b->n_dims; d++) {
    if (ust__dim_resolve(&b->dims[d], nargs, names) != 0)
      ust__log(b->router->log, UST_LOG_WARN, "%s: key dimension '%s' names argument '%s', which %s does not have",
               b->op->def_path, b->def->dims[d].name, b->dims[d].arg, b->display);
  }
  ust__binding_keys_set(b);
  /* its calls may be floored by the bound ops they call: its own roofline
   * is absent (or was dropped just now for a missing argument) or an estimate */
  b->nested_ok = !b->roofline.present || b->def->roofline.estimate[0] != '\0';
  atomic_store(&b->resolved, 2);
}
