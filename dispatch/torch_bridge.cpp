// The dispatcher seam: the only C++ in understudy.
//
// For every bound op and overload, a boxed functor is registered at the
// BackendSelect dispatch key. It builds the C view of the call (DLTensor
// arguments, scalars, the device's current native stream), hands it to the
// router, and redispatches below BackendSelect, which reaches the production
// kernel. Every exception of understudy's own is caught here and counted;
// exceptions raised by production reach the caller unchanged, as they would
// without understudy.
//
// Shadowed calls (the router decides which) also snapshot the arguments
// production writes, run the candidate on the snapshot after production, and
// hand both sides' outputs to the guard. Production's results are what the
// caller receives; a candidate that fails or raises only earns a verdict.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/callview.h"
#include "guard/guard.h"
#include "understudy/candidate.h"
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

// A borrowed DLPack view of t (its sizes and strides live in the TensorImpl,
// valid while t is). The data pointer is read-only access to torch (no
// copy-on-write materialisation); writable snapshots are understudy's own.
DLDevice dl_device(bool cuda, int index) {
#if defined(UST_GPU_HIP)
  return DLDevice{cuda ? kDLROCM : kDLCPU, cuda ? index : 0};
#else
  return DLDevice{cuda ? kDLCUDA : kDLCPU, cuda ? index : 0};
#endif
}

void fill_dl(const at::Tensor &t, DLTensor *dl, int *dtype_id) {
  const DTypeInfo d = dtype_of(t.scalar_type());
  std::memset(dl, 0, sizeof *dl);
  dl->data = t.has_storage() ? const_cast<void *>(t.const_data_ptr()) : nullptr;
  dl->device = dl_device(t.is_cuda(), t.is_cuda() ? t.get_device() : 0);
  dl->ndim = static_cast<int32_t>(t.dim());
  dl->dtype = d.dl;
  dl->shape = const_cast<int64_t *>(t.sizes().data());
  dl->strides = const_cast<int64_t *>(t.strides().data());
  if (dtype_id != nullptr)
    *dtype_id = d.id;
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
      a.kind = UST__ARG_TENSOR;
      fill_dl(t, &a.t, &a.dtype);
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
  uint32_t writes = 0;
  for (size_t i = 0; i < schema_args.size(); i++) {
    names.push_back(schema_args[i].name().c_str());
    const auto *alias = schema_args[i].alias_info();
    if (alias != nullptr && alias->isWrite() && i < 32)
      writes |= 1u << i;
  }
  ust__binding_resolve(b, static_cast<int>(names.size()), names.data(), writes);
}

// Calls made while understudy runs a shadow (snapshots, the candidate, its
// own use of aten ops) pass through the interceptors untouched: they are
// not live traffic, and a candidate built from the op it stands in for must
// not shadow itself.
thread_local int tl_shadow_depth = 0;

// Calls a bound op makes to other bound ops while it runs (a framework's
// attention wrapper calling its flash kernel, SDPA's math path calling bmm)
// are part of the outer call: counting them again would count their device
// time twice in the operators' weights. They pass through untouched.
thread_local int tl_call_depth = 0;

struct CallScope {
  CallScope() { tl_call_depth++; }
  ~CallScope() { tl_call_depth--; }
  CallScope(const CallScope &) = delete;
  CallScope &operator=(const CallScope &) = delete;
};

struct ShadowScope {
  ShadowScope() { tl_shadow_depth++; }
  ~ShadowScope() { tl_shadow_depth--; }
  ShadowScope(const ShadowScope &) = delete;
  ShadowScope &operator=(const ShadowScope &) = delete;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
};

const char *result_name(size_t j) {
  static const char *names[] = {"result 0", "result 1", "result 2", "result 3",
                                "result 4", "result 5", "result 6", "result 7"};
  return j < 8 ? names[j] : "result";
}

bool is_defined_tensor(const c10::IValue &v) { return v.isTensor() && v.toTensor().defined(); }

// Fresh outputs for a native candidate, like production's, filled with a
// value no correct kernel leaves behind, so an output the candidate forgets
// to write cannot pass by reusing memory that held the right answer.
at::Tensor poisoned_like(const at::Tensor &r) {
  at::Tensor t = at::empty_strided(r.sizes(), r.strides(), r.options());
  if (at::isFloatingType(r.scalar_type()))
    t.fill_(std::numeric_limits<double>::quiet_NaN());
  else if (r.scalar_type() != at::kBool)
    t.fill_(-77);
  return t;
}

void enter_call_device(c10::OptionalDeviceGuard &g, const ust__call &call) {
  if (call.device == UST__DEV_CUDA)
    g.reset_device(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(call.device_id)));
}

// One shadowed call. prepare() runs before production, the rest after it;
// every method may throw (an internal error: the caller's result is already
// production's, and the slot is then abandoned by the caller of these).
class ShadowRun {
public:
  // serving: the candidate serves this call (canary, live) and production,
  // when the call is verified, runs on the snapshots; otherwise (shadow)
  // production serves and the candidate runs on the snapshots.
  ShadowRun(const c10::OperatorHandle &op, const ust__binding *b, const ust__call &call, ust__call_state &st,
            bool serving = false)
      : b_(b), call_(call), st_(st), n_args_(op.schema().arguments().size()),
        n_returns_(op.schema().returns().size()), serving_(serving) {}

  // Before production: what is needed later, and snapshots of what
  // production writes. Read-only arguments that share storage with a
  // written one are copied too (addmm(c, a, b, out=c)): the candidate must
  // read them as production did, before production wrote them.
  void prepare(const torch::jit::Stack &stack, bool snapshots = true) {
    ShadowScope scope;
    ust__shadow_info_get(&st_, &info_);
    saved_.assign(stack.end() - static_cast<std::ptrdiff_t>(n_args_), stack.end());
    snaps_.resize(n_args_);
    aa_snaps_.resize(n_args_);
    inputs_.resize(n_args_);
    for (size_t i = 0; snapshots && i < n_args_ && i < 32; i++) {
      if (!((info_.writes_mask >> i) & 1u))
        continue;
      if (saved_[i].isTensorList())
        throw std::runtime_error("written tensor lists are not shadowed");
      if (!is_defined_tensor(saved_[i]))
        continue;
      snaps_[i] = saved_[i].toTensor().clone(at::MemoryFormat::Preserve);
      if (info_.aa)
        aa_snaps_[i] = saved_[i].toTensor().clone(at::MemoryFormat::Preserve);
    }
    for (size_t i = 0; i < n_args_; i++) {
      if (snaps_[i].defined() || !is_defined_tensor(saved_[i]) || !saved_[i].toTensor().has_storage())
        continue;
      const at::Tensor &t = saved_[i].toTensor();
      for (size_t j = 0; j < n_args_; j++)
        if (snaps_[j].defined() && saved_[j].toTensor().has_storage() && saved_[j].toTensor().is_alias_of(t)) {
          inputs_[i] = t.clone(at::MemoryFormat::Preserve);
          break;
        }
    }
  }

  // After production returned: the candidate, the A/A run, the comparison.
  void run_candidate_and_compare(const c10::OperatorHandle &op, c10::DispatchKeySet below,
                                 const torch::jit::Stack &stack) {
    ShadowScope scope;
    prod_returns_.assign(stack.end() - static_cast<std::ptrdiff_t>(n_returns_), stack.end());
    learn_layout();
    // An out= argument production resized holds nothing the candidate
    // needs: give the candidate one of production's final shape.
    for (size_t i = 0; i < n_args_; i++)
      if (snaps_[i].defined() && snaps_[i].sizes() != saved_[i].toTensor().sizes()) {
        snaps_[i] = poisoned_like(saved_[i].toTensor());
        if (aa_snaps_[i].defined())
          aa_snaps_[i] = poisoned_like(saved_[i].toTensor());
      }
    std::vector<c10::IValue> cand_returns;
    std::string msg;
    // Everything understudy does for the candidate happens outside its
    // timed interval: the interval holds the candidate alone.
    int fail = info_.kind == UST__CAND_NATIVE ? prepare_native(cand_returns) : prepare_torch_op(msg);
    if (fail == UST__FAIL_NONE) {
      ust__shadow_mark(&st_, UST__MARK_CAND_BEGIN, &call_);
      fail = info_.kind == UST__CAND_NATIVE ? call_native(msg) : call_torch_op(cand_returns, msg);
      ust__shadow_mark(&st_, UST__MARK_CAND_END, &call_);
    }

    std::vector<c10::IValue> aa_returns;
    if (info_.aa) {
      torch::jit::Stack aa_stack = with_snapshots(aa_snaps_);
      op.redispatchBoxed(below, &aa_stack);
      aa_returns.assign(aa_stack.begin(), aa_stack.end());
    }

    std::vector<ust__pair> pairs;
    if (fail == UST__FAIL_NONE)
      add_pairs(pairs, snaps_, cand_returns, 0, fail, msg);
    if (info_.aa)
      add_pairs(pairs, aa_snaps_, aa_returns, 1, fail, msg);
    ust__shadow_finish(&call_, &st_, pairs.data(), static_cast<int>(pairs.size()), fail,
                       msg.empty() ? nullptr : msg.c_str());
  }

  enum Served { kCandidate, kProduction, kRunProduction };

  // Serving (canary, live): the candidate runs on the call's own arguments
  // and its outputs replace them on the stack (kCandidate). When the call is
  // verified, production first runs on the snapshots (it may raise: that
  // reaches the caller as it would without understudy) and the guard gets
  // both sides. When the candidate fails, or a verdict known before
  // returning says it is wrong, production's results are served instead:
  // already on the stack (kProduction), or to be computed by the caller on
  // the restored arguments (kRunProduction).
  Served serve(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack &stack) {
    ShadowScope scope;
    const bool verify = st_.shadow != nullptr;
    if (verify) {
      ust__shadow_mark(&st_, UST__MARK_PROD_BEGIN, &call_);
      torch::jit::Stack ps = with_snapshots(snaps_);
      try {
        op.redispatchBoxed(below, &ps);
      } catch (...) {
        production_raised_ = true;
        throw;
      }
      ust__shadow_mark(&st_, UST__MARK_PROD_END, &call_);
      prod_returns_.assign(ps.begin(), ps.end());
      production_ran_ = true; // from here on the snapshots hold production's results
      learn_layout();
    }
    std::vector<c10::IValue> cand_returns;
    std::string msg;
    int fail = UST__FAIL_NONE;
    if (info_.kind == UST__CAND_NATIVE) {
      if (!native_outputs(verify, cand_returns)) {
        ust__call_unlearned(&st_);
        if (verify)
          ust__shadow_abandon(&call_, &st_);
        return verify ? production_instead(stack) : kRunProduction;
      }
    } else {
      fail = prepare_torch_op(msg, saved_);
    }
    if (fail == UST__FAIL_NONE) {
      if (verify)
        ust__shadow_mark(&st_, UST__MARK_CAND_BEGIN, &call_);
      fail = info_.kind == UST__CAND_NATIVE ? call_native(msg) : call_torch_op(cand_returns, msg);
      if (verify)
        ust__shadow_mark(&st_, UST__MARK_CAND_END, &call_);
    }
    if (fail != UST__FAIL_NONE) {
      if (verify) {
        ust__shadow_finish(&call_, &st_, nullptr, 0, fail, msg.c_str());
        return production_instead(stack);
      }
      ust__call_serve_failed(&st_, fail, msg.c_str());
      restore_written();
      return kRunProduction;
    }
    if (verify) {
      std::vector<ust__pair> pairs;
      add_pairs(pairs, snaps_, cand_returns, 0, fail, msg);
      // A host comparison concludes in ust__shadow_finish; a device one when
      // the worker harvests it, unless strict waits for it here. This call's
      // own verdict decides what it serves.
      const bool wait = call_.device != UST__DEV_CUDA || ust__call_strict(&st_);
      if (wait)
        ust__shadow_want_verdict(&st_);
      ust__shadow_finish(&call_, &st_, pairs.data(), static_cast<int>(pairs.size()), fail,
                         msg.empty() ? nullptr : msg.c_str());
      if (wait && ust__shadow_verdict(&call_, &st_, call_.device == UST__DEV_CUDA) == 1)
        return production_instead(stack);
      ust__call_verified_serving(&st_);
    }
    torch::jit::drop(stack, n_args_);
    for (size_t j = 0; j < n_returns_; j++)
      stack.push_back(j < cand_returns.size() ? cand_returns[j] : c10::IValue());
    return kCandidate;
  }

  bool production_raised() const { return production_raised_; }
  bool production_ran() const { return production_ran_; }

  // Production's results as the call's: its writes (in the snapshots) copied
  // into the arguments, its returns on the stack.
  Served production_instead(torch::jit::Stack &stack) {
    for (size_t i = 0; i < n_args_; i++)
      if (snaps_[i].defined())
        saved_[i].toTensor().copy_(snaps_[i]);
    torch::jit::drop(stack, n_args_);
    for (size_t j = 0; j < n_returns_; j++) {
      c10::IValue v = j < prod_returns_.size() ? prod_returns_[j] : c10::IValue();
      for (size_t i = 0; i < n_args_ && is_defined_tensor(v); i++)
        if (snaps_[i].defined() && snaps_[i].is_same(v.toTensor()))
          v = saved_[i]; // a return that is a written argument is the caller's argument
      stack.push_back(v);
    }
    return kProduction;
  }

  // The arguments the candidate may have written, back to what they held.
  void restore_written() {
    for (size_t i = 0; i < n_args_; i++)
      if (snaps_[i].defined())
        saved_[i].toTensor().copy_(snaps_[i]);
  }

private:
  torch::jit::Stack with_snapshots(const std::vector<at::Tensor> &snaps) const {
    torch::jit::Stack s(saved_.begin(), saved_.end());
    for (size_t i = 0; i < n_args_; i++) {
      if (snaps[i].defined())
        s[i] = snaps[i];
      else if (inputs_[i].defined())
        s[i] = inputs_[i];
    }
    return s;
  }


  // The layout of production's returns, learned for calls with this call's
  // signature so that a native candidate serving unverified calls gets
  // outputs like production's. Per return: 0 none, 1 a fresh tensor (dtype,
  // device index, rank, sizes, strides), 2 a written argument (its index),
  // 3 a value a native candidate cannot produce.
  void learn_layout() {
    size_t known = 0;
    if (info_.kind != UST__CAND_NATIVE || n_returns_ == 0 || ust__call_layout(&st_, &call_, &known) != nullptr)
      return; // nothing to lay out, or learned already
    std::vector<int64_t> blob{static_cast<int64_t>(prod_returns_.size())};
    for (size_t j = 0; j < prod_returns_.size(); j++) {
      const c10::IValue &v = prod_returns_[j];
      int64_t alias = -1;
      for (size_t i = 0; i < n_args_ && is_defined_tensor(v); i++)
        if (snaps_[i].defined() && (serving_ ? snaps_[i] : saved_[i].toTensor()).is_same(v.toTensor()))
          alias = static_cast<int64_t>(i);
      if (alias >= 0) {
        blob.insert(blob.end(), {2, alias});
      } else if (is_defined_tensor(v)) {
        const at::Tensor &t = v.toTensor();
        blob.insert(blob.end(), {1, static_cast<int64_t>(t.scalar_type()), t.is_cuda() ? t.get_device() : -1,
                                 t.dim()});
        blob.insert(blob.end(), t.sizes().begin(), t.sizes().end());
        blob.insert(blob.end(), t.strides().begin(), t.strides().end());
      } else {
        blob.push_back(v.isNone() ? 0 : 3);
      }
    }
    ust__call_learn_layout(&st_, &call_, blob.data(), blob.size() * sizeof(int64_t));
  }

  // The candidate ABI's view of the call's arguments, as the call view read them.
  void call_values() {
    values_.assign(n_args_, ust_value{});
    for (size_t i = 0; i < n_args_; i++) {
      ust_value &v = values_[i];
      v.name = ust__binding_arg_name(b_, static_cast<int>(i));
      const ust__arg *a = static_cast<int>(i) < call_.nargs ? &call_.args[i] : nullptr;
      switch (a != nullptr ? a->kind : UST__ARG_OTHER) {
      case UST__ARG_NONE: v.kind = UST_VALUE_NONE; break;
      case UST__ARG_TENSOR: v.kind = UST_VALUE_TENSOR; v.tensor = a->t; break;
      case UST__ARG_INT: v.kind = UST_VALUE_INT; v.i = a->i; break;
      case UST__ARG_BOOL: v.kind = UST_VALUE_BOOL; v.i = a->i; break;
      case UST__ARG_DOUBLE: v.kind = UST_VALUE_DOUBLE; v.f = a->f; break;
      default: v.kind = UST_VALUE_OTHER;
      }
    }
  }

  // A native candidate serving: its arguments are the call's own (written
  // ones writable), its outputs fresh tensors like production's returns
  // (this call's when verified, else the learned layout). false when no
  // layout is known for this call's shapes.
  bool native_outputs(bool verify, std::vector<c10::IValue> &cand_returns) {
    call_values();
    for (size_t i = 0; i < n_args_ && i < 32; i++)
      values_[i].writable = (info_.writes_mask >> i) & 1u;
    cand_returns.assign(n_returns_, c10::IValue());
    if (verify) {
      for (size_t j = 0; j < n_returns_; j++) {
        if (!is_defined_tensor(prod_returns_[j]))
          continue;
        const at::Tensor &r = prod_returns_[j].toTensor();
        bool alias = false;
        for (size_t i = 0; i < n_args_; i++)
          if (snaps_[i].defined() && snaps_[i].is_same(r)) {
            cand_returns[j] = saved_[i];
            alias = true;
          }
        if (!alias) {
          native_outputs_.push_back(poisoned_like(r));
          cand_returns[j] = native_outputs_.back();
        }
      }
    } else if (n_returns_ > 0) {
      size_t len = 0;
      const int64_t *l = static_cast<const int64_t *>(ust__call_layout(&st_, &call_, &len));
      const size_t n = len / sizeof(int64_t);
      if (l == nullptr || n < 1 || static_cast<size_t>(l[0]) != n_returns_)
        return false;
      size_t at = 1;
      for (size_t j = 0; j < n_returns_; j++) {
        if (at >= n)
          return false;
        const int64_t kind = l[at++];
        if (kind == 3)
          return false;
        if (kind == 2) {
          cand_returns[j] = saved_[static_cast<size_t>(l[at++])];
        } else if (kind == 1) {
          const auto dtype = static_cast<c10::ScalarType>(l[at]);
          const int64_t dev = l[at + 1], rank = l[at + 2];
          at += 3;
          if (at + 2 * static_cast<size_t>(rank) > n)
            return false;
          c10::IntArrayRef sizes(l + at, static_cast<size_t>(rank)), strides(l + at + rank, static_cast<size_t>(rank));
          at += 2 * static_cast<size_t>(rank);
          auto opts = at::TensorOptions().dtype(dtype).device(
              dev < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(dev)));
          native_outputs_.push_back(at::empty_strided(sizes, strides, opts));
          cand_returns[j] = native_outputs_.back();
        }
      }
    }
    outputs_.resize(native_outputs_.size());
    for (size_t k = 0; k < native_outputs_.size(); k++)
      fill_dl(native_outputs_[k], &outputs_[k], nullptr);
    return true;
  }

  // The production return j aliases a written argument: compared there.
  bool aliases_written_arg(size_t j) const {
    if (!is_defined_tensor(prod_returns_[j]))
      return false;
    const at::Tensor &r = prod_returns_[j].toTensor();
    for (size_t i = 0; i < n_args_; i++)
      if (snaps_[i].defined() && (serving_ ? snaps_[i] : saved_[i].toTensor()).is_same(r))
        return true;
    return false;
  }

  bool compared_return(size_t j) const {
    return info_.compared_returns < 0 || j < static_cast<size_t>(info_.compared_returns);
  }

  // The arguments as the call view read them, with understudy's snapshots
  // in place of what production writes (and of read-only arguments that
  // alias it), and fresh outputs like production's returns.
  int prepare_native(std::vector<c10::IValue> &cand_returns) {
    call_values();
    for (size_t i = 0; i < n_args_; i++) {
      ust_value &v = values_[i];
      if (snaps_[i].defined()) {
        v.writable = 1;
        fill_dl(snaps_[i], &v.tensor, nullptr);
      } else if (inputs_[i].defined()) {
        fill_dl(inputs_[i], &v.tensor, nullptr);
      }
    }
    cand_returns.assign(n_returns_, c10::IValue());
    for (size_t j = 0; j < n_returns_; j++) {
      if (!is_defined_tensor(prod_returns_[j]) || aliases_written_arg(j))
        continue;
      native_outputs_.push_back(poisoned_like(prod_returns_[j].toTensor()));
      cand_returns[j] = native_outputs_.back();
    }
    outputs_.resize(native_outputs_.size());
    for (size_t k = 0; k < native_outputs_.size(); k++)
      fill_dl(native_outputs_[k], &outputs_[k], nullptr);
    return UST__FAIL_NONE;
  }

  int call_native(std::string &msg) {
    const ust_candidate *d = info_.native;
    ust_candidate_call cc;
    std::memset(&cc, 0, sizeof cc);
    cc.size = sizeof cc;
    cc.n_args = static_cast<int32_t>(n_args_);
    cc.args = values_.data();
    cc.n_outputs = static_cast<int32_t>(outputs_.size());
    cc.outputs = outputs_.data();
    cc.device = dl_device(call_.device == UST__DEV_CUDA, call_.device_id);
    cc.stream = call_.stream;
    char buf[256] = "";
    int rc = 0;
    if (int f = guarded([&] { rc = d->run(d->ctx, &cc, buf, sizeof buf); }, msg))
      return f;
    if (rc != 0) {
      buf[sizeof buf - 1] = '\0';
      msg = "candidate returned status " + std::to_string(rc) + (buf[0] ? std::string(": ") + buf : std::string());
      return UST__FAIL_ERROR;
    }
    return UST__FAIL_NONE;
  }

  int prepare_torch_op(std::string &msg) { return prepare_torch_op(msg, with_snapshots(snaps_)); }

  int prepare_torch_op(std::string &msg, const torch::jit::Stack &args) {
    auto handle = c10::Dispatcher::singleton().findSchema(c10::OperatorName(info_.torch_op, info_.torch_overload));
    if (!handle.has_value())
      throw std::runtime_error(std::string("candidate op ") + info_.torch_op + " is not defined in this process");
    const auto &cs = handle->schema();
    if (cs.arguments().size() != n_args_ || cs.returns().size() != n_returns_) {
      msg = "candidate " + cs.operator_name().name + " takes " + std::to_string(cs.arguments().size()) +
            " arguments and returns " + std::to_string(cs.returns().size()) + " values; production " +
            std::to_string(n_args_) + " and " + std::to_string(n_returns_);
      return UST__FAIL_SCHEMA;
    }
    cand_op_ = *handle;
    cand_stack_ = args;
    return UST__FAIL_NONE;
  }

  int call_torch_op(std::vector<c10::IValue> &cand_returns, std::string &msg) {
    if (int f = guarded([&] { cand_op_->callBoxed(&cand_stack_); }, msg))
      return f;
    cand_returns.assign(cand_stack_.begin(), cand_stack_.end());
    return UST__FAIL_NONE;
  }

  // Runs the candidate; whatever it raises stays here and becomes a verdict.
  template <typename F> static int guarded(F &&run, std::string &msg) {
    try {
      run();
      return UST__FAIL_NONE;
    } catch (const std::exception &e) {
      msg = std::string("candidate raised: ") + e.what();
    } catch (...) {
      msg = "candidate raised an exception";
    }
    if (msg.size() > 240)
      msg.resize(240);
    return UST__FAIL_RAISED;
  }

  // Pairs of (production's value, the other side's): every written argument
  // (against its snapshot, which the other side wrote), then every compared
  // return that is not a written argument. A return understudy cannot read
  // (a tensor list, ...) makes the call unverifiable rather than passed.
  void add_pairs(std::vector<ust__pair> &pairs, const std::vector<at::Tensor> &snaps,
                 const std::vector<c10::IValue> &other_returns, int aa, int &fail, std::string &msg) {
    std::vector<const char *> names;
    std::vector<at::Tensor> prod, other;
    for (size_t i = 0; i < n_args_; i++)
      if (snaps[i].defined()) {
        // production wrote the caller's argument and the other side the
        // snapshot; serving, the other way round
        names.push_back(ust__binding_arg_name(b_, static_cast<int>(i)));
        prod.push_back(serving_ && !aa ? snaps[i] : saved_[i].toTensor());
        other.push_back(serving_ && !aa ? saved_[i].toTensor() : snaps[i]);
      }
    bool unreadable = false;
    for (size_t j = 0; j < n_returns_; j++) {
      if (!compared_return(j) || aliases_written_arg(j) || prod_returns_[j].isNone())
        continue;
      if (!is_defined_tensor(prod_returns_[j])) {
        unreadable |= !(prod_returns_[j].isTensor() || prod_returns_[j].isInt() || prod_returns_[j].isDouble() ||
                        prod_returns_[j].isBool());
        continue;
      }
      if (j >= other_returns.size() || !is_defined_tensor(other_returns[j])) {
        if (!aa && fail == UST__FAIL_NONE) {
          fail = UST__FAIL_SCHEMA;
          msg = std::string("candidate returned no tensor for ") + result_name(j);
        }
        continue;
      }
      names.push_back(result_name(j));
      prod.push_back(prod_returns_[j].toTensor());
      other.push_back(other_returns[j].toTensor());
    }
    if (info_.compare == UST__CMP_SET) {
      as_sets(prod);
      as_sets(other);
    }
    for (size_t k = 0; k < prod.size(); k++)
      add_pair(pairs, names[k], prod[k], other[k], aa);
    if (unreadable || pairs.size() >= 2 * UST__SHADOW_MAX_PAIRS) {
      // A pair whose dtype the guard does not read: the verdict is then
      // "unverifiable", never "passed" on a partial look.
      ust__pair p;
      std::memset(&p, 0, sizeof p);
      p.name = "unreadable outputs";
      p.aa = aa;
      p.prod_dtype = p.cand_dtype = UST__DT_OTHER;
      if (pairs.size() >= 2 * UST__SHADOW_MAX_PAIRS)
        pairs.back() = p;
      else
        pairs.push_back(p);
    }
  }

  // Set comparison (top-k style): order the rows of one side's outputs by
  // (first output's value, then second's) with one permutation, so values
  // and indices stay paired and ties order the same way on both sides.
  static void as_sets(std::vector<at::Tensor> &ts) {
    if (ts.empty() || ts[0].dim() == 0 || ts[0].scalar_type() == at::kBool)
      return;
    at::Tensor perm;
    if (ts.size() > 1 && ts[1].sizes() == ts[0].sizes()) {
      perm = std::get<1>(ts[1].sort(/*stable=*/true, -1));
      perm = perm.gather(-1, std::get<1>(ts[0].gather(-1, perm).sort(/*stable=*/true, -1)));
    } else {
      perm = std::get<1>(ts[0].sort(/*stable=*/true, -1));
    }
    for (auto &t : ts)
      if (t.sizes() == perm.sizes())
        t = t.gather(-1, perm);
  }

  void add_pair(std::vector<ust__pair> &pairs, const char *name, const at::Tensor &prod, const at::Tensor &other,
                int aa) {
    if (pairs.size() >= 2 * UST__SHADOW_MAX_PAIRS)
      return;
    ust__pair p;
    std::memset(&p, 0, sizeof p);
    p.name = name;
    p.aa = aa;
    keep_.push_back(prod);
    keep_.push_back(other);
    fill_dl(keep_[keep_.size() - 2], &p.prod, &p.prod_dtype);
    fill_dl(keep_.back(), &p.cand, &p.cand_dtype);
    if (prod.device() == other.device() && prod.sizes() == other.sizes() && prod.scalar_type() == other.scalar_type()) {
      dense_.push_back(prod.contiguous());
      dense_.push_back(other.contiguous());
      p.prod_dense = dense_[dense_.size() - 2].const_data_ptr();
      p.cand_dense = dense_.back().const_data_ptr();
    }
    pairs.push_back(p);
  }

  const ust__binding *b_;
  const ust__call &call_;
  ust__call_state &st_;
  size_t n_args_, n_returns_;
  bool serving_;
  bool production_raised_ = false;
  bool production_ran_ = false;
  ust__shadow_info info_{};
  std::vector<c10::IValue> saved_, prod_returns_;
  std::vector<at::Tensor> snaps_, aa_snaps_, inputs_, native_outputs_;
  std::vector<ust_value> values_;
  std::vector<DLTensor> outputs_;
  std::optional<c10::OperatorHandle> cand_op_;
  torch::jit::Stack cand_stack_;
  // Tensors the guard reads through DLTensor views (their sizes and strides
  // live in the TensorImpl, which these references keep alive).
  std::vector<at::Tensor> keep_, dense_;
};

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
    if (tl_shadow_depth > 0 || tl_call_depth > 0 || ust__binding_is_off(b_)) {
      op.redispatchBoxed(below, stack);
      return;
    }
    CallScope nested;
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
    if (tracked && st.serve) {
      if (served(op, below, stack, call, st))
        return;
      st.shadow = nullptr; // released by served()
    } else if (tracked && st.shadow != nullptr) {
      shadowed(op, below, stack, call, st);
      return;
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
  // The candidate serves (canary, live). Returns true when the call was
  // served here, by the candidate or by production's results; false when
  // the caller must run production on the (restored) arguments: the
  // candidate could not serve or failed, or understudy did. Production's
  // own exceptions propagate as in the plain path.
  bool served(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack *stack,
              const ust__call &call, ust__call_state &st) {
    std::unique_ptr<ShadowRun> run;
    ShadowRun::Served how = ShadowRun::kRunProduction;
    bool restorable = false;
    try {
      c10::OptionalDeviceGuard guard;
      enter_call_device(guard, call);
      run = std::make_unique<ShadowRun>(op, b_, call, st, /*serving=*/true);
      // No snapshots inside a graph capture: nothing could be restored
      // there, and copies would become part of the graph.
      run->prepare(*stack, /*snapshots=*/!st.capturing);
      restorable = true;
      how = run->serve(op, below, *stack);
    } catch (...) {
      // Production raising on the snapshots (out of memory for them, say)
      // leaves the arguments untouched: production runs again on them and
      // raises to the caller only if it would without understudy.
      how = internal_error(call, st, run.get(), restorable, stack);
    }
    if (how == ShadowRun::kRunProduction) {
      if (st.shadow != nullptr)
        ust__shadow_abandon(&call, &st);
      return false;
    }
    if (how == ShadowRun::kCandidate)
      ust__call_served_by_candidate(&st);
    return true;
  }

  // understudy failed while serving (or production raised on the
  // snapshots): production serves. Once production has run on the
  // snapshots they hold its results, which are served; before, the
  // arguments the candidate may have written are restored and production
  // runs on them.
  ShadowRun::Served internal_error(const ust__call &call, ust__call_state &st, ShadowRun *run, bool restorable,
                                   torch::jit::Stack *stack) {
    if (run == nullptr || !run->production_raised())
      ust__count_internal_error();
    if (st.shadow != nullptr)
      ust__shadow_abandon(&call, &st);
    if (run != nullptr && restorable) {
      try {
        if (run->production_ran())
          return run->production_instead(*stack);
        run->restore_written();
      } catch (...) {
        ust__count_internal_error();
      }
    }
    return ShadowRun::kRunProduction;
  }

  // Production serves exactly as in the plain path; the shadow work before
  // and after it fails open. st.shadow is released exactly once: by
  // ust__shadow_finish, or by ust__shadow_abandon.
  void shadowed(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack *stack,
                const ust__call &call, ust__call_state &st) {
    // understudy's own device work runs on the call's device; production
    // runs outside this guard, exactly as in the plain path.
    std::unique_ptr<ShadowRun> run;
    try {
      c10::OptionalDeviceGuard guard;
      enter_call_device(guard, call);
      run = std::make_unique<ShadowRun>(op, b_, call, st);
      run->prepare(*stack);
    } catch (...) {
      ust__count_internal_error();
      ust__shadow_abandon(&call, &st);
      run.reset();
    }
    if (run)
      ust__shadow_mark(&st, UST__MARK_PROD_BEGIN, &call);
    try {
      op.redispatchBoxed(below, stack);
    } catch (...) {
      if (run)
        ust__shadow_abandon(&call, &st);
      throw;
    }
    if (!run)
      return;
    ust__shadow_mark(&st, UST__MARK_PROD_END, &call);
    if (!ust__shadow_alive(&st)) {
      ust__shadow_abandon(&call, &st); /* no device resources for this call: do not run the candidate */
      return;
    }
    try {
      c10::OptionalDeviceGuard guard;
      enter_call_device(guard, call);
      run->run_candidate_and_compare(op, below, *stack);
    } catch (const std::exception &e) {
      ust__count_internal_error();
      ust__error(UST_EINTERNAL, "shadow of %s: %s", ust__binding_display(b_), e.what());
      ust__shadow_abandon(&call, &st);
    } catch (...) {
      ust__count_internal_error();
      ust__shadow_abandon(&call, &st);
    }
  }

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
