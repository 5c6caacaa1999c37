// The seam's table for the C core (ust__seam_i, dispatch/callview.h): the
// registration of interceptors, and what the core asks of torch itself (an
// op's existence, a torch-op candidate's handle, TF32, the profiler).
#include <dlfcn.h>
#include <kineto/libkineto.h>

#include <map>
#include <mutex>

#include "dispatch/bridge.h"

namespace ust_bridge {
namespace {

int op_defined(const char *qualname, const char *overload) {
  try {
    return c10::Dispatcher::singleton().findSchema(c10::OperatorName(qualname, overload)).has_value() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

// Handles of torch-op candidates, one per op for the life of the process:
// every enable, and threads resolving an op at once, get the same one.
std::mutex resolved_lock;
std::map<std::string, c10::OperatorHandle *> handles_by_name;

void *find_op_handle(const char *qualname, const char *overload) {
  try {
    const std::string key = std::string(qualname) + "." + overload;
    std::lock_guard<std::mutex> guard(resolved_lock);
    auto known = handles_by_name.find(key);
    if (known != handles_by_name.end())
      return known->second;
    auto h = c10::Dispatcher::singleton().findSchema(c10::OperatorName(qualname, overload));
    if (!h.has_value())
      return nullptr;
    auto *kept = new c10::OperatorHandle(*h);
    handles_by_name.emplace(key, kept);
    return kept;
  } catch (...) {
    return nullptr;
  }
}

#ifdef UST_TORCH_VERSION
constexpr const char *kTorchVersion = UST_TORCH_VERSION;
#else
constexpr const char *kTorchVersion = "";
#endif

int matmul_allows_tf32(int device) {
  try {
#ifdef UST_TORCH_FP32_PRECISION
    const auto backend = device == UST__DEV_CUDA ? at::Float32Backend::CUDA : at::Float32Backend::MKLDNN;
    return at::globalContext().float32Precision(backend, at::Float32Op::MATMUL) == at::Float32Precision::TF32 ? 1 : 0;
#else
    // a torch without per-backend precisions: cuBLAS's switch; oneDNN's is not known
    return device == UST__DEV_CUDA && at::globalContext().allowTF32CuBLAS() ? 1 : 0;
#endif
  } catch (...) {
    return 0;
  }
}

int resolve_binding(ust__binding *b) {
  try {
    auto op = c10::Dispatcher::singleton().findSchema(
        c10::OperatorName(ust__binding_qualname(b), ust__binding_overload(b)));
    if (!op.has_value())
      return 0;
    if (ust__binding_needs_names(b))
      resolve_names(b, *op);
    return 1;
  } catch (...) {
    return 0;
  }
}

/* torch's profiler: enabled (torch.profiler recording) or Kineto preparing a
 * trace (the warm-up of a schedule, when it already holds CUPTI). Looked up
 * at run time: a torch whose build leaves either out answers "no". */
int profiler_active() {
  using enabled_fn = bool (*)();
  using kineto_fn = libkineto::LibkinetoApi &(*)();
  static const auto enabled =
      reinterpret_cast<enabled_fn>(dlsym(RTLD_DEFAULT, "_ZN5torch8autograd8profiler29isProfilerEnabledInMainThreadEv"));
  static const auto kineto = reinterpret_cast<kineto_fn>(dlsym(RTLD_DEFAULT, "_ZN9libkineto3apiEv"));
  try {
    if (enabled != nullptr && enabled())
      return 1;
    if (kineto != nullptr) {
      libkineto::LibkinetoApi &api = kineto();
      if (api.isProfilerRegistered() && api.activityProfiler().isActive())
        return 1;
    }
  } catch (...) {
  }
  return 0;
}

const ust__seam_i kSeam = {kTorchVersion,     register_hook,           op_defined, resolve_binding, find_op_handle,
                           matmul_allows_tf32, profiler_active};

} // namespace
} // namespace ust_bridge

extern "C" const ust__seam_i *ust__seam(void) { return &ust_bridge::kSeam; }
