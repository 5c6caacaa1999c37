/* Candidates for tests of qualification in a process of its own: a correct
 * float32 aten::silu on dense CPU tensors, made to misbehave on its Nth call
 * by one macro:
 *   UST_TEST_CRASH_AT=N  writes to an address nothing maps (SIGSEGV)
 *   UST_TEST_HANG_AT=N   never returns
 *   UST_TEST_WRONG_AT=N  returns a result off by one in its first element
 *   UST_TEST_SIGNAL_PARENT_AT=N  sends SIGKILL to the process that started it
 *                        (the serving process, when it qualifies out of process)
 *   UST_TEST_FORK_CRASH_AT=N  forks a process that sleeps a minute holding
 *                        every descriptor (its id appended to
 *                        $UST_TEST_FORKED_LOG), then crashes
 *   UST_TEST_CRASH_ON_LOAD  its constructor does the same
 *   UST_TEST_SETSID_FORK_AT=N  forks a process that tries to leave the
 *                        qualifying process's group (setsid, else setpgid),
 *                        appends "PID SETSID_RESULT ERRNO" to
 *                        $UST_TEST_FORKED_LOG and sleeps a minute; the call
 *                        itself is correct
 *   UST_TEST_STDOUT_MB=N every call writes N MiB to its standard output (a
 *                        marker, then filler), then is correct
 *   UST_TEST_LEAK_MB=N   every call takes N MiB more, never freed, and
 *                        writes each page of it without checking that the
 *                        allocation succeeded
 *   UST_TEST_PROMOTES_ITSELF  every call asks the loaded understudy
 *                        ($UNDERSTUDY_LIB, dlopen RTLD_NOLOAD) to put aten::silu's
 *                        operator live, and to read its report, then returns
 *                        a result off by one in its first element and status
 *                        3, its message saying what understudy answered
 * Each call also appends its process id to the file named by
 * $UST_TEST_CALL_LOG, when set, so a test can tell which process ran it. */
/* kill and getppid are POSIX */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "understudy/candidate.h"

/* An address no process maps: a store there faults (SIGSEGV). Not NULL,
 * which the undefined-behaviour sanitizer would stop before the store. */
static volatile uintptr_t nowhere = 64;

#ifdef UST_TEST_CRASH_ON_LOAD
__attribute__((constructor)) static void crash_on_load(void) { *(volatile int *)nowhere = 1; }
#endif

static void log_call(void) {
  const char *path = getenv("UST_TEST_CALL_LOG");
  if (path == NULL)
    return;
  FILE *f = fopen(path, "a");
  if (f != NULL) {
    fprintf(f, "%ld\n", (long)getpid());
    fclose(f);
  }
}

static int run(void *ctx, const ust_candidate_call *call, char *msg, size_t cap) {
  (void)ctx;
  static int calls;
  const int n = ++calls;
  log_call();
#ifdef UST_TEST_CRASH_AT
  if (n == UST_TEST_CRASH_AT)
    *(volatile int *)nowhere = n;
#endif
#ifdef UST_TEST_SIGNAL_PARENT_AT
  if (n == UST_TEST_SIGNAL_PARENT_AT)
    kill(getppid(), SIGKILL);
#endif
#ifdef UST_TEST_FORK_CRASH_AT
  if (n == UST_TEST_FORK_CRASH_AT) {
    const pid_t kid = fork();
    if (kid == 0) {
      sleep(60);
      _exit(0);
    }
    const char *path = getenv("UST_TEST_FORKED_LOG");
    FILE *f = path != NULL ? fopen(path, "a") : NULL;
    if (f != NULL) {
      fprintf(f, "%ld\n", (long)kid);
      fclose(f);
    }
    *(volatile int *)nowhere = n;
  }
#endif
#ifdef UST_TEST_SETSID_FORK_AT
  if (n == UST_TEST_SETSID_FORK_AT) {
    const pid_t kid = fork();
    if (kid == 0) {
      int r = (int)setsid();
      const int err = r == -1 ? errno : 0;
      if (r == -1)
        r = setpgid(0, 0);
      const char *path = getenv("UST_TEST_FORKED_LOG");
      FILE *f = path != NULL ? fopen(path, "a") : NULL;
      if (f != NULL) {
        fprintf(f, "%ld %d %d\n", (long)getpid(), r, err);
        fclose(f);
      }
      sleep(60);
      _exit(0);
    }
  }
#endif
#ifdef UST_TEST_STDOUT_MB
  {
    static char filler[1 << 16];
    memset(filler, 'x', sizeof filler);
    const char marker[] = "UST_TEST_STDOUT_MARKER\n";
    ssize_t w = write(1, marker, sizeof marker - 1);
    for (long left = (long)UST_TEST_STDOUT_MB << 20; left > 0 && w >= 0; left -= (long)sizeof filler)
      w = write(1, filler, sizeof filler);
  }
#endif
#ifdef UST_TEST_LEAK_MB
  {
    volatile char *leak = malloc((size_t)UST_TEST_LEAK_MB << 20); /* never freed, never checked */
    for (size_t k = 0; k < ((size_t)UST_TEST_LEAK_MB << 20); k += 4096)
      leak[k] = 1;
  }
#endif
#ifdef UST_TEST_PROMOTES_ITSELF
  int set_rc = 1, report_rc = 1;
  const char *lib = getenv("UNDERSTUDY_LIB");
  void *self = lib != NULL ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (self != NULL) {
    int (*set_mode)(const char *, const char *) = NULL;
    int (*report_json)(char **) = NULL;
    *(void **)&set_mode = dlsym(self, "ust_set_mode");
    *(void **)&report_json = dlsym(self, "ust_report_json");
    char *rep = NULL;
    set_rc = set_mode != NULL ? set_mode("silu", "live") : 1;
    report_rc = report_json != NULL ? report_json(&rep) : 1;
    free(rep);
    dlclose(self);
  }
#endif
#ifdef UST_TEST_HANG_AT
  if (n == UST_TEST_HANG_AT)
    for (;;)
      pause();
#endif
  if (call->n_args < 1 || ust_candidate_arg(call, 0)->kind != UST_VALUE_TENSOR || call->n_outputs != 1) {
    snprintf(msg, cap, "expected one tensor argument and one output");
    return 1;
  }
  const DLTensor *x = &ust_candidate_arg(call, 0)->tensor, *y = &call->outputs[0];
  if (x->dtype.code != kDLFloat || x->dtype.bits != 32 || y->dtype.code != kDLFloat || y->dtype.bits != 32) {
    snprintf(msg, cap, "only float32");
    return 1;
  }
  int64_t numel = 1, dense = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    if (x->shape[d] != 1 && (x->strides[d] != dense || y->strides[d] != dense)) {
      snprintf(msg, cap, "only dense tensors");
      return 1;
    }
    dense *= x->shape[d];
    numel *= x->shape[d];
  }
  const float *in = (const float *)((const char *)x->data + x->byte_offset);
  float *out = (float *)((char *)y->data + y->byte_offset);
  for (int64_t i = 0; i < numel; i++)
    out[i] = in[i] / (1.0f + expf(-in[i]));
#ifdef UST_TEST_WRONG_AT
  if (n >= UST_TEST_WRONG_AT && numel > 0)
    out[0] += 1.0f;
#endif
#ifdef UST_TEST_PROMOTES_ITSELF
  if (numel > 0)
    out[0] += 1.0f;
  snprintf(msg, cap, "set_mode %d, report %d", set_rc, report_rc);
  return 3; /* a failure whose message carries what understudy answered */
#endif
  (void)n;
  return 0;
}

__attribute__((visibility("default"))) const ust_candidate *ust_candidate_get(void);

const ust_candidate *ust_candidate_get(void) {
  static const ust_candidate desc = {sizeof(ust_candidate), UST_CANDIDATE_ABI_VERSION, "misbehaving silu",
                                     "aten::silu", run, NULL, 0, 0};
  return &desc;
}
