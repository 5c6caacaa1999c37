/*
 * Runs every test of test_list.h in its own process with a timeout, prints
 * one line per test and closes with "N passed, N failed".
 * Usage: ust_test_runner [name-substring]
 */
#include <signal.h>
#include <sys/wait.h>
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

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  /* seconds a test may take: 30, or $UST_TEST_TIMEOUT_S (a run under Valgrind is some 30x slower) */
  const char *limit_env = getenv("UST_TEST_TIMEOUT_S");
  const unsigned limit = limit_env != NULL && atoi(limit_env) > 0 ? (unsigned)atoi(limit_env) : 30;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (argc > 1 && strstr(tests[i].name, argv[1]) == NULL)
      continue;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(limit);
      tests[i].fn();
      exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      printf("ok %s\n", tests[i].name);
      passed++;
    } else {
      if (WIFSIGNALED(status))
        printf("not ok %s (signal %d%s)\n", tests[i].name, WTERMSIG(status),
               WTERMSIG(status) == SIGALRM ? ": timeout" : "");
      else
        printf("not ok %s (exit %d)\n", tests[i].name, WEXITSTATUS(status));
      failed++;
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
