/* The guard's part of a route (guard/verify.h): what its verifications
 * found, counted by the shadow slots (guard/shadow.c) and by the router
 * where a call goes without a slot, and read as one snapshot. */
#include "guard/guard.h"

const char *ust__skip_name(int reason) {
  static const char *const names[UST__SKIP_COUNT] = {"no_slot", "error", "budget", "capture"};
  return reason >= 0 && reason < UST__SKIP_COUNT ? names[reason] : "error";
}

void ust__verify_skipped(ust__verify *v, int reason) {
  if (reason < 0 || reason >= UST__SKIP_COUNT)
    reason = UST__SKIP_ERROR;
  atomic_fetch_add_explicit(&v->skipped_by[reason], 1, memory_order_relaxed);
}

void ust__verify_overdue(ust__verify *v) { atomic_fetch_add_explicit(&v->overdue, 1, memory_order_relaxed); }

void ust__verify_graph_shadowed(ust__verify *v, int beside) {
  atomic_fetch_add_explicit(&v->graph_shadowed, 1, memory_order_relaxed);
  if (beside)
    atomic_fetch_add_explicit(&v->graph_beside, 1, memory_order_relaxed);
}

uint64_t ust__verify_failed_call(ust__verify *v) {
  const uint64_t n = atomic_fetch_add_explicit(&v->calls, 1, memory_order_relaxed) + 1;
  atomic_fetch_add_explicit(&v->verified, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&v->failed, 1, memory_order_relaxed);
  return n;
}

int ust__verify_budget(ust__verify *v, ust__figs *f, double max_slowdown) {
  if (max_slowdown <= 0 || atomic_load_explicit(&v->paused, memory_order_relaxed) ||
      atomic_load_explicit(&f->cand_hist.count, memory_order_relaxed) < 5)
    return 0;
  const double tp = ust__hist_quantile_live(&f->hist, 0.5), tc = ust__hist_quantile_live(&f->cand_hist, 0.5);
  if (!(tp > 0) || !(tc > max_slowdown * tp))
    return 0;
  int expected = 0;
  if (!atomic_compare_exchange_strong(&v->paused, &expected, 1))
    return 0;
  atomic_store(&v->paused_ratio_milli, (uint64_t)(tc / tp * 1000.0 + 0.5));
  return 1;
}

void ust__verify_snapshot(ust__verify *v, ust__verify_snap *o) {
  o->calls = atomic_load(&v->calls);
  o->verified = atomic_load(&v->verified);
  o->passed = atomic_load(&v->passed);
  o->failed = atomic_load(&v->failed);
  o->skipped = 0;
  for (int i = 0; i < UST__SKIP_COUNT; i++)
    o->skipped += o->skipped_by[i] = atomic_load(&v->skipped_by[i]);
  o->unverifiable = atomic_load(&v->unverifiable);
  o->aa_runs = atomic_load(&v->aa_runs);
  o->aa_mismatching = atomic_load(&v->aa_mismatching);
  o->max_abs = ust__bits_to_double(atomic_load(&v->max_abs_bits));
  o->max_rel = ust__bits_to_double(atomic_load(&v->max_rel_bits));
  o->aa_max_abs = ust__bits_to_double(atomic_load(&v->aa_max_abs_bits));
  o->aa_max_rel = ust__bits_to_double(atomic_load(&v->aa_max_rel_bits));
  o->bytes_copied = atomic_load(&v->bytes_copied);
  o->overdue = atomic_load(&v->overdue);
  o->proc_passed = atomic_load(&v->proc_passed);
  o->paused = atomic_load(&v->paused);
  o->paused_ratio = (double)atomic_load(&v->paused_ratio_milli) / 1000.0;
  o->graph_shadowed = atomic_load(&v->graph_shadowed);
  o->graph_plain = atomic_load(&v->graph_plain);
  o->graph_beside = atomic_load(&v->graph_beside);
  o->graph_why = atomic_load(&v->graph_why);
  o->graph_ungated = atomic_load(&v->graph_ungated);
  o->graph_dropped = atomic_load(&v->graph_dropped);
  o->graph_exposed = atomic_load(&v->graph_exposed);
}

const char *ust__graph_why_text(int why) {
  static const char *const texts[UST__GW_COUNT] = {
      "",
      "a torch-op candidate: its allocations cannot be captured into a conditional body",
      "the candidate still qualifies in its own process",
      "this build has no CUDA conditional graph nodes",
      "the shadow could not be captured (the log says why)",
      "the shadow holds graph nodes a conditional body cannot hold (events, host calls, ...)",
      "an argument or result the graph cannot copy or compare (not a contiguous CUDA tensor, a tensor list, "
      "resized by production), or a set comparison",
      "the candidate failed while it was captured",
      "its copies beside the chain do not fit: over shadow.graph_beside_max_mb, or no device memory (the log says which)",
      "the candidate says it cannot be captured into a graph (UST_CANDIDATE_NO_CAPTURE)",
  };
  return why > 0 && why < UST__GW_COUNT ? texts[why] : "";
}

void ust__verify_graph_plain(ust__verify *v, int why) {
  atomic_fetch_add_explicit(&v->graph_plain, 1, memory_order_relaxed);
  atomic_store_explicit(&v->graph_why, why, memory_order_relaxed);
}
