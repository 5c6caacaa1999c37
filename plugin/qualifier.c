/*
 * understudy-qualify: the process a native candidate qualifies in
 * (candidate.qualify: "process"). Started by the serving process with its
 * end of a socket as descriptor 3:
 *
 *     understudy-qualify --candidate PATH --sha256 HEX [--dep PATH HEX]...
 *
 * It verifies the pins and loads the candidate exactly as the serving
 * process would (plugin/verify.c), says hello with the descriptor's name,
 * target and ABI version (or why it could not load it), then runs the calls
 * the serving process sends until the socket closes (guard/procrun.c). A
 * crash or hang here is what the serving process is spared: it sees the
 * socket break or time out, kills this process and refuses the candidate.
 *
 * Before it starts a thread or loads the candidate (its constructors run
 * at load) this process confines itself (ust__confine_signals,
 * plugin/confine.c).
 */

/* close_range is Linux's. */
#define _GNU_SOURCE

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "guard/procrun.h"
#include "plugin/plugin.h"
#include "plugin/verify.h"
#include "understudy/candidate.h"

#define FD 3

/* Ends this process once the serving process is gone, even while a
 * candidate hangs (the socket's close reaches only a process reading it).
 * Not a parent-death signal: that follows the thread that started this
 * process, which may end long before the serving process does. */
static void *watch_parent(void *arg) {
  const pid_t parent = (pid_t)(intptr_t)arg;
  for (;;) {
    struct timespec t = {0, 200 * 1000 * 1000};
    nanosleep(&t, NULL);
    if (getppid() != parent)
      kill(0, SIGKILL); /* this process and whatever it forked: its group */
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *path = NULL, *pin = NULL;
  ust__dep_pin deps[UST__MAX_DEPS];
  int n_deps = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--candidate") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else if (strcmp(argv[i], "--sha256") == 0 && i + 1 < argc) {
      pin = argv[++i];
    } else if (strcmp(argv[i], "--dep") == 0 && i + 2 < argc && n_deps < UST__MAX_DEPS) {
      deps[n_deps].path = argv[++i];
      deps[n_deps++].sha256 = argv[++i];
    } else {
      fprintf(stderr, "understudy-qualify: unexpected argument '%s' (this program is started by understudy)\n",
              argv[i]);
      return 2;
    }
  }
  /* nothing of the serving process but the socket; gone when it is */
  close_range(FD + 1, ~0u, 0);
  signal(SIGPIPE, SIG_IGN);
  ust__confine_signals(); /* before any thread, before the candidate's constructors */
  pthread_t watcher;
  if (pthread_create(&watcher, NULL, watch_parent, (void *)(intptr_t)getppid()) == 0)
    pthread_detach(watcher);
  if (path == NULL || pin == NULL) {
    ust__procrun_hello(FD, NULL, -1, "understudy-qualify: started without --candidate and --sha256");
    return 2;
  }
  ust__loaded_deps loaded = {0};
  void *dl = NULL;
  int dl_fd = -1;
  const ust_candidate *d = NULL;
  int rc = ust__dlopen_verified_closure(path, pin, deps, n_deps, &loaded, &dl, &dl_fd);
  if (rc == 0)
    rc = ust__candidate_descriptor(dl, path, &d);
  if (rc != 0) {
    char why[1100];
    snprintf(why, sizeof why, "%s", ust_last_error());
    ust__procrun_hello(FD, NULL, rc, why);
    return 1;
  }
  if (ust__procrun_hello(FD, d, 0, NULL) != 0)
    return 1;
  return ust__procrun_serve(FD, d) == 0 ? 0 : 1;
}
