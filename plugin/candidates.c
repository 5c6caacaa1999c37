/* Candidates: loading a pinned native shared object (here, or first in a
 * qualifying process of its own), or noting a torch op. */

/* dladdr is a GNU extension that the build's POSIX level does not expose. */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <limits.h>
#include <errno.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

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

int ust__candidate_descriptor(void *dl, const char *path, const ust_candidate **out) {
  ust_candidate_get_fn get = NULL;
  void *sym = dlsym(dl, UST_CANDIDATE_ENTRY);
  memcpy(&get, &sym, sizeof get);
  const ust_candidate *d = get != NULL ? get() : NULL;
  if (d == NULL)
    return ust__error(UST_ECONFIG, "%s exports no %s() or it returned NULL", path, UST_CANDIDATE_ENTRY);
  if (d->size < offsetof(ust_candidate, ctx) + sizeof d->ctx || d->abi_version < 1 ||
      d->abi_version > UST_CANDIDATE_ABI_VERSION)
    return ust__error(UST_ECONFIG, "%s has descriptor size %u, ABI version %u; this understudy reads ABI versions 1 "
                      "to %d (size %zu)", path, d->size, d->abi_version, UST_CANDIDATE_ABI_VERSION,
                      sizeof(ust_candidate));
  if (d->run == NULL || d->target == NULL)
    return ust__error(UST_ECONFIG, "%s's descriptor has no run function or no target", path);
  if (d->abi_version >= 3 && d->size < offsetof(ust_candidate, reserved) + sizeof d->reserved)
    return ust__error(UST_ECONFIG, "%s has descriptor size %u for ABI version %u, which needs %zu", path, d->size,
                      d->abi_version, offsetof(ust_candidate, reserved) + sizeof d->reserved);
  if (d->abi_version >= 3 && ((d->flags & ~UST_CANDIDATE_NO_CAPTURE) != 0 || d->reserved != 0))
    return ust__error(UST_ECONFIG, "%s's descriptor has flags 0x%x and reserved %u: bits and fields this understudy "
                      "does not know must be 0 (flags it knows: UST_CANDIDATE_NO_CAPTURE 0x%x)", path, d->flags,
                      d->reserved, UST_CANDIDATE_NO_CAPTURE);
  *out = d;
  return 0;
}

int ust__qualifier_path(char *out, size_t cap) {
  const char *env = getenv("UNDERSTUDY_QUALIFIER");
  if (env != NULL && env[0] != '\0') {
    if (snprintf(out, cap, "%s", env) >= (int)cap)
      return ust__error(UST_EINVAL, "UNDERSTUDY_QUALIFIER is longer than %zu bytes", cap - 1);
    return 0;
  }
  Dl_info info;
  if (dladdr((void *)&ust__qualifier_path, &info) == 0 || info.dli_fname == NULL)
    return ust__error(UST_EINTERNAL, "cannot tell which file holds understudy's code (dladdr failed)");
  const char *slash = strrchr(info.dli_fname, '/');
  int dir_len = slash != NULL ? (int)(slash - info.dli_fname) : 1;
  const char *dir = slash != NULL ? info.dli_fname : ".";
  if (snprintf(out, cap, "%.*s/understudy-qualify", dir_len, dir) >= (int)cap)
    return ust__error(UST_EINVAL, "the path of the qualifying program is longer than %zu bytes", cap - 1);
  return 0;
}

/* qualify "process": the candidate is started in a process of its own,
 * which verifies its pins and loads it there; this process loads it only
 * once a route qualified there (ust__candidate_load_here). */
static int start_qualifying(const ust__op_config *oc, const ust__problem *p, const char *field, ust__candidate *lc) {
  const ust__cand_config *cc = &oc->cand;
  ust__cand *c = &lc->cand;
  char exe[PATH_MAX];
  int rc = ust__qualifier_path(exe, sizeof exe);
  if (rc != 0)
    return ust__error(rc, "config: '%s.qualify': %s", field, ust_last_error());
  if (access(exe, X_OK) != 0)
    return ust__error(UST_ECONFIG, "config: '%s.qualify' is \"process\" but the qualifying program %s cannot be run "
                      "(%s); it is built beside libunderstudy.so, or named by UNDERSTUDY_QUALIFIER", field, exe,
                      strerror(errno));
  const char *dep_paths[UST__MAX_DEPS], *dep_pins[UST__MAX_DEPS];
  for (int k = 0; k < cc->n_deps; k++) {
    dep_paths[k] = cc->dep_path[k];
    dep_pins[k] = cc->dep_sha256[k];
  }
  /* loading it there gets the same deadline as a call */
  ust__procrun_spec spec = {exe, cc->path, cc->sha256, cc->n_deps, dep_paths, dep_pins,
                            (uint64_t)(oc->deadline_ms * 1e6), (uint64_t)cc->qualify_memory_mb << 20,
                            (uint64_t)cc->qualify_cpu_s};
  ust__procrun *proc = NULL;
  if ((rc = ust__procrun_start(&spec, &proc)) != 0)
    return ust__error(rc, "config: '%s.native' (qualifying in its own process): %s", field, ust_last_error());
  lc->proc = proc;
  const char *target = ust__procrun_target(proc);
  if (cc->target[0] != '\0' && strcmp(cc->target, target) != 0) {
    rc = ust__error(UST_ECONFIG, "config: '%s.target' is '%s' but %s stands in for '%s'", field, cc->target,
                    cc->path, target);
  } else {
    char tfield[UST__NAME_MAX + 64];
    snprintf(tfield, sizeof tfield, "%s (target of %s)", field, cc->path);
    rc = pick_target(tfield, target, p, c->target, sizeof c->target);
  }
  if (rc != 0)
    return rc; /* the caller unloads, which stops the process */
  c->proc = proc;
  c->qualify_calls = (uint64_t)cc->qualify_calls;
  c->abi = (int)ust__procrun_abi(proc);
  const char *name = ust__procrun_name(proc);
  snprintf(c->name, sizeof c->name, "%s", name[0] != '\0' ? name : cc->path);
  return 0;
}

int ust__candidate_load_here(ust__candidate *lc) {
  ust__cand *c = &lc->cand;
  if (c->proc == NULL || lc->dl != NULL || ust__procrun_routes_qualified(c->proc) == 0 ||
      ust__procrun_lost(c->proc, NULL, 0))
    return 0;
  const ust__cand_config *cc = lc->config;
  ust__dep_pin pins[UST__MAX_DEPS];
  for (int k = 0; k < cc->n_deps; k++)
    pins[k] = (ust__dep_pin){cc->dep_path[k], cc->dep_sha256[k]};
  const ust_candidate *d = NULL;
  int rc = ust__dlopen_verified_closure(cc->path, cc->sha256, pins, cc->n_deps, &lc->deps, &lc->dl, &lc->dl_fd);
  if (rc == 0)
    rc = ust__candidate_descriptor(lc->dl, cc->path, &d);
  if (rc == 0 && (strcmp(d->target, ust__procrun_target(c->proc)) != 0 || (int)d->abi_version != c->abi))
    rc = ust__error(UST_ECONFIG, "%s describes itself here as '%s' (ABI %u), in its qualifying process as '%s' (ABI "
                    "%d)", cc->path, d->target, d->abi_version, ust__procrun_target(c->proc), c->abi);
  if (rc != 0) {
    char why[600];
    snprintf(why, sizeof why, "loading it into the serving process failed: %s", ust_last_error());
    ust__procrun_refuse(c->proc, why);
    return rc;
  }
  atomic_store_explicit(&c->loaded, d, memory_order_release);
  return 1;
}

/* The candidate's source (borrowed from the config, which the engine keeps
 * as long as the candidate) and its label; its "when" checked against the
 * key dimensions of every binding of the operator. */
static int source_and_when(const ust__cand_config *cc, const ust__problem *p, const char *field, ust__cand *c) {
  c->source_json = cc->source;
  c->label[0] = '\0';
  if (cc->source != NULL) {
    cJSON *src = cJSON_Parse(cc->source);
    const cJSON *label = cJSON_GetObjectItemCaseSensitive(src, "label");
    if (cJSON_IsString(label))
      snprintf(c->label, sizeof c->label, "%s", label->valuestring);
    cJSON_Delete(src);
  }
  c->n_when = cc->n_when;
  for (int k = 0; k < cc->n_when; k++) {
    int found = 0;
    for (int i = 0; i < p->n_bindings && !found; i++)
      for (int d = 0; d < p->bindings[i].n_dims && !found; d++)
        found = strcmp(p->bindings[i].dims[d].name, cc->when_dim[k]) == 0;
    if (!found)
      return ust__error(UST_ECONFIG, "config: '%s.when.%s' is no key dimension of operator '%s' (%s)", field,
                        cc->when_dim[k], p->name, p->path);
    snprintf(c->when_dim[k], sizeof c->when_dim[k], "%s", cc->when_dim[k]);
    c->when_value[k] = cc->when_value[k];
  }
  return 0;
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
  c->repro_bytes = (uint64_t)oc->repro_bytes;
  snprintf(lc->sha256, sizeof lc->sha256, "%s", cc->sha256);
  int rc = source_and_when(cc, p, field, c);
  if (rc != 0)
    return rc;
  if (cc->kind == UST__CAND_TORCH_OP) {
    const char *dot = strchr(strstr(cc->torch_op, "::") + 2, '.');
    size_t qlen = dot != NULL ? (size_t)(dot - cc->torch_op) : strlen(cc->torch_op);
    snprintf(c->torch_op, sizeof c->torch_op, "%.*s", (int)qlen, cc->torch_op);
    snprintf(c->torch_overload, sizeof c->torch_overload, "%s", dot != NULL ? dot + 1 : "");
    snprintf(c->name, sizeof c->name, "%s", cc->torch_op);
    snprintf(c->id, sizeof c->id, "torch_op:%s", cc->torch_op);
    if (cc->qualify == UST__QUALIFY_PROCESS) {
      c->torch_qualify = 1;
      c->qualify_calls = (uint64_t)cc->qualify_calls;
    }
    char tfield[UST__NAME_MAX + 64];
    snprintf(tfield, sizeof tfield, "%s.target", field);
    return pick_target(tfield, cc->target, p, c->target, sizeof c->target);
  }
  snprintf(c->id, sizeof c->id, "sha256:%s", cc->sha256);
  if ((lc->path = ust__strdup(cc->path)) == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  lc->config = cc;
  if (cc->qualify == UST__QUALIFY_PROCESS)
    return start_qualifying(oc, p, field, lc);
  ust__dep_pin pins[UST__MAX_DEPS];
  for (int k = 0; k < cc->n_deps; k++)
    pins[k] = (ust__dep_pin){cc->dep_path[k], cc->dep_sha256[k]};
  rc = ust__dlopen_verified_closure(cc->path, cc->sha256, pins, cc->n_deps, &lc->deps, &lc->dl, &lc->dl_fd);
  if (rc != 0) {
    ust__candidate_unload(lc);
    return ust__error(rc, "config: '%s.native': %s", field, ust_last_error());
  }
  const ust_candidate *d = NULL;
  rc = ust__candidate_descriptor(lc->dl, cc->path, &d);
  if (rc != 0) {
    rc = ust__error(rc, "config: '%s.native': %s", field, ust_last_error());
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
  c->no_capture = d->abi_version >= 3 && (d->flags & UST_CANDIDATE_NO_CAPTURE) != 0;
  snprintf(c->name, sizeof c->name, "%s", d->name != NULL ? d->name : cc->path);
  return 0;
}

void ust__candidate_unload(ust__candidate *c) {
  if (c == NULL)
    return;
  ust__procrun_free(c->proc);
  c->proc = NULL;
  c->cand.proc = NULL;
  atomic_store(&c->cand.loaded, NULL);
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
