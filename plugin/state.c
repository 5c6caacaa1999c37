/*
 * The rollout state file: the routes' own modes, so that a restart keeps
 * promotions and rollbacks. The state machine (guard/rollout.c) owns the
 * table; this file reads and writes it:
 *
 *   {"schema": "understudy.state v1",
 *    "routes": {KEY: {"mode": MODE, "canary": P, "reason": TEXT, "candidate": ID, "unix_ms": N,
 *                     "decision": {"state": "rejected"|"inconclusive"|"dry_run", "evidence": TEXT}}}}
 *
 * A row without "mode" keeps a promotion decision only: the route's mode is
 * the config's.
 *
 * Written whole, atomically (temp file, fsync, rename).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "plugin/plugin.h"

#define STATE_SCHEMA "understudy.state v1"

int ust__state_read(const char *path, int (*each)(void *ctx, const ust__rollout_row *row), void *ctx) {
  char *text = ust__read_text_file(path, UST__FILE_MAX);
  if (text == NULL) {
    if (errno == ENOENT)
      return 0; /* the first start: nothing to restore */
    return ust__error(UST_ECONFIG, "state file: %s", ust_last_error());
  }
  char what[4200];
  snprintf(what, sizeof what, "state file '%s'", path);
  cJSON *root = ust__json_parse(text, what, UST_ECONFIG);
  free(text);
  if (root == NULL)
    return UST_ECONFIG;
  int rc = 0;
  const cJSON *routes = NULL, *schema = NULL;
  if (!cJSON_IsObject(root))
    rc = ust__error(UST_ECONFIG, "state file '%s': not a JSON object", path);
  else if (!cJSON_IsString(schema = cJSON_GetObjectItemCaseSensitive(root, "schema")) ||
           strcmp(schema->valuestring, STATE_SCHEMA) != 0)
    rc = ust__error(UST_ECONFIG, "state file '%s': 'schema' must be \"" STATE_SCHEMA "\"", path);
  else if (!cJSON_IsObject(routes = cJSON_GetObjectItemCaseSensitive(root, "routes")))
    rc = ust__error(UST_ECONFIG, "state file '%s': 'routes' must be an object", path);
  for (const cJSON *it = routes != NULL ? routes->child : NULL; rc == 0 && it != NULL; it = it->next) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(it, "mode");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "canary");
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(it, "reason");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(it, "unix_ms");
    const cJSON *cand = cJSON_GetObjectItemCaseSensitive(it, "candidate");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(it, "decision");
    const cJSON *dstate = cJSON_GetObjectItemCaseSensitive(dec, "state");
    const cJSON *devid = cJSON_GetObjectItemCaseSensitive(dec, "evidence");
    ust__rollout_row row = {it->string, 0, cJSON_IsNumber(c) ? c->valuedouble : 0,
                          cJSON_IsString(why) ? why->valuestring : "", cJSON_IsString(cand) ? cand->valuestring : "",
                          cJSON_IsNumber(ms) && ms->valuedouble >= 0 && ms->valuedouble < 1.8e19
                              ? (uint64_t)ms->valuedouble : 0,
                          "", cJSON_IsString(devid) ? devid->valuestring : ""};
    const int decided = cJSON_IsString(dstate) && (strcmp(dstate->valuestring, "rejected") == 0 ||
                                                   strcmp(dstate->valuestring, "inconclusive") == 0 ||
                                                   strcmp(dstate->valuestring, "dry_run") == 0);
    if (decided)
      row.decision = dstate->valuestring;
    const int decision_only = m == NULL && decided; /* the route's mode stays the config's */
    if (decision_only)
      row.mode = -1;
    if (dec != NULL && !decided)
      rc = ust__error(UST_ECONFIG, "state file '%s': 'routes.%s.decision.state' must be rejected, inconclusive or "
                      "dry_run", path, it->string);
    else if (!decision_only && (!cJSON_IsString(m) || ust__mode_parse_any(m->valuestring, &row.mode, 1) != 0))
      rc = ust__error(UST_ECONFIG, "state file '%s': 'routes.%s.mode' must be a mode", path, it->string);
    else if (row.mode == UST__MODE_CANARY && (!cJSON_IsNumber(c) || !(c->valuedouble > 0 && c->valuedouble < 1)))
      rc = ust__error(UST_ECONFIG, "state file '%s': 'routes.%s.canary' must be a fraction in (0, 1)", path,
                      it->string);
    else if (strlen(it->string) >= UST__KEY_MAX)
      rc = ust__error(UST_ECONFIG, "state file '%s': a route key is too long", path);
    else
      rc = each(ctx, &row);
  }
  cJSON_Delete(root);
  return rc;
}

int ust__state_write(const char *path, const ust__rollout_row *rows, int n) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "schema", STATE_SCHEMA);
  cJSON *routes = cJSON_AddObjectToObject(root, "routes");
  for (int i = 0; i < n; i++) {
    cJSON *x = cJSON_AddObjectToObject(routes, rows[i].key);
    if (rows[i].mode >= 0) /* else the route's mode is the config's; the row keeps its decision */
      cJSON_AddStringToObject(x, "mode", ust__mode_name(rows[i].mode));
    if (rows[i].mode == UST__MODE_CANARY)
      cJSON_AddNumberToObject(x, "canary", rows[i].canary);
    if (rows[i].decision != NULL && rows[i].decision[0] != '\0') {
      cJSON *d = cJSON_AddObjectToObject(x, "decision");
      cJSON_AddStringToObject(d, "state", rows[i].decision);
      cJSON_AddStringToObject(d, "evidence", rows[i].evidence != NULL ? rows[i].evidence : "");
    }
    cJSON_AddStringToObject(x, "reason", rows[i].reason);
    if (rows[i].candidate[0] != '\0')
      cJSON_AddStringToObject(x, "candidate", rows[i].candidate);
    cJSON_AddNumberToObject(x, "unix_ms", (double)rows[i].unix_ms);
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (text == NULL)
    return ust__error(UST_ENOMEM, "state file: out of memory");
  /* never write what enable would refuse to read back */
  const size_t len = strlen(text);
  if (len > UST__FILE_MAX) {
    free(text);
    return ust__error(UST_EFULL, "state file %s: %d routes take %zu bytes, over the %u bytes enable reads back; the "
                      "previous state file is kept", path, n, len, UST__FILE_MAX);
  }
  int rc = ust__write_file_atomic(path, text, "state file");
  free(text);
  return rc;
}
