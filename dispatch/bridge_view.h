// The view of an intercepted call (dispatch/callview.h) as the seam builds
// it from torch's arguments: read by every call the router keys, so inline
// here and included by bridge_intercept.cpp alone.
#ifndef UST_DISPATCH_BRIDGE_VIEW_H
#define UST_DISPATCH_BRIDGE_VIEW_H

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <optional>

#include "dispatch/bridge.h"

namespace ust_bridge {

// A defined tensor argument (or a list's first): the call's device when it
// has none yet; viewed as kind when on the CPU or CUDA and strided.
[[gnu::hot]] inline bool view_tensor(const at::Tensor &t, int kind, ust__arg *a, ust__call *call) {
  const c10::Device dev = t.device();
  const int devkind = dev.is_cpu() ? UST__DEV_CPU : dev.is_cuda() ? UST__DEV_CUDA : UST__DEV_OTHER;
  if (call->device < 0) {
    call->device = devkind;
    call->device_id = dev.index() < 0 ? 0 : dev.index();
  }
  if (devkind == UST__DEV_OTHER || t.layout() != c10::kStrided)
    return false;
  a->kind = kind;
  view_meta(t, dl_device(devkind == UST__DEV_CUDA, devkind == UST__DEV_CUDA ? dev.index() : 0), &a->t, &a->dtype);
  return true;
}

// The head of a call's view: n arguments in args, made in phase (the
// thread's ust_phase); view_arg fills each argument, view_end the rest.
[[gnu::hot]] inline void view_begin(ust__call *call, ust__arg *args, size_t n, int phase) {
  call->size = sizeof *call;
  call->nargs = static_cast<int>(n);
  call->args = args;
  call->device = -1;
  call->device_id = 0;
  call->stream = nullptr;
  call->phase = phase;
}

// One argument as a typed (unboxed) call passes a tensor.
[[gnu::hot]] inline void view_arg(const at::Tensor &t, ust__arg &a, ust__call *call) {
  a.kind = UST__ARG_OTHER;
  if (!t.defined())
    a.kind = UST__ARG_NONE;
  else
    view_tensor(t, UST__ARG_TENSOR, &a, call);
}

// A bool, a float, an int, a SymInt (an int when it is one, else OTHER), as
// a typed call passes it and a boxed call's IValue holds it.
inline void view_arg(bool v, ust__arg &a, ust__call *) {
  a.kind = UST__ARG_BOOL;
  a.i = v ? 1 : 0;
}
inline void view_arg(double v, ust__arg &a, ust__call *) {
  a.kind = UST__ARG_DOUBLE;
  a.f = v;
}
inline void view_arg(int64_t v, ust__arg &a, ust__call *) {
  a.kind = UST__ARG_INT;
  a.i = v;
}
inline void view_arg(const c10::SymInt &v, ust__arg &a, ust__call *) {
  a.kind = UST__ARG_OTHER;
  if (auto i = v.maybe_as_int()) {
    a.kind = UST__ARG_INT;
    a.i = *i;
  }
}

// One argument as a boxed call holds it.
[[gnu::hot]] inline void view_arg(const c10::IValue &iv, ust__arg &a, ust__call *call) {
  a.kind = UST__ARG_OTHER;
  if (iv.isTensor()) {
    view_arg(iv.toTensor(), a, call);
  } else if (iv.isInt()) {
    view_arg(iv.toInt(), a, call);
  } else if (iv.isSymInt()) {
    view_arg(iv.toSymInt(), a, call);
  } else if (iv.isBool()) {
    view_arg(iv.toBool(), a, call);
  } else if (iv.isDouble()) {
    view_arg(iv.toDouble(), a, call);
  } else if (iv.isIntList()) {
    a.kind = UST__ARG_INTLIST;
    const auto list = iv.toIntList();
    a.i = static_cast<int64_t>(list.size());
    for (size_t k = 0; k < list.size() && k < UST__MAX_LIST; k++)
      a.list[k] = list.get(k);
  } else if (iv.isTensorList()) {
    // Collectives take their tensors as a list (c10d::allreduce_): the
    // first tensor stands for the list's device, dtype and shape.
    const auto list = iv.toTensorList();
    const at::Tensor first = list.size() > 0 ? list.get(0) : at::Tensor();
    if (first.defined() && view_tensor(first, UST__ARG_TENSORLIST, &a, call))
      a.i = static_cast<int64_t>(list.size());
  } else if (iv.isNone()) {
    a.kind = UST__ARG_NONE;
  }
}

// The data pointer of a typed call's tensor argument, where a view needs
// them (ust__binding_reads_lengths); other arguments carry none.
inline void data_arg(const at::Tensor &t, ust__arg &a) {
  if (a.kind == UST__ARG_TENSOR)
    a.t.data = data_of(t);
}
inline void data_arg(const std::optional<at::Tensor> &t, ust__arg &a) {
  if (t.has_value())
    data_arg(*t, a);
}
template <class T> inline void data_arg(const T &, ust__arg &) {}

// A typed call's Scalar: viewed as the IValue boxing it would make (an int,
// a float, a bool; a complex or an unsigned value past int64 stays OTHER).
inline void view_arg(const c10::Scalar &v, ust__arg &a, ust__call *call) { view_arg(c10::IValue(v), a, call); }

// A typed call's optionals and int lists, each viewed as the IValue boxing
// it would make is (the boxed view above), without making one.
inline void view_arg(const std::optional<double> &v, ust__arg &a, ust__call *call) {
  if (v.has_value())
    view_arg(*v, a, call);
  else
    a.kind = UST__ARG_NONE;
}
inline void view_arg(const std::optional<c10::ScalarType> &v, ust__arg &a, ust__call *call) {
  if (v.has_value()) // boxed, a dtype is an int
    view_arg(static_cast<int64_t>(*v), a, call);
  else
    a.kind = UST__ARG_NONE;
}
inline void view_arg(const std::optional<at::Tensor> &v, ust__arg &a, ust__call *call) {
  if (v.has_value())
    view_arg(*v, a, call);
  else
    a.kind = UST__ARG_NONE;
}
inline void view_arg(at::IntArrayRef v, ust__arg &a, ust__call *) {
  a.kind = UST__ARG_INTLIST;
  a.i = static_cast<int64_t>(v.size());
  for (size_t k = 0; k < v.size() && k < UST__MAX_LIST; k++)
    a.list[k] = v[k];
}
// boxed, a list of sizes none of which is held on the heap (symbolic) is
// an int list; else a SymInt list the view leaves OTHER
inline void view_arg(c10::SymIntArrayRef v, ust__arg &a, ust__call *) {
  a.kind = UST__ARG_OTHER;
  for (const auto &x : v)
    if (x.is_heap_allocated())
      return;
  a.kind = UST__ARG_INTLIST;
  a.i = static_cast<int64_t>(v.size());
  for (size_t k = 0; k < v.size() && k < UST__MAX_LIST; k++)
    a.list[k] = v[k].as_int_unchecked();
}

// Whether the call's device can be counted; its current stream when CUDA
// (NULL: torch's default, legacy one).
[[gnu::hot]] inline bool view_end(ust__call *call) {
  if (call->device < 0 || call->device == UST__DEV_OTHER)
    return false;
  if (call->device == UST__DEV_CUDA) {
    const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(call->device_id));
    call->stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dev).native_handle();
  }
  return true;
}

// The arguments of op's call on top of the stack.
[[gnu::hot]] inline const c10::IValue *stack_args(const c10::OperatorHandle &op, const torch::jit::Stack &stack,
                                                  size_t *n_schema) {
  *n_schema = op.schema().arguments().size();
  return stack.data() + (stack.size() - *n_schema);
}

// Fills the view (room for that many arguments in args) from the arguments
// on top of the stack, for a call made in phase (the thread's ust_phase).
// Returns false when the call touches no tensor understudy counts (meta,
// fake, sparse, ...).
[[gnu::hot]] inline bool build_view(const c10::OperatorHandle &op, const torch::jit::Stack &stack, ust__arg *args,
                             size_t room, ust__call *call, int phase) {
  size_t n_schema;
  const c10::IValue *ivs = stack_args(op, stack, &n_schema);
  const size_t n = std::min(n_schema, room);
  view_begin(call, args, n, phase);
  for (size_t i = 0; i < n; i++)
    view_arg(ivs[i], args[i], call);
  return view_end(call);
}

// Whether a call can be counted without a key (ust__binding_admit): the
// kernel production runs below understudy is a dense host or CUDA one (the
// keys below BackendSelect are Dense's and the CPU and CUDA backends' at
// most), so its tensors are strided on the devices a view counts; a meta,
// sparse, quantized or nested call, or one on another device, is keyed. Read
// in the call's key set, in a register. Its stream is not asked: a thread
// capturing a graph says so (ust_graph_capture_begun), and its calls are
// keyed before they get here.
[[gnu::always_inline]] inline bool tallies_below(c10::DispatchKeySet below) {
  constexpr c10::DispatchKeySet dense_host_cuda =
      c10::DispatchKeySet(c10::DispatchKey::CPU) | c10::DispatchKeySet(c10::DispatchKey::CUDA);
  // (bits, not DispatchKeySet's difference: that keeps the backend bits)
  return (below.raw_repr() & ~dense_host_cuda.raw_repr()) == 0 && !below.empty();
}

} // namespace ust_bridge

#endif // UST_DISPATCH_BRIDGE_VIEW_H
