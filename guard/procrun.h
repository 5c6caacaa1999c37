/*
 * A native candidate run in a process of its own (candidate.qualify:
 * "process"): before the serving process ever loads it, the candidate
 * qualifies in a child process (plugin/qualifier.c) that receives copies of
 * real arguments over a socket, runs the candidate on them and sends every
 * tensor back for the guard to judge as it judges a call in shadow. A crash,
 * a hang or a broken answer there costs the serving process one failed
 * verification: the child is killed and the runner is lost for good, with
 * the evidence, and the serving process never loads the candidate.
 *
 * Both ends of the wire are here: ust__procrun_* for the serving process,
 * ust__procrun_serve for the child. CPU tensors travel as bytes over the
 * socket. GPU tensors (a build with a GPU backend) stay on the device: the
 * serving process copies them into an arena of its own device memory, the
 * child maps that arena (CUDA/HIP IPC) and runs the candidate there on a
 * stream of its own, in a GPU context of its own, so a kernel that faults or
 * spins is the child's to lose; the results are copied back onto the call's
 * stream.
 *
 * Threading: a runner serves one call at a time; a call that finds it busy
 * is not run there (UST__PROCRUN_BUSY, counted), so no serving thread waits
 * for another's call. The queries may be called from any thread and never
 * wait for a call (they read atomics). Nothing here aborts, exits or raises
 * a signal in the serving process (writes never raise SIGPIPE).
 *
 * Includes only base/. Internal header: never installed.
 */
#ifndef UST_PROCRUN_H
#define UST_PROCRUN_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

struct ust_candidate;
struct ust_candidate_call;

typedef struct ust__procrun ust__procrun;

/* What the child is started with: all borrowed for the call. */
typedef struct ust__procrun_spec {
  const char *exe;           /* the qualifying program */
  const char *path;          /* the candidate shared object */
  const char *sha256;        /* its pin */
  int n_deps;
  const char *const *dep_path; /* pinned dependencies, n_deps each */
  const char *const *dep_sha256;
  uint64_t start_deadline_ns; /* how long the child may take to load the candidate and answer */
  uint64_t memory_bytes;      /* the memory the candidate may take there (RLIMIT_DATA beyond the child's own); 0 none */
  uint64_t cpu_s;             /* the CPU seconds the child may use (RLIMIT_CPU); 0 none */
} ust__procrun_spec;

/* The child's exit status when it crashed or failed within reach of its
 * memory limit: refused as over it. */
#define UST__PROCRUN_EXIT_MEMORY 86

/* Start the child (stdio on /dev/null, a process group of its own that it
 * cannot leave, its limits) and wait for it to load the candidate: 0 and a new runner
 * in *out, whose name, target and ABI version the candidate's descriptor
 * gave (ust__procrun_name, ...); else an error naming what went wrong (the
 * program cannot be started, the pin or the descriptor was refused there,
 * the child crashed or did not answer in time) and *out untouched. */
int ust__procrun_start(const ust__procrun_spec *spec, ust__procrun **out);

/* Stop the child (it exits when its socket closes; killed if it lingers)
 * and free the runner. NULL is a no-op. */
void ust__procrun_free(ust__procrun *p);

const char *ust__procrun_name(const ust__procrun *p);
const char *ust__procrun_target(const ust__procrun *p);
unsigned ust__procrun_abi(const ust__procrun *p);
/* The child's process id (0 once it is gone). */
long ust__procrun_pid(ust__procrun *p);

/* Run one call there: the call's tensors (the caller's private copies, CPU
 * memory or one GPU's, call->stream ordering them) are sent, the candidate
 * runs on the child's copies, and every tensor (arguments and outputs) is
 * written back with what the candidate left in it (GPU tensors: by copies
 * queued on call->stream). A GPU call waits for call->stream's work before
 * it is sent. Returns the candidate's status (0: it succeeded) with its
 * message in msg; or UST__PROCRUN_LOST when the child crashed, did not
 * answer within deadline_ns or answered out of protocol, or the runner was
 * already lost: msg then says what happened, and the runner is lost for
 * good (ust__procrun_lost). */
#define UST__PROCRUN_LOST (-1000)
/* Or, the runner kept: the call cannot be sent there (tensors on several
 * devices, GPU tensors in a build without a GPU backend or on a capturing
 * stream, too many arguments, no device memory for the arena, or the child
 * could not map it); msg says why. */
#define UST__PROCRUN_UNSENT (-1001)
/* Or, nothing sent: another call holds the runner (counted,
 * ust__procrun_busy_count). */
#define UST__PROCRUN_BUSY (-1002)
int ust__procrun_call(ust__procrun *p, const struct ust_candidate_call *call, uint64_t deadline_ns, char *msg,
                      size_t cap);
/* 1 while a call holds the runner: a call planned now would find it busy. */
int ust__procrun_busy(ust__procrun *p);
/* A call not run there for that: counted. */
void ust__procrun_note_busy(ust__procrun *p);
/* Calls not run there because another held the runner. */
uint64_t ust__procrun_busy_count(const ust__procrun *p);

/* Refuse the candidate for good (a verification of a call it ran there
 * failed): the child is killed, why kept as the evidence. The first reason
 * stays. Never waits for a call in progress: that call reaps the child. */
void ust__procrun_refuse(ust__procrun *p, const char *why);
/* 1 once lost or refused; the evidence into why (cap bytes) when why is not NULL. */
int ust__procrun_lost(ust__procrun *p, char *why, size_t cap);
/* Calls run there, verifications of them that passed, and routes that
 * qualified there (route_qualified: this pass made its route qualify). */
uint64_t ust__procrun_runs(const ust__procrun *p);
void ust__procrun_note_passed(ust__procrun *p, int route_qualified);
uint64_t ust__procrun_passed(const ust__procrun *p);
uint64_t ust__procrun_routes_qualified(const ust__procrun *p);
/* What the child used: its peak resident set (KiB) and CPU time (user and
 * system, µs), read after each call and, once it ended, from its exit; and
 * its limits (0: none). Any thread, lock-free. */
typedef struct ust__procrun_usage {
  uint64_t peak_rss_kb, cpu_us, memory_limit_bytes, cpu_limit_s;
} ust__procrun_usage;
void ust__procrun_get_usage(const ust__procrun *p, ust__procrun_usage *out);

/* 1 when this build sends GPU tensors there. */
int ust__procrun_gpu(void);

/* The child's side: answer the calls arriving on fd with the candidate d
 * until the socket closes (returns 0) or the wire breaks (returns -1).
 * data_limit: the child's RLIMIT_DATA (0 none): a call that fails within
 * reach of it says so in its message (ust__procrun_near_limit). */
int ust__procrun_serve(int fd, const struct ust_candidate *d, uint64_t data_limit);
/* The child's data memory now (private writable mappings and heap, as
 * RLIMIT_DATA counts them), in bytes; 0 when unknown. Async-signal-safe. */
uint64_t ust__procrun_data_bytes(void);
/* 1 when data bytes are within reach of limit: an eighth of it, at least
 * 64 MiB (an allocation that failed there was refused by the limit). */
int ust__procrun_near_limit(uint64_t data, uint64_t limit);
/* The child's first answer: status 0 with d's name, target and ABI, or an
 * error status with why (d NULL). */
int ust__procrun_hello(int fd, const struct ust_candidate *d, int status, const char *why);

#endif
