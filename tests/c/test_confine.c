/* The qualifying process's confinement (plugin/confine.c), in forked
 * children: what it lets through, what kills the process, what fails. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runner.h"

#include "plugin/plugin.h"

enum { CONFINE_FAILED = 90, REFUSED = 77 };

static void on_usr1(int sig) { (void)sig; }

/* The exit code of a child that confined itself and then ran case c, or
 * -signal when a signal ended it. */
static int confined(int c) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0); /* a group of its own, as the qualifying process has */
    if (ust__confine_signals() != 0)
      _exit(CONFINE_FAILED);
    signal(SIGUSR1, on_usr1);
    long r = -1;
    switch (c) {
    case 0: r = kill(getpid(), 0); break;
    case 1: r = kill(0, 0); break; /* its own group */
    case 2: r = raise(SIGUSR1); break;
    case 3: r = syscall(SYS_tgkill, getpid(), gettid(), SIGUSR1); break;
    case 4: r = getppid() > 0 ? 0 : -1; break; /* an unfiltered call */
    case 5: r = kill(getppid(), 0); break;
    case 6: r = kill(-1, 0); break;
    case 7: r = syscall(SYS_tkill, gettid(), 0); break;
    case 8: r = syscall(SYS_kill, (long)getpid() | (1L << 32), 0); break; /* not this pid in 64 bits */
    case 9: r = syscall(SYS_rt_sigqueueinfo, getppid(), SIGUSR1, NULL); break;
    case 10:
      r = ptrace(PTRACE_ATTACH, getppid(), 0, 0);
      if (r == -1 && errno == EPERM)
        _exit(REFUSED);
      break;
#if defined(__x86_64__)
    case 11: { /* i386's kill (37) through int $0x80 */
      long ret;
      __asm__ volatile("int $0x80" : "=a"(ret) : "a"(37L), "b"((long)getppid()), "c"(0L) : "memory");
      r = ret;
      break;
    }
#endif
    case 12: /* leaving its process group: a new session, or another group */
      r = setsid() == -1 && errno == EPERM && setpgid(0, 0) == -1 && errno == EPERM && getpgrp() == getpid() ? 0 : 1;
      if (r == 0) {
        const pid_t kid = fork(); /* and so for what it forks */
        if (kid == 0)
          _exit(setsid() == -1 && errno == EPERM && setpgid(0, 0) == -1 && errno == EPERM ? 0 : 1);
        int kst = 1;
        while (kid > 0 && waitpid(kid, &kst, 0) < 0 && errno == EINTR) {
        }
        r = kid > 0 && WIFEXITED(kst) && WEXITSTATUS(kst) == 0 ? 0 : 1;
      }
      break;
    default: r = 0;
    }
    _exit(r == 0 ? 0 : 1);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFSIGNALED(st) ? -WTERMSIG(st) : WEXITSTATUS(st);
}

TEST(qualifying_process_confinement_kills_signals_to_others) {
  if (getenv("UST_TEST_UNDER_VALGRIND") != NULL) {
    /* Valgrind implements no seccomp: the confinement fails, and says so */
    ASSERT_INT_EQ(confined(0), CONFINE_FAILED);
    return;
  }
#if defined(__x86_64__) || defined(__aarch64__)
  /* itself, its group, its threads, and calls that name no process */
  for (int c = 0; c <= 4; c++)
    ASSERT_INT_EQ(confined(c), 0);
  /* another process, every process, a tkill, a pid with high bits set, a
   * queued signal to another: SIGSYS */
  for (int c = 5; c <= 9; c++)
    ASSERT_INT_EQ(confined(c), -SIGSYS);
  ASSERT_INT_EQ(confined(10), REFUSED); /* ptrace fails */
  ASSERT_INT_EQ(confined(12), 0);       /* setsid and setpgid fail, in it and in what it forks */
#if defined(__x86_64__)
  ASSERT_INT_EQ(confined(11), -SIGSYS); /* another numbering */
#endif
#else
  ASSERT_INT_EQ(confined(0), CONFINE_FAILED); /* no filter here: said, not pretended */
#endif
}
