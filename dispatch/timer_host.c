/* The timers of a build without a GPU: host calls are timed inline by the
 * router; there is nothing to queue. */
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"

#if !defined(UST_GPU_CUDA) && !defined(UST_GPU_HIP)
struct ust__timers {
  int unused;
};

int ust__timers_create(int max_pending, const ust__timer_opts *opts, ust__log_sink *log, ust__timers **out) {
  (void)max_pending;
  (void)opts;
  (void)log;
  *out = calloc(1, sizeof **out);
  return *out == NULL ? ust__error(UST_ENOMEM, "out of memory") : 0;
}
void ust__timers_destroy(ust__timers *t) { free(t); }
int ust__timers_used(const ust__timers *t) { return 0; }
int ust__timers_tracing(const ust__timers *t) { return UST__TRACING_OFF; }
int ust__timers_may_trace(const ust__timers *t) { return 0; }
void ust__timers_status(ust__timers *t, ust__timer_status *out) {
  memset(out, 0, sizeof *out);
  out->kind = "host";
}
int ust__timers_begin(ust__timers *t, int device_id, void *stream, ust__hold_word *hold) { return -1; }
int ust__timers_defer_floor(ust__timers *t, int token, const ust__floor_defer *d, int part) { return -1; }
void ust__timers_floor_settled(ust__timers *t, int token, int part) {}
int ust__timers_stage(ust__timers *t, int device, const ust__floor_defer *d) { return 0; }
void ust__timers_stage_copy(ust__timers *t, int tag1, void *stream) {}
uint64_t ust__timers_stage_floor(ust__timers *t, int tag1, uint64_t tsol_ps) { return tsol_ps; }
void ust__timers_end(ust__timers *t, int token, void *stream, ust__figs *figs, uint64_t tsol_ps, int kind) {}
void ust__timers_cancel(ust__timers *t, int token) {}
int ust__timers_span_begin(ust__timers *t) { return -1; }
void ust__timers_span_end(ust__timers *t, int token, ust__kt_sink *sink, int role) {}
int ust__timers_capture_mark(ust__timers *t, void *stream, uint32_t *from) {
  *from = 0;
  return -1;
}
void ust__timers_captured(ust__timers *t, void *stream, uint32_t from, ust__figs *figs, uint64_t tsol_ps) {}
void ust__timers_graph_made(ust__timers *t, void *stream) {}
int ust__timers_harvest(ust__timers *t) { return 0; }
void ust__timers_harvest_all_sync(ust__timers *t) {}
void ust__timers_hold_status(ust__timers *t, ust__hold_status *out) { memset(out, 0, sizeof *out); }
int ust__gpu_capturing(void *stream) { return 0; }
int ust__gpu_device_name(int device, char *buf, size_t cap) { return -1; }
#endif
