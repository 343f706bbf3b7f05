/* kdtr_kernels.h -- the C ABI of build/lib/libkdtr_kernels.so (`make lib`).
 *
 * One extern "C" entry per op and backend, each taking one plain C parameter struct
 * (pointers to row-major tensors + dims, names as in docs/ops/<op>.md and the goldens):
 *
 *   int kdtr_<op>_cpu (kdtr_<op>_params* p);                 host pointers, runs to the end
 *   int kdtr_<op>_cuda(kdtr_<op>_params* p, void* stream);   device pointers, enqueued on
 *                                                              `stream` (a cudaStream_t;
 *                                                              NULL = the legacy default
 *                                                              stream), no synchronization
 *
 * for <op> in tree_build, verify_attn, tree_accept, greedy_step.  Every entry returns
 * KDTR_OK (0) or an error code below; kdtr_last_error() then says why (a string owned by
 * the library, valid in the calling thread until its next call of an entry).  A library
 * built without CUDA (`make lib NO_CUDA=1`, or no nvcc) has every *_cuda entry, returning
 * KDTR_ERR_NO_CUDA ("not built with CUDA"); kdtr_has_cuda() says which build it is.
 *
 * The CUDA entries run the kernels of cuda_tests/kernels/ (launch_* of *_launch.h) on the
 * current device (cudaGetDevice), raising the kernels' shared-memory limits as the
 * binaries do; the CPU entries run the CPU backends (*_cpu of *.cuh).  Output tensors are
 * written in full (every element).  Both check what the host can see before anything runs
 * (dims >= 0 and within the kernels' bounds, non-null pointers of non-empty tensors, enum
 * values, d_v in [1, Dqk]); the CPU entries also check the per-request lengths that
 * verify_attn trusts (prefix_len >= 0, tree_len in [0, T], prefix_len + tree_len <= S;
 * greedy_step: prefix_len + T <= S).  The CUDA entries cannot read device memory without a
 * copy: there the caller guarantees those lengths (kdtr.kernels checks them).
 *
 * C-compatible (C99 and C++).  The ABI version (KDTR_ABI_VERSION, kdtr_abi_version())
 * changes whenever a struct or an entry changes; kdtr_params_size(op) is sizeof the op's
 * struct, for bindings that mirror the structs (kdtr/kernels.py checks both at load).
 */
#ifndef KDTR_KERNELS_H
#define KDTR_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KDTR_ABI_VERSION 1

#if defined(_WIN32)
#define KDTR_API
#else
#define KDTR_API __attribute__((visibility("default")))
#endif

/* Return codes. */
enum {
  KDTR_OK = 0,
  KDTR_ERR_INVALID_ARGUMENT = 1, /* a dim, pointer, enum value or length the op cannot take */
  KDTR_ERR_NOT_SUPPORTED = 2,    /* valid, but no kernel for it here (shared memory, forced mma / wgmma) */
  KDTR_ERR_NO_CUDA = 3,          /* a *_cuda entry of a library built without CUDA */
  KDTR_ERR_CUDA = 4,             /* a CUDA runtime error (its name and string in kdtr_last_error) */
  KDTR_ERR_OUT_OF_MEMORY = 5,    /* the CPU backend's scratch could not be allocated */
  KDTR_ERR_INTERNAL = 6          /* anything else (a C++ exception) */
};

/* verify_attn / greedy_step: the dtype of q and kv_cache. */
enum { KDTR_DTYPE_F32 = 0, KDTR_DTYPE_BF16 = 1 };

/* tree_build: the build (docs/ops/tree_build.md); same outputs either way. */
enum { KDTR_TREE_BUILD_AUTO = 0, KDTR_TREE_BUILD_HEAP = 1, KDTR_TREE_BUILD_SELECT = 2 };

/* verify_attn: the CUDA kernel (the CPU entry takes AUTO only).  WGMMA: the Hopper kernel
 * (compute capability 9.0, a library built with it: CUDA_ARCH holding 90 and the CUTLASS
 * headers found, docs/binaries.md); KDTR_ERR_NOT_SUPPORTED elsewhere.  (A value added
 * without a struct or entry change: KDTR_ABI_VERSION stays 1.) */
enum { KDTR_VERIFY_ATTN_AUTO = 0, KDTR_VERIFY_ATTN_SIMT = 1, KDTR_VERIFY_ATTN_MMA = 2, KDTR_VERIFY_ATTN_WGMMA = 3 };

/* tree_build: top_log_probs f32 [B,D,K], top_token_ids i64 [B,D,K], root_token_ids i64
 * [B], budget i32 [B], depth_limit i32 [B]; N = max_budget, T = N + 1; outputs node_count
 * i32 [B], node_token_ids i64 [B,T], node_depths / parents / next_token / next_sibling i32
 * [B,T], visibility u8 [B,T,T], status i32 [B].  kernel: KDTR_TREE_BUILD_* (CUDA AUTO:
 * select where its shared memory fits, else heap; CPU AUTO: heap).  kernel_ran (out): the
 * build that ran, HEAP or SELECT.  heap_fallback (optional, may be NULL): u8 [B], 1 where
 * the select build handed a valid request to the heap build. */
typedef struct kdtr_tree_build_params {
  const float* top_log_probs;
  const int64_t* top_token_ids;
  const int64_t* root_token_ids;
  const int32_t* budget;
  const int32_t* depth_limit;
  int32_t* node_count;
  int64_t* node_token_ids;
  int32_t* node_depths;
  int32_t* parents;
  int32_t* next_token;
  int32_t* next_sibling;
  uint8_t* visibility;
  int32_t* status;
  uint8_t* heap_fallback;
  int64_t B, D, K, N;
  int32_t kernel;
  int32_t kernel_ran;
} kdtr_tree_build_params;

/* verify_attn: q [B,T,H,Dqk] and kv_cache [B,S,Dqk] (f32, or bf16 as uint16 bits; dtype
 * KDTR_DTYPE_*), prefix_len / tree_len i32 [B], visibility u8 [B,T,T]; outputs out f32
 * [B,T,H,d_v], lse f32 [B,T,H].  kernel: KDTR_VERIFY_ATTN_* (CUDA; AUTO: wgmma for
 * Dqk > 256 where it applies, else mma where it applies, else simt).  kernel_ran (out):
 * the instance that ran ("cpu_f64", "simt_...", "mma_...", "wgmma_..."), a static string. */
typedef struct kdtr_verify_attn_params {
  const void* q;
  const void* kv_cache;
  const int32_t* prefix_len;
  const int32_t* tree_len;
  const uint8_t* visibility;
  float* out;
  float* lse;
  int64_t B, T, H, S, Dqk, d_v;
  float sm_scale;
  int32_t dtype;
  int32_t kernel;
  int32_t reserved; /* 0 */
  const char* kernel_ran;
} kdtr_verify_attn_params;

/* tree_accept: node_token_ids i64 [B,T], next_token / next_sibling i32 [B,T], node_count
 * i32 [B], target_predict i64 [B,T]; outputs accepted_count i32 [B], accepted_path i32
 * [B,T], proposed i64 [B,T], status i32 [B]. */
typedef struct kdtr_tree_accept_params {
  const int64_t* node_token_ids;
  const int32_t* next_token;
  const int32_t* next_sibling;
  const int32_t* node_count;
  const int64_t* target_predict;
  int32_t* accepted_count;
  int32_t* accepted_path;
  int64_t* proposed;
  int32_t* status;
  int64_t B, T;
} kdtr_tree_accept_params;

/* greedy_step: tree_build -> verify_attn -> tree_accept (docs/ops/greedy_step.md).  Inputs:
 * tree_build's five, q / kv_cache / prefix_len of verify_attn, target_predict i64 [B,T] of
 * tree_accept, sm_scale, d_v, N = max_budget (T = N + 1).  Outputs: tree_build's (the
 * golden's tree_build.<name>; its status is build_status), verify_attn's out / lse, and
 * tree_accept's accepted_count / accepted_path / proposed / accept_status.  tree_len: i32
 * [B] workspace of the caller (memory of the entry's side), written node_count + 1.  The
 * CUDA entry enqueues the four launches on `stream` with nothing on the host in between;
 * the builds and the attention kernel are chosen as AUTO. */
typedef struct kdtr_greedy_step_params {
  const float* top_log_probs;
  const int64_t* top_token_ids;
  const int64_t* root_token_ids;
  const int32_t* budget;
  const int32_t* depth_limit;
  const void* q;
  const void* kv_cache;
  const int32_t* prefix_len;
  const int64_t* target_predict;
  int32_t* node_count;
  int64_t* node_token_ids;
  int32_t* node_depths;
  int32_t* parents;
  int32_t* next_token;
  int32_t* next_sibling;
  uint8_t* visibility;
  int32_t* build_status;
  float* out;
  float* lse;
  int32_t* accepted_count;
  int32_t* accepted_path;
  int64_t* proposed;
  int32_t* accept_status;
  int32_t* tree_len;
  int64_t B, D, K, N, H, S, Dqk, d_v;
  float sm_scale;
  int32_t dtype;
  const char* attn_kernel_ran; /* out, as verify_attn's kernel_ran */
} kdtr_greedy_step_params;

KDTR_API int kdtr_abi_version(void);
KDTR_API int kdtr_has_cuda(void);
/* sizeof the params struct of `op` ("tree_build", ...), 0 for another name. */
KDTR_API int64_t kdtr_params_size(const char* op);
/* The message of the calling thread's last failed call ("" after a success). */
KDTR_API const char* kdtr_last_error(void);

KDTR_API int kdtr_tree_build_cpu(kdtr_tree_build_params* p);
KDTR_API int kdtr_tree_build_cuda(kdtr_tree_build_params* p, void* stream);
KDTR_API int kdtr_verify_attn_cpu(kdtr_verify_attn_params* p);
KDTR_API int kdtr_verify_attn_cuda(kdtr_verify_attn_params* p, void* stream);
KDTR_API int kdtr_tree_accept_cpu(kdtr_tree_accept_params* p);
KDTR_API int kdtr_tree_accept_cuda(kdtr_tree_accept_params* p, void* stream);
KDTR_API int kdtr_greedy_step_cpu(kdtr_greedy_step_params* p);
KDTR_API int kdtr_greedy_step_cuda(kdtr_greedy_step_params* p, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* KDTR_KERNELS_H */
