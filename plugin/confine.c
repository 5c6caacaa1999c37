/* A process confining itself from signalling others (plugin/plugin.h,
 * ust__confine_signals): a seccomp filter, installed on every thread.
 *
 *  - kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo: allowed when their
 *    first argument names this process or 0 (its process group: the
 *    qualifying process leads one of its own); to any other, the process is
 *    killed with SIGSYS;
 *  - tkill, pidfd_send_signal, and a call of another numbering (i386's
 *    int $0x80 or x32's on x86-64): killed with SIGSYS;
 *  - ptrace, process_vm_readv, process_vm_writev: EPERM;
 *  - setsid, setpgid: EPERM, so that the process and whatever it forks
 *    stay in its process group, which the serving process ends with it;
 *  - everything else: allowed.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "plugin/plugin.h"

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

int ust__confine_signals(void) {
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
  static const long refused[] = {__NR_ptrace, __NR_process_vm_readv, __NR_process_vm_writev, __NR_setsid,
                                 __NR_setpgid};
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

