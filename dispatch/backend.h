/*
 * Timing backends: the host clock for CPU tensors, device events for GPU
 * tensors. The GPU backend (backend_gpu.c) is compiled for CUDA or HIP; with
 * UST_GPU=none its entry points are stubs that report "no GPU".
 *
 * Stream discipline: begin/end only record events on the caller's stream;
 * nothing here synchronises on the serving path. Harvesting happens on the
 * engine's worker thread.
 */
#ifndef UST_BACKEND_H
#define UST_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct ust__route;

uint64_t ust__now_ns(void);

/* 1 once the GPU backend has timed a call (never in a host-only build). */
int ust__gpu_available(void);
/* Prepare up to max_pending concurrent timings. Not thread-safe with the
 * other calls; the engine calls it at enable. */
int ust__gpu_init(int max_pending);
/* Wait for every pending timing and free everything (synchronises). */
void ust__gpu_shutdown(void);
/* 1 if the stream is capturing a graph, 0 if not, 0 on error. */
int ust__gpu_capturing(void *stream);
/* Record the start event on stream; returns a slot, or -1 when no slot is
 * free (the call is then served untimed and the drop counted). */
int ust__gpu_timer_begin(int device_id, void *stream);
/* Record the end event and queue the slot for harvest into route, with the
 * call's roofline floor (0: unknown). */
void ust__gpu_timer_end(int slot, void *stream, struct ust__route *route, uint64_t tsol_ps);
/* The GPU's name ("NVIDIA H200"); -1 when there is none. */
int ust__gpu_device_name(int device, char *buf, size_t cap);
/* Release a slot whose call raised; nothing is recorded. */
void ust__gpu_timer_cancel(int slot);
/* Move completed timings into their routes; returns how many are still
 * pending. Never blocks. Called from the worker thread. */
int ust__gpu_harvest(void);
/* Harvest until nothing is pending (synchronises with the device). */
void ust__gpu_harvest_all_sync(void);

#endif /* UST_BACKEND_H */
