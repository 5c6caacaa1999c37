/* A library a test candidate depends on. Built twice: as itself, and (with
 * UST_DEP_EVIL) as what an attacker would put in its place, whose
 * constructor leaves a mark where $UST_DEP_MARKER says. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((visibility("default"))) float ust_dep_silu(float x);

float ust_dep_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

#ifdef UST_DEP_EVIL
__attribute__((constructor)) static void mark(void) {
  const char *path = getenv("UST_DEP_MARKER");
  FILE *f = path != NULL ? fopen(path, "w") : NULL;
  if (f != NULL) {
    fputs("the attacker's constructor ran\n", f);
    fclose(f);
  }
}
#endif
