/*
 * understudy-qualify: the process a native candidate qualifies in
 * (candidate.qualify: "process"). Started by the serving process with its
 * end of a socket as descriptor 3:
 *
 *     understudy-qualify --candidate PATH --sha256 HEX [--dep PATH HEX]...
 *                        [--memory-bytes N] [--cpu-s N]
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
 * plugin/confine.c) and takes its limits: the candidate may map
 * --memory-bytes of data beyond what this process mapped by then
 * (RLIMIT_DATA: a GPU runtime's reserved address space is not data, nor is
 * a sanitizer's shadow counted against the candidate), and the process may
 * use --cpu-s of CPU time (RLIMIT_CPU: SIGXCPU ends it). A crash within
 * reach of the memory limit (an allocation it refused, then used) exits
 * with UST__PROCRUN_EXIT_MEMORY, so that the serving process names the
 * limit, not the crash.
 */

/* close_range is Linux's. */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/resource.h>
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

static uint64_t data_limit; /* RLIMIT_DATA as set; 0 none */

/* A crash (a fault, an abort) within reach of the memory limit: this
 * process exits naming it; any other ends as the signal would. */
static void on_crash(int sig) {
  if (ust__procrun_near_limit(ust__procrun_data_bytes(), data_limit))
    _exit(UST__PROCRUN_EXIT_MEMORY);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* The limits: 0, or why not (into why). */
static int take_limits(uint64_t memory_bytes, uint64_t cpu_s, char *why, size_t cap) {
  /* AddressSanitizer's allocator (built in, or preloaded as the sanitized
   * test pass does) maps data of its own beyond what was mapped here by
   * now, so that every crash would read as one at the limit, and the limit
   * meets the allocator before the candidate: under it no memory limit is
   * taken */
  if (dlsym(RTLD_DEFAULT, "__asan_init") != NULL)
    memory_bytes = 0;
  if (memory_bytes > 0) {
    const uint64_t own = ust__procrun_data_bytes();
    struct rlimit r = {(rlim_t)(own + memory_bytes), (rlim_t)(own + memory_bytes)};
    if (own == 0 || setrlimit(RLIMIT_DATA, &r) != 0) {
      snprintf(why, cap, "understudy-qualify: cannot limit its memory (RLIMIT_DATA): %s",
               own == 0 ? "its data size is unknown (/proc/self/statm)" : strerror(errno));
      return -1;
    }
    data_limit = own + memory_bytes;
    static char alt[1 << 16]; /* a fault for want of memory may come with no stack left to run on */
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sa.sa_flags = SA_ONSTACK | SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGABRT, &sa, NULL);
  }
  if (cpu_s > 0) {
    struct rlimit r = {(rlim_t)cpu_s, (rlim_t)cpu_s + 5}; /* SIGXCPU at the limit; SIGKILL if it outlives it */
    if (setrlimit(RLIMIT_CPU, &r) != 0) {
      snprintf(why, cap, "understudy-qualify: cannot limit its CPU time (RLIMIT_CPU): %s", strerror(errno));
      return -1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *path = NULL, *pin = NULL;
  ust__dep_pin deps[UST__MAX_DEPS];
  int n_deps = 0;
  uint64_t memory_bytes = 0, cpu_s = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--candidate") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else if (strcmp(argv[i], "--sha256") == 0 && i + 1 < argc) {
      pin = argv[++i];
    } else if (strcmp(argv[i], "--memory-bytes") == 0 && i + 1 < argc) {
      memory_bytes = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--cpu-s") == 0 && i + 1 < argc) {
      cpu_s = strtoull(argv[++i], NULL, 10);
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
  char limits_why[256];
  if (take_limits(memory_bytes, cpu_s, limits_why, sizeof limits_why) != 0) {
    ust__procrun_hello(FD, NULL, -1, limits_why);
    return 1;
  }
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
  return ust__procrun_serve(FD, d, data_limit) == 0 ? 0 : 1;
}
