/* Candidates: loading a pinned native shared object, or noting a torch op. */
#include <dlfcn.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/plugin.h"
#include "plugin/verify.h"
#include "understudy/candidate.h"

/* The binding a candidate stands in for: the configured target, else the
 * native descriptor's, else the operator's first binding. */
static int pick_target(const char *field, const char *want, const ust__problem *p, char *out, size_t cap) {
  char first[UST__QUALNAME_MAX + UST__NAME_MAX];
  const ust__binding_def *b0 = &p->bindings[0];
  snprintf(first, sizeof first, "%s%s%s", b0->op, b0->overloads[0][0] ? "." : "", b0->overloads[0]);
  int n_bound = 0;
  for (int i = 0; i < p->n_bindings; i++)
    n_bound += p->bindings[i].n_overloads;
  if ((want == NULL || want[0] == '\0') && n_bound > 1)
    return ust__error(UST_ECONFIG, "config: '%s' is not set: operator '%s' binds %d ops (%s first); name the one "
                      "the candidate stands in for", field, p->name, n_bound, first);
  if (want == NULL || want[0] == '\0')
    want = first;
  for (int i = 0; i < p->n_bindings; i++)
    for (int o = 0; o < p->bindings[i].n_overloads; o++) {
      char name[UST__QUALNAME_MAX + UST__NAME_MAX];
      const char *ov = p->bindings[i].overloads[o];
      snprintf(name, sizeof name, "%s%s%s", p->bindings[i].op, ov[0] ? "." : "", ov);
      if (strcmp(name, want) == 0) {
        snprintf(out, cap, "%s", name);
        return 0;
      }
    }
  return ust__error(UST_ECONFIG, "config: '%s' is '%s', which operator '%s' (%s) does not bind", field, want,
                    p->name, p->path);
}

int ust__candidate_load(const ust__op_config *oc, const ust__problem *p, ust__candidate *lc) {
  memset(lc, 0, sizeof *lc);
  lc->dl_fd = -1;
  ust__cand *c = &lc->cand;
  const ust__cand_config *cc = &oc->cand;
  char field[UST__NAME_MAX + 48];
  snprintf(field, sizeof field, "operators.%s.candidate", oc->name);
  c->kind = cc->kind;
  c->compare = oc->compare >= 0 ? oc->compare : p->compare;
  c->atol = oc->atol;
  c->rtol = oc->rtol;
  c->aa_sample = oc->aa_sample;
  c->aa_q32 = ust__share_q32(oc->aa_sample);
  c->deadline_ns = (uint64_t)(oc->deadline_ms * 1e6);
  c->max_slowdown = oc->max_slowdown;
  snprintf(lc->sha256, sizeof lc->sha256, "%s", cc->sha256);
  if (cc->kind == UST__CAND_TORCH_OP) {
    const char *dot = strchr(strstr(cc->torch_op, "::") + 2, '.');
    size_t qlen = dot != NULL ? (size_t)(dot - cc->torch_op) : strlen(cc->torch_op);
    snprintf(c->torch_op, sizeof c->torch_op, "%.*s", (int)qlen, cc->torch_op);
    snprintf(c->torch_overload, sizeof c->torch_overload, "%s", dot != NULL ? dot + 1 : "");
    snprintf(c->name, sizeof c->name, "%s", cc->torch_op);
    snprintf(c->id, sizeof c->id, "torch_op:%s", cc->torch_op);
    char tfield[UST__NAME_MAX + 64];
    snprintf(tfield, sizeof tfield, "%s.target", field);
    return pick_target(tfield, cc->target, p, c->target, sizeof c->target);
  }
  snprintf(c->id, sizeof c->id, "sha256:%s", cc->sha256);
  if ((lc->path = ust__strdup(cc->path)) == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  ust__dep_pin pins[UST__MAX_DEPS];
  for (int k = 0; k < cc->n_deps; k++)
    pins[k] = (ust__dep_pin){cc->dep_path[k], cc->dep_sha256[k]};
  int rc = ust__dlopen_verified_closure(cc->path, cc->sha256, pins, cc->n_deps, &lc->deps, &lc->dl, &lc->dl_fd);
  if (rc != 0) {
    ust__candidate_unload(lc);
    return ust__error(rc, "config: '%s.native': %s", field, ust_last_error());
  }
  ust_candidate_get_fn get = NULL;
  void *sym = dlsym(lc->dl, UST_CANDIDATE_ENTRY);
  memcpy(&get, &sym, sizeof get);
  const ust_candidate *d = get != NULL ? get() : NULL;
  if (d == NULL) {
    rc = ust__error(UST_ECONFIG, "config: '%s.native': %s exports no %s() or it returned NULL", field, cc->path,
                    UST_CANDIDATE_ENTRY);
  } else if (d->size < offsetof(ust_candidate, ctx) + sizeof d->ctx || d->abi_version < 1 ||
             d->abi_version > UST_CANDIDATE_ABI_VERSION) {
    rc = ust__error(UST_ECONFIG,
                    "config: '%s.native': %s has descriptor size %u, ABI version %u; this understudy reads ABI "
                    "versions 1 to %d (size %zu)",
                    field, cc->path, d->size, d->abi_version, UST_CANDIDATE_ABI_VERSION, sizeof(ust_candidate));
  } else if (d->run == NULL || d->target == NULL) {
    rc = ust__error(UST_ECONFIG, "config: '%s.native': %s's descriptor has no run function or no target", field,
                    cc->path);
  } else if (cc->target[0] != '\0' && strcmp(cc->target, d->target) != 0) {
    rc = ust__error(UST_ECONFIG, "config: '%s.target' is '%s' but %s stands in for '%s'", field, cc->target,
                    cc->path, d->target);
  } else {
    char tfield[UST__NAME_MAX + 64];
    snprintf(tfield, sizeof tfield, "%s (target of %s)", field, cc->path);
    rc = pick_target(tfield, d->target, p, c->target, sizeof c->target);
  }
  if (rc != 0) {
    ust__candidate_unload(lc);
    return rc;
  }
  c->native = d;
  c->abi = (int)d->abi_version;
  snprintf(c->name, sizeof c->name, "%s", d->name != NULL ? d->name : cc->path);
  return 0;
}

void ust__candidate_unload(ust__candidate *c) {
  if (c == NULL)
    return;
  if (c->dl != NULL)
    dlclose(c->dl);
  if (c->dl != NULL && c->dl_fd >= 0)
    close(c->dl_fd);
  for (int k = c->deps.n - 1; k >= 0; k--) {
    dlclose(c->deps.dl[k]);
    close(c->deps.fd[k]);
  }
  c->deps.n = 0;
  free(c->path);
  c->dl = NULL;
  c->path = NULL;
  c->cand.native = NULL;
}
