/*
 * The hold's kernels (dispatch/hold.cu), for the GPU timers
 * (dispatch/timer_gpu.c): valid C and C++. Internal header.
 */
#ifndef UST_DISPATCH_HOLD_GPU_H
#define UST_DISPATCH_HOLD_GPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues a hold on stream, on the current device: one thread spins until
 * *release (host memory mapped for the device) reaches seq, or until
 * deadline_ticks of the device's clock passed since it began, when it sets
 * *expired to seq. A runtime error code: 0 when enqueued. */
int ust__hold_launch(void *stream, const unsigned *release, unsigned seq, unsigned long long deadline_ticks,
                     unsigned *expired);
/* Enqueues the calibration's work: n empty kernels of one thread. */
int ust__hold_empty_launch(void *stream, int n);
/* The device clock's ticks per ns (CUDA's %globaltimer counts ns; HIP's
 * wall clock runs at the device's wall-clock rate); 0 when unknown. */
double ust__hold_ticks_per_ns(int device);

#ifdef __cplusplus
}
#endif

#endif /* UST_DISPATCH_HOLD_GPU_H */
