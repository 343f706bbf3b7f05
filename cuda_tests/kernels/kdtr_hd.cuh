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
