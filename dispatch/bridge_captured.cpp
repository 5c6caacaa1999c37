// The captured run of an intercepted call (dispatch/bridge.h): a shadow
// captured into the call's CUDA graph (UST__DF_CAPTURED). understudy's copies
// are made by the graph, at the replays the route's gate verifies: their
// buffers are allocated now (from the graph's memory pool, in the capture's
// order, so they live as long as the graph) and filled in a part
// (ust__call_graph_part_begin). Nothing in a part runs on torch's stream:
// copies are plain device copies of dense tensors.
#include "dispatch/bridge.h"

namespace ust_bridge {

int CallRun::drop(int why, const char *detail) {
  ust__call_graph_drop(&st_, why, detail);
  return UST__EV_OK; // production alone, as if nothing were shadowed
}

// A buffer of the captured shadow. Beside the chain: memory kept for the
// process and counted against the call's bound (undefined over it): a
// graph holding it may replay at any time, and freed, the capture's
// allocator would hand it to the nodes captured after the call, which
// the shadow's branch would race.
at::Tensor CallRun::buffer_of(at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions &options) {
  if (!ust__call_graph_beside(&st_))
    return at::empty_strided(sizes, strides, options);
  const uint64_t bytes = at::detail::computeStorageNbytes(sizes, strides, options.dtype().itemsize());
  void *p = ust__call_graph_alloc(&st_, bytes);
  return p != nullptr ? at::from_blob(p, sizes, strides, options) : at::Tensor();
}

at::Tensor CallRun::buffer_like(const at::Tensor &t) { return buffer_of(t.sizes(), t.strides(), t.options()); }

int CallRun::drop_kept() { return drop(UST__GW_KEPT, ust_last_error()); }

bool CallRun::graph_copy(const at::Tensor &dst, const at::Tensor &src) {
  return ust__call_graph_copy(&st_, dst.data_ptr(), src.const_data_ptr(), src.nbytes()) == 0;
}

// Before production: buffers for every copy; the copies of what production
// writes (and inputs aliasing it) taken in a first part. An argument the
// op overwrites without reading needs no copy of its values before: its
// buffer is filled with all bits set in the second part instead, so the
// first is left out when nothing else needs it (one condition less).
int CallRun::snapshot_captured() {
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

// After production: the candidate's fresh outputs and the comparison's
// statistics allocated; the second part holds its private inputs, its
// outputs poisoned (all bits set: NaN in every float dtype), and the
// candidate, on the part's stream. The part stays open for COMPARE.
int CallRun::cand_on_snaps_captured() {
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
int CallRun::compare_captured() {
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
bool CallRun::prod_side_kept() {
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

} // namespace ust_bridge
