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
 * Before the candidate is loaded (its constructors run at load) this process
 * confines itself with a seccomp filter: a signal to any process but itself
 * (kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo to another, tkill,
 * pidfd_send_signal) kills this process with SIGSYS, which the serving
 * process reports as the evidence; ptrace and process_vm_readv/writev fail
 * with EPERM. It is not a sandbox: files, the network and the rest of the
 * system's calls are open to it, as to any process of its user.
 */

/* close_range is Linux's. */
#define _GNU_SOURCE

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
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

#if defined(__x86_64__)
#define CONFINE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define CONFINE_ARCH AUDIT_ARCH_AARCH64
#endif
#ifndef SECCOMP_RET_KILL_PROCESS
#define SECCOMP_RET_KILL_PROCESS SECCOMP_RET_KILL /* kernels before 4.14: the thread */
#endif
#ifndef SECCOMP_FILTER_FLAG_TSYNC
#define SECCOMP_FILTER_FLAG_TSYNC 1
#endif

/* The filter above, on every thread of this process; 0, or -1 where the
 * kernel or the architecture has none (this process then runs unconfined,
 * and says so on its standard error). */
static int confine(void) {
#if defined(CONFINE_ARCH) && defined(SYS_seccomp)
  const uint32_t self = (uint32_t)getpid();
  /* syscalls whose first argument names the process signalled: allowed for
   * this process, and for 0 (its process group, its own: the serving
   * process made it a group leader) */
  static const long by_pid[] = {__NR_kill, __NR_tgkill, __NR_rt_sigqueueinfo, __NR_rt_tgsigqueueinfo};
  static const long killed[] = {
    __NR_tkill,
#ifdef __NR_pidfd_send_signal
    __NR_pidfd_send_signal,
#endif
  };
  static const long refused[] = {__NR_ptrace, __NR_process_vm_readv, __NR_process_vm_writev};
  struct sock_filter f[80];
  int n = 0;
  /* jumps to the three returns, patched once their places are known: on a
   * false test (jf), on a true one (jt), or always (ja) */
  int jf_kill[16], jt_kill[16], ja_kill[16], jt_allow[16], jt_refuse[16];
  int n_jf_kill = 0, n_jt_kill = 0, n_ja_kill = 0, n_jt_allow = 0, n_jt_refuse = 0;
#define AT(field) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)offsetof(struct seccomp_data, field))
#define ARG0(half) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)(offsetof(struct seccomp_data, args[0]) + 4 * (half)))
#define JEQ(v) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(v), 0, 0)
  /* another architecture's calls (i386 through int $0x80 on x86-64) are
   * another numbering: killed */
  f[n++] = (struct sock_filter)AT(arch);
  jf_kill[n_jf_kill++] = n;
  f[n++] = (struct sock_filter)JEQ(CONFINE_ARCH);
  f[n++] = (struct sock_filter)AT(nr);
#if defined(__x86_64__)
  jt_kill[n_jt_kill++] = n; /* x32's numbering */
  f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 0);
#endif
  for (size_t i = 0; i < sizeof by_pid / sizeof by_pid[0]; i++) {
    /* not this call: past its check (7 instructions) */
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)by_pid[i], 0, 7);
    f[n++] = (struct sock_filter)ARG0(1); /* the high half: 0 for this process and for 0 */
    jf_kill[n_jf_kill++] = n;
    f[n++] = (struct sock_filter)JEQ(0);
    f[n++] = (struct sock_filter)ARG0(0);
    jt_allow[n_jt_allow++] = n;
    f[n++] = (struct sock_filter)JEQ(self);
    jt_allow[n_jt_allow++] = n;
    f[n++] = (struct sock_filter)JEQ(0);
    ja_kill[n_ja_kill++] = n; /* any other process */
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0);
    f[n++] = (struct sock_filter)AT(nr); /* the check loaded an argument: the number again */
  }
  for (size_t i = 0; i < sizeof killed / sizeof killed[0]; i++) {
    jt_kill[n_jt_kill++] = n;
    f[n++] = (struct sock_filter)JEQ(killed[i]);
  }
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    jt_refuse[n_jt_refuse++] = n;
    f[n++] = (struct sock_filter)JEQ(refused[i]);
  }
  const int allow = n;
  f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  const int kill_at = n;
  f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  const int refuse = n;
  f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA));
#undef JEQ
#undef ARG0
#undef AT
  for (int i = 0; i < n_jf_kill; i++)
    f[jf_kill[i]].jf = (uint8_t)(kill_at - jf_kill[i] - 1);
  for (int i = 0; i < n_jt_kill; i++)
    f[jt_kill[i]].jt = (uint8_t)(kill_at - jt_kill[i] - 1);
  for (int i = 0; i < n_ja_kill; i++)
    f[ja_kill[i]].k = (uint32_t)(kill_at - ja_kill[i] - 1);
  for (int i = 0; i < n_jt_allow; i++)
    f[jt_allow[i]].jt = (uint8_t)(allow - jt_allow[i] - 1);
  for (int i = 0; i < n_jt_refuse; i++)
    f[jt_refuse[i]].jt = (uint8_t)(refuse - jt_refuse[i] - 1);
  struct sock_fprog prog = {(unsigned short)n, f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) {
    fprintf(stderr, "understudy-qualify: running unconfined: seccomp: %s\n", strerror(errno));
    return -1;
  }
  return 0;
#else
  fprintf(stderr, "understudy-qualify: running unconfined: no seccomp filter for this architecture\n");
  return -1;
#endif
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
  confine(); /* before any thread, before the candidate's constructors */
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
