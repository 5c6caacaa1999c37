// A failing call kept to be replayed (ust__repro, dispatch/callview.h): the
// arguments of a shadowed call as the op received them (dtype, shape,
// strides, storage offset and the values of the storage they span; every
// other argument as its value), and both sides' outputs, kept while the
// call's verdict is pending. When the call fails, the router keeps it as
// its route's; its text (a JSON object) is made once: at once for host
// tensors (the caller's may change after the call), at the report for
// device tensors (understudy's own copies, read then in the relaxed
// capture mode).
#include "dispatch/bridge_repro.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>

namespace ust_bridge {

namespace {

// torch's Python name of a dtype; nullptr for one a repro does not keep.
const char *dtype_name(c10::ScalarType s) {
  using S = c10::ScalarType;
  switch (s) {
  case S::Float: return "float32";
  case S::Double: return "float64";
  case S::Half: return "float16";
  case S::BFloat16: return "bfloat16";
  case S::Long: return "int64";
  case S::Int: return "int32";
  case S::Short: return "int16";
  case S::Char: return "int8";
  case S::Byte: return "uint8";
  case S::Bool: return "bool";
  case S::Float8_e4m3fn: return "float8_e4m3fn";
  case S::Float8_e5m2: return "float8_e5m2";
  default: return nullptr;
  }
}

// Elements of the storage a view reaches, from its offset: the span a
// replay needs (a stride-0 dimension reaches one element).
int64_t storage_span(const at::Tensor &t) {
  if (t.numel() == 0)
    return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); d++)
    last += (t.size(d) - 1) * t.stride(d);
  return last + 1;
}

void put_string(std::ostringstream &o, const std::string &s) {
  o << '"';
  for (unsigned char c : s) {
    switch (c) {
    case '"': o << "\\\""; break;
    case '\\': o << "\\\\"; break;
    case '\n': o << "\\n"; break;
    case '\t': o << "\\t"; break;
    default:
      if (c < 0x20) {
        char u[8];
        std::snprintf(u, sizeof u, "\\u%04x", c);
        o << u;
      } else {
        o << c;
      }
    }
  }
  o << '"';
}

void put_number(std::ostringstream &o, double v) {
  if (std::isnan(v)) {
    o << "\"nan\"";
  } else if (std::isinf(v)) {
    o << (v > 0 ? "\"inf\"" : "\"-inf\"");
  } else {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", v);
    o << b;
  }
}

void put_ints(std::ostringstream &o, c10::IntArrayRef v) {
  o << '[';
  for (size_t i = 0; i < v.size(); i++)
    o << (i ? "," : "") << v[i];
  o << ']';
}

void put_base64(std::ostringstream &o, const uint8_t *p, size_t n) {
  static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  o << '"';
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    const uint32_t w = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    o << k[w >> 18] << k[(w >> 12) & 63] << k[(w >> 6) & 63] << k[w & 63];
  }
  if (i < n) {
    const uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
    o << k[w >> 18] << k[(w >> 12) & 63] << (i + 1 < n ? k[(w >> 6) & 63] : '=') << '=';
  }
  o << '"';
}

// A tensor as the repro keeps it: its layout, and the storage it spans as
// bytes on the host; values, when defined, holds its elements in a layout
// of its own (understudy's copy): they are laid out as t's, the storage
// between them zero.
void put_tensor(std::ostringstream &o, const at::Tensor &t, const at::Tensor &values = at::Tensor()) {
  o << "{\"dtype\":";
  put_string(o, dtype_name(t.scalar_type()));
  o << ",\"shape\":";
  put_ints(o, t.sizes());
  o << ",\"stride\":";
  put_ints(o, t.strides());
  o << ",\"storage_offset\":" << t.storage_offset() << ",\"device\":";
  put_string(o, t.device().str());
  const int64_t span = storage_span(t);
  at::Tensor flat;
  if (values.defined()) {
    at::Tensor host = at::zeros({t.storage_offset() + span}, t.options().device(at::kCPU));
    host.as_strided(t.sizes(), t.strides(), t.storage_offset()).copy_(values.to(at::kCPU));
    flat = host.narrow(0, t.storage_offset(), span);
  } else {
    flat = t.as_strided({span}, {1}, t.storage_offset()).to(at::kCPU).contiguous();
  }
  o << ",\"span\":" << span << ",\"data\":";
  put_base64(o, static_cast<const uint8_t *>(flat.const_data_ptr()), flat.nbytes());
  o << '}';
}

// A value of the schema's other types: a number, a bool, a string, a list
// of them, null; false when the repro cannot keep it (a generator, ...).
bool put_value(std::ostringstream &o, const c10::IValue &v) {
  if (v.isNone()) {
    o << "null";
  } else if (v.isBool()) {
    o << (v.toBool() ? "true" : "false");
  } else if (v.isInt() || v.isSymInt()) {
    o << (v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__));
  } else if (v.isDouble()) {
    put_number(o, v.toDouble());
  } else if (v.isString()) {
    put_string(o, v.toStringRef());
  } else if (v.isDevice()) {
    put_string(o, v.toDevice().str());
  } else if (v.isIntList()) {
    put_ints(o, v.toIntVector());
  } else if (v.isDoubleList() || v.isBoolList() || v.isList()) {
    const auto items = v.toListRef();
    o << '[';
    for (size_t i = 0; i < items.size(); i++) {
      o << (i ? "," : "");
      if (!put_value(o, items[i]))
        return false;
    }
    o << ']';
  } else {
    return false;
  }
  return true;
}

} // namespace

struct Repro::Arg {
  c10::IValue value; // tensors: the values before the call (its name and type: the schema's, in order)
  at::Tensor layout; // defined: value holds the values, this the caller's layout
};

struct Repro::Out {
  std::string name;
  at::Tensor prod, cand;
};

Repro::Repro(const c10::OperatorHandle &op, ust__binding *b, const ust__call &call, bool serving, uint64_t bound)
    : ust__repro{}, bound_(bound), serving_(serving), op_handle_(op) {
  text = &Repro::text_of;
  settle = &Repro::settle_of;
  destroy = &Repro::destroy_of;
  first_mismatch = -1;
  op_ = ust__binding_qualname(b);
  overload_ = ust__binding_overload(b);
  device_ = call.device == UST__DEV_CPU ? "cpu" : "cuda:" + std::to_string(call.device_id);
}

Repro::~Repro() = default;

bool Repro::fits(const at::Tensor &t) {
  if (dtype_name(t.scalar_type()) == nullptr || !t.has_storage() || t.is_sparse())
    return false;
  used_ += static_cast<uint64_t>(storage_span(t)) * t.element_size();
  return used_ <= bound_;
}

bool Repro::add_arg(const c10::IValue &v) {
  if (v.isTensor() && v.toTensor().defined() && !fits(v.toTensor()))
    return false;
  if (v.isTensorList())
    for (const at::Tensor &t : v.toTensorList().vec())
      if (t.defined() && !fits(t))
        return false;
  args_.push_back(Arg{v, at::Tensor()});
  return true;
}

bool Repro::add_arg(const at::Tensor &caller, const at::Tensor &values) {
  if (!fits(caller))
    return false;
  args_.push_back(Arg{values, caller});
  return true;
}

bool Repro::add_output(const char *name, const at::Tensor &prod, const at::Tensor &cand) {
  if (!fits(prod) || !fits(cand))
    return false;
  outs_.push_back(Out{name, prod, cand});
  return true;
}

// Both sides' values at the output's worst elements: the largest
// differences (a non-finite value where the other side is finite counts as
// the largest), and the first mismatch.
void Repro::put_worst(std::ostringstream &o, const Out &w) const {
  at::Tensor p = w.prod.to(at::kCPU).contiguous().reshape({-1}).to(at::kDouble);
  at::Tensor c = w.cand.to(at::kCPU).contiguous().reshape({-1}).to(at::kDouble);
  o << "{\"name\":";
  put_string(o, w.name);
  o << ",\"dtype\":";
  put_string(o, dtype_name(w.prod.scalar_type()));
  o << ",\"shape\":";
  put_ints(o, w.prod.sizes());
  if (p.numel() != c.numel() || p.numel() == 0) {
    o << ",\"worst\":[]}";
    return;
  }
  at::Tensor diff = (p - c).abs();
  diff = at::where(p.isfinite().logical_and(c.isfinite()), diff, at::full_like(diff, INFINITY));
  diff = at::where(p.eq(c).logical_or(p.isnan().logical_and(c.isnan())), at::zeros_like(diff), diff);
  const int64_t k = std::min<int64_t>(8, diff.numel());
  auto top = diff.topk(k);
  at::Tensor val = std::get<0>(top).contiguous(), idx = std::get<1>(top).contiguous();
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < k; i++)
    if (val.const_data_ptr<double>()[i] > 0) // where the sides differ
      picked.push_back(idx.const_data_ptr<int64_t>()[i]);
  if (output == w.name && first_mismatch >= 0 && first_mismatch < p.numel() &&
      std::find(picked.begin(), picked.end(), first_mismatch) == picked.end())
    picked.push_back(first_mismatch);
  const double *pp = p.const_data_ptr<double>(), *cp = c.const_data_ptr<double>();
  o << ",\"worst\":[";
  for (size_t i = 0; i < picked.size(); i++) {
    const int64_t f = picked[i];
    o << (i ? "," : "") << "{\"flat_index\":" << f << ",\"production\":";
    put_number(o, pp[f]);
    o << ",\"candidate\":";
    put_number(o, cp[f]);
    o << '}';
  }
  o << "]}";
}

std::string Repro::make() {
  std::ostringstream o;
  o.exceptions(std::ios::badbit | std::ios::failbit); // a stream that cannot grow throws, never truncates
  std::ostringstream schema;
  schema.exceptions(std::ios::badbit | std::ios::failbit);
  schema << op_handle_.schema();
  o << "{\"format\":\"understudy-repro/1\",\"op\":";
  put_string(o, op_);
  o << ",\"overload\":";
  put_string(o, overload_);
  o << ",\"schema\":";
  put_string(o, schema.str());
  o << ",\"device\":";
  put_string(o, device_);
  o << ",\"serving\":" << (serving_ ? "true" : "false") << ",\"reason\":";
  put_string(o, reason);
  o << ",\"output\":";
  put_string(o, output);
  o << ",\"first_mismatch\":" << first_mismatch << ",\"args\":[";
  const auto &schema_args = op_handle_.schema().arguments();
  for (size_t i = 0; i < args_.size() && i < schema_args.size(); i++) {
    const Arg &a = args_[i];
    o << (i ? "," : "") << "{\"name\":";
    put_string(o, schema_args[i].name());
    o << ",\"type\":";
    put_string(o, schema_args[i].type()->str());
    if (a.layout.defined()) {
      o << ",\"tensor\":";
      put_tensor(o, a.layout, a.value.toTensor());
    } else if (a.value.isTensor() && a.value.toTensor().defined()) {
      o << ",\"tensor\":";
      put_tensor(o, a.value.toTensor());
    } else if (a.value.isTensorList()) {
      o << ",\"tensors\":[";
      const auto ts = a.value.toTensorList().vec();
      for (size_t k = 0; k < ts.size(); k++) {
        o << (k ? "," : "");
        if (ts[k].defined())
          put_tensor(o, ts[k]);
        else
          o << "null";
      }
      o << ']';
    } else if (a.value.isTensor()) {
      o << ",\"value\":null";
    } else {
      std::ostringstream v;
      if (put_value(v, a.value))
        o << ",\"value\":" << v.str();
      else
        o << ",\"unsupported\":true";
    }
    o << '}';
  }
  o << "],\"outputs\":[";
  for (size_t i = 0; i < outs_.size(); i++) {
    o << (i ? "," : "");
    put_worst(o, outs_[i]);
  }
  o << "],\"bytes\":" << used_ << '}';
  return o.str();
}

// The text made once, under the repro's lock; its tensors go then.
const char *Repro::text_of(ust__repro *r) {
  Repro *self = static_cast<Repro *>(r);
  std::lock_guard<std::mutex> lock(self->mu_);
  if (!self->made_) {
    self->made_ = true;
    const int mode = ust__call_relaxed_begin();
    try {
      OwnWork scope;
      self->text_ = self->make();
    } catch (const std::exception &e) {
      self->text_.clear();
      ust__error(UST_EINTERNAL, "a failing call of %s could not be kept: %s", self->op_.c_str(), e.what());
    } catch (...) {
      self->text_.clear();
    }
    ust__call_relaxed_end(mode);
    self->args_.clear();
    self->outs_.clear();
  }
  return self->text_.empty() ? nullptr : self->text_.c_str();
}

void Repro::settle_of(ust__repro *r) {
  Repro *self = static_cast<Repro *>(r);
  if (self->device_ == "cpu")
    text_of(r);
}

void Repro::destroy_of(ust__repro *r) {
  try {
    OwnWork scope; // its tensors freed: nothing of understudy's to intercept
    delete static_cast<Repro *>(r);
  } catch (...) {
  }
}

} // namespace ust_bridge

namespace ust_bridge {

void ReproDrop::operator()(Repro *r) const {
  if (r != nullptr)
    r->destroy(r);
}

// At the snapshot: every argument as it is before the call. A written one
// is copied now (both sides write theirs); a read-only one that shares
// storage with a written one is understudy's copy of it, taken before; on a
// GPU any other read-only one is the candidate's private copy (the caller's
// may change before the report reads it), on the host the caller's own,
// settled at the verdict, which the call reaches before it returns. A copy
// holds the values; the layout kept is the caller's.
uint64_t CallRun::keep_inputs() {
  const uint64_t bound = ust__call_repro_bound(&st_);
  // allocations going to a graph's pool (a CUDA graph tree's warm-up): none
  // may outlive the call, which the pool's owner checks
  if (bound == 0 || st_.slot == nullptr || st_.cand.remote || captured() || ust__thread_state()->pool_allocs > 0)
    return 0;
  uint64_t copied = 0;
  repro_.reset(new Repro(op_, b_, call_, serving_, bound));
  const bool gpu = call_.device != UST__DEV_CPU;
  for (size_t i = 0; i < n_args_; i++) {
    c10::IValue v = x_.saved[i];
    at::Tensor values; // understudy's copy of a read-only argument, in a layout of its own
    if (is_defined_tensor(v) && v.toTensor().has_storage()) {
      if (x_.snaps[i].defined()) {
        v = snapshot_of(v.toTensor());
        copied += v.toTensor().nbytes();
      } else if (gpu && x_.cin[i].defined()) {
        values = x_.cin[i];
      } else if (x_.inputs[i].defined()) {
        values = x_.inputs[i]; // it shares storage with a written one: the copy holds it as it was
      }
    } else if (gpu && x_.cin_lists[i].isTensorList()) {
      v = x_.cin_lists[i];
    }
    if (!(values.defined() ? repro_->add_arg(v.toTensor(), values) : repro_->add_arg(v))) {
      repro_.reset();
      return copied;
    }
  }
  return copied;
}

// The compared outputs, both sides. On a GPU the side the caller holds
// (production's in shadow, the candidate's serving) is copied now.
void CallRun::keep_outputs(const std::vector<at::Tensor> &prod, const std::vector<at::Tensor> &other) {
  if (!repro_)
    return;
  const bool gpu = call_.device != UST__DEV_CPU;
  for (size_t k = 0; k < prod.size() && k < other.size() && k < x_.names.size(); k++) {
    at::Tensor p = prod[k], c = other[k];
    if (gpu)
      (serving_ ? c : p) = (serving_ ? c : p).clone();
    if (!repro_->add_output(x_.names[k], p, c)) {
      repro_.reset();
      return;
    }
  }
}

// Before the comparison: the repro to the call's slot, which tells it the
// verdict.
void CallRun::hand_keep() {
  if (repro_)
    ust__call_keep(&st_, repro_.release());
}

} // namespace ust_bridge
