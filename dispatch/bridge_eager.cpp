// The eager run of an intercepted call (dispatch/bridge.h): the steps of
// its plan when its stream does not capture a graph, and what they share
// with the captured and native paths (the pairs compared, the layout learned,
// the torch-op candidate).
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include <ATen/record_function.h>

#include "dispatch/bridge.h"

namespace ust_bridge {
namespace {

thread_local Scratch tl_scratch;

// What a candidate calls while it runs: the ops it calls directly, seen by
// a thread-local RecordFunction callback added for the run (a sampled run
// only: while it is added every op on the thread is recorded), and the
// bound ops among them, whose work the nested scope sums. Depth 1 is the
// candidate's own op (a torch op) or the first op a native one calls.
// Names are copied: a record named by a string owns it and frees it when it
// ends (an autograd.Function's apply is named by its class), so a pointer
// kept past the record would read freed memory into the report.
struct FallbackCount {
  int depth = 0;
  int direct = 1;  // the depth of the candidate's direct calls
  // inside a kernel-tracing window, the spans whose kernels count: the run's
  // (-1: none) and the direct call's open now (-1: none)
  ust__call_state *st = nullptr;
  const ust__call *call = nullptr;
  int run_span = -1, op_span = -1;
  uint64_t aten = 0, other = 0;
  int n = 0;
  std::array<std::array<char, UST__FALLBACK_NAME_MAX>, UST__FALLBACK_OPS> names;  // the first n written
  std::array<const char *, UST__FALLBACK_OPS> name_of{};  // names[k].data(), as the router takes them
  std::array<uint32_t, UST__FALLBACK_OPS> counts{};
};
thread_local FallbackCount *tl_fallback = nullptr;

// The bytes of name a route keeps: all of them, or those before the UTF-8
// character that would not fit, so that a cut name stays UTF-8.
size_t kept_length(const char *name) {
  size_t n = strnlen(name, UST__FALLBACK_NAME_MAX);
  if (n < UST__FALLBACK_NAME_MAX)
    return n;
  n = UST__FALLBACK_NAME_MAX - 1;
  while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xC0) == 0x80)
    n--;
  return n;
}

std::unique_ptr<at::ObserverContext> fallback_start(const at::RecordFunction &fn) {
  FallbackCount *c = tl_fallback;
  if (c == nullptr || ++c->depth != c->direct || fn.scope() != at::RecordScope::FUNCTION)
    return nullptr;
  const char *name = fn.name();  // the record's: valid until it ends
  if (std::strncmp(name, "aten::", 6) == 0)
    c->aten++;
  else
    c->other++;
  const size_t len = kept_length(name);
  int k = 0;
  while (k < c->n && !(std::strncmp(c->names[k].data(), name, len) == 0 && c->names[k][len] == '\0'))
    k++;
  if (k == c->n && c->n < UST__FALLBACK_OPS) {
    std::memcpy(c->names[k].data(), name, len);
    c->names[k][len] = '\0';
    c->name_of[k] = c->names[k].data();
    c->n++;
  }
  if (k < c->n)
    c->counts[k]++;
  if (c->run_span >= 0)
    c->op_span = ust__call_span_begin(c->st, c->call);
  return nullptr;
}

void fallback_end(const at::RecordFunction &, at::ObserverContext *) {
  FallbackCount *c = tl_fallback;
  if (c == nullptr)
    return;
  if (c->depth == c->direct && c->op_span >= 0) {
    ust__call_span_end(c->st, c->op_span, UST__SPAN_OP);
    c->op_span = -1;
  }
  c->depth--;
}

// "[2,3]"
std::string shape_str(c10::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); i++)
    s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

} // namespace

Scratch &thread_scratch() { return tl_scratch; }

const char *result_name(size_t j) {
  static const char *names[] = {"result 0", "result 1", "result 2", "result 3",
                                "result 4", "result 5", "result 6", "result 7"};
  return j < 8 ? names[j] : "result";
}

void fill_dl(const at::Tensor &t, DLTensor *dl, int *dtype_id) {
  int id = UST__DT_OTHER;
  view_meta(t, dl_device(t.is_cuda(), t.is_cuda() ? t.get_device() : 0), dl, &id);
  dl->data = data_of(t);
  if (dtype_id != nullptr)
    *dtype_id = id;
}

at::Tensor poisoned_like(const at::Tensor &r) {
  at::Tensor t = at::empty_strided(r.sizes(), r.strides(), r.options());
  if (at::isFloatingType(r.scalar_type()))
    t.fill_(std::numeric_limits<double>::quiet_NaN());
  else if (r.scalar_type() != at::kBool)
    t.fill_(-77);
  return t;
}

at::Tensor snapshot_of(const at::Tensor &t) {
  at::Tensor s = at::empty_strided(t.sizes(), t.strides(), t.options());
  s.copy_(t);
  return s;
}

CallRun::CallRun(const c10::OperatorHandle &op, c10::DispatchKeySet below, torch::jit::Stack &stack, ust__binding *b,
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
  x_.arm_snaps.resize(n_args_);
  x_.aa_snaps.resize(n_args_);
  x_.inputs.resize(n_args_);
  x_.cin.resize(n_args_);
  x_.cin_lists.resize(n_args_);
}

int CallRun::perform(int step) {
  switch (step) {
  case UST__STEP_SNAPSHOT: return own(&CallRun::snapshot);
  case UST__STEP_PROD_ON_ARGS: return prod_on_args();
  case UST__STEP_PROD_ON_SNAPS: return prod_on_snaps();
  case UST__STEP_PROD_ON_COPIES: return own(&CallRun::prod_on_copies);
  case UST__STEP_AA_ON_COPIES: return own(&CallRun::aa_on_copies);
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
void CallRun::finish(int outcome) {
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

// A step of understudy's own work: on the call's device, below autograd,
// passing through the interceptors; anything it throws is internal.
int CallRun::own(int (CallRun::*fn)()) {
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
void CallRun::mark(int point) {
  if (st_.slot == nullptr || untimed_)
    return;
  try {
    c10::OptionalDeviceGuard guard;
    enter_call_device(guard, call_);
    ust__call_mark(&st_, point, &call_);
  } catch (...) {
  }
}

template <typename F> void CallRun::timed(int point, F &&work) {
  mark(point);
  work();
  mark(point + 1);
}

// Copies of what the op writes, and of read-only arguments that share
// storage with a written one (addmm(c, a, b, out=c)): the other side must
// read them as the first did, before it wrote them.
int CallRun::snapshot() {
  if (captured())
    return snapshot_captured();
  const uint32_t writes = st_.cand.writes_mask;
  for (size_t i = 0; i < n_args_ && i < 32; i++) {
    if (!((writes >> i) & 1u))
      continue;
    if (x_.saved[i].isTensorList())
      throw std::runtime_error("written tensor lists are not shadowed");
    if (!is_defined_tensor(x_.saved[i]))
      continue;
    copy_written(i);
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
  uint64_t bytes = keep_inputs();
  for (const auto *v : {&x_.snaps, &x_.arm_snaps, &x_.aa_snaps, &x_.inputs, &x_.cin})
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

// The copies of written argument i that the runs on copies write: made in
// the order the arms run (the first arm's first), so that which copy is the
// freshest in the caches follows the drawn order too. In an armed shadow
// the candidate writes snaps and production arm_snaps; serving verified,
// production writes snaps (the candidate the caller's); aa_snaps: the A/A
// run's.
void CallRun::copy_written(size_t i) {
  const at::Tensor &t = x_.saved[i].toTensor();
  const bool arms = (st_.flags & UST__DF_ARMS) != 0, aa = ust__call_aa(&st_) != 0,
             cand_first = (st_.flags & UST__DF_CAND_FIRST) != 0;
  std::vector<at::Tensor> *order[3];
  size_t n = 0;
  if (aa && !cand_first)
    order[n++] = &x_.aa_snaps;
  if (arms && cand_first)
    order[n++] = &x_.snaps;
  order[n++] = arms ? &x_.arm_snaps : &x_.snaps;
  if (arms && !cand_first)
    order[n++] = &x_.snaps;
  if (aa && cand_first)
    order[n++] = &x_.aa_snaps;
  for (size_t k = 0; k < n; k++)
    (*order[k])[i] = snapshot_of(t);
}

int CallRun::prod_on_args() {
  ust__nested nested{};
  const bool collect = ust__call_wants_nested(&st_) != 0;
  ust__call_nested_open(&st_, &nested);
  // an armed shadow times production on its copies, beside the candidate:
  // this run serves the caller (and collects its nested ops' floors)
  const bool timed_here = (st_.flags & UST__DF_ARMS) == 0;
  if (timed_here)
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
  if (timed_here)
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

// Production on the snapshots (verified serving): its results are what the
// caller receives should the candidate's fail. It is the candidate's
// counterpart, run as the candidate is (understudy's own scope, no floors
// of its nested ops collected inside its span, which would lengthen its
// time alone: the call's floor is its own roofline's), on copies of what
// it reads too, since a candidate that ran first may have written the
// caller's.
int CallRun::prod_on_snaps() {
  try {
    x_.side = with_snapshots(x_.snaps, /*private_inputs=*/true);
  } catch (...) {
    return UST__EV_INTERNAL;
  }
  try {
    OwnWork scope;
    timed(kProdBegin, [&] { op_.redispatchBoxed(below_, &x_.side); });
  } catch (...) {
    prod_exc_ = std::current_exception();
    return UST__EV_RAISED;
  }
  const ust__nested none{};
  ust__call_nested_done(&st_, &none);
  prod_on_snaps_ = true;
  x_.prod_returns.assign(x_.side.begin(), x_.side.end()); // in its room: what the caller receives
  if (cand_first_native_) // what a native candidate does not make is production's (as in native_outputs_serving)
    for (size_t j = 0; j < x_.prod_returns.size() && j < x_.cand_returns.size(); j++)
      if (!is_defined_tensor(x_.prod_returns[j]))
        x_.cand_returns[j] = x_.prod_returns[j];
  try {
    OwnWork scope;
    learn_layout();
  } catch (...) {
  }
  return UST__EV_OK;
}

// Production again on copies of its own (an armed shadow): the candidate's
// counterpart, beside it.
int CallRun::prod_on_copies() {
  arm_ran_ = production_again(x_.arm_snaps, kProdBegin, x_.arm_returns) == UST__EV_OK;
  return UST__EV_OK;
}

// Production once more, beside its arm (A/A).
int CallRun::aa_on_copies() {
  aa_ran_ = production_again(x_.aa_snaps, kAaBegin, x_.aa_returns) == UST__EV_OK;
  return UST__EV_OK;
}

// A run of production on snaps (written arguments) and the candidate's
// private copies of what it reads, timed from point as the candidate is;
// its results into returns. Run as understudy's own work (own()): what it
// raises is understudy's failure, not the caller's.
int CallRun::production_again(const std::vector<at::Tensor> &snaps, int point, std::vector<c10::IValue> &returns) {
  if (st_.plan == UST__PLAN_SHADOW)
    fit_resized();
  x_.side = with_snapshots(snaps, /*private_inputs=*/true);
  timed(point, [&] { op_.redispatchBoxed(below_, &x_.side); });
  returns.assign(x_.side.begin(), x_.side.end());
  return UST__EV_OK;
}

// An out= argument production resized (serving the caller, in shadow)
// holds nothing the runs on copies need: each gets a fresh one of
// production's final shape, all of them before the first arm runs.
void CallRun::fit_resized() {
  for (size_t i = 0; i < n_args_; i++)
    if (x_.snaps[i].defined() && x_.snaps[i].sizes() != x_.saved[i].toTensor().sizes())
      for (auto *v : {&x_.snaps, &x_.arm_snaps, &x_.aa_snaps})
        if ((*v)[i].defined())
          (*v)[i] = poisoned_like(x_.saved[i].toTensor());
}

int CallRun::cand_on_snaps() {
  if (captured())
    return cand_on_snaps_captured();
  if (!ust__call_slot_alive(&st_))
    return UST__EV_INTERNAL; // no device resources for this call: the candidate does not run
  fit_resized();
  if (st_.cand.kind == kNative) {
    prepare_native_on_snaps();
  } else {
    x_.side = with_snapshots(x_.snaps, /*private_inputs=*/true);
  }
  return run_candidate(/*timed=*/true);
}

// Production's returns as the learned layout of the call's signature has
// them, before production ran (a native candidate verified first): the
// shapes its outputs take, production's snapshots where it returns a
// written argument. false when none is learned, or the layout holds what a
// native candidate does not make.
bool CallRun::layout_first() {
  ust__layout l;
  if (n_returns_ > 0 && (ust__call_layout(&st_, &call_, &l) != 0 || static_cast<size_t>(l.n_returns) != n_returns_))
    return false;
  x_.prod_returns.assign(n_returns_, c10::IValue());
  for (size_t j = 0; j < n_returns_; j++) {
    const ust__ret_layout &r = l.ret[j];
    if (r.kind == UST__RET_OPAQUE)
      return false;
    if (r.kind == UST__RET_ARG) {
      if (r.arg < 0 || static_cast<size_t>(r.arg) >= n_args_ || !x_.snaps[static_cast<size_t>(r.arg)].defined())
        return false;
      x_.prod_returns[j] = x_.snaps[static_cast<size_t>(r.arg)];
    } else if (r.kind == UST__RET_FRESH) {
      if (r.ndim < 0 || r.ndim > UST__MAX_RANK)
        return false;
      const c10::Device dev = r.device < 0 ? c10::Device(c10::kCPU)
                                           : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(r.device));
      x_.prod_returns[j] = at::empty_strided(c10::IntArrayRef(r.sizes, static_cast<size_t>(r.ndim)),
                                             c10::IntArrayRef(r.strides, static_cast<size_t>(r.ndim)),
                                             at::TensorOptions().dtype(static_cast<c10::ScalarType>(r.scalar_type))
                                                 .device(dev));
    }
  }
  cand_first_native_ = true;
  return true;
}

int CallRun::cand_on_args() {
  const bool verified = st_.plan == UST__PLAN_SERVE_VERIFIED;
  if (st_.cand.kind == kNative) {
    if (verified && !prod_on_snaps_ && !layout_first()) {
      untimed_ = true; // it runs after production instead, an order not drawn: no times
      return UST__EV_NO_LAYOUT;
    }
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
bool CallRun::returns_like_production() {
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

int CallRun::run_candidate(bool timed_run) {
  const auto plain = [&] { fail_ = st_.cand.kind == kNative ? call_native() : call_torch_op(); };
  // a sampled run here (not one sent to a qualifying process, not captured)
  // counts what the candidate calls: ops of torch's it falls back to
  bool count = st_.slot != nullptr && !st_.cand.remote && !captured() && tl_fallback == nullptr;
  FallbackCount fc;
  ust__nested bound{};
  const auto run = [&] {
    if (!count)
      return plain();
    fc.direct = st_.cand.kind == kNative ? 1 : 2;
    at::CallbackHandle h = 0;
    try {
      h = at::addThreadLocalCallback(at::RecordFunctionCallback(fallback_start, fallback_end)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
    } catch (...) {
      // understudy's failure (out of memory): counted, and the run goes on uncounted
      ust__call_internal_error(b_);
      count = false;
      return plain();
    }
    fc.st = &st_;
    fc.call = &call_;
    fc.run_span = ust__call_span_begin(&st_, &call_);
    tl_fallback = &fc;
    {
      // the count ends whatever the run does: the callback removed, the run's
      // span ended (left open, it would keep every later window open)
      struct CountEnd {
        FallbackCount &c;
        at::CallbackHandle h;
        ~CountEnd() {
          tl_fallback = nullptr;
          ust__call_span_end(c.st, c.run_span, UST__SPAN_RUN);
          if (h != 0)
            at::removeCallback(h);
        }
      } end{fc, h};
      NestedScope nscope(ust__thread_state(), &bound);
      plain();
    }
  };
  ust__call_cand_begin(&st_);
  if (timed_run)
    timed(kCandBegin, run);
  else
    run();
  if (count)
    ust__call_fallback(&st_, &call_, fc.aten, fc.other, fc.n, fc.name_of.data(), fc.counts.data(), &bound);
  // a call past its deadline is a failure whatever it returned (its route
  // was rolled back at the deadline, or is now)
  char overdue[160];
  if (ust__call_cand_end(&st_, overdue, sizeof overdue) && (fail_ == kFailNone || fail_ == kFailSchema)) {
    fail_ = kFailOverdue;
    msg_ = overdue;
  }
  if (not_run_)
    return UST__EV_NO_LAYOUT; // it could not run: production alone, no verdict
  if (fail_ == kFailRaised)
    return UST__EV_RAISED;
  return fail_ == kFailNone ? UST__EV_OK : UST__EV_FAILED;
}

int CallRun::compare() {
  if (captured())
    return compare_captured();
  if (fail_ == kFailNone)
    add_pairs(x_.snaps, x_.cand_returns, 0);
  if (fail_ == kFailNone)
    add_input_pairs();
  // production's runs again against the results it served (A/A in values),
  // whatever the candidate did, where they fit beside the candidate's
  if (arm_ran_)
    add_aa_pairs(x_.arm_snaps, x_.arm_returns);
  if (aa_ran_)
    add_aa_pairs(x_.aa_snaps, x_.aa_returns);
  if (st_.flags & UST__DF_WAIT_VERDICT)
    ust__call_want_verdict(&st_);
  hand_keep();
  ust__call_compare(&st_, &call_, x_.pairs.data(), static_cast<int>(x_.pairs.size()), fail_,
                    msg_.empty() ? nullptr : msg_.c_str());
  return UST__EV_OK;
}

int CallRun::abandon() {
  ust__call_abandon(&st_, &call_);
  return UST__EV_OK;
}

int CallRun::verdict() { return ust__call_verdict(&st_, &call_) ? UST__EV_VERDICT_FAILED : UST__EV_OK; }

int CallRun::cand_failed() {
  ust__call_cand_failed(&st_, fail_, msg_.c_str());
  return UST__EV_OK;
}

// The pairs of a run of production again (snaps: its written arguments;
// returns), when all of them fit: the candidate's and the inputs' come
// first.
void CallRun::add_aa_pairs(const std::vector<at::Tensor> &snaps, const std::vector<c10::IValue> &returns) {
  size_t most = n_returns_;
  for (const at::Tensor &t : snaps)
    most += t.defined();
  if (x_.pairs.size() + most <= UST__MAX_PAIRS)
    add_pairs(snaps, returns, 1);
}

// Every input the candidate got its own copy of (shadow), or that it read
// in place (verified serving), against its value before: a candidate that
// writes an input fails ("wrote input"). As many as fit beside the
// outputs.
void CallRun::add_input_pairs() {
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
int CallRun::snaps_into_args() {
  for (size_t i = 0; i < n_args_; i++) {
    if (x_.snaps[i].defined())
      x_.saved[i].toTensor().copy_(x_.snaps[i]);
    else if (x_.cin[i].defined() && st_.plan == UST__PLAN_SERVE_VERIFIED)
      x_.saved[i].toTensor().copy_(x_.cin[i]);
  }
  return UST__EV_OK;
}

void CallRun::replace_stack(const std::vector<c10::IValue> &returns) {
  torch::jit::drop(stack_, n_args_);
  for (size_t j = 0; j < n_returns_; j++)
    stack_.push_back(j < returns.size() ? returns[j] : c10::IValue());
}

// The arguments with understudy's snapshots in place of what the op
// writes (and of inputs that alias it); private_inputs: the candidate's
// own copies of the rest too.
torch::jit::Stack CallRun::with_snapshots(const std::vector<at::Tensor> &snaps, bool private_inputs) const {
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
void CallRun::learn_layout() {
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

// The production return j aliases a written argument: compared there.
bool CallRun::aliases_written_arg(size_t j) const {
  if (!is_defined_tensor(x_.prod_returns[j]))
    return false;
  const at::Tensor &r = x_.prod_returns[j].toTensor();
  for (size_t i = 0; i < n_args_; i++)
    if (x_.snaps[i].defined() && (serving_ ? x_.snaps[i] : x_.saved[i].toTensor()).is_same(r))
      return true;
  return false;
}

bool CallRun::compared_return(size_t j) const {
  return st_.cand.compared_returns < 0 || j < static_cast<size_t>(st_.cand.compared_returns);
}

int CallRun::call_torch_op() {
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

// Pairs of (production's value, the other side's): every written argument
// (against its snapshot, which the other side wrote), then every compared
// return that is not a written argument. A return understudy cannot read
// (a tensor list, ...) makes the call unverifiable rather than passed.
void CallRun::add_pairs(const std::vector<at::Tensor> &snaps, const std::vector<c10::IValue> &other_returns, int aa) {
  x_.names.clear();
  std::vector<at::Tensor> prod, other;
  std::vector<int> written;
  for (size_t i = 0; i < n_args_; i++)
    if (snaps[i].defined()) {
      // production wrote the caller's argument and the other side its
      // copy; serving, production wrote the snapshot and the candidate
      // the caller's argument (an A/A run its own copy)
      x_.names.push_back(ust__binding_arg_name(b_, static_cast<int>(i)));
      prod.push_back(serving_ ? x_.snaps[i] : x_.saved[i].toTensor());
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
  if (!aa)
    keep_outputs(prod, other);
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
void CallRun::as_sets(std::vector<at::Tensor> &ts) {
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

void CallRun::add_pair(const char *name, const at::Tensor &prod, const at::Tensor &other, int aa, int written) {
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

} // namespace ust_bridge
