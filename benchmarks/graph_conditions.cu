// What gating work inside a CUDA graph costs per replay, when the gate is
// closed: the price of the ways guard/graph.c could decide, at each replay,
// whether a captured call's shadow runs.
//
// A graph of K production kernels in a chain (each one pass over 256 KiB),
// with S sites spread along it; at each site, one way of gating a body that
// never runs (its condition is always 0):
//
//   gate + IF, twice    a one-thread kernel setting an IF node's condition,
//                       then the IF node; before and after the site's kernel
//                       (understudy with a copy part before production)
//   gate + IF, once     the same once (understudy without that part)
//   one gate + IF       one kernel at the graph's start sets every site's
//                       condition; an IF node per site
//   one gate + 2 IF     the same, two IF nodes per site
//   empty node          an empty node per site (the floor)
//   2 disabled kernels  two kernel nodes per site, disabled in the executable
//                       graph (cudaGraphNodeSetEnabled)
//   gate + IF, beside   gate + IF on a branch off the chain, joined at the
//                       graph's end (off the critical path)
//   gated copy + IF beside  in the chain, one kernel (8 blocks) that reads the
//                       gate, exits when closed (else would copy what the
//                       body reads into buffers of its own) and sets the
//                       condition; the IF node on a branch off it, joined at
//                       the graph's end: a body that reads only those copies
//                       cannot race the writers after it
//   exiting kernel      one such kernel in the chain per site, no IF (its floor)
//   exiting kernel + device launch  the same kernel, which launches the body
//                       (a graph instantiated for device launch, one per
//                       site) fire-and-forget when the gate is open: the
//                       caller's graph stays one chain, nothing beside it
//
// Then whether two IF nodes may share one condition (one gate for both).
//
// Each variant: instantiated, warmed, then R launches timed with events;
// rounds interleave the variants. Prints µs per replay and what each site
// adds over the plain chain. Build and run (sm_90; relocatable device code
// and the device runtime, for the device-side graph launch):
//
//     nvcc -O2 -arch=sm_90 -rdc=true -o graph_conditions benchmarks/graph_conditions.cu -lcudadevrt
//     ./graph_conditions [--device-words] [--open]
//
// With --device-words the gates are read from device memory instead of
// host memory mapped for the device (understudy's, which the host writes).
// With --open every gate is open: each body runs at each replay (it adds
// one to a counter, checked against the replays after the run), which
// prices running the gated work rather than skipping it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                                                     \
  do {                                                                                                               \
    cudaError_t e_ = (x);                                                                                            \
    if (e_ != cudaSuccess) {                                                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
      std::exit(1);                                                                                                  \
    }                                                                                                                \
  } while (0)

namespace {

constexpr int kElems = 1 << 16; // a production kernel's pass
constexpr int kMaxHandles = 64;

__global__ void production(float *p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    p[i] = p[i] * 0.999f + 1.0f;
}

__global__ void body(float *p) {
  if (threadIdx.x == 0)
    atomicAdd(p, 1.0f);
}

__global__ void gate(const volatile unsigned long long *word, cudaGraphConditionalHandle h) {
  cudaGraphSetConditional(h, (*word & 1) ? 1u : 0u);
}

// One read of the gate per block (a read of host memory crosses the bus).
__device__ bool block_reads(const volatile unsigned long long *word) {
  __shared__ bool open;
  if (threadIdx.x == 0)
    open = (*word & 1) != 0;
  __syncthreads();
  return open;
}

// Closed: exit (block 0 sets the condition).
__global__ void gated_copy(const volatile unsigned long long *word, float *dst, const float *src, int n,
                           cudaGraphConditionalHandle h) {
  const bool open = block_reads(word);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    cudaGraphSetConditional(h, open ? 1u : 0u);
  if (!open)
    return;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void exiting(const volatile unsigned long long *word, float *dst, const float *src, int n) {
  if (!block_reads(word))
    return;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = src[i];
}

// The same, launching the body fire-and-forget when open: the block that
// finishes last (a ticket), so the body reads every block's copies.
__global__ void exiting_launch(const volatile unsigned long long *word, float *dst, const float *src, int n,
                               cudaGraphExec_t body_exec, unsigned *ticket, unsigned *refused) {
  if (!block_reads(word))
    return;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = src[i];
  __syncthreads();
  if (threadIdx.x != 0)
    return;
  __threadfence();
  if (atomicAdd(ticket, 1u) != gridDim.x - 1)
    return;
  *ticket = 0;
  __threadfence();
  if (cudaGraphLaunch(body_exec, cudaStreamGraphFireAndForget) != cudaSuccess)
    atomicAdd(refused, 1u);
}

struct Handles {
  int n;
  cudaGraphConditionalHandle h[kMaxHandles];
};

__global__ void gate_all(const volatile unsigned long long *words, const Handles *t) {
  const int i = threadIdx.x;
  if (i < t->n)
    cudaGraphSetConditional(t->h[i], (words[i] & 1) ? 1u : 0u);
}

enum Variant {
  kPlain,
  kGateIfTwice,
  kGateIfOnce,
  kOneGateIf,
  kOneGateTwoIf,
  kEmpty,
  kDisabled,
  kBeside,
  kCopyBeside,
  kExiting,
  kExitingLaunch,
  kVariants
};

const char *const kNames[kVariants] = {"plain",           "gate + IF, twice",   "gate + IF, once",
                                       "one gate + IF",   "one gate + 2 IF",    "empty node",
                                       "2 disabled kernels", "gate + IF, beside", "gated copy + IF beside",
                                       "exiting kernel",  "exiting + device launch"};

struct Device {
  float *buf, *scratch;
  unsigned long long *words; // the gates, all 0 (closed): host-mapped, or device memory (--device-words)
  Handles *handles;          // device copy for gate_all
  unsigned *tickets;         // per site, for exiting_launch
  unsigned *refused;         // device launches refused
};

// Kernel parameters are copied when a node is added: locals suffice.
cudaGraphNode_t add_kernel(cudaGraph_t g, const cudaGraphNode_t *deps, size_t n_deps, void *fn, void **args,
                           dim3 grid, dim3 block) {
  cudaKernelNodeParams p = {};
  p.func = fn;
  p.gridDim = grid;
  p.blockDim = block;
  p.kernelParams = args;
  cudaGraphNode_t node;
  CHECK(cudaGraphAddKernelNode(&node, g, deps, n_deps, &p));
  return node;
}

cudaGraphNode_t after(cudaGraph_t g, cudaGraphNode_t dep, void *fn, void **args, dim3 grid, dim3 block) {
  return add_kernel(g, dep ? &dep : nullptr, dep ? 1 : 0, fn, args, grid, block);
}

cudaGraphNode_t add_production(cudaGraph_t g, cudaGraphNode_t dep, const Device &d) {
  float *p = d.buf;
  int n = kElems;
  void *args[] = {&p, &n};
  return after(g, dep, reinterpret_cast<void *>(production), args, dim3(kElems / 256), dim3(256));
}

cudaGraphNode_t add_body_kernel(cudaGraph_t g, cudaGraphNode_t dep, const Device &d) {
  float *p = d.scratch;
  void *args[] = {&p};
  return after(g, dep, reinterpret_cast<void *>(body), args, dim3(1), dim3(32));
}

cudaGraphNodeParams if_params(cudaGraphConditionalHandle h) {
  cudaGraphNodeParams p = {};
  p.type = cudaGraphNodeTypeConditional;
  p.conditional.handle = h;
  p.conditional.type = cudaGraphCondTypeIf;
  p.conditional.size = 1;
  return p;
}

cudaGraphNode_t add_if(cudaGraph_t g, cudaGraphNode_t dep, cudaGraphConditionalHandle h, const Device &d) {
  cudaGraphNodeParams p = if_params(h);
  cudaGraphNode_t node;
  CHECK(cudaGraphAddNode(&node, g, dep ? &dep : nullptr, nullptr, dep ? 1 : 0, &p));
  add_body_kernel(p.conditional.phGraph_out[0], nullptr, d);
  return node;
}

cudaGraphNode_t add_gate(cudaGraph_t g, cudaGraphNode_t dep, int site, cudaGraphConditionalHandle h,
                         const Device &d) {
  const unsigned long long *w = d.words + site;
  void *args[] = {&w, &h};
  return after(g, dep, reinterpret_cast<void *>(gate), args, dim3(1), dim3(1));
}

cudaGraphConditionalHandle new_handle(cudaGraph_t g) {
  cudaGraphConditionalHandle h;
  CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, cudaGraphCondAssignDefault));
  return h;
}

cudaGraphNode_t add_gated_copy(cudaGraph_t g, cudaGraphNode_t dep, int site, const Device &d,
                               cudaGraphConditionalHandle *h) {
  const unsigned long long *w = d.words + site;
  float *dst = d.scratch;
  const float *src = d.buf;
  int n = 1024;
  if (h == nullptr) {
    void *args[] = {&w, &dst, &src, &n};
    return after(g, dep, reinterpret_cast<void *>(exiting), args, dim3(8), dim3(256));
  }
  *h = new_handle(g);
  void *args[] = {&w, &dst, &src, &n, h};
  return after(g, dep, reinterpret_cast<void *>(gated_copy), args, dim3(8), dim3(256));
}

// A body graph instantiated for launch from the device, uploaded.
cudaGraphExec_t device_body(const Device &d, cudaStream_t stream) {
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  add_body_kernel(g, nullptr, d);
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, cudaGraphInstantiateFlagDeviceLaunch));
  CHECK(cudaGraphUpload(exec, stream));
  CHECK(cudaGraphDestroy(g));
  return exec;
}

cudaGraphNode_t add_exiting_launch(cudaGraph_t g, cudaGraphNode_t dep, int site, const Device &d,
                                   cudaGraphExec_t body_exec) {
  const unsigned long long *w = d.words + site;
  float *dst = d.scratch + 64;
  const float *src = d.buf;
  int n = 1024;
  unsigned *ticket = d.tickets + site, *refused = d.refused;
  void *args[] = {&w, &dst, &src, &n, &body_exec, &ticket, &refused};
  return after(g, dep, reinterpret_cast<void *>(exiting_launch), args, dim3(8), dim3(256));
}

cudaGraphNode_t gated(cudaGraph_t g, cudaGraphNode_t dep, int site, const Device &d) {
  const cudaGraphConditionalHandle h = new_handle(g);
  return add_if(g, add_gate(g, dep, site, h, d), h, d);
}

double replay_us(Variant v, int K, int S, int reps, const Device &d, cudaStream_t stream) {
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t last = nullptr;
  std::vector<cudaGraphNode_t> disabled, beside;
  std::vector<cudaGraphExec_t> bodies;
  Handles tab = {};
  if (v == kOneGateIf || v == kOneGateTwoIf) {
    tab.n = v == kOneGateTwoIf ? 2 * S : S;
    for (int i = 0; i < tab.n; i++)
      tab.h[i] = new_handle(g);
    const unsigned long long *w = d.words;
    const Handles *t = d.handles;
    void *args[] = {&w, &t};
    last = after(g, last, reinterpret_cast<void *>(gate_all), args, dim3(1), dim3(kMaxHandles));
  }
  const int every = K / S;
  for (int k = 0; k < K; k++) {
    const int site = k / every;
    const bool at = k % every == 0 && site < S;
    if (at) {
      switch (v) {
      case kGateIfTwice:
      case kGateIfOnce:
        last = gated(g, last, site, d);
        break;
      case kOneGateIf:
      case kOneGateTwoIf:
        last = add_if(g, last, tab.h[site], d);
        break;
      case kEmpty:
        CHECK(cudaGraphAddEmptyNode(&last, g, last ? &last : nullptr, last ? 1 : 0));
        break;
      case kDisabled:
        last = add_body_kernel(g, last, d);
        disabled.push_back(last);
        break;
      default:
        break;
      }
    }
    last = add_production(g, last, d);
    if (at) {
      if (v == kGateIfTwice)
        last = gated(g, last, site, d);
      if (v == kOneGateTwoIf)
        last = add_if(g, last, tab.h[S + site], d);
      if (v == kDisabled) {
        last = add_body_kernel(g, last, d);
        disabled.push_back(last);
      }
      if (v == kBeside)
        beside.push_back(gated(g, last, site, d));
      if (v == kCopyBeside) {
        cudaGraphConditionalHandle h;
        last = add_gated_copy(g, last, site, d, &h);
        beside.push_back(add_if(g, last, h, d));
      }
      if (v == kExiting)
        last = add_gated_copy(g, last, site, d, nullptr);
      if (v == kExitingLaunch) {
        bodies.push_back(device_body(d, stream));
        last = add_exiting_launch(g, last, site, d, bodies.back());
      }
    }
  }
  if (!beside.empty()) {
    beside.push_back(last);
    cudaGraphNode_t join;
    CHECK(cudaGraphAddEmptyNode(&join, g, beside.data(), beside.size()));
  }
  CHECK(cudaMemcpy(d.handles, &tab, sizeof tab, cudaMemcpyHostToDevice));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  for (cudaGraphNode_t n : disabled)
    CHECK(cudaGraphNodeSetEnabled(exec, n, 0));
  for (int i = 0; i < 50; i++)
    CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; i++)
    CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaEventRecord(b, stream));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  for (cudaGraphExec_t b : bodies)
    CHECK(cudaGraphExecDestroy(b));
  return ms * 1e3 / reps;
}

} // namespace

int main(int argc, char **argv) {
  constexpr int K = 60, S = 10, R = 2000, kRounds = 5;
  bool device_words = false, open = false;
  for (int i = 1; i < argc; i++) {
    device_words |= std::string(argv[i]) == "--device-words";
    open |= std::string(argv[i]) == "--open";
  }
  Device d;
  CHECK(cudaMalloc(&d.buf, kElems * sizeof(float)));
  CHECK(cudaMalloc(&d.scratch, 4096));
  CHECK(cudaMalloc(&d.handles, sizeof(Handles)));
  CHECK(cudaMalloc(&d.tickets, kMaxHandles * sizeof(unsigned)));
  CHECK(cudaMemset(d.tickets, 0, kMaxHandles * sizeof(unsigned)));
  CHECK(cudaMalloc(&d.refused, sizeof(unsigned)));
  CHECK(cudaMemset(d.refused, 0, sizeof(unsigned)));
  unsigned long long *host_words;
  CHECK(cudaHostAlloc(&host_words, kMaxHandles * sizeof *host_words, cudaHostAllocMapped));
  for (int i = 0; i < kMaxHandles; i++)
    host_words[i] = open ? 1 : 0;
  CHECK(cudaHostGetDevicePointer(&d.words, host_words, 0));
  if (device_words) {
    CHECK(cudaMalloc(&d.words, kMaxHandles * sizeof *host_words));
    CHECK(cudaMemcpy(d.words, host_words, kMaxHandles * sizeof *host_words, cudaMemcpyHostToDevice));
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0;
  CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("%s, CUDA runtime %d; a chain of %d kernels, %d sites, gates %s (in %s memory); %d rounds of %d "
              "replays\n", prop.name, runtime, K, S, open ? "open" : "closed", device_words ? "device" : "host-mapped", kRounds, R);
  std::vector<std::vector<double>> us(kVariants);
  float runs_launched = 0; // the device-launched bodies' count, over every launch of that variant
  for (int round = 0; round < kRounds; round++)
    for (int v = 0; v < kVariants; v++) {
      CHECK(cudaMemset(d.scratch, 0, 4096));
      us[v].push_back(replay_us(static_cast<Variant>(v), K, S, R, d, stream));
      if (v == kExitingLaunch) {
        float ran = 0;
        CHECK(cudaMemcpy(&ran, d.scratch, sizeof ran, cudaMemcpyDeviceToHost));
        runs_launched += ran;
      }
    }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  const double plain = median(us[kPlain]);
  std::printf("%-24s %12s %10s %14s\n", "variant", "us/replay", "vs plain", "us per site");
  for (int v = 0; v < kVariants; v++) {
    const double m = median(us[v]);
    std::printf("%-24s %12.2f %10.3f %14.2f\n", kNames[v], m, m / plain, (m - plain) / S);
  }
  unsigned refused = 0;
  CHECK(cudaMemcpy(&refused, d.refused, sizeof refused, cudaMemcpyDeviceToHost));
  std::printf("device-launched bodies that ran: %.0f of %lld expected (%s); launches refused: %u\n", runs_launched,
              open ? (long long)kRounds * (R + 50) * S : 0LL, open ? "every site, every launch" : "none: closed",
              refused);
  // one condition for two IF nodes: the second node's creation answers
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  const cudaGraphConditionalHandle h = new_handle(g);
  cudaGraphNode_t first = add_if(g, nullptr, h, d);
  cudaGraphNodeParams p = if_params(h);
  cudaGraphNode_t second;
  const cudaError_t e = cudaGraphAddNode(&second, g, &first, nullptr, 1, &p);
  std::printf("two IF nodes on one condition: %s\n", e == cudaSuccess ? "accepted" : cudaGetErrorString(e));
  (void)cudaGetLastError();
  CHECK(cudaGraphDestroy(g));
  return 0;
}
