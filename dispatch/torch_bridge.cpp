// The dispatcher seam: the only C++ in understudy.
//
// For every bound op and overload, a boxed functor is registered at the
// BackendSelect dispatch key. It builds the C view of the call (DLTensor
// arguments, scalars, the device's current native stream), hands it to the
// router, and redispatches below BackendSelect, which reaches the production
// kernel. Every exception of understudy's own is caught here and counted;
// exceptions raised by production reach the caller unchanged, as they would
// without understudy.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <memory>
#include <string>
#include <vector>

#include "dispatch/callview.h"
#include "understudy/understudy.h"

extern "C" int ust__error(int err, const char *fmt, ...);

namespace {

constexpr int kMaxArgs = 32;

struct DTypeInfo {
  int id;
  DLDataType dl;
};

DTypeInfo dtype_of(c10::ScalarType s) {
  using S = c10::ScalarType;
  switch (s) {
  case S::Half: return {UST__DT_F16, {kDLFloat, 16, 1}};
  case S::BFloat16: return {UST__DT_BF16, {kDLBfloat, 16, 1}};
  case S::Float: return {UST__DT_F32, {kDLFloat, 32, 1}};
  case S::Double: return {UST__DT_F64, {kDLFloat, 64, 1}};
  case S::Char: return {UST__DT_I8, {kDLInt, 8, 1}};
  case S::Byte: return {UST__DT_U8, {kDLUInt, 8, 1}};
  case S::Short: return {UST__DT_I16, {kDLInt, 16, 1}};
  case S::Int: return {UST__DT_I32, {kDLInt, 32, 1}};
  case S::Long: return {UST__DT_I64, {kDLInt, 64, 1}};
  case S::Bool: return {UST__DT_BOOL, {kDLUInt, 8, 1}};
  case S::Float8_e4m3fn: return {UST__DT_F8E4M3FN, {kDLFloat, 8, 1}};
  case S::Float8_e5m2: return {UST__DT_F8E5M2, {kDLFloat, 8, 1}};
  case S::Float8_e4m3fnuz: return {UST__DT_F8E4M3FNUZ, {kDLFloat, 8, 1}};
  case S::Float8_e5m2fnuz: return {UST__DT_F8E5M2FNUZ, {kDLFloat, 8, 1}};
  case S::ComplexFloat: return {UST__DT_C64, {kDLComplex, 64, 1}};
  case S::ComplexDouble: return {UST__DT_C128, {kDLComplex, 128, 1}};
  default: return {UST__DT_OTHER, {kDLOpaqueHandle, 0, 1}};
  }
}

// Fills the view from the arguments on top of the stack. Returns false when
// the call touches no tensor understudy counts (meta, fake, sparse, ...).
bool build_view(const c10::OperatorHandle &op, const torch::jit::Stack &stack, ust__arg *args,
                ust__call *call) {
  const size_t n_schema = op.schema().arguments().size();
  const size_t n = std::min<size_t>(n_schema, kMaxArgs);
  const c10::IValue *ivs = stack.data() + (stack.size() - n_schema);
  call->size = sizeof *call;
  call->nargs = static_cast<int>(n);
  call->args = args;
  call->device = -1;
  call->device_id = 0;
  call->stream = nullptr;
  for (size_t i = 0; i < n; i++) {
    const c10::IValue &iv = ivs[i];
    ust__arg &a = args[i];
    a.kind = UST__ARG_OTHER;
    if (iv.isTensor()) {
      const at::Tensor &t = iv.toTensor();
      if (!t.defined()) {
        a.kind = UST__ARG_NONE;
        continue;
      }
      const c10::Device dev = t.device();
      const int devkind = dev.is_cpu() ? UST__DEV_CPU : dev.is_cuda() ? UST__DEV_CUDA : UST__DEV_OTHER;
      if (call->device < 0) {
        call->device = devkind;
        call->device_id = dev.index() < 0 ? 0 : dev.index();
      }
      if (devkind == UST__DEV_OTHER || t.layout() != c10::kStrided)
        continue;
      const DTypeInfo d = dtype_of(t.scalar_type());
      a.kind = UST__ARG_TENSOR;
      a.dtype = d.id;
      a.t.data = t.has_storage() ? const_cast<void *>(t.const_data_ptr()) : nullptr;
      a.t.device.device_type = devkind == UST__DEV_CPU ? kDLCPU : kDLCUDA;
      a.t.device.device_id = call->device_id;
      a.t.ndim = static_cast<int32_t>(t.dim());
      a.t.dtype = d.dl;
      a.t.shape = const_cast<int64_t *>(t.sizes().data());
      a.t.strides = const_cast<int64_t *>(t.strides().data());
      a.t.byte_offset = 0;
    } else if (iv.isInt()) {
      a.kind = UST__ARG_INT;
      a.i = iv.toInt();
    } else if (iv.isSymInt()) {
      if (auto v = iv.toSymInt().maybe_as_int()) {
        a.kind = UST__ARG_INT;
        a.i = *v;
      }
    } else if (iv.isBool()) {
      a.kind = UST__ARG_BOOL;
      a.i = iv.toBool() ? 1 : 0;
    } else if (iv.isDouble()) {
      a.kind = UST__ARG_DOUBLE;
      a.f = iv.toDouble();
    } else if (iv.isIntList()) {
      a.kind = UST__ARG_INTLIST;
      a.i = static_cast<int64_t>(iv.toIntList().size());
    } else if (iv.isNone()) {
      a.kind = UST__ARG_NONE;
    }
  }
  if (call->device < 0 || call->device == UST__DEV_OTHER)
    return false;
  if (call->device == UST__DEV_CUDA) {
    const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(call->device_id));
    call->stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dev).native_handle();
  }
  return true;
}

void resolve_names(ust__binding *b, const c10::OperatorHandle &op) {
  const auto &schema_args = op.schema().arguments();
  std::vector<const char *> names;
  names.reserve(schema_args.size());
  for (const auto &arg : schema_args)
    names.push_back(arg.name().c_str());
  ust__binding_resolve(b, static_cast<int>(names.size()), names.data());
}

struct InflightGuard {
  InflightGuard() { ust__inflight_enter(); }
  ~InflightGuard() { ust__inflight_leave(); }
  InflightGuard(const InflightGuard &) = delete;
  InflightGuard &operator=(const InflightGuard &) = delete;
};

class Interceptor final : public c10::OperatorKernel {
public:
  explicit Interceptor(ust__binding *b) : b_(b) {}

  void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack) {
    InflightGuard inflight;
    const c10::DispatchKeySet below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                                                               c10::DispatchKey::BackendSelect);
    if (ust__binding_is_off(b_)) {
      op.redispatchBoxed(below, stack);
      return;
    }
    ust__arg args[kMaxArgs];
    ust__call call;
    ust__call_state st{};
    bool tracked = false;
    try {
      if (ust__binding_needs_names(b_))
        resolve_names(b_, op);
      tracked = build_view(op, *stack, args, &call);
      if (tracked)
        ust__call_begin(b_, &call, &st);
    } catch (...) {
      ust__count_internal_error();
      tracked = false;
    }
    try {
      op.redispatchBoxed(below, stack);
    } catch (...) {
      if (tracked)
        ust__call_cancel(&call, &st);
      throw;
    }
    if (tracked)
      ust__call_end(&call, &st);
  }

private:
  ust__binding *b_;
};

int register_binding(ust__binding *b, void **handle) {
  *handle = nullptr;
  const char *display = ust__binding_display(b);
  try {
    c10::OperatorName name(ust__binding_qualname(b), ust__binding_overload(b));
    auto &dispatcher = c10::Dispatcher::singleton();
    if (auto existing = dispatcher.findOp(name)) {
      if (existing->hasKernelForDispatchKey(c10::DispatchKey::BackendSelect))
        return ust__error(UST_ETORCH,
                          "%s already has a BackendSelect kernel; intercepting it would bypass that kernel",
                          display);
    }
    auto kernel = c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<Interceptor>(b));
    auto reg = dispatcher.registerImpl(name, c10::DispatchKey::BackendSelect, std::move(kernel), std::nullopt,
                                       nullptr, std::string("understudy interceptor for ") + display);
    *handle = new c10::RegistrationHandleRAII(std::move(reg));
    return 0;
  } catch (const std::exception &e) {
    return ust__error(UST_ETORCH, "registering an interceptor for %s failed: %s", display, e.what());
  } catch (...) {
    return ust__error(UST_ETORCH, "registering an interceptor for %s failed", display);
  }
}

void unregister_binding(void *handle) {
  try {
    delete static_cast<c10::RegistrationHandleRAII *>(handle);
  } catch (...) {
    ust__count_internal_error();
  }
}

int op_defined(const char *qualname, const char *overload) {
  try {
    return c10::Dispatcher::singleton().findSchema(c10::OperatorName(qualname, overload)).has_value() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

#ifdef UST_TORCH_VERSION
constexpr const char *kTorchVersion = UST_TORCH_VERSION;
#else
constexpr const char *kTorchVersion = "";
#endif

const ust__seam_i kSeam = {kTorchVersion, register_binding, unregister_binding, op_defined};

struct SeamInstaller {
  SeamInstaller() { ust__seam_install(&kSeam); }
} installer;

} // namespace
