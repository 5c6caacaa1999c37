/* A native candidate run in a process of its own: the serving side (start,
 * call, refuse) and the child's side (hello, serve) of one wire.
 *
 * The wire is a stream socket between two processes of one build, so its
 * records are this build's structs, byte for byte:
 *   hello  (child):  wire_hello, name, target, message
 *   call   (server): wire_call, per argument wire_value + shape + strides +
 *                    name, per output the same, then the bytes every tensor
 *                    spans, arguments then outputs (CPU); or (GPU) the
 *                    wire_arena whose device memory holds them
 *   answer (child):  wire_answer, message, then (status 0, CPU) the bytes of
 *                    every tensor again, as the candidate left them (GPU:
 *                    they are in the arena)
 * The serving side trusts nothing the child says: lengths are bounded, the
 * bytes it takes back are exactly those it sent, and a record out of
 * protocol loses the runner. */

/* sigabbrev_np-free signal names, MSG_NOSIGNAL and pipe2 need no more than
 * the build's POSIX level; prctl's death signal is Linux's. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "guard/procrun.h"
#include "understudy/candidate.h"

#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
#define PROCRUN_GPU 1
#include "base/gpu_runtime.h"
#endif
#if defined(UST_GPU_HIP)
#define GPU_DL kDLROCM
#else
#define GPU_DL kDLCUDA
#endif

extern char **environ;

#define WIRE_MAGIC 0x51545355u /* "USTQ" */
#define WIRE_MAX_MSG 1024u
#define WIRE_MAX_NAME 256u
#define WIRE_MAX_VALUES 64
#define WIRE_MAX_OUTPUTS 16
#define WIRE_MAX_NDIM 16
#define WIRE_MAX_SPAN (1ull << 38) /* 256 GiB: more than any one tensor a CPU call hands over */
#define WIRE_IPC_HANDLE 64u /* CUDA's and HIP's IPC memory handles */
#define ARENA_ALIGN 256u    /* each tensor's start in the arena, as the allocators align */
#ifdef PROCRUN_GPU
_Static_assert(sizeof(cudaIpcMemHandle_t) == WIRE_IPC_HANDLE, "an IPC handle fits the wire");
#endif

typedef struct wire_hello {
  uint32_t magic;
  int32_t status; /* 0: loaded; else the message says why not */
  uint32_t abi, name_len, target_len, msg_len;
} wire_hello;

typedef struct wire_call {
  uint32_t magic;
  int32_t n_args, n_outputs;
  int32_t device; /* -1: CPU tensors, their bytes follow; else the GPU whose arena holds them */
} wire_call;

/* A GPU call's tensors: the serving process's device memory, for the child
 * to map. */
typedef struct wire_arena {
  unsigned char handle[WIRE_IPC_HANDLE];
  uint64_t bytes;
} wire_arena;

typedef struct wire_value {
  int32_t kind, writable, dtype, ndim;
  int64_t i;
  double f;
  uint8_t code, bits;
  uint16_t lanes;
  uint32_t name_len;
  uint64_t span;   /* bytes from the first element to one past the last */
  uint64_t offset; /* GPU: where they start in the arena */
} wire_value;

typedef struct wire_answer {
  uint32_t magic;
  int32_t status;
  uint32_t msg_len;
  int32_t reserved;
} wire_answer;

struct ust__procrun {
  /* one call at a time, never waited for by a serving thread or a reader
   * (they try it, or read the atomics below); guards fd, pidfd, the arena */
  pthread_mutex_t lock;
  /* guards pid only around signalling and reaping the child, which are
   * short: a process id is never signalled once it may name another */
  pthread_mutex_t pid_lock;
  int fd;
  pid_t pid;   /* the child, leader of a process group of its own */
  int pidfd;   /* the child's process descriptor (-1 where the kernel has none) */
  atomic_long pid_seen; /* pid, for readers: 0 once the child is reaped */
  atomic_int in_call;   /* 1 while a call holds the runner */
  /* 0; 2 while the first reason to lose the runner is written into why;
   * 1 once lost (why then never changes) */
  atomic_int lost;
  char why[512];
  char name[WIRE_MAX_NAME], target[WIRE_MAX_NAME];
  unsigned abi;
  atomic_uint_fast64_t runs, passed, routes_qualified, busy;
  atomic_uint_fast64_t peak_rss_kb, cpu_us; /* what the child used (ust__procrun_usage) */
  uint64_t memory_limit, cpu_limit;         /* its limits, as started */
#ifdef PROCRUN_GPU
  /* GPU calls' tensors, copied in and out on the call's stream; the event
   * follows the last copies out, which the next copies in wait for */
  void *arena;
  uint64_t arena_bytes;
  int arena_dev;
  cudaIpcMemHandle_t arena_handle;
  cudaEvent_t arena_free;
#endif
};

/* ---- deadline-bounded I/O ------------------------------------------------------------- */

#define NO_DEADLINE UINT64_MAX

/* 0 ready, -1 the deadline passed, -2 an error or, when watch is a
 * process's descriptor (a pidfd; -1: none), that process ended: a child
 * that crashed is known at once, even while a process it forked keeps its
 * socket open. */
static int wait_fd(int fd, short events, uint64_t deadline, int watch) {
  for (;;) {
    int ms = -1;
    if (deadline != NO_DEADLINE) {
      uint64_t now = ust__now_ns();
      if (now >= deadline)
        return -1;
      uint64_t left = (deadline - now + 999999u) / 1000000u;
      ms = left > 60000 ? 60000 : (int)left;
    }
    struct pollfd pfd[2] = {{fd, events, 0}, {watch, POLLIN, 0}};
    int n = poll(pfd, watch >= 0 ? 2 : 1, ms);
    if (n > 0 && watch >= 0 && (pfd[1].revents & POLLIN) && !(pfd[0].revents & events))
      return -2; /* the process ended, and nothing more came from it */
    if (n > 0)
      return 0; /* readable, writable, or hung up: the read or write says which */
    if (n < 0 && errno != EINTR)
      return -2;
  }
}

/* 0 sent; -1 the deadline passed; -2 the peer is gone or an error. */
static int send_all(int fd, const void *buf, size_t n, uint64_t deadline, int watch) {
  const char *p = buf;
  while (n > 0) {
    ssize_t k = send(fd, p, n > (1u << 20) ? (1u << 20) : n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int w = wait_fd(fd, POLLOUT, deadline, watch);
      if (w != 0)
        return w;
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else {
      return -2;
    }
  }
  return 0;
}

/* 0 received; -1 the deadline passed; -2 the peer closed or an error. */
static int recv_all(int fd, void *buf, size_t n, uint64_t deadline, int watch) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = recv(fd, p, n > (1u << 20) ? (1u << 20) : n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
    } else if (k == 0) {
      return -2;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = wait_fd(fd, POLLIN, deadline, watch);
      if (w != 0)
        return w;
    } else if (errno != EINTR) {
      return -2;
    }
  }
  return 0;
}

/* The bytes a tensor spans from its first element, -1 when they cannot be
 * described (a negative stride, an overflow, a lane count of 0). */
static int64_t span_of(const DLTensor *t) {
  const uint64_t elem = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7u) / 8u;
  if (t->ndim < 0 || t->ndim > WIRE_MAX_NDIM || elem == 0)
    return -1;
  uint64_t last = 0, dense = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    const int64_t n = t->shape[d];
    const int64_t s = t->strides != NULL ? t->strides[d] : (int64_t)dense;
    if (n < 0 || s < 0)
      return -1;
    if (n == 0)
      return 0;
    if ((uint64_t)(n - 1) > 0 && (uint64_t)s > (WIRE_MAX_SPAN / elem) / (uint64_t)(n - 1))
      return -1;
    last += (uint64_t)(n - 1) * (uint64_t)s;
    dense *= (uint64_t)n;
    if (last > WIRE_MAX_SPAN / elem || dense > WIRE_MAX_SPAN)
      return -1;
  }
  return (int64_t)((last + 1) * elem);
}

static char *tensor_bytes(const DLTensor *t) { return (char *)t->data + t->byte_offset; }

/* ---- GPU calls: the arena (serving side) --------------------------------------------- */

int ust__procrun_gpu(void) {
#ifdef PROCRUN_GPU
  return 1;
#else
  return 0;
#endif
}

#ifdef PROCRUN_GPU
/* Run with dev current, the caller's device put back after; and in relaxed
 * capture mode, so that allocating or waiting here cannot invalidate a
 * graph another thread is capturing (its mode put back after too). */
typedef struct gpu_scope {
  int dev, prev;
  enum cudaStreamCaptureMode mode;
} gpu_scope;

static int enter_device(int dev, gpu_scope *g) {
  g->dev = dev;
  g->prev = -1;
  g->mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&g->mode);
  if (cudaGetDevice(&g->prev) != cudaSuccess)
    return -1;
  return g->prev == dev || cudaSetDevice(dev) == cudaSuccess ? 0 : -1;
}

static void leave_device(gpu_scope *g) {
  if (g->prev >= 0 && g->prev != g->dev)
    cudaSetDevice(g->prev);
  cudaThreadExchangeStreamCaptureMode(&g->mode);
}

/* Free the arena once the copies out of it finished. On its device. */
static void arena_release(ust__procrun *p) {
  if (p->arena == NULL)
    return;
  cudaEventSynchronize(p->arena_free);
  cudaEventDestroy(p->arena_free);
  cudaFree(p->arena);
  cudaGetLastError(); /* a failure here must not be taken for torch's next launch's */
  p->arena = NULL;
  p->arena_bytes = 0;
}

/* Free the arena, if any, on its device (under p->lock). */
static void arena_drop(ust__procrun *p) {
  if (p->arena == NULL)
    return;
  gpu_scope g;
  if (enter_device(p->arena_dev, &g) == 0)
    arena_release(p);
  leave_device(&g);
}

/* An arena of at least bytes on dev (current), exported for the child. */
static cudaError_t arena_fit(ust__procrun *p, int dev, uint64_t bytes) {
  if (p->arena != NULL && p->arena_dev == dev && p->arena_bytes >= bytes)
    return cudaSuccess;
  arena_drop(p);
  if (p->arena != NULL)
    return cudaErrorInvalidDevice;
  const uint64_t want = (bytes + bytes / 2 + (2u << 20) - 1) / (2u << 20) * (2u << 20); /* room to grow, 2 MiB pages */
  cudaError_t e = cudaMalloc(&p->arena, want);
  if (e != cudaSuccess) {
    p->arena = NULL;
    return e;
  }
  e = cudaIpcGetMemHandle(&p->arena_handle, p->arena);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&p->arena_free, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaFree(p->arena);
    p->arena = NULL;
    return e;
  }
  p->arena_bytes = want;
  p->arena_dev = dev;
  return cudaSuccess;
}

/* Queue the copies between the call's tensors and the arena, into it or
 * out of it, on stream s (dev current). */
static cudaError_t arena_copy(ust__procrun *p, cudaStream_t s, const DLTensor *const *t, int n, const uint64_t *off,
                              int into) {
  cudaError_t e = cudaSuccess;
  for (int k = 0; e == cudaSuccess && k < n; k++) {
    char *arena = (char *)p->arena + off[k], *tensor = tensor_bytes(t[k]);
    if (span_of(t[k]) > 0)
      e = cudaMemcpyAsync(into ? arena : tensor, into ? tensor : arena, (size_t)span_of(t[k]),
                          cudaMemcpyDeviceToDevice, s);
  }
  return e;
}

/* Copy the call's tensors into the arena (after the previous call's copies
 * out) and wait for them: the child reads them from another context. */
static int arena_in(ust__procrun *p, int dev, void *stream, const DLTensor *const *t, int n, const uint64_t *off,
                    uint64_t bytes, char *msg, size_t cap) {
  cudaStream_t s = (cudaStream_t)stream;
  gpu_scope g;
  cudaError_t e = enter_device(dev, &g) == 0 ? cudaSuccess : cudaErrorInvalidDevice;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (e == cudaSuccess)
    e = cudaStreamIsCapturing(s, &cs);
  if (e == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
    leave_device(&g);
    snprintf(msg, cap, "qualifying process: the call's stream is capturing a graph");
    return -1;
  }
  if (e == cudaSuccess)
    e = arena_fit(p, dev, bytes);
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(s, p->arena_free, 0);
  if (e == cudaSuccess)
    e = arena_copy(p, s, t, n, off, 1);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(msg, cap, "qualifying process: copying the call's tensors into device memory the child maps failed: %s",
             cudaGetErrorString(e));
  }
  leave_device(&g);
  return e == cudaSuccess ? 0 : -1;
}

/* Queue the copies of what the candidate left in the arena back into the
 * call's tensors, on its stream. */
static int arena_out(ust__procrun *p, int dev, void *stream, const DLTensor *const *t, int n, const uint64_t *off,
                     char *msg, size_t cap) {
  cudaStream_t s = (cudaStream_t)stream;
  gpu_scope g;
  cudaError_t e = enter_device(dev, &g) == 0 ? cudaSuccess : cudaErrorInvalidDevice;
  if (e == cudaSuccess)
    e = arena_copy(p, s, t, n, off, 0);
  if (e == cudaSuccess)
    e = cudaEventRecord(p->arena_free, s);
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(msg, cap, "qualifying process: copying the candidate's results back failed: %s", cudaGetErrorString(e));
  }
  leave_device(&g);
  return e == cudaSuccess ? 0 : -1;
}
#else
static void arena_drop(ust__procrun *p) { (void)p; }
#endif

/* ---- the serving side -------------------------------------------------------------------- */

static const char *signal_name(int sig) {
  switch (sig) {
  case SIGSEGV: return "SIGSEGV";
  case SIGBUS: return "SIGBUS";
  case SIGABRT: return "SIGABRT";
  case SIGFPE: return "SIGFPE";
  case SIGILL: return "SIGILL";
  case SIGKILL: return "SIGKILL";
  case SIGTERM: return "SIGTERM";
  case SIGTRAP: return "SIGTRAP";
  case SIGSYS: return "SIGSYS";
  default: return "a signal";
  }
}

/* What the child used, as far as known: the peak only grows. */
static void note_usage(ust__procrun *p, uint64_t rss_kb, uint64_t cpu_us) {
  uint64_t was = atomic_load(&p->peak_rss_kb);
  while (rss_kb > was && !atomic_compare_exchange_weak(&p->peak_rss_kb, &was, rss_kb)) {
  }
  was = atomic_load(&p->cpu_us);
  while (cpu_us > was && !atomic_compare_exchange_weak(&p->cpu_us, &was, cpu_us)) {
  }
}

/* The running child's usage from /proc (its peak RSS, VmHWM, and its CPU
 * time), after a call. Under p->lock: the child is not reaped meanwhile. */
static void sample_usage(ust__procrun *p) {
  if (p->pid <= 0)
    return;
  char path[64], buf[4096];
  uint64_t rss_kb = 0, cpu_us = 0;
  snprintf(path, sizeof path, "/proc/%ld/status", (long)p->pid);
  FILE *f = fopen(path, "re");
  if (f != NULL) {
    while (fgets(buf, sizeof buf, f) != NULL)
      if (sscanf(buf, "VmHWM: %" SCNu64, &rss_kb) == 1)
        break;
    fclose(f);
  }
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)p->pid);
  f = fopen(path, "re");
  if (f != NULL) {
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *after = strrchr(buf, ')'); /* past the command's name, which may hold anything */
    unsigned long long ut = 0, st = 0;
    /* fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (after != NULL && sscanf(after + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2) {
      const long hz = sysconf(_SC_CLK_TCK);
      cpu_us = hz > 0 ? (uint64_t)(ut + st) * 1000000u / (uint64_t)hz : 0;
    }
  }
  note_usage(p, rss_kb, cpu_us);
}

void ust__procrun_get_usage(const ust__procrun *p, ust__procrun_usage *out) {
  ust__procrun *q = (ust__procrun *)p;
  out->peak_rss_kb = atomic_load(&q->peak_rss_kb);
  out->cpu_us = atomic_load(&q->cpu_us);
  out->memory_limit_bytes = p->memory_limit;
  out->cpu_limit_s = p->cpu_limit;
}

/* Reap the child (killed first unless it ends by itself within grace_ms)
 * and say how it ended into out. Under p->lock. */
static void reap(ust__procrun *p, int grace_ms, char *out, size_t cap) {
  if (p->fd >= 0)
    close(p->fd);
  p->fd = -1;
  if (p->pid <= 0) {
    snprintf(out, cap, "the qualifying process is gone");
    return;
  }
  if (p->pidfd >= 0)
    close(p->pidfd);
  p->pidfd = -1;
  /* ended by itself within grace_ms? (seen without reaping it: its process
   * group stays its own until then) */
  int ended = 0, present = 0;
  for (int waited = 0;; waited++) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    present = waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0;
    ended = present && si.si_pid == p->pid;
    if (!present || ended || waited >= grace_ms)
      break;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  /* the child, unless it ended, and whatever it forked: its process group.
   * Only while the child is there (running, or unreaped): its id cannot
   * name another process group then. */
  if (present && !ended)
    sample_usage(p); /* its peak while it still has one to read (a process that ended has none) */
  pthread_mutex_lock(&p->pid_lock);
  if (present)
    kill(-p->pid, SIGKILL);
  const int killed = present && !ended;
  int status = 0;
  pid_t got;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  while ((got = wait4(p->pid, &status, 0, &ru)) < 0 && errno == EINTR) {
  }
  p->pid = 0;
  atomic_store(&p->pid_seen, 0);
  pthread_mutex_unlock(&p->pid_lock);
  /* its CPU time to its end; not ru_maxrss, which Linux carries over exec
   * from the image forked off this process (this process's own RSS) */
  if (got > 0)
    note_usage(p, 0,
               (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000u +
                   (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec));
  if (got < 0)
    snprintf(out, cap, "the qualifying process could not be waited for: %s", strerror(errno));
  else if (killed)
    snprintf(out, cap, "killed by understudy");
  else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGXCPU)
    snprintf(out, cap, "the qualifying process used its CPU time limit (candidate.qualify_cpu_s: %llu s) and was "
             "killed by SIGXCPU", (unsigned long long)p->cpu_limit);
  else if (WIFSIGNALED(status))
    snprintf(out, cap, "the qualifying process was killed by %s (signal %d)", signal_name(WTERMSIG(status)),
             WTERMSIG(status));
  else if (WIFEXITED(status) && WEXITSTATUS(status) == UST__PROCRUN_EXIT_MEMORY && p->memory_limit > 0)
    snprintf(out, cap, "the qualifying process crashed at its memory limit (candidate.qualify_memory_mb: %llu MiB "
             "beyond its own)", (unsigned long long)(p->memory_limit >> 20));
  else if (WIFEXITED(status))
    snprintf(out, cap, "the qualifying process exited with status %d", WEXITSTATUS(status));
  else
    snprintf(out, cap, "the qualifying process ended");
}

/* The first reason to lose the runner, kept: 1 when this one is it. Any
 * thread; readers see why whole once lost reads 1. */
static int set_why(ust__procrun *p, const char *what, const char *ended) {
  int none = 0;
  if (!atomic_compare_exchange_strong(&p->lost, &none, 2))
    return 0;
  if (what != NULL && what[0] != '\0' && ended != NULL)
    snprintf(p->why, sizeof p->why, "%s; %s", what, ended);
  else
    snprintf(p->why, sizeof p->why, "%s", what != NULL && what[0] != '\0' ? what : ended);
  ust__procrun_usage u;
  ust__procrun_get_usage(p, &u);
  const size_t len = strlen(p->why);
  if (u.peak_rss_kb > 0 || u.cpu_us > 0)
    snprintf(p->why + len, sizeof p->why - len, " (the qualifying process: peak RSS %.1f MiB, CPU %.2f s)",
             (double)u.peak_rss_kb / 1024.0, (double)u.cpu_us / 1e6);
  atomic_store_explicit(&p->lost, 1, memory_order_release);
  return 1;
}

/* Lose the runner for good (under p->lock): the child is reaped, what
 * happened and how it ended kept as the evidence. */
static void lose(ust__procrun *p, int grace_ms, const char *what) {
  char ended[160];
  reap(p, grace_ms, ended, sizeof ended);
  arena_drop(p); /* no call goes there again */
  set_why(p, what, ended);
}

/* What a failed receive means, for the evidence. */
static void lose_on(ust__procrun *p, int io, uint64_t deadline_ns, const char *during) {
  char what[200];
  if (io == -1) {
    snprintf(what, sizeof what, "the qualifying process did not answer within %.0f ms %s", (double)deadline_ns / 1e6,
             during);
    lose(p, 0, what);
  } else {
    /* closed: the child is ending; give it a moment to be reaped as it ends */
    snprintf(what, sizeof what, "the qualifying process broke off %s", during);
    lose(p, 200, what);
  }
}

/* Read a length-prefixed text of at most WIRE_MAX_MSG bytes into out. */
static int recv_text(int fd, uint32_t len, char *out, size_t cap, uint64_t deadline, int watch) {
  char buf[WIRE_MAX_MSG + 1];
  if (len > WIRE_MAX_MSG)
    return -3;
  int io = recv_all(fd, buf, len, deadline, watch);
  if (io != 0)
    return io;
  buf[len] = '\0';
  for (uint32_t k = 0; k < len; k++)
    if (buf[k] == '\0' || (unsigned char)buf[k] < 0x20)
      buf[k] = ' ';
  snprintf(out, cap, "%s", buf);
  return 0;
}

int ust__procrun_start(const ust__procrun_spec *spec, ust__procrun **out) {
  if (spec == NULL || spec->exe == NULL || spec->path == NULL || spec->sha256 == NULL || out == NULL ||
      spec->n_deps < 0 || spec->n_deps > 64)
    return ust__error(UST_EINVAL, "qualifying process: invalid arguments");
  ust__procrun *p = calloc(1, sizeof *p);
  if (p == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  pthread_mutex_init(&p->lock, NULL);
  pthread_mutex_init(&p->pid_lock, NULL);
  p->fd = -1;
  p->pidfd = -1;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    int rc = ust__error(UST_EIO, "qualifying process: socketpair failed: %s", strerror(errno));
    ust__procrun_free(p);
    return rc;
  }
  /* the child's end becomes its descriptor 3; one already at 3 is moved
   * first, since dup2 onto itself would keep close-on-exec */
  int child_fd = sv[1];
  if (child_fd == 3) {
    child_fd = fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
    close(sv[1]);
  }
  const char *argv[12 + 3 * 64];
  char mem[32], cpu[32];
  int n = 0;
  argv[n++] = spec->exe;
  argv[n++] = "--candidate";
  argv[n++] = spec->path;
  argv[n++] = "--sha256";
  argv[n++] = spec->sha256;
  p->memory_limit = spec->memory_bytes;
  p->cpu_limit = spec->cpu_s;
  if (spec->memory_bytes > 0) {
    snprintf(mem, sizeof mem, "%" PRIu64, spec->memory_bytes);
    argv[n++] = "--memory-bytes";
    argv[n++] = mem;
  }
  if (spec->cpu_s > 0) {
    snprintf(cpu, sizeof cpu, "%" PRIu64, spec->cpu_s);
    argv[n++] = "--cpu-s";
    argv[n++] = cpu;
  }
  for (int k = 0; k < spec->n_deps; k++) {
    argv[n++] = "--dep";
    argv[n++] = spec->dep_path[k];
    argv[n++] = spec->dep_sha256[k];
  }
  argv[n] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&fa, child_fd, 3);
  /* nothing of the serving process's stdio: what the candidate prints goes
   * nowhere, and never fills a pipe someone must read */
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGSEGV);
  sigaddset(&defaults, SIGBUS);
  sigaddset(&defaults, SIGFPE);
  sigaddset(&defaults, SIGILL);
  sigaddset(&defaults, SIGABRT);
  sigaddset(&defaults, SIGXCPU);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0); /* a group of its own: what it forks ends with it */
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  int err = child_fd < 0 ? errno : posix_spawn(&pid, spec->exe, &fa, &attr, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (child_fd >= 0)
    close(child_fd);
  p->fd = sv[0];
  if (err != 0) {
    int rc = ust__error(UST_EIO, "qualifying process: cannot start %s: %s", spec->exe, strerror(err));
    ust__procrun_free(p);
    return rc;
  }
  p->pid = pid;
  atomic_store(&p->pid_seen, (long)pid);
#ifdef SYS_pidfd_open
  p->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
  const uint64_t deadline = ust__now_ns() + spec->start_deadline_ns;
  wire_hello h;
  char msg[WIRE_MAX_MSG + 1] = "";
  int io = recv_all(p->fd, &h, sizeof h, deadline, p->pidfd);
  if (io == 0 && h.magic != WIRE_MAGIC)
    io = -3;
  if (io == 0 && (h.name_len >= WIRE_MAX_NAME || h.target_len >= WIRE_MAX_NAME))
    io = -3;
  if (io == 0)
    io = recv_text(p->fd, h.name_len, p->name, sizeof p->name, deadline, p->pidfd);
  if (io == 0)
    io = recv_text(p->fd, h.target_len, p->target, sizeof p->target, deadline, p->pidfd);
  if (io == 0)
    io = recv_text(p->fd, h.msg_len, msg, sizeof msg, deadline, p->pidfd);
  if (io != 0) {
    pthread_mutex_lock(&p->lock);
    if (io == -3)
      lose(p, 0, "the qualifying process answered out of protocol while loading the candidate");
    else
      lose_on(p, io, spec->start_deadline_ns, "while loading the candidate");
    pthread_mutex_unlock(&p->lock);
    int rc = ust__error(UST_ECONFIG, "%s: %s", spec->path, p->why);
    ust__procrun_free(p);
    return rc;
  }
  if (h.status != 0) {
    int rc = ust__error(UST_ECONFIG, "%s", msg);
    ust__procrun_free(p);
    return rc;
  }
  p->abi = h.abi;
  *out = p;
  return 0;
}

void ust__procrun_free(ust__procrun *p) {
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->lock);
  char ended[160];
  if (p->pid > 0 || p->fd >= 0)
    reap(p, 500, ended, sizeof ended); /* the child ends on its socket's close */
  arena_drop(p);
  pthread_mutex_unlock(&p->lock);
  pthread_mutex_destroy(&p->lock);
  pthread_mutex_destroy(&p->pid_lock);
  free(p);
}

const char *ust__procrun_name(const ust__procrun *p) { return p->name; }
const char *ust__procrun_target(const ust__procrun *p) { return p->target; }
unsigned ust__procrun_abi(const ust__procrun *p) { return p->abi; }

long ust__procrun_pid(ust__procrun *p) { return atomic_load_explicit(&p->pid_seen, memory_order_relaxed); }

int ust__procrun_busy(ust__procrun *p) { return atomic_load_explicit(&p->in_call, memory_order_relaxed) != 0; }

void ust__procrun_note_busy(ust__procrun *p) { atomic_fetch_add_explicit(&p->busy, 1, memory_order_relaxed); }

uint64_t ust__procrun_busy_count(const ust__procrun *p) { return atomic_load(&((ust__procrun *)p)->busy); }

uint64_t ust__procrun_runs(const ust__procrun *p) { return atomic_load(&((ust__procrun *)p)->runs); }
void ust__procrun_note_passed(ust__procrun *p, int route_qualified) {
  atomic_fetch_add(&p->passed, 1);
  if (route_qualified)
    atomic_fetch_add(&p->routes_qualified, 1);
}
uint64_t ust__procrun_routes_qualified(const ust__procrun *p) {
  return atomic_load(&((ust__procrun *)p)->routes_qualified);
}
uint64_t ust__procrun_passed(const ust__procrun *p) { return atomic_load(&((ust__procrun *)p)->passed); }

int ust__procrun_lost(ust__procrun *p, char *why, size_t cap) {
  int lost = atomic_load_explicit(&p->lost, memory_order_acquire);
  if (lost == 0)
    return 0;
  while (lost == 2) { /* the first reason is being written: a few instructions */
    sched_yield();
    lost = atomic_load_explicit(&p->lost, memory_order_acquire);
  }
  if (why != NULL && cap > 0)
    snprintf(why, cap, "%s", p->why);
  return 1;
}

void ust__procrun_refuse(ust__procrun *p, const char *why) {
  if (!set_why(p, why != NULL ? why : "refused", NULL))
    return;
  if (pthread_mutex_trylock(&p->lock) == 0) {
    char ended[160];
    reap(p, 0, ended, sizeof ended);
    arena_drop(p);
    pthread_mutex_unlock(&p->lock);
    return;
  }
  /* a call holds the runner: the child (and whatever it forked) is killed
   * now, and that call, seeing it end, reaps it */
  pthread_mutex_lock(&p->pid_lock);
  if (p->pid > 0)
    kill(-p->pid, SIGKILL);
  pthread_mutex_unlock(&p->pid_lock);
}

/* One value's record (a tensor: its shape, strides and span), as the
 * candidate ABI describes it. */
static void describe(const ust_value *v, const DLTensor *t, int32_t dtype, uint64_t offset, wire_value *w) {
  memset(w, 0, sizeof *w);
  w->kind = v != NULL ? v->kind : UST_VALUE_TENSOR;
  w->writable = v != NULL ? v->writable : 1;
  w->i = v != NULL ? v->i : 0;
  w->f = v != NULL ? v->f : 0;
  w->name_len = v != NULL && v->name != NULL ? (uint32_t)strnlen(v->name, WIRE_MAX_NAME - 1) : 0;
  if (t != NULL) {
    w->dtype = dtype;
    w->ndim = t->ndim;
    w->code = t->dtype.code;
    w->bits = t->dtype.bits;
    w->lanes = t->dtype.lanes;
    int64_t s = span_of(t);
    w->span = s > 0 ? (uint64_t)s : 0;
    w->offset = offset;
  }
}

static int send_value(int fd, const ust_value *v, const DLTensor *t, int32_t dtype, uint64_t offset,
                      uint64_t deadline, int watch) {
  wire_value w;
  describe(v, t, dtype, offset, &w);
  int io = send_all(fd, &w, sizeof w, deadline, watch);
  if (io == 0 && t != NULL) {
    int64_t strides[WIRE_MAX_NDIM];
    int64_t dense = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      strides[d] = t->strides != NULL ? t->strides[d] : dense;
      dense *= t->shape[d];
    }
    io = send_all(fd, t->shape, sizeof(int64_t) * (size_t)t->ndim, deadline, watch);
    if (io == 0)
      io = send_all(fd, strides, sizeof(int64_t) * (size_t)t->ndim, deadline, watch);
  }
  if (io == 0 && w.name_len > 0)
    io = send_all(fd, v->name, w.name_len, deadline, watch);
  return io;
}

/* One call, the runner held (p->lock, p->in_call): ust__procrun_call's. */
static int call_held(ust__procrun *p, const ust_candidate_call *call, const DLTensor *const *tensors, int n_t,
                     const uint64_t *off, uint64_t arena_bytes, int gpu, uint64_t deadline_ns, char *msg, size_t cap) {
  wire_arena wa;
  memset(&wa, 0, sizeof wa);
#ifdef PROCRUN_GPU
  if (gpu >= 0) {
    if (arena_in(p, gpu, call->stream, tensors, n_t, off, arena_bytes > 0 ? arena_bytes : 1, msg, cap) != 0) {
      return UST__PROCRUN_UNSENT;
    }
    memcpy(wa.handle, &p->arena_handle, sizeof wa.handle);
    wa.bytes = p->arena_bytes;
  }
#endif
  atomic_fetch_add(&p->runs, 1);
  const uint64_t deadline = ust__now_ns() + deadline_ns;
  wire_call wc = {WIRE_MAGIC, call->n_args, call->n_outputs, gpu};
  int io = send_all(p->fd, &wc, sizeof wc, deadline, p->pidfd);
  int t = 0; /* the tensors' index, in the order they are described */
  for (int i = 0; io == 0 && i < call->n_args; i++) {
    const ust_value *v = ust_candidate_arg(call, i);
    const int is_t = v->kind == UST_VALUE_TENSOR;
    io = send_value(p->fd, v, is_t ? &v->tensor : NULL, v->dtype, is_t ? off[t] : 0, deadline, p->pidfd);
    t += is_t;
  }
  for (int k = 0; io == 0 && k < call->n_outputs; k++, t++)
    io = send_value(p->fd, NULL, &call->outputs[k], call->output_dtypes != NULL ? call->output_dtypes[k] : 0, off[t],
                    deadline, p->pidfd);
  if (gpu >= 0 && io == 0)
    io = send_all(p->fd, &wa, sizeof wa, deadline, p->pidfd);
  for (int k = 0; gpu < 0 && io == 0 && k < n_t; k++)
    io = send_all(p->fd, tensor_bytes(tensors[k]), (size_t)span_of(tensors[k]), deadline, p->pidfd);
  if (io != 0) {
    lose_on(p, io, deadline_ns, "while taking a call");
    ust__procrun_lost(p, msg, cap);
    return UST__PROCRUN_LOST;
  }
  wire_answer a;
  io = recv_all(p->fd, &a, sizeof a, deadline, p->pidfd);
  if (io == 0 && (a.magic != WIRE_MAGIC || a.msg_len > WIRE_MAX_MSG))
    io = -3;
  char text[WIRE_MAX_MSG + 1] = "";
  if (io == 0)
    io = recv_text(p->fd, a.msg_len, text, sizeof text, deadline, p->pidfd);
  for (int k = 0; gpu < 0 && io == 0 && a.status == 0 && k < n_t; k++)
    io = recv_all(p->fd, tensor_bytes(tensors[k]), (size_t)span_of(tensors[k]), deadline, p->pidfd);
  if (io != 0) {
    if (io == -3)
      lose(p, 0, "the qualifying process answered out of protocol");
    else
      lose_on(p, io, deadline_ns, "while the candidate ran");
    ust__procrun_lost(p, msg, cap);
    return UST__PROCRUN_LOST;
  }
  snprintf(msg, cap, "%s", text);
  if (a.status == UST__PROCRUN_UNSENT) {
    /* the child could not take a GPU call (map the arena, make a stream):
     * qualification cannot happen there, and no later call would fare
     * better. A CPU call is never answered so. Either way the runner is
     * lost, with what the child said. */
    char what[WIRE_MAX_MSG + 64];
    snprintf(what, sizeof what, "%s", gpu >= 0 ? text : "the qualifying process answered out of protocol");
    lose(p, 0, what);
    ust__procrun_lost(p, msg, cap);
    return UST__PROCRUN_LOST;
  }
#ifdef PROCRUN_GPU
  if (gpu >= 0 && a.status == 0 && arena_out(p, gpu, call->stream, tensors, n_t, off, msg, cap) != 0) {
    return UST__PROCRUN_UNSENT;
  }
#endif
  return a.status == UST__PROCRUN_LOST || a.status == UST__PROCRUN_BUSY ? -1 : a.status;
}


int ust__procrun_call(ust__procrun *p, const ust_candidate_call *call, uint64_t deadline_ns, char *msg, size_t cap) {
  if (cap > 0)
    msg[0] = '\0';
  if (call->n_args < 0 || call->n_args > WIRE_MAX_VALUES || call->n_outputs < 0 ||
      call->n_outputs > WIRE_MAX_OUTPUTS) {
    snprintf(msg, cap, "qualifying process: a call of %d arguments and %d outputs is more than it takes",
             call->n_args, call->n_outputs);
    return UST__PROCRUN_UNSENT;
  }
  const DLTensor *tensors[WIRE_MAX_VALUES + WIRE_MAX_OUTPUTS];
  int n_t = 0;
  for (int i = 0; i < call->n_args; i++) {
    const ust_value *v = ust_candidate_arg(call, i);
    if (v->kind == UST_VALUE_TENSOR)
      tensors[n_t++] = &v->tensor;
  }
  for (int k = 0; k < call->n_outputs; k++)
    tensors[n_t++] = &call->outputs[k];
  /* all on the CPU, or all on one GPU (then laid out in the arena) */
  const int gpu = n_t > 0 && tensors[0]->device.device_type == GPU_DL ? (int)tensors[0]->device.device_id : -1;
  uint64_t off[WIRE_MAX_VALUES + WIRE_MAX_OUTPUTS] = {0}, arena_bytes = 0;
  for (int k = 0; k < n_t; k++) {
    const DLDevice d = tensors[k]->device;
    const int same = gpu < 0 ? d.device_type == kDLCPU
                             : ust__procrun_gpu() && d.device_type == GPU_DL && (int)d.device_id == gpu;
    if (!same || span_of(tensors[k]) < 0 || (span_of(tensors[k]) > 0 && tensors[k]->data == NULL)) {
      snprintf(msg, cap, "qualifying process: only tensors with non-negative strides, all on the CPU or all on one "
                         "GPU%s, can be sent there", ust__procrun_gpu() ? "" : " (this build has no GPU backend: CPU)");
      return UST__PROCRUN_UNSENT;
    }
    arena_bytes = (arena_bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    off[k] = arena_bytes;
    arena_bytes += (uint64_t)span_of(tensors[k]);
  }
  /* a call that finds the runner busy is not run (production serves it):
   * no serving thread waits for another's call there */
  if (pthread_mutex_trylock(&p->lock) != 0) {
    ust__procrun_note_busy(p);
    snprintf(msg, cap, "qualifying process: busy with another call");
    return UST__PROCRUN_BUSY;
  }
  int rc;
  if (ust__procrun_lost(p, msg, cap) || p->fd < 0) {
    if (cap > 0 && msg[0] == '\0')
      snprintf(msg, cap, "the qualifying process is gone");
    if (p->fd >= 0 || p->pid > 0) { /* refused while a call held it, and not reaped since */
      char ended[160];
      reap(p, 0, ended, sizeof ended);
      arena_drop(p);
    }
    rc = UST__PROCRUN_LOST;
  } else {
    atomic_store(&p->in_call, 1);
    rc = call_held(p, call, tensors, n_t, off, arena_bytes, gpu, deadline_ns, msg, cap);
    if (rc != UST__PROCRUN_LOST)
      sample_usage(p);
    if (rc != UST__PROCRUN_LOST && atomic_load(&p->lost) != 0) { /* refused meanwhile: reaped now */
      char ended[160];
      reap(p, 0, ended, sizeof ended);
      arena_drop(p);
    }
    atomic_store(&p->in_call, 0);
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

/* ---- the child's side ------------------------------------------------------------------- */

static int send_text(int fd, const char *s, uint32_t len) {
  return len > 0 ? send_all(fd, s, len, NO_DEADLINE, -1) : 0;
}

int ust__procrun_hello(int fd, const ust_candidate *d, int status, const char *why) {
  const char *name = d != NULL && d->name != NULL ? d->name : "";
  const char *target = d != NULL && d->target != NULL ? d->target : "";
  why = why != NULL ? why : "";
  wire_hello h = {WIRE_MAGIC, status, d != NULL ? d->abi_version : 0, (uint32_t)strnlen(name, WIRE_MAX_NAME - 1),
                  (uint32_t)strnlen(target, WIRE_MAX_NAME - 1), (uint32_t)strnlen(why, WIRE_MAX_MSG)};
  int io = send_all(fd, &h, sizeof h, NO_DEADLINE, -1);
  if (io == 0)
    io = send_text(fd, name, h.name_len);
  if (io == 0)
    io = send_text(fd, target, h.target_len);
  if (io == 0)
    io = send_text(fd, why, h.msg_len);
  return io == 0 ? 0 : -1;
}

/* One call's storage in the child. */
typedef struct child_call {
  ust_value values[WIRE_MAX_VALUES];
  DLTensor outputs[WIRE_MAX_OUTPUTS];
  int32_t output_dtypes[WIRE_MAX_OUTPUTS];
  int64_t dims[WIRE_MAX_VALUES + WIRE_MAX_OUTPUTS][2 * WIRE_MAX_NDIM];
  char names[WIRE_MAX_VALUES][WIRE_MAX_NAME];
  DLTensor *tensors[WIRE_MAX_VALUES + WIRE_MAX_OUTPUTS];
  uint64_t spans[WIRE_MAX_VALUES + WIRE_MAX_OUTPUTS];
  uint64_t offsets[WIRE_MAX_VALUES + WIRE_MAX_OUTPUTS];
  int n_t;
#ifdef PROCRUN_GPU
  /* the serving process's arena as mapped here, and this process's stream */
  int dev;
  unsigned char handle[WIRE_IPC_HANDLE];
  void *base;
  cudaStream_t stream;
  int has_stream, stream_dev;
#endif
} child_call;

/* Read one value's record into t (and v): -1 on a broken wire. */
static int recv_value(int fd, child_call *c, ust_value *v, DLTensor *t, int32_t *dtype, int slot) {
  wire_value w;
  if (recv_all(fd, &w, sizeof w, NO_DEADLINE, -1) != 0 || w.name_len >= WIRE_MAX_NAME)
    return -1;
  const int is_tensor = v == NULL || w.kind == UST_VALUE_TENSOR;
  if (is_tensor && (w.ndim < 0 || w.ndim > WIRE_MAX_NDIM || w.span > WIRE_MAX_SPAN))
    return -1;
  if (v != NULL) {
    memset(v, 0, sizeof *v);
    v->kind = w.kind;
    v->writable = w.writable;
    v->i = w.i;
    v->f = w.f;
    v->dtype = w.dtype;
  }
  if (is_tensor) {
    int64_t *dims = c->dims[c->n_t];
    if (recv_all(fd, dims, sizeof(int64_t) * 2 * (size_t)w.ndim, NO_DEADLINE, -1) != 0)
      return -1;
    memset(t, 0, sizeof *t);
    t->device.device_type = kDLCPU;
    t->ndim = w.ndim;
    t->dtype.code = w.code;
    t->dtype.bits = w.bits;
    t->dtype.lanes = w.lanes;
    t->shape = dims;
    t->strides = dims + w.ndim;
    int64_t s = span_of(t);
    if (s < 0 || (uint64_t)s != w.span)
      return -1;
    if (dtype != NULL)
      *dtype = w.dtype;
    c->tensors[c->n_t] = t;
    c->offsets[c->n_t] = w.offset;
    c->spans[c->n_t++] = w.span;
  }
  if (w.name_len > 0) {
    if (v == NULL || recv_all(fd, c->names[slot], w.name_len, NO_DEADLINE, -1) != 0)
      return -1;
    c->names[slot][w.name_len] = '\0';
    v->name = c->names[slot];
  }
  return 0;
}

static int answer(int fd, int status, const char *msg, child_call *c, int gpu) {
  wire_answer a = {WIRE_MAGIC, status, (uint32_t)strnlen(msg, WIRE_MAX_MSG), 0};
  int io = send_all(fd, &a, sizeof a, NO_DEADLINE, -1);
  if (io == 0)
    io = send_text(fd, msg, a.msg_len);
  for (int k = 0; io == 0 && status == 0 && gpu < 0 && k < c->n_t; k++)
    io = send_all(fd, tensor_bytes(c->tensors[k]), c->spans[k], NO_DEADLINE, -1);
  return io;
}

#ifdef PROCRUN_GPU
/* Map the serving process's arena on dev (once per arena: the serving side
 * keeps it until it needs a larger one) and point the tensors into it.
 * 0, or UST__PROCRUN_UNSENT with msg saying why. */
static int child_map(child_call *c, int dev, const wire_arena *a, char *msg, size_t cap) {
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess && c->base != NULL && (c->dev != dev || memcmp(c->handle, a->handle, sizeof c->handle) != 0)) {
    cudaIpcCloseMemHandle(c->base);
    c->base = NULL;
  }
  if (e == cudaSuccess && c->base == NULL) {
    cudaIpcMemHandle_t h;
    memcpy(&h, a->handle, sizeof h);
    e = cudaIpcOpenMemHandle(&c->base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaSuccess) {
      c->dev = dev;
      memcpy(c->handle, a->handle, sizeof c->handle);
    } else {
      c->base = NULL;
    }
  }
  if (e == cudaSuccess && c->has_stream && c->stream_dev != dev) {
    cudaStreamDestroy(c->stream); /* a stream belongs to its device */
    c->has_stream = 0;
  }
  if (e == cudaSuccess && !c->has_stream) {
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    c->has_stream = e == cudaSuccess;
    c->stream_dev = dev;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(msg, cap, "the qualifying process cannot map the call's device memory on GPU %d: %s", dev,
             cudaGetErrorString(e));
    return UST__PROCRUN_UNSENT;
  }
  for (int j = 0; j < c->n_t; j++) {
    c->tensors[j]->device.device_type = GPU_DL;
    c->tensors[j]->device.device_id = dev;
    c->tensors[j]->data = (char *)c->base + c->offsets[j];
  }
  return 0;
}

/* After the candidate returned: its GPU work, finished or failed, on any
 * stream it used (this process runs nothing else on the device). A kernel
 * that faulted leaves this process's context lost, which is this process's
 * to lose. */
static int child_finish(int rc, char *msg, size_t cap) {
  const cudaError_t launch = cudaGetLastError();
  const cudaError_t done = cudaDeviceSynchronize(); /* whatever failed, nothing of it runs on after the answer */
  const cudaError_t e = launch != cudaSuccess ? launch : done;
  if (e == cudaSuccess)
    return rc;
  const size_t len = strnlen(msg, cap);
  snprintf(msg + len, cap - len, "%sthe candidate's GPU work failed: %s", len > 0 ? "; " : "", cudaGetErrorString(e));
  return rc != 0 ? rc : -1;
}
#endif

uint64_t ust__procrun_data_bytes(void) {
  /* /proc/self/statm: size resident shared text lib data dt, in pages; read
   * with system calls alone (a signal handler calls this) */
  const int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  int field = 0;
  uint64_t v = 0;
  for (const char *s = buf; *s != '\0'; s++) {
    if (*s == ' ') {
      if (++field == 6)
        break;
      v = 0;
    } else if (*s >= '0' && *s <= '9') {
      v = v * 10 + (uint64_t)(*s - '0');
    }
  }
  return field >= 5 ? v * (uint64_t)getpagesize() : 0;
}

int ust__procrun_near_limit(uint64_t data, uint64_t limit) {
  if (limit == 0 || data == 0)
    return 0;
  uint64_t reach = limit / 8;
  if (reach < (64u << 20))
    reach = 64u << 20;
  return data + reach >= limit;
}

/* Read, run and answer one call: 1 done, 0 the socket closed, -1 broken. */
static int serve_one(int fd, const ust_candidate *d, child_call *c, uint64_t data_limit) {
  wire_call wc;
  ssize_t k = recv(fd, &wc, 1, MSG_PEEK);
  if (k == 0)
    return 0;
  if (recv_all(fd, &wc, sizeof wc, NO_DEADLINE, -1) != 0 || wc.magic != WIRE_MAGIC || wc.n_args < 0 ||
      wc.n_args > WIRE_MAX_VALUES || wc.n_outputs < 0 || wc.n_outputs > WIRE_MAX_OUTPUTS)
    return -1;
  c->n_t = 0;
  for (int i = 0; i < wc.n_args; i++)
    if (recv_value(fd, c, &c->values[i], &c->values[i].tensor, NULL, i) != 0)
      return -1;
  for (int j = 0; j < wc.n_outputs; j++)
    if (recv_value(fd, c, NULL, &c->outputs[j], &c->output_dtypes[j], 0) != 0)
      return -1;
  void *bufs[WIRE_MAX_VALUES + WIRE_MAX_OUTPUTS] = {0};
  int rc = 0, io = 0;
  char msg[WIRE_MAX_MSG] = "";
  const int gpu = wc.device;
  if (gpu >= 0) {
    /* the tensors are in the serving process's device memory */
    wire_arena a;
    if (recv_all(fd, &a, sizeof a, NO_DEADLINE, -1) != 0)
      return -1;
    for (int j = 0; j < c->n_t; j++)
      if (c->offsets[j] > a.bytes || c->spans[j] > a.bytes - c->offsets[j])
        return -1;
#ifdef PROCRUN_GPU
    rc = child_map(c, gpu, &a, msg, sizeof msg);
#else
    rc = UST__PROCRUN_UNSENT;
    snprintf(msg, sizeof msg, "the qualifying process was built without a GPU backend");
#endif
  }
  for (int j = 0; gpu < 0 && j < c->n_t; j++) {
    /* every tensor's own buffer, aligned as torch aligns its storage */
    if (c->spans[j] > 0 && posix_memalign(&bufs[j], 64, c->spans[j]) != 0) {
      bufs[j] = NULL;
      rc = -1;
      snprintf(msg, sizeof msg, "the qualifying process is out of memory for %llu bytes",
               (unsigned long long)c->spans[j]);
    }
    c->tensors[j]->data = bufs[j];
  }
  for (int j = 0; gpu < 0 && io == 0 && j < c->n_t; j++) {
    if (bufs[j] != NULL) {
      io = recv_all(fd, bufs[j], c->spans[j], NO_DEADLINE, -1);
    } else {
      /* no room: read and drop the bytes, then say so */
      char sink[4096];
      for (uint64_t left = c->spans[j]; io == 0 && left > 0; left -= left > sizeof sink ? sizeof sink : left)
        io = recv_all(fd, sink, left > sizeof sink ? sizeof sink : left, NO_DEADLINE, -1);
    }
  }
  if (io == 0 && rc == 0) {
    /* a version 1 candidate reads its arguments with version 1's stride */
    unsigned char v1[WIRE_MAX_VALUES * UST_VALUE_V1_SIZE];
    ust_candidate_call cc;
    memset(&cc, 0, sizeof cc);
    cc.n_args = wc.n_args;
    cc.n_outputs = wc.n_outputs;
    cc.outputs = c->outputs;
    cc.device.device_type = gpu >= 0 ? GPU_DL : kDLCPU;
    cc.device.device_id = gpu >= 0 ? gpu : 0;
#ifdef PROCRUN_GPU
    cc.stream = gpu >= 0 ? (void *)c->stream : NULL;
#endif
    if (d->abi_version < 2) {
      for (int i = 0; i < wc.n_args; i++)
        memcpy(v1 + (size_t)i * UST_VALUE_V1_SIZE, &c->values[i], UST_VALUE_V1_SIZE);
      cc.args = (const ust_value *)(const void *)v1;
      cc.size = offsetof(ust_candidate_call, value_size);
    } else {
      cc.args = c->values;
      cc.size = sizeof cc;
      cc.value_size = sizeof(ust_value);
      cc.output_dtypes = c->output_dtypes;
    }
    char buf[256] = "";
    rc = d->run(d->ctx, &cc, buf, sizeof buf);
    buf[sizeof buf - 1] = '\0';
    snprintf(msg, sizeof msg, "%s", buf);
    if (rc == UST__PROCRUN_LOST || rc == UST__PROCRUN_UNSENT || rc == UST__PROCRUN_BUSY)
      rc = -1;
    const uint64_t data = rc != 0 ? ust__procrun_data_bytes() : 0;
    if (rc != 0 && ust__procrun_near_limit(data, data_limit)) {
      const size_t len = strnlen(msg, sizeof msg);
      snprintf(msg + len, sizeof msg - len, "%sat its memory limit in the qualifying process (%llu of %llu MiB)",
               len > 0 ? "; " : "", (unsigned long long)(data >> 20), (unsigned long long)(data_limit >> 20));
    }
#ifdef PROCRUN_GPU
    if (gpu >= 0)
      rc = child_finish(rc, msg, sizeof msg);
#endif
  }
  if (io == 0)
    io = answer(fd, rc, msg, c, gpu);
  for (int j = 0; j < c->n_t; j++)
    free(bufs[j]);
  return io == 0 ? 1 : -1;
}

int ust__procrun_serve(int fd, const ust_candidate *d, uint64_t data_limit) {
  child_call *c = calloc(1, sizeof *c);
  if (c == NULL)
    return -1;
  int r;
  while ((r = serve_one(fd, d, c, data_limit)) == 1) {
  }
  free(c);
  return r == 0 ? 0 : -1;
}
