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
 * for <op> in tree_build, verify_attn, tree_accept, greedy_step, ddtree_decode.  Every entry returns
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
 * greedy_step: prefix_len + T <= S) and return KDTR_ERR_INVALID_ARGUMENT naming the
 * request.  The CUDA entries cannot read device memory without a copy: there the kernel
 * checks each request's lengths on the device, before any load of that request (the same
 * rules; greedy_step's verify_attn stage: prefix_len + T <= S), and a request that fails
 * has every element of its out and lse (greedy_step: verify_attn_out, verify_attn_lse)
 * written quiet NaN, nothing of its q / kv_cache read, and is recorded in the device's
 * error record, which kdtr_device_errors() reads; the entry itself returns KDTR_OK.
 *
 * The CUDA entries do nothing per call that synchronizes, allocates or copies: device
 * attributes, shared-memory limits (cudaFuncSetAttribute) and the record's address are
 * asked once per device and cached for the process's life (a process that calls
 * cudaDeviceReset must not call them again).  Each is legal while `stream` is being
 * captured (cudaStreamBeginCapture, any mode), its first call on a device included, and
 * the captured graph may be replayed with new data in the same buffers (lengths checked
 * on every replay).  The stream must belong to the current device.
 *
 * C-compatible (C99 and C++).  The ABI version (KDTR_ABI_VERSION, kdtr_abi_version())
 * changes whenever a struct or an existing entry changes; an entry added to the library
 * (kdtr_device_errors, ABI version 2) leaves it as it is: bindings look such an entry up
 * by name.  kdtr_params_size(op) is sizeof the op's struct, for bindings that mirror the
 * structs (kdtr/kernels.py checks both at load).
 */
#ifndef KDTR_KERNELS_H
#define KDTR_KERNELS_H

#include <stdint.h>

#include "ddtree_decode_params.h"
#include "greedy_step_params.h"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KDTR_ABI_VERSION 2

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

/* The parameter structs, one per op (kdtr_tree_build_params, kdtr_verify_attn_params,
 * kdtr_tree_accept_params, kdtr_greedy_step_params), their kernel and dtype codes
 * (KDTR_TREE_BUILD_*, KDTR_VERIFY_ATTN_*, KDTR_DTYPE_*): <op>_params.h, laid out by the
 * rule of kdtr_abi.h from the op's spec.  tree_build: kernel AUTO on CUDA is select where
 * its shared memory fits, else heap; on the CPU heap; kernel_ran (out) names the build
 * that ran ("heap", "select", "cpu_heap", "cpu_select"); heap_fallback (may be NULL):
 * u8 [B], 1 where the select build handed a valid request to the heap build.
 * verify_attn: kernel (CUDA; the CPU entry takes AUTO only; AUTO: wgmma for Dqk > 256
 * where it applies, else mma where it applies, else simt; WGMMA needs compute capability
 * 9.0 and a library built with it), kernel_ran (out): the instance that ran ("cpu_f64",
 * "simt_...", "mma_...", "wgmma_..."), a static string.  greedy_step: tree_build's
 * outputs tree_build_*, verify_attn's verify_attn_*, tree_accept's tree_accept_*;
 * tree_len: i32 [B] workspace of the caller (memory of the entry's side), written
 * node_count + 1; kernel / kernel_ran as verify_attn's (its attention stage); the CUDA
 * entry enqueues the four launches on `stream` with nothing on the host in between. */
KDTR_API int kdtr_abi_version(void);
KDTR_API int kdtr_has_cuda(void);
/* sizeof the params struct of `op` ("tree_build", ...), 0 for another name. */
KDTR_API int64_t kdtr_params_size(const char* op);
/* The layout of `op`'s params struct as JSON, as `kdtr_<op> --describe` prints it (name,
 * C type, offset and size of every field, the op's kernels); "" for another name.  A
 * string owned by the library, valid in the calling thread until its next call. */
KDTR_API const char* kdtr_describe(const char* op);
/* The message of the calling thread's last failed call ("" after a success). */
KDTR_API const char* kdtr_last_error(void);

/* The device error record of `device` (< 0: the current device): returns how many
 * failing requests the CUDA entries' device-side length checks recorded there since the
 * last clear (0: none; capped at INT32_MAX), and writes the first one's message, e.g.
 * "verify_attn: request 3: prefix_len 100 + tree_len 9 exceeds the cache rows S = 64" (the
 * CPU entries' message for the same lengths; greedy_step: "greedy_step: request 3:
 * prefix_len 100 + T 9 exceeds ..."), into message (NUL-terminated, truncated to size
 * bytes; "" when none; nothing when message is NULL or size <= 0).  clear != 0 resets the
 * record after reading it.  It synchronizes that device first (cudaDeviceSynchronize: the
 * one call of the library that does), so it is never called inside a stream capture; the
 * caller's current device is restored.  A CUDA error (an invalid device, an earlier
 * kernel's fault, no driver) returns -KDTR_ERR_CUDA with the error's name and string in
 * message and kdtr_last_error().  The CPU-only build returns 0 and "": nothing of it runs
 * on a device. */
KDTR_API int kdtr_device_errors(int device, int clear, char* message, int64_t size);

KDTR_API int kdtr_tree_build_cpu(kdtr_tree_build_params* p);
KDTR_API int kdtr_tree_build_cuda(kdtr_tree_build_params* p, void* stream);
KDTR_API int kdtr_verify_attn_cpu(kdtr_verify_attn_params* p);
KDTR_API int kdtr_verify_attn_cuda(kdtr_verify_attn_params* p, void* stream);
KDTR_API int kdtr_tree_accept_cpu(kdtr_tree_accept_params* p);
KDTR_API int kdtr_tree_accept_cuda(kdtr_tree_accept_params* p, void* stream);
KDTR_API int kdtr_greedy_step_cpu(kdtr_greedy_step_params* p);
KDTR_API int kdtr_greedy_step_cuda(kdtr_greedy_step_params* p, void* stream);
/* ddtree_decode (docs/ops/ddtree_decode.md): R DDTree decode steps of a tiny MLA target; the
 * CPU entry checks the values its core trusts (lengths, ranges, the weights' fixed-point
 * rule) and returns KDTR_ERR_INVALID_ARGUMENT for a step needing more than S cache rows;
 * the CUDA entry returns KDTR_ERR_NOT_SUPPORTED: the device loop (kdtr_ddtree_decode
 * --backend cuda) needs a workspace and a synchronizing read of its stop record, which this
 * asynchronous entry has no place for yet. */
KDTR_API int kdtr_ddtree_decode_cpu(kdtr_ddtree_decode_params* p);
KDTR_API int kdtr_ddtree_decode_cuda(kdtr_ddtree_decode_params* p, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* KDTR_KERNELS_H */
