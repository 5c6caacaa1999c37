// A native candidate's side of a call's run (dispatch/bridge.h): its
// arguments as the candidate ABI's values (include/understudy/candidate.h),
// the outputs understudy allocates for it, and the call through its entry
// point (or its qualifying process).
#include "dispatch/bridge.h"

namespace ust_bridge {

// The candidate ABI's view of the call's arguments, as the call view read them.
void CallRun::call_values() {
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

void CallRun::set_outputs() {
  x_.outputs.resize(x_.native_outputs.size());
  x_.output_dtypes.resize(x_.native_outputs.size());
  for (size_t k = 0; k < x_.native_outputs.size(); k++)
    fill_dl(x_.native_outputs[k], &x_.outputs[k], &x_.output_dtypes[k]);
}

// Shadow: the arguments as the call view read them, with understudy's
// snapshots in place of what production writes (and of read-only
// arguments that alias it), and fresh outputs like production's returns
// (poisoned now; captured: poisoned in the graph, at each verified replay).
bool CallRun::prepare_native_on_snaps(bool captured) {
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
bool CallRun::native_outputs_serving(bool verified) {
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

int CallRun::call_native() {
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
  cc.capturing = call_.device == UST__DEV_CUDA && (captured() || (st_.flags & UST__DF_NO_SNAPSHOTS) != 0) ? 1 : 0;
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
    if (rc == UST__CALL_REMOTE_BUSY) {
      not_run_ = true; // counted there; the call goes without its candidate
      return kFailNone;
    }
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

} // namespace ust_bridge
