/*
 * Runs every test of test_list.h in its own process with a timeout, prints
 * one line per test (with the milliseconds it took) and closes with
 * "N passed, N failed" and, last, a line for scripts:
 * "ust_test_runner: passed=N failed=N seconds=S".
 * Usage: ust_test_runner [name-substring]
 */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/c/runner.h"
#include "tests/c/test_list.h"

#define DECLARE(name) void test_##name(void);
UST_TEST_LIST(DECLARE)
UST_TEST_LIST_TRACER(DECLARE)

static const struct {
  const char *name;
  void (*fn)(void);
} tests[] = {
#define ENTRY(name) {#name, test_##name},
    UST_TEST_LIST(ENTRY) UST_TEST_LIST_TRACER(ENTRY)};

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  /* Seconds a test may take before it is taken for hung: 300, or
   * $UST_TEST_TIMEOUT_S. A guard against hangs only: no test asserts on how
   * fast it ran, and the slowest takes a few seconds under ASan on a loaded
   * machine (Valgrind is some 30x slower still: run.sh gives it more). */
  const char *limit_env = getenv("UST_TEST_TIMEOUT_S");
  const unsigned limit = limit_env != NULL && atoi(limit_env) > 0 ? (unsigned)atoi(limit_env) : 300;
  const double start = seconds_now();
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (argc > 1 && strstr(tests[i].name, argv[1]) == NULL)
      continue;
    fflush(stdout);
    const double t0 = seconds_now();
    pid_t pid = fork();
    if (pid == 0) {
      alarm(limit);
      tests[i].fn();
      exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    const long ms = (long)((seconds_now() - t0) * 1e3);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      printf("ok %s (%ld ms)\n", tests[i].name, ms);
      passed++;
    } else {
      if (WIFSIGNALED(status))
        printf("not ok %s (signal %d%s, %ld ms)\n", tests[i].name, WTERMSIG(status),
               WTERMSIG(status) == SIGALRM ? ": timeout" : "", ms);
      else
        printf("not ok %s (exit %d, %ld ms)\n", tests[i].name, WEXITSTATUS(status), ms);
      failed++;
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  printf("ust_test_runner: passed=%d failed=%d seconds=%.1f\n", passed, failed, seconds_now() - start);
  return failed == 0 && passed > 0 ? 0 : 1;
}
