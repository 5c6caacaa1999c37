/*
 * One spelling for the GPU runtime: CUDA names, mapped to HIP when building
 * for ROCm, so the GPU timers, the comparison and its kernels are single-source.
 */
#ifndef UST_GPU_RUNTIME_H
#define UST_GPU_RUNTIME_H

#if defined(UST_GPU_HIP)
#include <hip/hip_runtime_api.h>
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorInvalidDevice hipErrorInvalidDevice
#define cudaEvent_t hipEvent_t
#define cudaStream_t hipStream_t
#define cudaEventDefault hipEventDefault
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventQuery hipEventQuery
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetErrorString hipGetErrorString
#define cudaStreamCaptureStatus hipStreamCaptureStatus
#define cudaStreamCaptureStatusNone hipStreamCaptureStatusNone
#define cudaStreamCaptureMode hipStreamCaptureMode
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaStreamIsCapturing hipStreamIsCapturing
#define cudaThreadExchangeStreamCaptureMode hipThreadExchangeStreamCaptureMode
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaFreeHost hipHostFree
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaGetLastError hipGetLastError
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaIpcMemHandle_t hipIpcMemHandle_t
#define cudaIpcGetMemHandle hipIpcGetMemHandle
#define cudaIpcOpenMemHandle hipIpcOpenMemHandle
#define cudaIpcCloseMemHandle hipIpcCloseMemHandle
#define cudaIpcMemLazyEnablePeerAccess hipIpcMemLazyEnablePeerAccess
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#else
#include <cuda_runtime_api.h>
#endif

/* Every GPU runtime call that can fail goes through this: a failure sets the
 * thread's last error naming the statement, function and place, is logged to
 * log (a ust__log_sink *, or NULL), and the error is yielded (0 on success). */
#define UST__GPU_CHECK(log, stmt) ust__gpu_check((log), (int)(stmt), #stmt, __func__, __FILE__, __LINE__)

struct ust__log_sink;
#ifdef __cplusplus
extern "C"
#endif
int ust__gpu_check(struct ust__log_sink *log, int err, const char *stmt, const char *fn, const char *file, int line);

#endif /* UST_GPU_RUNTIME_H */
