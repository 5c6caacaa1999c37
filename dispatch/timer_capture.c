/* Graph capture with the CUDA kernel tracer (dispatch/timers.h): the nodes a
 * captured call added to the graph its stream captures into, by CUPTI's ids,
 * so that replays of them are the call's route's. Capture-safe runtime calls
 * only. CUDA builds; a HIP build's tracer (timer_notrace.c) maps no graph. */
#include <limits.h>
#include <stdlib.h>

#include "base/gpu_runtime.h"
#include "dispatch/dispatch.h"

/* The graph stream captures into and how many nodes it holds: 0, or -1
 * (not capturing, an error). Capture-safe calls only. */
static int capture_graph(ust__log_sink *log, void *stream, cudaGraph_t *graph, size_t *count) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  *graph = NULL;
  *count = 0;
  if (UST__GPU_CHECK(log, cudaStreamGetCaptureInfo((cudaStream_t)stream, &st, NULL, graph, NULL, NULL, NULL)) != 0 ||
      st != cudaStreamCaptureStatusActive || *graph == NULL ||
      UST__GPU_CHECK(log, cudaGraphGetNodes(*graph, NULL, count)) != 0)
    return -1;
  return 0;
}

int ust__cupti_capture_mark(ust__cupti *c, ust__log_sink *log, void *stream, uint32_t *from) {
  *from = 0;
  /* a node's id is its graph's id above its index, the order it was added
   * in: the call's nodes take the indices from the count now */
  cudaGraph_t graph;
  size_t count = 0;
  if (!ust__cupti_maps_graphs(c) || capture_graph(log, stream, &graph, &count) != 0 || count >= UINT32_MAX)
    return -1;
  *from = (uint32_t)count;
  return 0;
}

void ust__cupti_captured(ust__cupti *c, ust__log_sink *log, void *stream, uint32_t from, ust__figs *figs,
                         uint64_t tsol_ps) {
  cudaGraph_t graph;
  size_t count = 0;
  if (capture_graph(log, stream, &graph, &count) != 0 || count <= from || count - from > INT_MAX)
    return;
  /* the graph's nodes come in the order they were added (CUDA 13.0): the
   * call's are the last count - from; each one's index says so, else the
   * call is not mapped */
  cudaGraphNode_t *nodes = malloc(count * sizeof *nodes);
  const size_t n = count - from;
  uint64_t *ids = malloc(n * sizeof *ids);
  uint32_t kernels = 0;
  int ok = nodes != NULL && ids != NULL && UST__GPU_CHECK(log, cudaGraphGetNodes(graph, nodes, &count)) == 0 &&
           count == from + n && ust__cupti_node_ids(c, (void *const *)(nodes + from), n, ids) == 0;
  for (size_t i = 0; ok && i < n; i++) {
    enum cudaGraphNodeType type;
    ok = (uint32_t)ids[i] == from + i && ids[i] >> 32 == ids[0] >> 32 &&
         UST__GPU_CHECK(log, cudaGraphNodeGetType(nodes[from + i], &type)) == 0;
    kernels += ok && type == cudaGraphNodeTypeKernel;
  }
  if (ok)
    ust__cupti_graph_call(c, ids, (int)n, kernels, figs, tsol_ps);
  free(nodes);
  free(ids);
}

void ust__cupti_capture_made(ust__cupti *c, ust__log_sink *log, void *stream) {
  cudaGraph_t graph, made = NULL;
  size_t count = 0;
  /* an empty graph made now takes the next id: the last understudy took
   * (made in relaxed capture mode, as the shadow's own graphs are) */
  if (!ust__cupti_maps_graphs(c) || capture_graph(log, stream, &graph, &count) != 0)
    return;
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (UST__GPU_CHECK(log, cudaGraphCreate(&made, 0)) == 0) {
    ust__cupti_graph_made(c, graph, made);
    cudaGraphDestroy(made);
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
}

