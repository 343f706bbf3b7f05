// The launch floor of the tree_build benchmark: an empty kernel of one block (256 and 1024
// threads, the select kernel's two instances), timed as bench/bench_tree_build.py times the
// kernels -- a pair of CUDA events around each launch, eager and as one cudaGraphLaunch of a
// captured graph; 10 warm-up launches, then the median (the 51st smallest) and minimum of
// 100 (microseconds).
//
//   nvcc -O2 -gencode arch=compute_90,code=sm_90 bench/launch_floor.cu -o /tmp/launch_floor
//   /tmp/launch_floor
//
// Exit status 1 (with the CUDA error) if any CUDA call fails.
#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__); \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

// Never stores (p is null): the launch and the block's start and retirement only.
__global__ void empty_kernel(int* p) {
  if (p && threadIdx.x == 1023) p[0] = 1;
}

static int time_launches(cudaStream_t s, cudaEvent_t a, cudaEvent_t b, int threads, cudaGraphExec_t graph,
                         std::vector<float>* us) {
  us->clear();
  for (int i = 0; i < 110; ++i) {
    CK(cudaEventRecord(a, s));
    if (graph) {
      CK(cudaGraphLaunch(graph, s));
    } else {
      empty_kernel<<<1, threads, 0, s>>>(nullptr);
      CK(cudaGetLastError());
    }
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 10) us->push_back(ms * 1000.0f);
  }
  std::sort(us->begin(), us->end());
  return 0;
}

int main() {
  cudaStream_t s;
  cudaEvent_t a, b;
  CK(cudaStreamCreate(&s));
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int threads : {256, 1024}) {
    std::vector<float> eager, graph;
    if (time_launches(s, a, b, threads, nullptr, &eager)) return 1;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    empty_kernel<<<1, threads, 0, s>>>(nullptr);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    if (time_launches(s, a, b, threads, ge, &graph)) return 1;
    std::printf("empty kernel, 1 x %d threads: eager median %.2f us (min %.2f), graph median %.2f us (min %.2f)\n",
                threads, eager[50], eager[0], graph[50], graph[0]);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}
