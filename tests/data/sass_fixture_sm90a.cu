// The sm_90a half of the SASS fixture (see sass_fixture.cu): one wgmma.mma_async.
#include <cstdint>

namespace kdtr {
namespace fixture {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KDTR_FIXTURE_WGMMA 1
#endif

// HGMMA (sm_90a only): one wgmma.mma_async m64n8k16 bf16 from shared-memory descriptors.
__global__ void wgmma_kernel(uint64_t desc_a, uint64_t desc_b, float* out) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
#if defined(KDTR_FIXTURE_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc_a), "l"(desc_b), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
  out[threadIdx.x * 4 + 0] = d0;
  out[threadIdx.x * 4 + 1] = d1;
  out[threadIdx.x * 4 + 2] = d2;
  out[threadIdx.x * 4 + 3] = d3;
}

}  // namespace fixture
}  // namespace kdtr
