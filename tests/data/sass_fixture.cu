// Kernels behind the SASS and ptxas fixtures of tests/test_sass_summary.py (tests/data/
// sass_fixture.*.txt): one per instruction class tools/sass_summary.py counts, compiled for
// sm_90 like verify_attn.cu; sass_fixture_sm90a.cu holds the wgmma kernel (sm_90a).  The
// fixtures were made with (CUDA 13.0 nvcc and ptxas, cuobjdump 13.5):
//   nvcc -O2 -gencode arch=compute_90,code=sm_90 -Xptxas -v -c sass_fixture.cu -o a.o
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -c sass_fixture_sm90a.cu -o b.o
//   nvcc -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90a,code=sm_90a a.o b.o -o fx
//   cuobjdump --list-elf fx; cuobjdump --dump-sass fx
// test_sass_summary.py also compiles this file where nvcc and cuobjdump exist.
#include <cuda_bf16.h>
#include <cstdint>

namespace kdtr {
namespace fixture {

// FFMA, BAR: a shared-memory reduction.
__global__ void ffma_kernel(const float* x, float* y, float a) {
  __shared__ float s[256];
  float v = x[threadIdx.x];
  #pragma unroll
  for (int i = 0; i < 8; ++i) v = fmaf(v, a, 1.0f);
  s[threadIdx.x] = v;
  __syncthreads();
  y[threadIdx.x] = s[255 - threadIdx.x];
}

// HMMA and LDSM: mma.sync m16n8k16 bf16 on fragments loaded by ldmatrix.
template <int Tiles>
__global__ void mma_kernel(const __nv_bfloat16* a, float* out) {
  __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
  reinterpret_cast<uint4*>(tile)[threadIdx.x] = reinterpret_cast<const uint4*>(a)[threadIdx.x];  // 32 threads x 8
  __syncthreads();
  uint32_t r0, r1, r2, r3;
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(&tile[(threadIdx.x % 16) * 16 + (threadIdx.x / 16) * 8]));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
  float d[4] = {0, 0, 0, 0};
  #pragma unroll
  for (int t = 0; t < Tiles; ++t)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(r0), "r"(r1), "r"(r2), "r"(r3), "r"(r0), "r"(r1));
  reinterpret_cast<float4*>(out)[threadIdx.x] = make_float4(d[0], d[1], d[2], d[3]);
}
template __global__ void mma_kernel<2>(const __nv_bfloat16*, float*);

// LDL / STL: a dynamically indexed local array.
__global__ void local_kernel(const float* x, float* y, int n) {
  float buf[8];
  #pragma unroll 1
  for (int i = 0; i < 8; ++i) buf[i] = x[i + n];
  y[threadIdx.x] = buf[(n + threadIdx.x) & 7];
}

}  // namespace fixture
}  // namespace kdtr

// A register-hungry kernel squeezed by __maxnreg__ so that ptxas spills.
extern "C" __global__ void __maxnreg__(24) spill_kernel(const float* x, float* y) {
  constexpr int N = 24;
  float acc[N];
  #pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = x[threadIdx.x + i * 1024];
  #pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = fmaf(acc[i], acc[N - 1 - i], 0.5f);
  float s = 0;
  #pragma unroll
  for (int i = 0; i < N; ++i) s += acc[i] * acc[(i + 7) % N];
  y[threadIdx.x] = s;
}

int main() { return 0; }
