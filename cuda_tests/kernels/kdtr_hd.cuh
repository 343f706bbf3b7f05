// kdtr_hd.cuh -- KDTR_HD marks functions shared by the CPU backends and the CUDA kernels.
//
// Under nvcc (__CUDACC__) it is `__host__ __device__`; under a plain C++ compiler it is
// empty, so a kernel's per-request core compiles into the g++ CPU-only build unchanged.
#pragma once

#if defined(__CUDACC__)
#define KDTR_HD __host__ __device__
#else
#define KDTR_HD
#endif

// KDTR_HD_TEMPLATE marks a KDTR_HD function template that calls its template argument's
// members, which are __device__ only for the CUDA instantiation (a block-wide team): nvcc
// is told not to check the execution space of the instantiation it never runs on the host.
#if defined(__CUDACC__)
#define KDTR_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define KDTR_HD_TEMPLATE
#endif
