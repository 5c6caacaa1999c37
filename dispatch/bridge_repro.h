// A failing call kept to be replayed (C++, internal; never installed): what
// CallRun keeps of a shadowed call while its verdict is pending
// (bridge_repro.cpp). The C core sees it as a ust__repro (dispatch/callview.h).
#ifndef UST_DISPATCH_BRIDGE_REPRO_H
#define UST_DISPATCH_BRIDGE_REPRO_H

#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "dispatch/bridge.h"

namespace ust_bridge {

class Repro : public ust__repro {
public:
  // An empty repro of a call of op through binding b, on call's device,
  // holding at most bound bytes of tensors (storage spans).
  Repro(const c10::OperatorHandle &op, ust__binding *b, const ust__call &call, bool serving, uint64_t bound);
  ~Repro();
  Repro(const Repro &) = delete;
  Repro &operator=(const Repro &) = delete;

  // The next argument (named and typed as the schema says, when the text is
  // made): v's tensors as
  // they were before the call (the caller keeps them unchanged until the
  // repro is settled, or they are understudy's copies). false when it does
  // not fit the bound, or a tensor's dtype is not one a repro keeps: the
  // repro is then dropped.
  bool add_arg(const c10::IValue &v);
  // The same, for a tensor whose values are held by a copy of another
  // layout (understudy's own): the argument's layout is the caller's.
  bool add_arg(const at::Tensor &caller, const at::Tensor &values);
  // A compared output: production's and the candidate's, as compared.
  bool add_output(const char *name, const at::Tensor &prod, const at::Tensor &cand);

private:
  struct Arg;
  struct Layout;
  struct Out;
  bool fits(const at::Tensor &t);
  std::string make();
  void put_worst(std::ostringstream &o, const Out &w) const;
  static const char *text_of(ust__repro *r);
  static void settle_of(ust__repro *r);
  static void destroy_of(ust__repro *r);

  uint64_t bound_, used_ = 0;
  bool serving_;
  c10::OperatorHandle op_handle_;
  std::string op_, overload_, device_;
  std::vector<Arg> args_;
  std::vector<Out> outs_;
  std::mutex mu_;
  bool made_ = false;
  std::string text_;
};

} // namespace ust_bridge

#endif // UST_DISPATCH_BRIDGE_REPRO_H
