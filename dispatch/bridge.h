// The dispatcher seam's shared parts (C++, internal; never installed): the
// thread's scopes, the tensors understudy makes for a call, the buffers a
// call's run reuses, and CallRun, which performs the steps of the serving
// decision (guard/decision.h) for one intercepted call. The seam is split by
// job:
//   bridge_intercept.cpp  the interceptors registered at BackendSelect, the
//                         admission of a call and its view (bridge_view.h)
//   bridge_eager.cpp      a run's steps for an eager call: snapshots,
//                         production, the candidate, the comparison, restoring
//   bridge_captured.cpp   the same steps while the call's stream captures a
//                         CUDA graph (a shadow captured beside production)
//   bridge_native.cpp     a native candidate's arguments and outputs (the
//                         candidate ABI, include/understudy/candidate.h)
//   bridge_repro.cpp      a shadowed call kept while its verdict is pending,
//                         its route's once it failed (ust__repro)
//   bridge_seam.cpp       the seam's table for the C core (ust__seam_i)
// The seam decides nothing itself; every exception of understudy's own is
// caught in it and turned into an event, and production's exceptions reach
// the caller as they would without understudy.
#ifndef UST_DISPATCH_BRIDGE_H
#define UST_DISPATCH_BRIDGE_H

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>

#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/callview.h"
#include "understudy/candidate.h"
#include "understudy/understudy.h"

extern "C" int ust__error(int err, const char *fmt, ...);

namespace ust_bridge {

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
inline constexpr DTypeTable kDTypes;

inline DTypeInfo dtype_info(c10::ScalarType s) {
  const auto i = static_cast<unsigned>(s);
  return kDTypes.of[i < static_cast<unsigned>(kScalarTypes) ? i : kScalarTypes];
}

inline DLDevice dl_device(bool cuda, int index) {
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
inline void *data_of(const at::Tensor &t) { return t.has_storage() ? const_cast<void *>(t.const_data_ptr()) : nullptr; }

// A whole borrowed DLPack view of t.
void fill_dl(const at::Tensor &t, DLTensor *dl, int *dtype_id);

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

// "result j", for messages.
const char *result_name(size_t j);

inline bool is_defined_tensor(const c10::IValue &v) { return v.isTensor() && v.toTensor().defined(); }

// Fresh outputs for a native candidate, like production's, filled with a
// value no correct kernel leaves behind, so an output the candidate forgets
// to write cannot pass by reusing memory that held the right answer.
at::Tensor poisoned_like(const at::Tensor &r);

// A copy of t with t's own sizes and strides (a view written in place, such
// as one split out of a fused qkv, keeps its layout).
at::Tensor snapshot_of(const at::Tensor &t);

inline void enter_call_device(c10::OptionalDeviceGuard &g, const ust__call &call) {
  if (call.device == UST__DEV_CUDA)
    g.reset_device(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(call.device_id)));
}

// Buffers a call's run reuses: one set per thread (a thread runs one bound
// call at a time; nested bound calls pass through), so the steady-state
// path allocates nothing once they have grown.
struct Scratch {
  std::vector<c10::IValue> saved, prod_returns, cand_returns, arm_returns, aa_returns;
  std::vector<c10::IValue> cin_lists; // the candidate's copies of tensor-list arguments (shadow)
  // snaps: the candidate's copies of what the op writes (shadow), or
  // production's (verified serving); arm_snaps: production's own in an armed
  // shadow; aa_snaps: its A/A run's
  std::vector<at::Tensor> snaps, arm_snaps, aa_snaps, inputs, cin, native_outputs, keep, dense;
  std::vector<ust_value> values;
  std::vector<DLTensor> outputs;
  std::vector<int32_t> output_dtypes;
  std::vector<ust__pair> pairs;
  std::vector<const char *> names;
  torch::jit::Stack side; // production on snapshots or copies, the candidate, the A/A run
  void clear() {
    saved.clear();
    prod_returns.clear();
    cand_returns.clear();
    arm_returns.clear();
    aa_returns.clear();
    snaps.clear();
    arm_snaps.clear();
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

// The calling thread's buffers.
Scratch &thread_scratch();

// A failing call kept to be replayed (bridge_repro.h); destroyed through
// its C table (it may have been handed to the router).
class Repro;
struct ReproDrop {
  void operator()(Repro *r) const;
};

// One intercepted call whose plan is not a plain pass: performs the steps
// the decision names. Every step returns its event; none throws. Its eager
// steps are in bridge_eager.cpp, the captured ones in bridge_captured.cpp, a
// native candidate's in bridge_native.cpp.
class CallRun {
public:
  CallRun(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack &stack, ust__binding *b,
          const ust__call &call, ust__call_state &st);
  CallRun(const CallRun &) = delete;
  CallRun &operator=(const CallRun &) = delete;
  ~CallRun() { x_.clear(); }

  // The step's event (UST__EV_*).
  int perform(int step);
  // What the caller receives, once the decision is done.
  void finish(int outcome);

private:
  // eager steps and what they share (bridge_eager.cpp)
  int own(int (CallRun::*fn)());
  void mark(int point);
  // The same marks around the work of every arm: point (a begin mark) and
  // its end, the end only when work returns.
  template <typename F> void timed(int point, F &&work);
  int snapshot();
  void copy_written(size_t i);
  int prod_on_args();
  int prod_on_snaps();
  int prod_on_copies();
  int aa_on_copies();
  int production_again(const std::vector<at::Tensor> &snaps, int point, std::vector<c10::IValue> &returns);
  void fit_resized();
  bool layout_first();
  int cand_on_snaps();
  int cand_on_args();
  bool returns_like_production();
  int run_candidate(bool timed);
  int compare();
  int abandon();
  int verdict();
  int cand_failed();
  void add_input_pairs();
  int snaps_into_args();
  void replace_stack(const std::vector<c10::IValue> &returns);
  torch::jit::Stack with_snapshots(const std::vector<at::Tensor> &snaps, bool private_inputs = false) const;
  void learn_layout();
  bool aliases_written_arg(size_t j) const;
  bool compared_return(size_t j) const;
  int call_torch_op();
  void add_pairs(const std::vector<at::Tensor> &snaps, const std::vector<c10::IValue> &other_returns, int aa);
  void add_aa_pairs(const std::vector<at::Tensor> &snaps, const std::vector<c10::IValue> &returns);
  static void as_sets(std::vector<at::Tensor> &ts);
  void add_pair(const char *name, const at::Tensor &prod, const at::Tensor &other, int aa, int written);

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

  // a shadow captured into the call's CUDA graph (bridge_captured.cpp)
  bool captured() const { return (st_.flags & UST__DF_CAPTURED) != 0; }
  static bool overwritten(size_t i, uint32_t mask) { return i < 32 && ((mask >> i) & 1u); }
  int drop(int why, const char *detail);
  at::Tensor buffer_of(at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions &options);
  at::Tensor buffer_like(const at::Tensor &t);
  int drop_kept();
  bool graph_copy(const at::Tensor &dst, const at::Tensor &src);
  int snapshot_captured();
  int cand_on_snaps_captured();
  int compare_captured();
  bool prod_side_kept();

  // the call kept while its verdict is pending, where its route wants a
  // failing call kept (bridge_repro.cpp)
  uint64_t keep_inputs(); // the bytes it copied
  void keep_outputs(const std::vector<at::Tensor> &prod, const std::vector<at::Tensor> &other);
  void hand_keep();

  // a native candidate's arguments and outputs (bridge_native.cpp)
  void call_values();
  void set_outputs();
  bool prepare_native_on_snaps(bool captured = false);
  bool native_outputs_serving(bool verified);
  int call_native();

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
  bool untimed_ = false;  // the arms' order was forced (a candidate that could not run first): no times
  bool arm_ran_ = false;  // production's arm ran on its copies (armed shadow)
  bool aa_ran_ = false;   // production's A/A run
  bool cand_first_native_ = false; // a native candidate ran before production, on the learned layout
  bool not_run_ = false; // the candidate did not run: its qualifying process was busy with another call
  std::string msg_;
  std::exception_ptr prod_exc_;
  ust__layout layout_{};
  void *side_ = nullptr; // a captured shadow's open part: the stream the candidate runs on
  at::Tensor stats_;     // its comparison's statistics (device memory the graph keeps)
  std::unique_ptr<Repro, ReproDrop> repro_;
};

// Runs a call's plan from step (the decision's first) to its end, then hands
// the caller what the decision says; the view's data pointers read first.
// false, with nothing run or ended, when the run could not be set up (its
// buffers could not be allocated). bridge_eager.cpp.
bool run_plan(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack *stack, ust__binding *b,
              ust__arg *args, const ust__call &call, ust__call_state &st, ust__decision &d, int step);

// Fills the data pointers of a view build_view filled from the same stack.
// bridge_intercept.cpp.
void fill_data(const c10::OperatorHandle &op, const torch::jit::Stack &stack, ust__arg *args, int nargs);
// The schema's argument names and written arguments into b. bridge_intercept.cpp.
void resolve_names(ust__binding *b, const c10::OperatorHandle &op);
// Registers the interceptor of an op and overload (ust__seam_i.register_hook).
// bridge_intercept.cpp.
int register_hook(ust__hook *hook, const char *qualname, const char *overload, const char *display);

} // namespace ust_bridge

#endif // UST_DISPATCH_BRIDGE_H
