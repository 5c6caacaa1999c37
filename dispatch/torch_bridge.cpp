// The dispatcher seam: the only C++ in understudy.
//
// For every bound op and overload, a functor is registered at the
// BackendSelect dispatch key, once for the life of the process: typed
// (unboxed) for functional aten ops of a C++ signature it knows (mm, addmm,
// silu: no stack built per call, production called unboxed), boxed
// for every other op. It calls through its hook (dispatch/dispatch.h), which
// names the enabled engine's binding, or none. For a bound call it builds
// the C view of the call (DLTensor arguments, scalars, the device's current
// native stream), asks the router for a plan, and performs the steps of the
// serving decision (guard/decision.h): snapshots, production (redispatched
// below BackendSelect), the candidate, the comparison, restoring. It decides
// nothing itself. Every exception of understudy's own is caught here and
// turned into an event; production's exceptions reach the caller as they
// would without understudy.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>
#include <kineto/libkineto.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/callview.h"
#include "understudy/candidate.h"
#include "understudy/understudy.h"

extern "C" int ust__error(int err, const char *fmt, ...);

namespace {

// The arguments a boxed call's view holds: the schema's first kMaxArgs; an
// op known at registration to take at most kFewArgs (every aten op that
// serving calls) gets an interceptor whose view has room for those only, and
// a frame as deep.
constexpr size_t kMaxArgs = 32, kFewArgs = 12;
// ust__cand_kind and ust__shadow_fail (guard/guard.h, C only)
constexpr int kNative = 1, kTorchOp = 2;
constexpr int kFailNone = 0, kFailError = 1, kFailRaised = 2, kFailSchema = 3, kFailOverdue = 4;
// ust__shadow_point
constexpr int kProdBegin = 0, kProdEnd = 1, kCandBegin = 2, kCandEnd = 3, kAaBegin = 4, kAaEnd = 5;

struct DTypeInfo {
  int id;
  DLDataType dl;
};

constexpr DTypeInfo dtype_of(c10::ScalarType s) {
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

// dtype_of as a table, read by every intercepted call: one load where the
// switch was a jump through a table of code.
constexpr int kScalarTypes = static_cast<int>(c10::ScalarType::NumOptions);
struct DTypeTable {
  DTypeInfo of[kScalarTypes + 1]; // the last: every type past the table
  constexpr DTypeTable() : of{} {
    for (int i = 0; i <= kScalarTypes; i++)
      of[i] = dtype_of(static_cast<c10::ScalarType>(i));
  }
};
constexpr DTypeTable kDTypes;

inline DTypeInfo dtype_info(c10::ScalarType s) {
  const auto i = static_cast<unsigned>(s);
  return kDTypes.of[i < static_cast<unsigned>(kScalarTypes) ? i : kScalarTypes];
}

DLDevice dl_device(bool cuda, int index) {
#if defined(UST_GPU_HIP)
  return DLDevice{cuda ? kDLROCM : kDLCPU, cuda ? index : 0};
#else
  return DLDevice{cuda ? kDLCUDA : kDLCPU, cuda ? index : 0};
#endif
}

// A borrowed DLPack view of t's metadata (its sizes and strides live in the
// TensorImpl, valid while t is), on dev; its data pointer is left NULL: an
// observed call never reads it (fill_data does, for a plan that runs more).
[[gnu::hot]] inline void view_meta(const at::Tensor &t, DLDevice dev, DLTensor *dl, int *dtype_id) {
  const DTypeInfo d = dtype_info(t.scalar_type());
  dl->data = nullptr;
  dl->byte_offset = 0;
  dl->device = dev;
  dl->ndim = static_cast<int32_t>(t.dim());
  dl->dtype = d.dl;
  dl->shape = const_cast<int64_t *>(t.sizes().data());
  dl->strides = const_cast<int64_t *>(t.strides().data());
  *dtype_id = d.id;
}

// The data pointer as a view reads it: read-only access to torch (no
// copy-on-write materialisation); writable snapshots are understudy's own.
void *data_of(const at::Tensor &t) { return t.has_storage() ? const_cast<void *>(t.const_data_ptr()) : nullptr; }

// A whole borrowed DLPack view of t.
void fill_dl(const at::Tensor &t, DLTensor *dl, int *dtype_id) {
  int id = UST__DT_OTHER;
  view_meta(t, dl_device(t.is_cuda(), t.is_cuda() ? t.get_device() : 0), dl, &id);
  dl->data = data_of(t);
  if (dtype_id != nullptr)
    *dtype_id = id;
}

// A defined tensor argument (or a list's first): the call's device when it
// has none yet; viewed as kind when on the CPU or CUDA and strided.
[[gnu::hot]] bool view_tensor(const at::Tensor &t, int kind, ust__arg *a, ust__call *call) {
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
[[gnu::hot]] bool build_view(const c10::OperatorHandle &op, const torch::jit::Stack &stack, ust__arg *args,
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

// The data pointers of the view build_view filled from the same stack: what
// a plan that runs more than production (a candidate, snapshots) reads.
void fill_data(const c10::OperatorHandle &op, const torch::jit::Stack &stack, ust__arg *args, int nargs) {
  size_t n_schema;
  const c10::IValue *ivs = stack_args(op, stack, &n_schema);
  for (int i = 0; i < nargs; i++) {
    ust__arg &a = args[i];
    if (a.kind == UST__ARG_TENSOR)
      a.t.data = data_of(ivs[i].toTensor());
    else if (a.kind == UST__ARG_TENSORLIST)
      a.t.data = data_of(ivs[i].toTensorList().get(0));
  }
}

void resolve_names(ust__binding *b, const c10::OperatorHandle &op) {
  const auto &schema_args = op.schema().arguments();
  std::vector<const char *> names;
  names.reserve(schema_args.size());
  uint32_t writes = 0, outs = 0;
  for (size_t i = 0; i < schema_args.size(); i++) {
    names.push_back(schema_args[i].name().c_str());
    const auto *alias = schema_args[i].alias_info();
    if (alias != nullptr && alias->isWrite() && i < 32)
      writes |= 1u << i;
    if (schema_args[i].is_out() && i < 32)
      outs |= 1u << i; // an out= overload's output: written, never read
  }
  ust__binding_resolve(b, static_cast<int>(names.size()), names.data(), writes, outs);
}

// The thread's block (ust__thread, dispatch/callview.h), read once by each
// intercepted call:
// - own_work: calls made while understudy runs its own work for a call
//   (snapshots, the candidate, its own use of aten ops) pass through the
//   interceptors untouched: they are not live traffic, and a candidate built
//   from the op it stands in for must not shadow itself;
// - call_depth: calls a bound op makes to other bound ops while it runs (a
//   framework's attention wrapper calling its flash kernel, SDPA's math path
//   calling bmm) are part of the outer call: counting them again would count
//   their device time twice in the operators' weights. They pass through;
// - nested: while an outer call's production runs and its floor may come
//   from the bound ops it calls, where their floors are summed (ust__nested).
//   Only the outer call's direct bound callees count (a counted one runs at
//   depth 2).
struct NestedScope {
  NestedScope(ust__thread *t, ust__nested *acc) : t_(t), prev_(t->nested) { t->nested = acc; }
  ~NestedScope() { t_->nested = prev_; }
  NestedScope(const NestedScope &) = delete;
  NestedScope &operator=(const NestedScope &) = delete;

private:
  ust__thread *t_;
  ust__nested *prev_;
};

// (t: nullptr for no call: a call passed on in its interceptor's body)
struct CallScope {
  [[gnu::always_inline]] explicit CallScope(ust__thread *t) : t_(t) {
    if (t_ != nullptr)
      t_->call_depth++;
  }
  [[gnu::always_inline]] ~CallScope() {
    if (t_ != nullptr)
      t_->call_depth--;
  }
  CallScope(const CallScope &) = delete;
  CallScope &operator=(const CallScope &) = delete;

private:
  ust__thread *t_;
};

struct OwnWork {
  OwnWork() : t_(ust__thread_state()) { t_->own_work++; }
  ~OwnWork() { t_->own_work--; }
  OwnWork(const OwnWork &) = delete;
  OwnWork &operator=(const OwnWork &) = delete;

private:
  ust__thread *t_;

public:
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

// A copy of t with t's own sizes and strides (a view written in place, such
// as one split out of a fused qkv, keeps its layout).
at::Tensor snapshot_of(const at::Tensor &t) {
  at::Tensor s = at::empty_strided(t.sizes(), t.strides(), t.options());
  s.copy_(t);
  return s;
}

void enter_call_device(c10::OptionalDeviceGuard &g, const ust__call &call) {
  if (call.device == UST__DEV_CUDA)
    g.reset_device(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(call.device_id)));
}

// Buffers a call's run reuses: one set per thread (a thread runs one bound
// call at a time; nested bound calls pass through), so the steady-state
// path allocates nothing once they have grown.
struct Scratch {
  std::vector<c10::IValue> saved, prod_returns, cand_returns, aa_returns;
  std::vector<c10::IValue> cin_lists; // the candidate's copies of tensor-list arguments (shadow)
  std::vector<at::Tensor> snaps, aa_snaps, inputs, cin, native_outputs, keep, dense;
  std::vector<ust_value> values;
  std::vector<DLTensor> outputs;
  std::vector<int32_t> output_dtypes;
  std::vector<ust__pair> pairs;
  std::vector<const char *> names;
  torch::jit::Stack side; // production on snapshots, the candidate, the A/A run
  void clear() {
    saved.clear();
    prod_returns.clear();
    cand_returns.clear();
    aa_returns.clear();
    snaps.clear();
    aa_snaps.clear();
    inputs.clear();
    cin.clear();
    cin_lists.clear();
    native_outputs.clear();
    keep.clear();
    dense.clear();
    pairs.clear();
    names.clear();
    side.clear();
  }
};

thread_local Scratch tl_scratch;

// One intercepted call whose plan is not a plain pass: performs the steps
// the decision names. Every step returns its event; none throws.
class CallRun {
public:
  CallRun(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack &stack, ust__binding *b,
          const ust__call &call, ust__call_state &st)
      : op_(op), below_(below), stack_(stack), b_(b), call_(call), st_(st), x_(tl_scratch),
        n_args_(op.schema().arguments().size()), n_returns_(op.schema().returns().size()),
        serving_(st.plan == UST__PLAN_SERVE || st.plan == UST__PLAN_SERVE_VERIFIED) {
    x_.clear();
    // room for production's returns, so that taking them cannot fail once
    // production has run (a step that allocates fails before its work)
    x_.prod_returns.reserve(n_returns_);
    stack.reserve(stack.size() - n_args_ + n_returns_); // and for them on the caller's stack
    x_.saved.assign(stack.end() - static_cast<std::ptrdiff_t>(n_args_), stack.end());
    x_.snaps.resize(n_args_);
    x_.aa_snaps.resize(n_args_);
    x_.inputs.resize(n_args_);
    x_.cin.resize(n_args_);
    x_.cin_lists.resize(n_args_);
  }
  CallRun(const CallRun &) = delete;
  CallRun &operator=(const CallRun &) = delete;
  ~CallRun() { x_.clear(); }

  int perform(int step) {
    switch (step) {
    case UST__STEP_SNAPSHOT: return own(&CallRun::snapshot);
    case UST__STEP_PROD_ON_ARGS: return prod_on_args();
    case UST__STEP_PROD_ON_SNAPS: return prod_on_snaps();
    case UST__STEP_CAND_ON_SNAPS: return own(&CallRun::cand_on_snaps);
    case UST__STEP_CAND_ON_ARGS: return own(&CallRun::cand_on_args);
    case UST__STEP_COMPARE: return own(&CallRun::compare);
    case UST__STEP_ABANDON: return own(&CallRun::abandon);
    case UST__STEP_VERDICT: return own(&CallRun::verdict);
    case UST__STEP_CAND_FAILED: return own(&CallRun::cand_failed);
    case UST__STEP_RESTORE: // the values before the call, undoing the candidate
    case UST__STEP_COPY_BACK: // production's writes on the snapshots
      return own(&CallRun::snaps_into_args);
    }
    return UST__EV_INTERNAL;
  }

  // What the caller receives, once the decision is done.
  void finish(int outcome) {
    switch (outcome) {
    case UST__OUT_RAISE:
      std::rethrow_exception(prod_exc_);
    case UST__OUT_CANDIDATE:
      replace_stack(x_.cand_returns);
      return;
    case UST__OUT_PROD_FROM_SNAPS:
      // a return that is a written argument is the caller's argument
      for (size_t j = 0; j < x_.prod_returns.size(); j++)
        for (size_t i = 0; i < n_args_ && is_defined_tensor(x_.prod_returns[j]); i++)
          if (x_.snaps[i].defined() && x_.snaps[i].is_same(x_.prod_returns[j].toTensor()))
            x_.prod_returns[j] = x_.saved[i];
      replace_stack(x_.prod_returns);
      return;
    default:
      return; // production on the arguments: its results are on the stack
    }
  }

private:
  // A step of understudy's own work: on the call's device, below autograd,
  // passing through the interceptors; anything it throws is internal.
  int own(int (CallRun::*fn)()) {
    try {
      OwnWork scope;
      c10::OptionalDeviceGuard guard;
      enter_call_device(guard, call_);
      return (this->*fn)();
    } catch (const std::exception &e) {
      ust__error(UST_EINTERNAL, "%s: %s", ust__binding_display(b_), e.what());
    } catch (...) {
    }
    return UST__EV_INTERNAL;
  }

  // Marks taken on the call's device (the events must be recorded there,
  // whatever device the calling thread has current).
  void mark(int point) {
    if (st_.slot == nullptr)
      return;
    try {
      c10::OptionalDeviceGuard guard;
      enter_call_device(guard, call_);
      ust__call_mark(&st_, point, &call_);
    } catch (...) {
    }
  }

  // Copies of what the op writes, and of read-only arguments that share
  // storage with a written one (addmm(c, a, b, out=c)): the other side must
  // read them as the first did, before it wrote them.
  int snapshot() {
    if (captured())
      return snapshot_captured();
    const uint32_t writes = st_.cand.writes_mask;
    const bool aa = ust__call_aa(&st_) != 0;
    for (size_t i = 0; i < n_args_ && i < 32; i++) {
      if (!((writes >> i) & 1u))
        continue;
      if (x_.saved[i].isTensorList())
        throw std::runtime_error("written tensor lists are not shadowed");
      if (!is_defined_tensor(x_.saved[i]))
        continue;
      x_.snaps[i] = snapshot_of(x_.saved[i].toTensor());
      if (aa)
        x_.aa_snaps[i] = snapshot_of(x_.saved[i].toTensor());
    }
    for (size_t i = 0; i < n_args_; i++) {
      if (x_.snaps[i].defined() || !is_defined_tensor(x_.saved[i]) || !x_.saved[i].toTensor().has_storage())
        continue;
      const at::Tensor &t = x_.saved[i].toTensor();
      for (size_t j = 0; j < n_args_; j++)
        if (x_.snaps[j].defined() && x_.saved[j].toTensor().has_storage() && x_.saved[j].toTensor().is_alias_of(t)) {
          x_.inputs[i] = snapshot_of(t);
          break;
        }
    }
    // The candidate's own copies of what it only reads: in shadow it never
    // touches the caller's tensors; verified serving keeps the originals to
    // check (and, if it wrote them, restore) the caller's.
    const bool verifying = st_.plan == UST__PLAN_SHADOW || st_.plan == UST__PLAN_SERVE_VERIFIED;
    for (size_t i = 0; verifying && i < n_args_; i++) {
      if (st_.plan == UST__PLAN_SHADOW && x_.saved[i].isTensorList()) {
        // a list of tensors it reads (cat's): its own copies of each
        c10::List<at::Tensor> copies;
        for (const at::Tensor &t : x_.saved[i].toTensorList().vec())
          copies.push_back(t.defined() && t.has_storage() ? snapshot_of(t) : t);
        x_.cin_lists[i] = copies;
        continue;
      }
      if (x_.snaps[i].defined() || !is_defined_tensor(x_.saved[i]) || !x_.saved[i].toTensor().has_storage())
        continue;
      if (st_.plan == UST__PLAN_SHADOW && x_.inputs[i].defined())
        continue; // already a private copy
      x_.cin[i] = snapshot_of(x_.saved[i].toTensor());
    }
    uint64_t bytes = 0;
    for (const auto *v : {&x_.snaps, &x_.aa_snaps, &x_.inputs, &x_.cin})
      for (const at::Tensor &t : *v)
        if (t.defined())
          bytes += t.nbytes();
    for (const c10::IValue &l : x_.cin_lists)
      if (l.isTensorList())
        for (const at::Tensor &t : l.toTensorList().vec())
          if (t.defined())
            bytes += t.nbytes();
    ust__call_note_copied(&st_, bytes);
    return UST__EV_OK;
  }

  // ---- a shadow captured into the call's CUDA graph (UST__DF_CAPTURED) ----
  // understudy's copies are made by the graph, at the replays the route's
  // gate verifies: their buffers are allocated now (from the graph's memory
  // pool, in the capture's order, so they live as long as the graph) and
  // filled in a part (ust__call_graph_part_begin). Nothing in a part runs
  // on torch's stream: copies are plain device copies of dense tensors.

  bool captured() const { return (st_.flags & UST__DF_CAPTURED) != 0; }

  int drop(int why, const char *detail) {
    ust__call_graph_drop(&st_, why, detail);
    return UST__EV_OK; // production alone, as if nothing were shadowed
  }

  // A buffer of the captured shadow. Beside the chain: memory kept for the
  // process and counted against the call's bound (undefined over it): a
  // graph holding it may replay at any time, and freed, the capture's
  // allocator would hand it to the nodes captured after the call, which
  // the shadow's branch would race.
  at::Tensor buffer_of(at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions &options) {
    if (!ust__call_graph_beside(&st_))
      return at::empty_strided(sizes, strides, options);
    const uint64_t bytes = at::detail::computeStorageNbytes(sizes, strides, options.dtype().itemsize());
    void *p = ust__call_graph_alloc(&st_, bytes);
    return p != nullptr ? at::from_blob(p, sizes, strides, options) : at::Tensor();
  }

  at::Tensor buffer_like(const at::Tensor &t) { return buffer_of(t.sizes(), t.strides(), t.options()); }

  int drop_kept() { return drop(UST__GW_KEPT, ust_last_error()); }

  bool graph_copy(const at::Tensor &dst, const at::Tensor &src) {
    return ust__call_graph_copy(&st_, dst.data_ptr(), src.const_data_ptr(), src.nbytes()) == 0;
  }

  // Before production: buffers for every copy; the copies of what production
  // writes (and inputs aliasing it) taken in a first part. An argument the
  // op overwrites without reading needs no copy of its values before: its
  // buffer is filled with all bits set in the second part instead, so the
  // first is left out when nothing else needs it (one condition less).
  int snapshot_captured() {
    const uint32_t writes = st_.cand.writes_mask;
    const uint32_t overwrites = st_.cand.overwrites_mask;
    uint64_t arg_bytes = 0;
    for (size_t i = 0; i < n_args_; i++) {
      if (x_.saved[i].isTensorList())
        return drop(UST__GW_LAYOUT, "a tensor-list argument");
      if (!is_defined_tensor(x_.saved[i]))
        continue;
      const at::Tensor &t = x_.saved[i].toTensor();
      if (!t.has_storage() || !t.is_contiguous() || !t.is_cuda())
        return drop(UST__GW_LAYOUT, "an argument that is not a contiguous CUDA tensor");
      arg_bytes += t.nbytes();
    }
    // beside the chain it keeps a copy of each argument for the candidate,
    // one for its comparison and its outputs' (about as large): else in it
    ust__call_graph_beside_plan(&st_, 3 * arg_bytes);
    for (size_t i = 0; i < n_args_; i++) {
      if (!is_defined_tensor(x_.saved[i]))
        continue;
      const at::Tensor &t = x_.saved[i].toTensor();
      if (i < 32 && ((writes >> i) & 1u) && !(x_.snaps[i] = buffer_like(t)).defined())
        return drop_kept();
    }
    bool before = false;
    for (size_t i = 0; i < n_args_; i++) {
      if (!is_defined_tensor(x_.saved[i]))
        continue;
      const at::Tensor &t = x_.saved[i].toTensor();
      before |= x_.snaps[i].defined() && !overwritten(i, overwrites);
      if (x_.snaps[i].defined())
        continue;
      for (size_t j = 0; j < n_args_; j++)
        if (x_.snaps[j].defined() && x_.saved[j].toTensor().is_alias_of(t)) {
          if (!(x_.inputs[i] = buffer_like(t)).defined())
            return drop_kept();
          before = true;
          break;
        }
      if (!x_.inputs[i].defined() && !(x_.cin[i] = buffer_like(t)).defined())
        return drop_kept();
    }
    if (!before)
      return UST__EV_OK;
    void *side = nullptr;
    if (ust__call_graph_part_begin(&st_, &side) != 0)
      return UST__EV_OK;
    for (size_t i = 0; i < n_args_; i++) {
      const at::Tensor &copy = x_.snaps[i].defined() ? x_.snaps[i] : x_.inputs[i];
      if (copy.defined() && !(x_.snaps[i].defined() && overwritten(i, overwrites)) &&
          !graph_copy(copy, x_.saved[i].toTensor()))
        return UST__EV_OK;
    }
    ust__call_graph_part_end(&st_, 1, UST__GW_CAPTURE);
    return UST__EV_OK;
  }

  static bool overwritten(size_t i, uint32_t mask) { return i < 32 && ((mask >> i) & 1u); }

  // After production: the candidate's fresh outputs and the comparison's
  // statistics allocated; the second part holds its private inputs, its
  // outputs poisoned (all bits set: NaN in every float dtype), and the
  // candidate, on the part's stream. The part stays open for COMPARE.
  int cand_on_snaps_captured() {
    if (st_.graph == nullptr)
      return UST__EV_NO_LAYOUT; // dropped: production alone
    for (size_t i = 0; i < n_args_; i++)
      if (x_.snaps[i].defined() && x_.snaps[i].sizes() != x_.saved[i].toTensor().sizes()) {
        // production resized an out= argument: its copy holds another shape
        ust__call_graph_drop(&st_, UST__GW_LAYOUT, "production resized a written argument");
        return UST__EV_NO_LAYOUT;
      }
    if (!prepare_native_on_snaps(/*captured=*/true)) {
      drop_kept();
      return UST__EV_NO_LAYOUT;
    }
    const int64_t stats_bytes = static_cast<int64_t>(UST__MAX_PAIRS * sizeof(ust__cmp_stats));
    stats_ = buffer_of({stats_bytes}, {1}, at::TensorOptions().dtype(at::kByte).device(
                                              c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(call_.device_id))));
    if (!stats_.defined()) {
      drop_kept();
      return UST__EV_NO_LAYOUT;
    }
    if (ust__call_graph_part_begin(&st_, &side_) != 0) {
      side_ = nullptr;
      return UST__EV_NO_LAYOUT;
    }
    for (size_t i = 0; i < n_args_; i++)
      if (x_.cin[i].defined() && !graph_copy(x_.cin[i], x_.saved[i].toTensor()))
        return UST__EV_NO_LAYOUT;
    // what the candidate writes without reading starts with all bits set
    auto poison = [this](const at::Tensor &t) { return ust__call_graph_fill(&st_, t.data_ptr(), 0xff, t.nbytes()) == 0; };
    for (const at::Tensor &o : x_.native_outputs)
      if (!poison(o))
        return UST__EV_NO_LAYOUT;
    for (size_t i = 0; i < n_args_; i++)
      if (x_.snaps[i].defined() && overwritten(i, st_.cand.overwrites_mask) && !poison(x_.snaps[i]))
        return UST__EV_NO_LAYOUT;
    return run_candidate(/*timed=*/false);
  }

  // COMPARE inside the second part: the pairs as an eager call's, their
  // comparison and its publication captured; the part then ends into the
  // graph. A candidate that failed (an error, a raise, results that do not
  // line up) without breaking the part's capture fails verification, as an
  // eager call; either way production stays alone in the graph.
  int compare_captured() {
    if (fail_ == kFailNone) {
      if (st_.cand.compare == UST__CMP_SET)
        return drop(UST__GW_LAYOUT, "a set comparison sorts: it would allocate inside the graph's condition");
      for (size_t j = 0; j < n_returns_ && j < x_.prod_returns.size(); j++)
        if (is_defined_tensor(x_.prod_returns[j]) && !x_.prod_returns[j].toTensor().is_contiguous())
          return drop(UST__GW_LAYOUT, "a result that is not contiguous");
      add_pairs(x_.snaps, x_.cand_returns, 0);
      if (fail_ == kFailNone)
        add_input_pairs();
    }
    if (fail_ != kFailNone) {
      if (ust__call_graph_active(&st_))
        ust__call_graph_failed(&st_, fail_, msg_.c_str());
      return drop(UST__GW_FAILED, msg_.c_str());
    }
    // served replays get the candidate's results over production's: all of
    // them, or none (a return not compared would stay production's)
    bool servable = true;
    for (size_t j = 0; j < n_returns_ && j < x_.prod_returns.size(); j++)
      servable &= !(is_defined_tensor(x_.prod_returns[j]) && !compared_return(j) && !aliases_written_arg(j));
    if (ust__call_graph_beside(&st_) && !prod_side_kept())
      return UST__EV_OK; // dropped: production alone
    ust__call_graph_compare(&st_, x_.pairs.data(), static_cast<int>(x_.pairs.size()), stats_.data_ptr(), servable);
    return UST__EV_OK;
  }

  // Beside the chain: production's side of each pair (its results, the
  // inputs as they were) copied in the chain into kept buffers, which the
  // comparisons read instead. false when the shadow was dropped.
  bool prod_side_kept() {
    for (ust__pair &p : x_.pairs) {
      if (p.aa || p.prod_dense == nullptr)
        continue;
      const at::Tensor *found = nullptr;
      for (const at::Tensor &d : x_.dense)
        if (d.const_data_ptr() == p.prod_dense)
          found = &d;
      if (found == nullptr)
        return drop(UST__GW_LAYOUT, "a pair understudy cannot copy beside the chain"), false;
      const at::Tensor prod = *found;
      at::Tensor snap = buffer_like(prod);
      if (!snap.defined())
        return drop_kept(), false;
      if (!graph_copy(snap, prod))
        return false;
      p.prod_dense = snap.const_data_ptr();
      x_.keep.push_back(snap);
      fill_dl(x_.keep.back(), &p.prod, &p.prod_dtype);
    }
    return true;
  }

  int prod_on_args() {
    ust__nested nested{};
    const bool collect = ust__call_wants_nested(&st_) != 0;
    mark(kProdBegin);
    const bool captured_prod = captured();
    if (captured_prod)
      ust__call_graph_prod(&st_, &call_, 0);
    try {
      NestedScope scope(ust__thread_state(), collect ? &nested : nullptr);
      op_.redispatchBoxed(below_, &stack_);
    } catch (...) {
      prod_exc_ = std::current_exception();
      return UST__EV_RAISED;
    }
    if (captured_prod)
      ust__call_graph_prod(&st_, &call_, 1);
    mark(kProdEnd);
    if (collect)
      ust__call_nested_done(&st_, &nested);
    if (st_.plan != UST__PLAN_PASS) {
      x_.prod_returns.assign(stack_.end() - static_cast<std::ptrdiff_t>(n_returns_), stack_.end()); // in its room
      try {
        OwnWork scope;
        learn_layout();
      } catch (...) {
      }
    }
    return UST__EV_OK;
  }

  int prod_on_snaps() {
    try {
      x_.side = with_snapshots(x_.snaps);
    } catch (...) {
      return UST__EV_INTERNAL;
    }
    ust__nested nested{};
    const bool collect = ust__call_wants_nested(&st_) != 0;
    mark(kProdBegin);
    try {
      NestedScope nscope(ust__thread_state(), collect ? &nested : nullptr);
      OwnWork scope; // production's own nested calls are part of it, not traffic
      op_.redispatchBoxed(below_, &x_.side);
    } catch (...) {
      prod_exc_ = std::current_exception();
      return UST__EV_RAISED;
    }
    mark(kProdEnd);
    if (collect)
      ust__call_nested_done(&st_, &nested);
    prod_on_snaps_ = true;
    x_.prod_returns.assign(x_.side.begin(), x_.side.end()); // in its room: what the caller receives
    try {
      OwnWork scope;
      learn_layout();
    } catch (...) {
    }
    return UST__EV_OK;
  }

  int cand_on_snaps() {
    if (captured())
      return cand_on_snaps_captured();
    if (!ust__call_slot_alive(&st_))
      return UST__EV_INTERNAL; // no device resources for this call: the candidate does not run
    // An out= argument production resized holds nothing the candidate
    // needs: give the candidate one of production's final shape.
    for (size_t i = 0; i < n_args_; i++)
      if (x_.snaps[i].defined() && x_.snaps[i].sizes() != x_.saved[i].toTensor().sizes()) {
        x_.snaps[i] = poisoned_like(x_.saved[i].toTensor());
        if (x_.aa_snaps[i].defined())
          x_.aa_snaps[i] = poisoned_like(x_.saved[i].toTensor());
      }
    if (st_.cand.kind == kNative) {
      prepare_native_on_snaps();
    } else {
      x_.side = with_snapshots(x_.snaps, /*private_inputs=*/true);
    }
    return run_candidate(/*timed=*/true);
  }

  int cand_on_args() {
    const bool verified = st_.plan == UST__PLAN_SERVE_VERIFIED;
    if (st_.cand.kind == kNative) {
      if (!native_outputs_serving(verified))
        return UST__EV_NO_LAYOUT;
    } else {
      x_.side.assign(x_.saved.begin(), x_.saved.end());
      // unverified, its results are checked against production's layout
      if (!verified && n_returns_ > 0 && (ust__call_layout(&st_, &call_, &layout_) != 0 ||
                                          static_cast<size_t>(layout_.n_returns) != n_returns_))
        return UST__EV_NO_LAYOUT;
    }
    int ev = run_candidate(/*timed=*/verified);
    if (ev == UST__EV_OK && !verified && st_.cand.kind != kNative && !returns_like_production()) {
      fail_ = kFailSchema;
      return UST__EV_FAILED;
    }
    return ev;
  }

  // The candidate's returns on an unverified call, against the layout
  // production showed for calls with this signature: a fresh tensor of the
  // same dtype, device, sizes and strides that shares no storage with an
  // argument, or the same written argument. A cheap host check.
  bool returns_like_production() {
    for (size_t j = 0; j < n_returns_; j++) {
      const ust__ret_layout &r = layout_.ret[j];
      const c10::IValue &v = j < x_.cand_returns.size() ? x_.cand_returns[j] : c10::IValue();
      std::string why;
      if (r.kind == UST__RET_NONE) {
        if (!v.isNone() && is_defined_tensor(v))
          why = "a tensor where production returns None";
      } else if (r.kind == UST__RET_ARG) {
        if (!is_defined_tensor(v) || !v.toTensor().is_same(x_.saved[static_cast<size_t>(r.arg)].toTensor()))
          why = std::string("not its argument '") + ust__binding_arg_name(b_, r.arg) + "' as production";
      } else if (r.kind == UST__RET_FRESH) {
        if (!is_defined_tensor(v)) {
          why = "no tensor";
        } else {
          const at::Tensor &t = v.toTensor();
          if (static_cast<int>(t.scalar_type()) != r.scalar_type)
            why = std::string("dtype ") + c10::toString(t.scalar_type()) + ", production's " +
                  c10::toString(static_cast<c10::ScalarType>(r.scalar_type));
          else if ((t.is_cuda() ? t.get_device() : -1) != r.device)
            why = "a tensor on another device";
          else if (t.dim() != r.ndim || t.sizes() != c10::IntArrayRef(r.sizes, static_cast<size_t>(r.ndim)))
            why = "shape " + shape_str(t.sizes()) + ", production's " +
                  shape_str(c10::IntArrayRef(r.sizes, static_cast<size_t>(r.ndim)));
          else if (t.strides() != c10::IntArrayRef(r.strides, static_cast<size_t>(r.ndim)))
            why = "strides " + shape_str(t.strides()) + ", production's " +
                  shape_str(c10::IntArrayRef(r.strides, static_cast<size_t>(r.ndim)));
          else
            for (size_t i = 0; i < n_args_ && why.empty(); i++)
              if (is_defined_tensor(x_.saved[i]) && x_.saved[i].toTensor().has_storage() && t.has_storage() &&
                  t.is_alias_of(x_.saved[i].toTensor()))
                why = std::string("the storage of its argument '") + ust__binding_arg_name(b_, static_cast<int>(i)) + "'";
        }
      }
      if (!why.empty()) {
        msg_ = std::string("candidate returned ") + why + " for " + result_name(j);
        return false;
      }
    }
    return true;
  }

  static std::string shape_str(c10::IntArrayRef v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++)
      s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
  }

  int run_candidate(bool timed) {
    if (timed)
      mark(kCandBegin);
    const auto t0 = std::chrono::steady_clock::now();
    fail_ = st_.cand.kind == kNative ? call_native() : call_torch_op();
    const uint64_t took = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    if (timed)
      mark(kCandEnd);
    // a call this long is a failure whatever it returned: the route rolls
    // back. A call run in the qualifying process is held to the deadline
    // there, from when it was sent (not counting the wait for the call's
    // stream that comes first on a GPU).
    // (While captured, the call only enqueued its work: not held to it.)
    if (st_.cand.deadline_ns > 0 && took > st_.cand.deadline_ns && st_.cand.proc == nullptr && !captured()) {
      ust__call_overdue(&st_);
      if (fail_ == kFailNone || fail_ == kFailSchema) {
        fail_ = kFailOverdue;
        msg_ = "candidate took " + std::to_string(took / 1000000) + " ms, over its deadline of " +
               std::to_string(st_.cand.deadline_ns / 1000000) + " ms";
      }
    }
    if (fail_ == kFailRaised)
      return UST__EV_RAISED;
    return fail_ == kFailNone ? UST__EV_OK : UST__EV_FAILED;
  }

  int compare() {
    if (captured())
      return compare_captured();
    if (fail_ == kFailNone && st_.plan == UST__PLAN_SHADOW && ust__call_aa(&st_)) {
      x_.side = with_snapshots(x_.aa_snaps);
      mark(kAaBegin); // production again, timed: its spread against itself floors the promotion's delta
      op_.redispatchBoxed(below_, &x_.side);
      mark(kAaEnd);
      x_.aa_returns.assign(x_.side.begin(), x_.side.end());
    }
    if (fail_ == kFailNone)
      add_pairs(x_.snaps, x_.cand_returns, 0);
    if (fail_ == kFailNone && st_.plan == UST__PLAN_SHADOW && ust__call_aa(&st_))
      add_pairs(x_.aa_snaps, x_.aa_returns, 1);
    if (fail_ == kFailNone)
      add_input_pairs();
    if (st_.flags & UST__DF_WAIT_VERDICT)
      ust__call_want_verdict(&st_);
    ust__call_compare(&st_, &call_, x_.pairs.data(), static_cast<int>(x_.pairs.size()), fail_,
                      msg_.empty() ? nullptr : msg_.c_str());
    return UST__EV_OK;
  }

  int abandon() {
    ust__call_abandon(&st_, &call_);
    return UST__EV_OK;
  }

  int verdict() { return ust__call_verdict(&st_, &call_) ? UST__EV_VERDICT_FAILED : UST__EV_OK; }

  int cand_failed() {
    ust__call_cand_failed(&st_, fail_, msg_.c_str());
    return UST__EV_OK;
  }

  // Every input the candidate got its own copy of (shadow), or that it read
  // in place (verified serving), against its value before: a candidate that
  // writes an input fails ("wrote input"). As many as fit beside the
  // outputs.
  void add_input_pairs() {
    for (size_t i = 0; i < n_args_ && x_.pairs.size() < UST__MAX_PAIRS; i++) {
      if (x_.cin_lists[i].isTensorList()) {
        // each element of a list it read, under the list's name
        const auto before = x_.saved[i].toTensorList().vec(), after = x_.cin_lists[i].toTensorList().vec();
        for (size_t k = 0; k < before.size() && k < after.size() && x_.pairs.size() < UST__MAX_PAIRS; k++)
          if (before[k].defined() && after[k].defined() && before[k].has_storage()) {
            add_pair(ust__binding_arg_name(b_, static_cast<int>(i)), before[k], after[k], 0, 0);
            x_.pairs.back().input_arg = 1;
          }
        continue;
      }
      if (!x_.cin[i].defined())
        continue;
      const bool in_place = st_.plan == UST__PLAN_SERVE_VERIFIED;
      const at::Tensor &before = in_place ? x_.cin[i] : x_.saved[i].toTensor();
      const at::Tensor &after = in_place ? x_.saved[i].toTensor() : x_.cin[i];
      add_pair(ust__binding_arg_name(b_, static_cast<int>(i)), before, after, 0, 0);
      x_.pairs.back().input_arg = 1;
    }
  }

  // The snapshots into the caller's arguments: before production ran there,
  // the values before the call (RESTORE); after it ran on them, its writes
  // (COPY_BACK). Inputs the candidate read in place get their values back.
  int snaps_into_args() {
    for (size_t i = 0; i < n_args_; i++) {
      if (x_.snaps[i].defined())
        x_.saved[i].toTensor().copy_(x_.snaps[i]);
      else if (x_.cin[i].defined() && st_.plan == UST__PLAN_SERVE_VERIFIED)
        x_.saved[i].toTensor().copy_(x_.cin[i]);
    }
    return UST__EV_OK;
  }

  void replace_stack(const std::vector<c10::IValue> &returns) {
    torch::jit::drop(stack_, n_args_);
    for (size_t j = 0; j < n_returns_; j++)
      stack_.push_back(j < returns.size() ? returns[j] : c10::IValue());
  }

  // The arguments with understudy's snapshots in place of what the op
  // writes (and of inputs that alias it); private_inputs: the candidate's
  // own copies of the rest too.
  torch::jit::Stack with_snapshots(const std::vector<at::Tensor> &snaps, bool private_inputs = false) const {
    torch::jit::Stack s(x_.saved.begin(), x_.saved.end());
    for (size_t i = 0; i < n_args_; i++) {
      if (snaps[i].defined())
        s[i] = snaps[i];
      else if (x_.inputs[i].defined())
        s[i] = x_.inputs[i];
      else if (private_inputs && x_.cin[i].defined())
        s[i] = x_.cin[i];
      else if (private_inputs && x_.cin_lists[i].isTensorList())
        s[i] = x_.cin_lists[i];
    }
    return s;
  }

  // The layout of production's returns, learned for calls with this call's
  // signature so that a native candidate serving unverified calls gets
  // outputs like production's.
  void learn_layout() {
    ust__layout known;
    if (n_returns_ == 0 || n_returns_ > UST__MAX_RETURNS || ust__call_layout(&st_, &call_, &known) == 0)
      return; // nothing to lay out, or learned already
    ust__layout l;
    std::memset(&l, 0, sizeof l);
    l.n_returns = static_cast<int>(x_.prod_returns.size());
    for (size_t j = 0; j < x_.prod_returns.size() && j < UST__MAX_RETURNS; j++) {
      const c10::IValue &v = x_.prod_returns[j];
      ust__ret_layout &r = l.ret[j];
      int alias = -1;
      for (size_t i = 0; i < n_args_ && is_defined_tensor(v); i++)
        if (is_defined_tensor(x_.saved[i]) &&
            (prod_on_snaps_ && x_.snaps[i].defined() ? x_.snaps[i] : x_.saved[i].toTensor()).is_same(v.toTensor()))
          alias = static_cast<int>(i);
      if (alias >= 0) {
        r.kind = UST__RET_ARG;
        r.arg = alias;
      } else if (is_defined_tensor(v) && v.toTensor().dim() <= UST__MAX_RANK) {
        const at::Tensor &t = v.toTensor();
        r.kind = UST__RET_FRESH;
        r.scalar_type = static_cast<int>(t.scalar_type());
        r.device = t.is_cuda() ? t.get_device() : -1;
        r.ndim = static_cast<int>(t.dim());
        for (int d = 0; d < r.ndim; d++) {
          r.sizes[d] = t.sizes()[d];
          r.strides[d] = t.strides()[d];
        }
      } else {
        r.kind = v.isNone() ? UST__RET_NONE : UST__RET_OPAQUE;
      }
    }
    ust__call_learn_layout(&st_, &call_, &l);
  }

  // The candidate ABI's view of the call's arguments, as the call view read them.
  void call_values() {
    x_.values.assign(n_args_, ust_value{});
    for (size_t i = 0; i < n_args_; i++) {
      ust_value &v = x_.values[i];
      v.name = ust__binding_arg_name(b_, static_cast<int>(i));
      const ust__arg *a = static_cast<int>(i) < call_.nargs ? &call_.args[i] : nullptr;
      switch (a != nullptr ? a->kind : UST__ARG_OTHER) {
      case UST__ARG_NONE: v.kind = UST_VALUE_NONE; break;
      case UST__ARG_TENSOR:
        v.kind = UST_VALUE_TENSOR;
        v.tensor = a->t;
        v.dtype = a->dtype;
        break;
      case UST__ARG_INT: v.kind = UST_VALUE_INT; v.i = a->i; break;
      case UST__ARG_BOOL: v.kind = UST_VALUE_BOOL; v.i = a->i; break;
      case UST__ARG_DOUBLE: v.kind = UST_VALUE_DOUBLE; v.f = a->f; break;
      default: v.kind = UST_VALUE_OTHER;
      }
    }
  }

  void set_outputs() {
    x_.outputs.resize(x_.native_outputs.size());
    x_.output_dtypes.resize(x_.native_outputs.size());
    for (size_t k = 0; k < x_.native_outputs.size(); k++)
      fill_dl(x_.native_outputs[k], &x_.outputs[k], &x_.output_dtypes[k]);
  }

  // Shadow: the arguments as the call view read them, with understudy's
  // snapshots in place of what production writes (and of read-only
  // arguments that alias it), and fresh outputs like production's returns
  // (poisoned now; captured: poisoned in the graph, at each verified replay).
  bool prepare_native_on_snaps(bool captured = false) {
    call_values();
    for (size_t i = 0; i < n_args_; i++) {
      ust_value &v = x_.values[i];
      if (x_.snaps[i].defined()) {
        v.writable = 1;
        fill_dl(x_.snaps[i], &v.tensor, nullptr);
      } else if (x_.inputs[i].defined()) {
        fill_dl(x_.inputs[i], &v.tensor, nullptr);
      } else if (x_.cin[i].defined()) {
        fill_dl(x_.cin[i], &v.tensor, nullptr);
      }
    }
    x_.cand_returns.assign(n_returns_, c10::IValue());
    for (size_t j = 0; j < n_returns_ && j < x_.prod_returns.size(); j++) {
      if (!is_defined_tensor(x_.prod_returns[j]) || aliases_written_arg(j))
        continue;
      const at::Tensor &r = x_.prod_returns[j].toTensor();
      x_.native_outputs.push_back(captured ? buffer_like(r) : poisoned_like(r));
      if (!x_.native_outputs.back().defined())
        return false; // beside the chain, over the bound
      x_.cand_returns[j] = x_.native_outputs.back();
    }
    set_outputs();
    return true;
  }

  // Serving: the arguments are the call's own (written ones writable), the
  // outputs fresh tensors like production's returns (this call's when
  // verified, else the learned layout). false when no layout is known.
  bool native_outputs_serving(bool verified) {
    call_values();
    for (size_t i = 0; i < n_args_ && i < 32; i++)
      x_.values[i].writable = (st_.cand.writes_mask >> i) & 1u;
    x_.cand_returns.assign(n_returns_, c10::IValue());
    if (verified) {
      for (size_t j = 0; j < n_returns_ && j < x_.prod_returns.size(); j++) {
        if (!is_defined_tensor(x_.prod_returns[j])) {
          // what a native candidate does not make (an int, None, no tensor:
          // the attention kernels' max_q, an unused cum_seq_q) is production's
          x_.cand_returns[j] = x_.prod_returns[j];
          continue;
        }
        const at::Tensor &r = x_.prod_returns[j].toTensor();
        bool alias = false;
        for (size_t i = 0; i < n_args_; i++)
          if (x_.snaps[i].defined() && x_.snaps[i].is_same(r)) {
            x_.cand_returns[j] = x_.saved[i];
            alias = true;
          }
        if (!alias) {
          x_.native_outputs.push_back(poisoned_like(r));
          x_.cand_returns[j] = x_.native_outputs.back();
        }
      }
    } else if (n_returns_ > 0) {
      ust__layout l;
      if (ust__call_layout(&st_, &call_, &l) != 0 || static_cast<size_t>(l.n_returns) != n_returns_)
        return false;
      for (size_t j = 0; j < n_returns_; j++) {
        const ust__ret_layout &r = l.ret[j];
        if (r.kind == UST__RET_OPAQUE)
          return false;
        if (r.kind == UST__RET_ARG) {
          if (r.arg < 0 || static_cast<size_t>(r.arg) >= n_args_)
            return false;
          x_.cand_returns[j] = x_.saved[static_cast<size_t>(r.arg)];
        } else if (r.kind == UST__RET_FRESH) {
          if (r.ndim < 0 || r.ndim > UST__MAX_RANK)
            return false;
          auto opts = at::TensorOptions()
                          .dtype(static_cast<c10::ScalarType>(r.scalar_type))
                          .device(r.device < 0 ? c10::Device(c10::kCPU)
                                               : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(r.device)));
          x_.native_outputs.push_back(at::empty_strided(c10::IntArrayRef(r.sizes, static_cast<size_t>(r.ndim)),
                                                        c10::IntArrayRef(r.strides, static_cast<size_t>(r.ndim)),
                                                        opts));
          x_.cand_returns[j] = x_.native_outputs.back();
        }
      }
    }
    set_outputs();
    return true;
  }

  // The production return j aliases a written argument: compared there.
  bool aliases_written_arg(size_t j) const {
    if (!is_defined_tensor(x_.prod_returns[j]))
      return false;
    const at::Tensor &r = x_.prod_returns[j].toTensor();
    for (size_t i = 0; i < n_args_; i++)
      if (x_.snaps[i].defined() && (serving_ ? x_.snaps[i] : x_.saved[i].toTensor()).is_same(r))
        return true;
    return false;
  }

  bool compared_return(size_t j) const {
    return st_.cand.compared_returns < 0 || j < static_cast<size_t>(st_.cand.compared_returns);
  }

  int call_native() {
    const ust_candidate *d = st_.cand.native;
    ust_candidate_call cc;
    std::memset(&cc, 0, sizeof cc);
    // a version 1 candidate reads its arguments with version 1's stride
    // (in its own process, that process converts them)
    std::vector<unsigned char> v1;
    const void *args = x_.values.data();
    if (st_.cand.proc == nullptr && st_.cand.abi < 2) {
      v1.resize(n_args_ * UST_VALUE_V1_SIZE);
      for (size_t i = 0; i < n_args_; i++)
        std::memcpy(v1.data() + i * UST_VALUE_V1_SIZE, &x_.values[i], UST_VALUE_V1_SIZE);
      args = v1.data();
      cc.size = offsetof(ust_candidate_call, value_size);
    } else {
      cc.size = sizeof cc;
      cc.value_size = sizeof(ust_value);
      cc.output_dtypes = x_.output_dtypes.data();
    }
    cc.n_args = static_cast<int32_t>(n_args_);
    cc.args = static_cast<const ust_value *>(args);
    cc.n_outputs = static_cast<int32_t>(x_.outputs.size());
    cc.outputs = x_.outputs.data();
    cc.device = dl_device(call_.device == UST__DEV_CUDA, call_.device_id);
    cc.stream = side_ != nullptr ? side_ : call_.stream; // a captured shadow's part, or the call's
    char buf[1024] = "";
    int rc = 0;
    if (st_.cand.proc != nullptr) {
      rc = ust__call_run_remote(&st_, &cc, buf, sizeof buf);
      buf[sizeof buf - 1] = '\0';
      if (rc == UST__CALL_REMOTE_LOST) {
        msg_ = std::string("in its qualifying process: ") + buf;
        return kFailError;
      }
      if (rc == UST__CALL_REMOTE_UNSENT)
        throw std::runtime_error(buf);
    } else if (int f = guarded([&] { rc = d->run(d->ctx, &cc, buf, sizeof buf); })) {
      return f;
    }
    if (rc != 0) {
      buf[sizeof buf - 1] = '\0';
      msg_ = "candidate returned status " + std::to_string(rc) + (buf[0] ? std::string(": ") + buf : std::string());
      return kFailError;
    }
    return kFailNone;
  }

  int call_torch_op() {
    const auto *h = static_cast<const c10::OperatorHandle *>(st_.cand.torch_op);
    const auto &cs = h->schema();
    if (cs.arguments().size() != n_args_ || cs.returns().size() != n_returns_) {
      msg_ = "candidate " + cs.operator_name().name + " takes " + std::to_string(cs.arguments().size()) +
             " arguments and returns " + std::to_string(cs.returns().size()) + " values; production " +
             std::to_string(n_args_) + " and " + std::to_string(n_returns_);
      return kFailSchema;
    }
    if (int f = guarded([&] { h->callBoxed(&x_.side); }))
      return f;
    x_.cand_returns.assign(x_.side.begin(), x_.side.end());
    return kFailNone;
  }

  // Runs the candidate; whatever it raises stays here and becomes a verdict.
  template <typename F> int guarded(F &&run) {
    try {
      run();
      return kFailNone;
    } catch (const std::exception &e) {
      msg_ = std::string("candidate raised: ") + e.what();
    } catch (...) {
      msg_ = "candidate raised an exception";
    }
    if (msg_.size() > 240)
      msg_.resize(240);
    return kFailRaised;
  }

  // Pairs of (production's value, the other side's): every written argument
  // (against its snapshot, which the other side wrote), then every compared
  // return that is not a written argument. A return understudy cannot read
  // (a tensor list, ...) makes the call unverifiable rather than passed.
  void add_pairs(const std::vector<at::Tensor> &snaps, const std::vector<c10::IValue> &other_returns, int aa) {
    x_.names.clear();
    std::vector<at::Tensor> prod, other;
    std::vector<int> written;
    for (size_t i = 0; i < n_args_; i++)
      if (snaps[i].defined()) {
        // production wrote the caller's argument and the other side the
        // snapshot; serving, the other way round
        x_.names.push_back(ust__binding_arg_name(b_, static_cast<int>(i)));
        prod.push_back(serving_ && !aa ? snaps[i] : x_.saved[i].toTensor());
        other.push_back(serving_ && !aa ? x_.saved[i].toTensor() : snaps[i]);
        written.push_back(1);
      }
    bool unreadable = false;
    for (size_t j = 0; j < n_returns_ && j < x_.prod_returns.size(); j++) {
      if (!compared_return(j) || aliases_written_arg(j) || x_.prod_returns[j].isNone())
        continue;
      if (!is_defined_tensor(x_.prod_returns[j])) {
        unreadable |= !(x_.prod_returns[j].isTensor() || x_.prod_returns[j].isInt() ||
                        x_.prod_returns[j].isDouble() || x_.prod_returns[j].isBool());
        continue;
      }
      if (j >= other_returns.size() || !is_defined_tensor(other_returns[j])) {
        if (!aa && fail_ == kFailNone) {
          fail_ = kFailSchema;
          msg_ = std::string("candidate returned no tensor for ") + result_name(j);
        }
        continue;
      }
      x_.names.push_back(result_name(j));
      prod.push_back(x_.prod_returns[j].toTensor());
      other.push_back(other_returns[j].toTensor());
      written.push_back(0);
    }
    if (st_.cand.compare == UST__CMP_SET) {
      as_sets(prod);
      as_sets(other);
    }
    for (size_t k = 0; k < prod.size(); k++)
      add_pair(x_.names[k], prod[k], other[k], aa, written[k]);
    if (unreadable || x_.pairs.size() >= UST__MAX_PAIRS) {
      // A pair whose dtype the guard does not read: the verdict is then
      // "unverifiable", never "passed" on a partial look.
      ust__pair p;
      std::memset(&p, 0, sizeof p);
      p.name = "unreadable outputs";
      p.aa = aa;
      p.prod_dtype = p.cand_dtype = UST__DT_OTHER;
      if (x_.pairs.size() >= UST__MAX_PAIRS)
        x_.pairs.back() = p;
      else
        x_.pairs.push_back(p);
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

  void add_pair(const char *name, const at::Tensor &prod, const at::Tensor &other, int aa, int written) {
    if (x_.pairs.size() >= UST__MAX_PAIRS)
      return;
    ust__pair p;
    std::memset(&p, 0, sizeof p);
    p.name = name;
    p.aa = aa;
    p.written_arg = written;
    x_.keep.push_back(prod);
    x_.keep.push_back(other);
    fill_dl(x_.keep[x_.keep.size() - 2], &p.prod, &p.prod_dtype);
    fill_dl(x_.keep.back(), &p.cand, &p.cand_dtype);
    if (prod.device() == other.device() && prod.sizes() == other.sizes() && prod.scalar_type() == other.scalar_type()) {
      x_.dense.push_back(prod.contiguous());
      x_.dense.push_back(other.contiguous());
      p.prod_dense = x_.dense[x_.dense.size() - 2].const_data_ptr();
      p.cand_dense = x_.dense.back().const_data_ptr();
    }
    x_.pairs.push_back(p);
  }

  const c10::OperatorHandle &op_;
  c10::DispatchKeySet below_;
  torch::jit::Stack &stack_;
  ust__binding *b_;
  const ust__call &call_;
  ust__call_state &st_;
  Scratch &x_;
  size_t n_args_, n_returns_;
  bool serving_;
  int fail_ = kFailNone;
  bool prod_on_snaps_ = false;
  std::string msg_;
  std::exception_ptr prod_exc_;
  ust__layout layout_{};
  void *side_ = nullptr; // a captured shadow's open part: the stream the candidate runs on
  at::Tensor stats_;     // its comparison's statistics (device memory the graph keeps)
};

// An intercepted call between its entry and its release (ust__hook_admit).
struct Entry {
  [[gnu::always_inline]] explicit Entry(ust__hook *h) : admitted(ust__hook_admit(h, &e)) {}
  [[gnu::always_inline]] ~Entry() { ust__hook_release(&e); }
  Entry(const Entry &) = delete;
  Entry &operator=(const Entry &) = delete;

  ust__entry e;
  const int admitted;
};

// A bound call inside an outer one whose floor may come from its callees.
template <class Source>
[[gnu::noinline]] void note_nested(const c10::OperatorHandle &op, Source &src, ust__binding *b, ust__thread *t) {
  try {
    if (ust__binding_needs_names(b))
      resolve_names(b, op);
    ust__arg args[Source::kArgs];
    ust__call call;
    if (src.view(args, &call, t->phase))
      ust__binding_nested_floor(b, &call, t->nested);
    else
      t->nested->n++, t->nested->unscored++;
  } catch (...) {
    t->nested->n++;
    t->nested->unscored++;
  }
}

// A call whose plan runs more than production (a shadow, a candidate that
// serves): its buffers and steps, out of the interceptor's common path;
// the view's data pointers read first.
// false, with nothing run or ended, when the run could not be set up (its
// buffers could not be allocated).
[[gnu::noinline]] bool run_plan(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack *stack,
                                ust__binding *b, ust__arg *args, const ust__call &call, ust__call_state &st,
                                ust__decision &d, int step) {
  std::optional<CallRun> run;
  try {
    fill_data(op, *stack, args, call.nargs);
    run.emplace(op, below, *stack, b, call, st);
  } catch (...) {
    return false;
  }
  while (step != UST__STEP_DONE)
    step = ust__decision_next(&d, run->perform(step));
  ust__call_end(&call, &st, &d);
  run->finish(d.outcome);
  return true;
}

// Production alone on a tracked call, ended as the PASS plan ends it: its
// nested floor collected where the call wants it.
template <class Source>
[[gnu::always_inline]] inline void serve_passed(Source &src, c10::DispatchKeySet below, ust__thread *th,
                                                const ust__call &call, ust__call_state &st, ust__decision &d) {
  try {
    if (st.nested_ok && ust__call_wants_nested(&st)) {
      ust__nested callees{};
      {
        NestedScope nscope(th, &callees);
        src.pass(below);
      }
      ust__call_nested_done(&st, &callees);
    } else {
      src.pass(below);
    }
  } catch (...) {
    ust__decision_passed(&d, 1);
    ust__call_end(&call, &st, &d);
    throw;
  }
  ust__decision_passed(&d, 0);
  ust__call_end(&call, &st, &d);
}

// A call whose plan's run could not be set up: understudy's error, counted;
// the candidate's side given up (its slot, a captured part) and production
// serves the call as a passed one.
template <class Source>
[[gnu::noinline, gnu::cold]] void plan_not_run(Source &src, c10::DispatchKeySet below, ust__binding *b, ust__thread *th,
                                               const ust__call &call, ust__call_state &st, ust__decision &d) {
  ust__call_internal_error(b);
  ust__call_abandon(&st, &call);
  serve_passed(src, below, th, call, st, d);
}

// A call the router planned (ust__call_settle did not settle it): production
// alone timed or captured, without a run's buffers or the machine's steps;
// else the plan's run. Out of the interceptor's common path.
template <class Source>
[[gnu::noinline]] void serve_planned(Source &src, c10::DispatchKeySet below, ust__binding *b, ust__thread *th,
                                     ust__arg *args, const ust__call &call, ust__call_state &st) {
  ust__decision d;
  if (st.plan == UST__PLAN_PASS) {
    serve_passed(src, below, th, call, st, d);
    return;
  }
  if (!src.plan(below, b, args, call, st, d, ust__decision_start(&d, st.plan, st.flags)))
    plan_not_run(src, below, b, th, call, st, d);
}

// A keyed call standing for weight calls: its view, its key's route, and
// what the router plans for it. Out of intercept's body, which a passed or
// tallied call runs through: its code lines are theirs alone.
template <class Source>
[[gnu::hot, gnu::noinline]] void serve_keyed(Source &src, const c10::OperatorHandle &op, c10::DispatchKeySet below,
                                             ust__binding *b, ust__thread *th, int weight) {
  ust__arg args[Source::kArgs];
  ust__call call;
  ust__call_state st; // ust__call_settle fills it when the call is not settled, before anything reads it
  bool settled = true, counted = false;
  try {
    if (ust__binding_needs_names(b))
      resolve_names(b, op);
    if (src.view(args, &call, th->phase)) {
      settled = ust__call_settle(b, &call, static_cast<unsigned>(weight), &st) != 0;
      counted = true;
    }
  } catch (...) {
    ust__call_internal_error(b);
    settled = true;
  }
  if (__builtin_expect(!counted && weight > 1, 0)) // the calls it stood for, counted without it
    ust__binding_tallied(b, static_cast<unsigned>(weight - 1));
  if (__builtin_expect(settled, 1)) { // counted (or untracked), production alone, untimed: nothing to end
    src.pass(below);
    return;
  }
  serve_planned(src, below, b, th, args, call, st);
}

// torch's operator handle keeps its operator's entry private (the
// dispatcher reads its dispatch table through it). The pointer to that
// member, named in an explicit instantiation, where C++ checks no access
// ([temp.explicit]): Production reads the entry's table once through it.
struct HandleEntry {
  friend auto entry_member(HandleEntry);
};
template <auto Member> struct ExposeEntry {
  friend auto entry_member(HandleEntry) { return Member; }
};
template struct ExposeEntry<&c10::OperatorHandle::operatorDef_>;

// Production's kernel for the keys below understudy's: the entry of the
// op's dispatch table torch's redispatch finds for them, found once, for the
// keys of the first call of dense host or dense CUDA tensors (not those of
// a meta or fake pass before serving), and called directly after, as the
// dispatcher's redispatch calls it, without its lookup (a function and a
// table of this library's own copy of torch's headers: cold lines a call
// would read for nothing). A registration rewrites the table's entries in
// place, so a call reads the kernel registered now, as torch's own lookup
// does. A call with other keys, or while the entry holds no kernel, is
// redispatched (torch then raises what it raises without understudy).
// One word, written once: the entry's address, its low bits naming the
// keys it serves.
class Production {
public:
  template <class Ret, class... Args>
  [[gnu::always_inline]] Ret call(const c10::TypedOperatorHandle<Ret(Args...)> &op, c10::DispatchKeySet below,
                                  Args... args) {
    if (const c10::KernelFunction *k = kernel(below); __builtin_expect(k != nullptr, 1))
      return k->template call<Ret, Args...>(op, below, std::forward<Args>(args)...);
    find(op, below);
    return c10::Dispatcher::singleton().redispatch<Ret, Args...>(op, below, std::forward<Args>(args)...);
  }
  [[gnu::always_inline]] void call_boxed(const c10::OperatorHandle &op, c10::DispatchKeySet below,
                                         torch::jit::Stack *stack) {
    if (const c10::KernelFunction *k = kernel(below); __builtin_expect(k != nullptr, 1))
      return k->callBoxed(op, below, stack);
    find(op, below);
    c10::Dispatcher::singleton().redispatchBoxed(op, below, stack);
  }

private:
  // The keys an entry may serve, in its word's low bits (a KernelFunction
  // is aligned to 8): 1 dense host, 2 dense CUDA; 0 any other keys.
  static constexpr uintptr_t kKeys = 3;
  [[gnu::always_inline]] static uintptr_t keys_of(c10::DispatchKeySet below) {
    constexpr c10::DispatchKeySet host(c10::DispatchKey::CPU), cuda(c10::DispatchKey::CUDA);
    return static_cast<uintptr_t>(below == host) | static_cast<uintptr_t>(below == cuda) << 1;
  }
  [[gnu::always_inline]] const c10::KernelFunction *kernel(c10::DispatchKeySet below) const {
    const uintptr_t word = __atomic_load_n(&entry_, __ATOMIC_ACQUIRE), keys = keys_of(below);
    const auto *k = reinterpret_cast<const c10::KernelFunction *>(word & ~kKeys);
    return keys != 0 && (word & kKeys) == keys && k->isValid() ? k : nullptr;
  }
  // The entry for below, published unless the call's keys are not claimable
  // or a call published first. Where no kernel serves below, torch's lookup
  // raises its own error, the one the redispatch would raise: production's.
  [[gnu::noinline, gnu::cold]] void find(const c10::OperatorHandle &op, c10::DispatchKeySet below) {
    const uintptr_t keys = keys_of(below);
    if (keys == 0 || __atomic_load_n(&entry_, __ATOMIC_RELAXED) != 0)
      return;
    const auto k = reinterpret_cast<uintptr_t>(&(op.*entry_member(HandleEntry{}))->op.lookup(below));
    static_assert(alignof(c10::KernelFunction) > kKeys, "an entry's address leaves the keys' bits free");
    uintptr_t none = 0;
    __atomic_compare_exchange_n(&entry_, &none, k | keys, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  }

  uintptr_t entry_ = 0; // the entry's address | the keys it serves; 0 until found
};

// The keys below understudy's: production's.
[[gnu::always_inline]] inline c10::DispatchKeySet below_us(c10::DispatchKeySet ks) {
  return ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);
}

// An admitted call that is neither passed on nor tallied, whatever its
// source (Boxed, Typed below): a bound op inside a tracked call's
// production, or a keyed call (its view, route and plan in serve_keyed).
template <class Source>
[[gnu::noinline]] void serve_admitted(const ust__entry &e, int weight, const c10::OperatorHandle &op,
                                      c10::DispatchKeySet below, Source &src) {
  ust__thread *const th = e.thread;
  ust__binding *const b = e.binding;
  if (weight == UST__ADMIT_NESTED) {
    // a bound op the outer call runs: its floor counts toward the outer's
    note_nested(op, src, b, th);
    CallScope deeper(th); // its own callees are not the outer's direct ones
    src.pass(below);
    return;
  }
  CallScope nested(th); // a keyed call's bound callees are part of it
  // a call the tally cannot take (a device or layout not counted) is keyed,
  // and stands for itself alone: the calls a random one stands for are
  // those the tally takes
  if (weight != 1 && !tallies_below(below))
    weight = 1;
  serve_keyed(src, op, below, b, th, weight);
}

// A call its interceptor tallies in its own body, before any entry (the
// admission's common case, ust__thread_tallies, for a call whose kernel the
// tally takes): its thread's block, the call counted on line and taken off
// the thread's countdown; nullptr, nothing touched, for any other call
// (intercept enters and admits it).
[[gnu::always_inline]] inline ust__thread *tally_here(ust__hook_line *line, uint64_t word, c10::DispatchKeySet below) {
  ust__thread *const t = ust__thread_here();
  if (!__builtin_expect(tallies_below(below) & ust__thread_tallies(word, t), 1))
    return nullptr;
  ust__line_tally(line, t);
  return t;
}

// An intercepted call past its interceptor's own checks (off; tally_here):
// its entry and admission (ust__hook_admit), then production alone for a
// call passed on (pass(below): its result), else other(the entry, the
// admission, below).
template <class Pass, class Other>
[[gnu::always_inline]] inline auto intercept(ust__hook *hook, c10::DispatchKeySet ks, Pass &&pass, Other &&other) {
  const c10::DispatchKeySet below = below_us(ks);
  Entry entry(hook);
  if (entry.admitted == UST__ADMIT_PASS)
    return pass(below);
  return other(entry.e, entry.admitted, below);
}

// A boxed call: its arguments, and then its results, on the stack.
template <size_t Room> struct Boxed {
  static constexpr size_t kArgs = Room; // the view's room: the schema's first Room arguments
  const c10::OperatorHandle &op;
  torch::jit::Stack *stack;
  Production &production; // the interceptor's

  bool view(ust__arg *args, ust__call *call, int phase) { return build_view(op, *stack, args, Room, call, phase); }
  void pass(c10::DispatchKeySet below) { production.call_boxed(op, below, stack); }
  bool plan(c10::DispatchKeySet below, ust__binding *b, ust__arg *args, const ust__call &call, ust__call_state &st,
            ust__decision &d, int step) {
    return run_plan(op, below, stack, b, args, call, st, d, step);
  }
};

// A plan's results as a typed call returns them, taken off the stack run_plan
// left (one tensor, or a tuple's values in order); false when it holds
// something else (then the caller counts an internal error and production
// answers).
inline bool take_results(torch::jit::Stack &stack, std::optional<at::Tensor> &out) {
  if (stack.size() != 1 || !stack.back().isTensor())
    return false;
  out.emplace(std::move(stack.back()).toTensor());
  return true;
}
template <class... Rs>
bool take_results(torch::jit::Stack &stack, std::optional<std::tuple<Rs...>> &out) {
  if (stack.size() != sizeof...(Rs))
    return false;
  try {
    out.emplace(c10::impl::PopResult<std::tuple<Rs...>>::call(stack));
  } catch (...) {
    return false;
  }
  return true;
}

// A typed call of an op whose C++ signature is Ret(Args...): its arguments
// as the caller passed them, production called without boxing them; a
// plan that runs more than production boxes them for run_plan and takes its
// results back off the stack.
template <class Ret, class... Args>
struct Typed {
  // the view's room: its own arguments (a call's frame as deep as the op's
  // arity, not a boxed call's)
  static constexpr size_t kArgs = sizeof...(Args);
  const c10::TypedOperatorHandle<Ret(Args...)> &op;
  Production &production; // the interceptor's
  std::tuple<Args...> in;
  std::optional<Ret> out;

  bool view(ust__arg *args, ust__call *call, int phase) {
    view_begin(call, args, sizeof...(Args), phase);
    std::apply([&](const auto &...a) {
      size_t i = 0;
      (view_arg(a, args[i++], call), ...);
    }, in);
    return view_end(call);
  }
  [[gnu::always_inline]] void pass(c10::DispatchKeySet below) {
    out.emplace(std::apply(
        [&](Args... a) { return production.call<Ret, Args...>(op, below, std::forward<Args>(a)...); }, in));
  }
  bool plan(c10::DispatchKeySet below, ust__binding *b, ust__arg *args, const ust__call &call, ust__call_state &st,
            ust__decision &d, int step) {
    torch::jit::Stack stack;
    try {
      stack.reserve(sizeof...(Args));
      std::apply([&](const auto &...a) { (torch::jit::push(stack, a), ...); }, in);
    } catch (...) {
      return false;
    }
    if (!run_plan(op, below, &stack, b, args, call, st, d, step))
      return false;
    if (take_results(stack, out))
      return true;
    // no results of production's types (a candidate's that do not convert):
    // counted, and production answers the caller
    ust__call_internal_error(b);
    pass(below);
    return true;
  }
};

// An interceptor is one cache line (what it holds, torch's reference count,
// its hook's line and production's kernel): all a call passed on or tallied
// reads of it and of its hook; a call that enters reads the hook's head too.
template <size_t Room> class alignas(64) Interceptor final : public c10::OperatorKernel {
public:
  explicit Interceptor(ust__hook *h)
      : line_{UST__TALLY_OFF, 0}, hook_(h) {}

  ust__hook_line *line() { return &line_; }

  [[gnu::hot, gnu::always_inline]] void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet ks,
                                                   torch::jit::Stack *stack) {
    const uint64_t word = ust__line_word(&line_);
    const c10::DispatchKeySet below = below_us(ks);
    ust__thread *t = nullptr; // off, or not bound: this object's line read alone, nothing entered
    if (__builtin_expect(word != UST__TALLY_OFF, 1) && (t = tally_here(&line_, word, below)) == nullptr)
      return serve(op, ks, stack);
    CallScope scope(t); // a tallied call's bound callees are part of it, as a keyed call's
    production_.call_boxed(op, below, stack);
  }

private:
  [[gnu::hot, gnu::noinline]] void serve(const c10::OperatorHandle &op, c10::DispatchKeySet ks,
                                         torch::jit::Stack *stack) {
    Boxed<Room> src{op, stack, production_};
    intercept(
        hook_, ks, [&](c10::DispatchKeySet below) { src.pass(below); },
        [&](const ust__entry &e, int weight, c10::DispatchKeySet below) {
          serve_admitted(e, weight, op, below, src);
        });
  }

  // the hook's line (its tally word and count), the hook's head pointing at
  // it once registered: a call passed on or tallied reads and counts here,
  // on the line torch's wrapper hands this object's address in
  ust__hook_line line_;
  // production of a call passed on, tallied or keyed (Boxed, Typed)
  Production production_;
  ust__hook *hook_;
};

// The interceptor of an op whose C++ signature is Ret(Args...), called
// unboxed by typed callers (torch's own C++ and Python bindings) and through
// the boxed wrapper torch makes for boxed ones.
template <class Sig> class TypedInterceptor;
template <class Ret, class... Args>
class alignas(64) TypedInterceptor<Ret(Args...)> final : public c10::OperatorKernel {
public:
  TypedInterceptor(ust__hook *h, c10::TypedOperatorHandle<Ret(Args...)> op)
      : line_{UST__TALLY_OFF, 0}, op_(op), hook_(h) {}

  ust__hook_line *line() { return &line_; }

  [[gnu::hot, gnu::always_inline]] Ret operator()(c10::DispatchKeySet ks, Args... args) {
    const uint64_t word = ust__line_word(&line_);
    const c10::DispatchKeySet below = below_us(ks);
    ust__thread *t = nullptr; // off, or not bound: this object's line read alone, nothing entered
    if (__builtin_expect(word != UST__TALLY_OFF, 1) && (t = tally_here(&line_, word, below)) == nullptr)
      return serve(ks, std::forward<Args>(args)...);
    CallScope scope(t); // a tallied call's bound callees are part of it, as a keyed call's
    return production(below, std::forward<Args>(args)...);
  }

private:
  [[gnu::always_inline]] Ret production(c10::DispatchKeySet below, Args... args) {
    return production_.call<Ret, Args...>(op_, below, std::forward<Args>(args)...);
  }

  [[gnu::hot, gnu::noinline]] Ret serve(c10::DispatchKeySet ks, Args... args) {
    return intercept(
        hook_, ks,
        [&](c10::DispatchKeySet below) __attribute__((always_inline)) {
          return production(below, std::forward<Args>(args)...);
        },
        [&](const ust__entry &e, int weight, c10::DispatchKeySet below) {
          return serve_other(e, weight, below, std::forward<Args>(args)...);
        });
  }

  // A call neither passed on nor tallied: its arguments kept for a view and
  // a plan, its result taken from the plan's run.
  [[gnu::noinline]] Ret serve_other(const ust__entry &e, int weight, c10::DispatchKeySet below, Args... args) {
    Typed<Ret, Args...> src{op_, production_, std::tuple<Args...>(args...), std::nullopt};
    serve_admitted(e, weight, op_, below, src);
    return std::move(*src.out);
  }

  ust__hook_line line_;    // as Interceptor's
  Production production_; // as Interceptor's
  c10::TypedOperatorHandle<Ret(Args...)> op_;
  ust__hook *hook_;
};

// The C++ signatures an op may be intercepted by without boxing: the
// functional ops serving traffic calls most (matmuls, activations, the
// attention and norm kernels models call once a layer, whose boxing and
// unboxing of many arguments and results would cost more than the rest of
// the interceptor). An op takes the first its schema matches exactly (torch
// checks the C++ signature against its other kernels'), else the boxed
// interceptor.
template <class... Sigs> struct SigList {};
using T_ = at::Tensor;
using OptT = std::optional<at::Tensor>;
using OptD = std::optional<double>;
using Sdpa9 = std::tuple<T_, T_, T_, T_, c10::SymInt, c10::SymInt, T_, T_, T_>;
using TypedSigs = SigList<
    T_(const T_ &), T_(const T_ &, const T_ &),
    T_(const T_ &, const T_ &, const T_ &, const c10::Scalar &, const c10::Scalar &),
    // _scaled_dot_product_cudnn_attention
    Sdpa9(const T_ &, const T_ &, const T_ &, const OptT &, bool, double, bool, bool, OptD),
    // _scaled_dot_product_flash_attention
    Sdpa9(const T_ &, const T_ &, const T_ &, double, bool, bool, OptD),
    // _scaled_dot_product_efficient_attention
    std::tuple<T_, T_, T_, T_>(const T_ &, const T_ &, const T_ &, const OptT &, bool, double, bool, OptD),
    // _scaled_dot_product_flash_attention_for_cpu
    std::tuple<T_, T_>(const T_ &, const T_ &, const T_ &, double, bool, const OptT &, OptD),
    // _fused_rms_norm
    std::tuple<T_, T_>(const T_ &, at::IntArrayRef, const OptT &, OptD),
    // native_layer_norm
    std::tuple<T_, T_, T_>(const T_ &, c10::SymIntArrayRef, const OptT &, const OptT &, double),
    // topk
    std::tuple<T_, T_>(const T_ &, c10::SymInt, int64_t, bool, bool),
    // _grouped_mm (a mixture of experts' layers, several a layer)
    T_(const T_ &, const T_ &, const OptT &, const OptT &, std::optional<c10::ScalarType>)>;

// A call passed on or tallied reads one line of its interceptor.
static_assert(sizeof(TypedInterceptor<T_(const T_ &, const T_ &)>) == 64 && sizeof(Interceptor<kMaxArgs>) == 64,
              "an interceptor is one cache line");

// Whether a schema is functional: no argument or return aliased or written.
bool functional(const c10::FunctionSchema &schema) {
  for (const auto &a : schema.arguments())
    if (a.alias_info() != nullptr)
      return false;
  for (const auto &r : schema.returns())
    if (r.alias_info() != nullptr)
      return false;
  return !schema.is_vararg() && !schema.is_varret();
}

// Once its interceptor is registered, the hook's calls read and count on
// the interceptor's line (off, none counted: enable binds the hook after).
void use_line(ust__hook *hook, ust__hook_line *line) {
  __atomic_store_n(&ust__hook_head_of(hook)->line, line, __ATOMIC_RELEASE);
}

template <size_t Room>
c10::KernelFunction boxed_kernel(std::unique_ptr<Interceptor<Room>> interceptor, ust__hook_line **line) {
  *line = interceptor->line();
  return c10::KernelFunction::makeFromBoxedFunctor(std::move(interceptor));
}

template <class Sig>
bool register_typed(ust__hook *hook, const c10::OperatorHandle &op, const char *display) {
  auto inferred = std::make_unique<c10::FunctionSchema>(c10::inferFunctionSchemaFlattenedReturns<Sig>());
  if (c10::findSchemaDifferences(*inferred, op.schema()).has_value())
    return false;
  try {
    auto interceptor = std::make_unique<TypedInterceptor<Sig>>(hook, op.typed<Sig>());
    ust__hook_line *const line = interceptor->line();
    auto kernel = c10::KernelFunction::makeFromUnboxedFunctor<false, TypedInterceptor<Sig>>(std::move(interceptor));
    // Kept for the life of the process: the kernel is never deregistered.
    new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().registerImpl(
        op.operator_name(), c10::DispatchKey::BackendSelect, std::move(kernel), c10::impl::CppSignature::make<Sig>(),
        std::move(inferred), std::string("understudy interceptor for ") + display));
    use_line(hook, line);
    return true;
  } catch (...) { // torch refused the signature (its kernels take another): the boxed interceptor instead
    return false;
  }
}

template <class... Sigs>
bool register_first(ust__hook *hook, const c10::OperatorHandle &op, const char *display, SigList<Sigs...>) {
  return (register_typed<Sigs>(hook, op, display) || ...);
}

// Registers op's typed interceptor when an aten op's schema is functional and
// matches one of TypedSigs; false when none does (then the boxed one).
bool try_typed(ust__hook *hook, const c10::OperatorHandle &op, const char *display) {
  if (op.operator_name().name.rfind("aten::", 0) != 0 || !functional(op.schema()))
    return false;
  return register_first(hook, op, display, TypedSigs{});
}

int register_hook(ust__hook *hook, const char *qualname, const char *overload, const char *display) {
  try {
    c10::OperatorName name(qualname, overload);
    auto &dispatcher = c10::Dispatcher::singleton();
    const auto existing = dispatcher.findOp(name);
    if (existing) {
      if (existing->hasKernelForDispatchKey(c10::DispatchKey::BackendSelect))
        return ust__error(UST_ETORCH,
                          "%s already has a BackendSelect kernel; intercepting it would bypass that kernel",
                          display);
      if (try_typed(hook, *existing, display))
        return 0;
    }
    // an op not defined yet may take any number of arguments
    ust__hook_line *line = nullptr;
    auto kernel = existing && existing->schema().arguments().size() <= kFewArgs
                      ? boxed_kernel(std::make_unique<Interceptor<kFewArgs>>(hook), &line)
                      : boxed_kernel(std::make_unique<Interceptor<kMaxArgs>>(hook), &line);
    // Kept for the life of the process: the kernel is never deregistered.
    new c10::RegistrationHandleRAII(dispatcher.registerImpl(name, c10::DispatchKey::BackendSelect, std::move(kernel),
                                                            std::nullopt, nullptr,
                                                            std::string("understudy interceptor for ") + display));
    use_line(hook, line);
    return 0;
  } catch (const std::exception &e) {
    return ust__error(UST_ETORCH, "registering an interceptor for %s failed: %s", display, e.what());
  } catch (...) {
    return ust__error(UST_ETORCH, "registering an interceptor for %s failed", display);
  }
}

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

extern "C" const ust__seam_i *ust__seam(void) { return &kSeam; }
