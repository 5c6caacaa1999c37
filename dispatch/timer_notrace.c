/* The kernel tracer of a HIP build (dispatch/timers.h): always off, so that
 * the GPU timers (dispatch/timer_gpu.c) hold one interface whatever the
 * build; their calls are timed by held event pairs. A ROCm tracer would
 * come from rocprofiler-sdk, which the distribution does not package. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"

struct ust__cupti {
  int unused;
};

int ust__cupti_create(const ust__timer_opts *opts, ust__log_sink *log, ust__cupti **out) {
  (void)opts;
  (void)log;
  *out = calloc(1, sizeof **out);
  return *out == NULL ? ust__error(UST_ENOMEM, "out of memory for the kernel tracer") : 0;
}

void ust__cupti_destroy(ust__cupti *c) { free(c); }
int ust__cupti_poll(ust__cupti *c, int used, int sync) {
  (void)c, (void)used, (void)sync;
  return 0;
}
int ust__cupti_tracing(const ust__cupti *c) {
  (void)c;
  return UST__TRACING_OFF;
}
int ust__cupti_present(const ust__cupti *c) {
  (void)c;
  return 0;
}
ust__kt *ust__cupti_kt(ust__cupti *c) {
  (void)c;
  return NULL;
}
int ust__cupti_begin(ust__cupti *c) {
  (void)c;
  return -1;
}
void ust__cupti_end(ust__cupti *c, int slot, ust__figs *figs, uint64_t tsol_ps, int kind) {
  (void)c, (void)slot, (void)figs, (void)tsol_ps, (void)kind;
}
void ust__cupti_end_span(ust__cupti *c, int slot, ust__kt_sink *sink, int role) {
  (void)c, (void)slot, (void)sink, (void)role;
}

void ust__cupti_status(ust__cupti *c, ust__timer_status *out) {
  (void)c;
  memset(out, 0, sizeof *out);
  out->kind = "events";
  snprintf(out->why, sizeof out->why, "no kernel tracer in a HIP build (rocprofiler-sdk is not packaged here)");
}

int ust__cupti_maps_graphs(const ust__cupti *c) {
  (void)c;
  return 0;
}
int ust__cupti_node_ids(ust__cupti *c, void *const *nodes, size_t n, uint64_t *ids) {
  (void)c, (void)nodes, (void)n, (void)ids;
  return -1;
}
void ust__cupti_graph_made(ust__cupti *c, void *graph, void *made) { (void)c, (void)graph, (void)made; }
int ust__cupti_graph_call(ust__cupti *c, const uint64_t *ids, int n, uint32_t kernels, ust__figs *figs,
                          uint64_t tsol_ps) {
  (void)c, (void)ids, (void)n, (void)kernels, (void)figs, (void)tsol_ps;
  return -1;
}
int ust__cupti_capture_mark(ust__cupti *c, ust__log_sink *log, void *stream, uint32_t *from) {
  (void)c, (void)log, (void)stream;
  *from = 0;
  return -1;
}
void ust__cupti_captured(ust__cupti *c, ust__log_sink *log, void *stream, uint32_t from, ust__figs *figs,
                         uint64_t tsol_ps) {
  (void)c, (void)log, (void)stream, (void)from, (void)figs, (void)tsol_ps;
}
void ust__cupti_capture_made(ust__cupti *c, ust__log_sink *log, void *stream) { (void)c, (void)log, (void)stream; }
