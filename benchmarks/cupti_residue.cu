// What a kernel tracer's window leaves behind: the host cost of a kernel
// launch before, during and after each step the tracer takes with CUPTI
// (dispatch/timer_cupti.c), each variant in a process of its own.
//
// A launch is an empty kernel's, through the runtime (cudaLaunchKernel, as
// torch launches) or the driver (cuLaunchKernel, as Triton launches). The
// host time of a block of launches is taken with the device caught up before
// each block (a full launch queue would time the device instead). Per
// process: a warm-up, BLOCKS blocks before the step, the step (its launches
// during it timed too), then BLOCKS blocks after it; the medians are
// printed, one line, for benchmarks/cupti_residue.py to gather.
//
// Variants (the step; every one is undone before "after" is timed):
//   none          nothing (the A/A line)
//   load          libcupti loaded (dlopen), nothing called
//   subscribe     cuptiSubscribe, then cuptiUnsubscribe
//   callbacks     subscribed, the launch callbacks enabled around the
//                 launches, then disabled and unsubscribed
//   kernels       kernel records (CONCURRENT_KERNEL) enabled around the
//                 launches, then disabled and flushed
//   window        callbacks and kernels together: a window of understudy's
//                 tracer in its default mode (timer.correlation: callbacks)
//   records       runtime, driver, external-correlation and kernel records,
//                 an id pushed and popped around each launch (the records mode)
//   window+final  a window, then cuptiFinalize
//   kernels+final kernel records, then cuptiFinalize
//   cycles        CYCLES windows in a row while THREADS other threads
//                 launch on streams of their own throughout (as a serving
//                 process's threads do), each window subscribing, tracing
//                 and unsubscribing again ("during": one block in each)
//   cycles+final  the same, each window ending in cuptiFinalize called by
//                 the timing thread while the others launch; then the heap
//                 is churned, so that a corruption shows as a crash
//   cycles+exit   the same, each window ending in cuptiFinalize called at a
//                 launch API's exit callsite, on whichever thread launches
//                 next (CUPTI's documented dynamic detach)
//
// Build (the device machine):
//   nvcc -O2 -arch=sm_90 -I$CUDA/include -o cupti_residue benchmarks/cupti_residue.cu -lcuda -ldl
//   ./cupti_residue VARIANT runtime|driver PATH_TO_LIBCUPTI
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <atomic>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK 256   // launches a block
#define BLOCKS 41   // blocks timed before and after
#define WARM 4000   // launches before any timing
#define THREADS 4   // launching threads beside the windows (cycles)
#define CYCLES 100  // windows in a row (cycles)

__global__ void empty_kernel(int x) {
  if (x == 12345)
    asm volatile("trap;");
}

static double now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int use_driver;
static CUfunction driver_fn;

static void launch() {
  int x = 0;
  if (use_driver) {
    void *args[] = {&x};
    cuLaunchKernel(driver_fn, 1, 1, 1, 1, 1, 1, 0, 0, args, NULL);
  } else {
    void *args[] = {&x};
    cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(1), args, 0, 0);
  }
}

typedef CUptiResult (*fn_subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
typedef CUptiResult (*fn_unsubscribe)(CUpti_SubscriberHandle);
typedef CUptiResult (*fn_enable_cb)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
typedef CUptiResult (*fn_register)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*fn_kind)(CUpti_ActivityKind);
typedef CUptiResult (*fn_flush)(uint32_t);
typedef CUptiResult (*fn_push)(CUpti_ExternalCorrelationKind, uint64_t);
typedef CUptiResult (*fn_pop)(CUpti_ExternalCorrelationKind, uint64_t *);
typedef CUptiResult (*fn_void)(void);

static struct {
  fn_subscribe subscribe;
  fn_unsubscribe unsubscribe;
  fn_enable_cb enable_callback;
  fn_register register_callbacks;
  fn_kind enable, disable;
  fn_flush flush_all;
  fn_push push;
  fn_pop pop;
  fn_void finalize;
} api;

static CUpti_SubscriberHandle sub;
static volatile unsigned long long noted;
static int pushing;
static std::atomic<int> detach_asked{0}, detached{0};

static void CUPTIAPI on_launch(void *data, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *cbdata) {
  (void)data, (void)domain, (void)cbid;
  const CUpti_CallbackData *cb = (const CUpti_CallbackData *)cbdata;
  if (cb->callbackSite == CUPTI_API_ENTER)
    noted += cb->correlationId;
  else if (detach_asked.load(std::memory_order_relaxed) == 1 && detach_asked.exchange(0) == 1)
    detached.store(api.finalize() == CUPTI_SUCCESS ? 1 : -1);
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *size = 8 << 20;
  *buffer = (uint8_t *)aligned_alloc(8, *size);
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx, (void)stream, (void)size, (void)valid;
  free(buffer);
}

static void load(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "cupti_residue: %s: %s\n", path, dlerror());
    exit(2);
  }
  *(void **)&api.subscribe = dlsym(h, "cuptiSubscribe");
  *(void **)&api.unsubscribe = dlsym(h, "cuptiUnsubscribe");
  *(void **)&api.enable_callback = dlsym(h, "cuptiEnableCallback");
  *(void **)&api.register_callbacks = dlsym(h, "cuptiActivityRegisterCallbacks");
  *(void **)&api.enable = dlsym(h, "cuptiActivityEnable");
  *(void **)&api.disable = dlsym(h, "cuptiActivityDisable");
  *(void **)&api.flush_all = dlsym(h, "cuptiActivityFlushAll");
  *(void **)&api.push = dlsym(h, "cuptiActivityPushExternalCorrelationId");
  *(void **)&api.pop = dlsym(h, "cuptiActivityPopExternalCorrelationId");
  *(void **)&api.finalize = dlsym(h, "cuptiFinalize");
}

static void check(CUptiResult r, const char *what) {
  if (r != CUPTI_SUCCESS) {
    fprintf(stderr, "cupti_residue: %s failed (%d)\n", what, (int)r);
    exit(3);
  }
}

static void callbacks(uint32_t on) {
  check(api.enable_callback(on, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000),
        "cuptiEnableCallback");
  check(api.enable_callback(on, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
        "cuptiEnableCallback");
}

static void kinds(int on, int records) {
  fn_kind f = on ? api.enable : api.disable;
  check(f(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "kernel records");
  if (records) {
    check(f(CUPTI_ACTIVITY_KIND_RUNTIME), "runtime records");
    check(f(CUPTI_ACTIVITY_KIND_DRIVER), "driver records");
    check(f(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), "external correlation records");
  }
}

// ns per launch of one block (the device caught up first)
static double block() {
  cudaDeviceSynchronize();
  const double t0 = now_ns();
  for (int i = 0; i < BLOCK; i++) {
    if (pushing)
      api.push(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, (uint64_t)i + 1);
    launch();
    if (pushing)
      api.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, NULL);
  }
  return (now_ns() - t0) / BLOCK;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_blocks(int n) {
  double v[BLOCKS];
  for (int i = 0; i < n; i++)
    v[i] = block();
  qsort(v, n, sizeof v[0], cmp);
  return v[n / 2];
}

static std::atomic<int> stop_launchers{0};

// A serving thread: launches on a stream of its own until told to stop.
static void *launcher(void *arg) {
  (void)arg;
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
    return NULL;
  int x = 0;
  void *args[] = {&x};
  while (!stop_launchers.load()) {
    for (int i = 0; i < BLOCK; i++) {
      if (use_driver)
        cuLaunchKernel(driver_fn, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, args, NULL);
      else
        cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(1), args, 0, s);
    }
    cudaStreamSynchronize(s);
  }
  cudaStreamDestroy(s);
  return NULL;
}

// CYCLES windows beside THREADS launching threads; the median block inside them.
// fin: 0 unsubscribe, 1 cuptiFinalize here, 2 cuptiFinalize at the next
// launch's exit callsite (the callbacks stay on until it has run)
static double cycles(int fin) {
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++)
    pthread_create(&th[i], NULL, launcher, NULL);
  double v[CYCLES];
  for (int c = 0; c < CYCLES; c++) {
    check(api.subscribe(&sub, on_launch, NULL), "cuptiSubscribe");
    callbacks(1);
    check(api.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    kinds(1, 0);
    v[c] = block();
    kinds(0, 0);
    api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (fin == 2) {
      detached.store(0);
      detach_asked.store(1);
      const double t0 = now_ns();
      while (detached.load() == 0 && now_ns() - t0 < 5e9)
        launch();
      if (detached.load() != 1) {
        fprintf(stderr, "cupti_residue: cuptiFinalize at an exit callsite %s\n",
                detached.load() == 0 ? "never ran" : "failed");
        exit(3);
      }
      continue;
    }
    callbacks(0);
    check(api.unsubscribe(sub), "cuptiUnsubscribe");
    if (fin)
      check(api.finalize(), "cuptiFinalize");
  }
  stop_launchers.store(1);
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  // a heap CUPTI corrupted fails here, not silently
  void *keep[1024] = {0};
  unsigned r = 12345;
  for (int i = 0; i < 200000; i++) {
    r = r * 1103515245u + 12345u;
    const int k = (int)(r >> 8) & 1023;
    free(keep[k]);
    keep[k] = malloc(1 + (r >> 12) % 8192);
    memset(keep[k], 0xab, 1);
  }
  for (int k = 0; k < 1024; k++)
    free(keep[k]);
  qsort(v, CYCLES, sizeof v[0], cmp);
  return v[CYCLES / 2];
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: cupti_residue VARIANT runtime|driver LIBCUPTI\n");
    return 2;
  }
  const char *v = argv[1];
  use_driver = strcmp(argv[2], "driver") == 0;
  cudaFree(0);
  if (use_driver) {
    cudaFunction_t rf;
    if (cudaGetFuncBySymbol(&rf, (const void *)empty_kernel) != cudaSuccess) {
      fprintf(stderr, "cupti_residue: no driver handle for the kernel\n");
      return 3;
    }
    driver_fn = (CUfunction)rf;
  }
  for (int i = 0; i < WARM / BLOCK; i++)
    block();
  const double before = median_blocks(BLOCKS);
  double during = before;
  const int win = strncmp(v, "window", 6) == 0, cbs = win || strcmp(v, "callbacks") == 0;
  const int kern = win || strncmp(v, "kernels", 7) == 0, rec = strcmp(v, "records") == 0;
  const int fin = strstr(v, "+final") != NULL ? 1 : strstr(v, "+exit") != NULL ? 2 : 0;
  if (strcmp(v, "none") != 0)
    load(argv[3]);
  if (strcmp(v, "subscribe") == 0) {
    check(api.subscribe(&sub, on_launch, NULL), "cuptiSubscribe");
    check(api.unsubscribe(sub), "cuptiUnsubscribe");
  }
  if (strncmp(v, "cycles", 6) == 0)
    during = cycles(fin);
  if (cbs || kern || rec) {
    if (cbs) {
      check(api.subscribe(&sub, on_launch, NULL), "cuptiSubscribe");
      callbacks(1);
    }
    if (kern || rec) {
      check(api.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
      kinds(1, rec);
    }
    pushing = rec;
    during = median_blocks(BLOCKS);
    pushing = 0;
    cudaDeviceSynchronize();
    if (kern || rec) {
      kinds(0, rec);
      api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    }
    if (cbs) {
      callbacks(0);
      check(api.unsubscribe(sub), "cuptiUnsubscribe");
    }
  }
  if (fin && strncmp(v, "cycles", 6) != 0)
    check(api.finalize(), "cuptiFinalize");
  const double after = median_blocks(BLOCKS);
  printf("%s %s before_ns=%.1f during_ns=%.1f after_ns=%.1f\n", v, use_driver ? "driver" : "runtime", before, during,
         after);
  return 0;
}
