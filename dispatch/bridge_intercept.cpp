// The interception (dispatch/bridge.h): for every bound op and overload, a
// functor registered at the BackendSelect dispatch key, once for the life of
// the process: typed (unboxed) for functional aten ops of a C++ signature it
// knows (mm, addmm, silu: no stack built per call, production called
// unboxed), boxed for every other op. It calls through its hook
// (dispatch/dispatch.h), which names the enabled engine's binding, or none.
// A call passed on or tallied (callview.h: admission) runs production at
// once; a keyed call gets its view (bridge_view.h), its route and its plan
// from the router, and a plan that runs more than production runs in a
// CallRun (bridge_eager.cpp). Production is the kernel torch's redispatch
// finds below BackendSelect.
#include <ATen/core/op_registration/infer_schema.h>

#include <memory>
#include <optional>
#include <tuple>

#include "dispatch/bridge_view.h"

namespace ust_bridge {

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

namespace {

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
    if (src.view(args, &call, t->phase)) {
      if (__builtin_expect(ust__binding_reads_lengths(b), 0)) // a varlen batch's floor reads its lengths
        src.data(args, call);
      ust__binding_nested_floor(b, &call, t->nested);
    } else {
      t->nested->n++, t->nested->unscored++;
    }
  } catch (...) {
    t->nested->n++;
    t->nested->unscored++;
  }
}


// Production alone on a tracked call, ended as the PASS plan ends it: its
// nested floor collected where the call wants it.
template <class Source>
[[gnu::always_inline]] inline void serve_passed(Source &src, c10::DispatchKeySet below, ust__thread *th,
                                                const ust__call &call, ust__call_state &st, ust__decision &d) {
  try {
    if (st.nested_ok && ust__call_wants_nested(&st)) {
      ust__nested callees{};
      ust__call_nested_open(&st, &callees);
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
      if (__builtin_expect(ust__binding_reads_lengths(b), 0)) // a varlen batch's floor reads its lengths
        src.data(args, call);
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
  bool view(ust__arg *args, ust__call *call, int phase) { return build_view(op, *stack, args, Room, call, phase); }
  void data(ust__arg *args, const ust__call &call) { fill_data(op, *stack, args, call.nargs); }
  void pass(c10::DispatchKeySet below) { op.redispatchBoxed(below, stack); }
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
  void data(ust__arg *args, const ust__call &) {
    std::apply([&](const auto &...a) {
      size_t i = 0;
      (data_arg(a, args[i++]), ...);
    }, in);
  }
  [[gnu::always_inline]] void pass(c10::DispatchKeySet below) {
    out.emplace(std::apply(
        [&](Args... a) {
          return c10::Dispatcher::singleton().redispatch<Ret, Args...>(op, below, std::forward<Args>(a)...);
        },
        in));
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
// its hook's line): all a call passed on or tallied
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
    op.redispatchBoxed(below, stack);
  }

private:
  [[gnu::hot, gnu::noinline]] void serve(const c10::OperatorHandle &op, c10::DispatchKeySet ks,
                                         torch::jit::Stack *stack) {
    Boxed<Room> src{op, stack};
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
    return c10::Dispatcher::singleton().redispatch<Ret, Args...>(op_, below, std::forward<Args>(args)...);
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
    Typed<Ret, Args...> src{op_, std::tuple<Args...>(args...), std::nullopt};
    serve_admitted(e, weight, op_, below, src);
    return std::move(*src.out);
  }

  ust__hook_line line_;    // as Interceptor's
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

} // namespace

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


} // namespace ust_bridge
