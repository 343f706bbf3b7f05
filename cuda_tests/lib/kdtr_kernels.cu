// kdtr_kernels.cu -- the C ABI of build/lib/libkdtr_kernels.so (cuda_tests/include/kdtr_kernels.h).
//
// Host code only (like cuda_tests/tests/test_<op>.cu): compiled as C++ by nvcc -x c++ in
// the CUDA build and linked with the kernels (cuda_tests/kernels/<op>.cu, compiled again
// as position-independent objects), or by g++ -DKDTR_NO_CUDA in the CPU-only build, where
// every *_cuda entry returns KDTR_ERR_NO_CUDA.  Each entry checks what the host can see
// and passes the caller's struct (the op's struct of <op>_params.h, shared with the
// kernels and CPU cores) on to the CPU core (kdtr::cpu::*, cuda_tests/cpu/) or the
// launcher (launch_*); greedy_step's struct is split into the chain's four stage structs.
// No C++ exception leaves the library.

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "ddtree_decode_params.h"
#include "greedy_step_params.h"
#include "kdtr_describe.hpp"
#include "kdtr_kernels.h"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

#ifndef KDTR_NO_CUDA
#include <cuda_runtime_api.h>

#include "greedy_step_launch.h"
#include "tree_accept_launch.h"
#include "tree_build_launch.h"
#include "verify_attn_launch.h"
#endif

namespace {

using namespace kdtr;

thread_local std::string g_last_error;

// Bounds of the dims, as kdtr_ops.hpp's table has them (docs/binaries.md).
constexpr int64_t kMaxIndexDim = 0x7fffffffLL;      // tree_build: B, D, K
constexpr int64_t kMaxBudget = 0x7fffffffLL - 1;    // tree_build: N (T = N + 1 fits int32)
constexpr int64_t kMaxAttnDim = kVerifyAttnMaxDim;  // verify_attn: B, T, H, Dqk, T*H, S
constexpr int64_t kMaxRowDim = INT64_MAX / 2;       // tree_accept: B, T

// A failed check: code and message, carried to the entry's return.
struct Fail {
  int code;
  std::string what;
};

[[noreturn]] void fail(int code, const std::string& what) { throw Fail{code, what}; }

void dim(const char* op, const char* name, int64_t v, int64_t max) {
  if (v < 0) fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": " + name + " " + std::to_string(v) + " is negative");
  if (v > max)
    fail(KDTR_ERR_INVALID_ARGUMENT,
         std::string(op) + ": " + name + " " + std::to_string(v) + " exceeds " + std::to_string(max));
}

// A pointer that must be set when its tensor has elements.
void ptr(const char* op, const char* name, const void* p, bool nonempty) {
  if (p == nullptr && nonempty) fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": " + name + " is NULL");
}

void null_params(const char* op, const void* p) {
  if (p == nullptr) fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": params is NULL");
}

// Runs `body` (which returns a code), mapping every exception to a code and a message.
template <class F>
int guarded(F&& body) {
  g_last_error.clear();
  try {
    return body();
  } catch (const Fail& f) {
    g_last_error = f.what;
    return f.code;
  } catch (const std::bad_alloc&) {
    g_last_error = "out of host memory (the CPU backend's scratch)";
    return KDTR_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return KDTR_ERR_INTERNAL;
  } catch (...) {
    g_last_error = "internal error: unknown exception";
    return KDTR_ERR_INTERNAL;
  }
}

// ---------------------------------------------------------------------------------------
// Checks and struct copies, one per op (shared by both backends)
// ---------------------------------------------------------------------------------------

// The checks of each op's struct: the entries pass the caller's struct on as it is (the
// struct of <op>_params.h is the ABI: no copies).
const TreeBuildParams& tree_build_checked(const kdtr_tree_build_params* c, const char* op) {
  null_params(op, c);
  dim(op, "B", c->B, kMaxIndexDim);
  dim(op, "D", c->D, kMaxIndexDim);
  dim(op, "K", c->K, kMaxIndexDim);
  dim(op, "N (max_budget)", c->N, kMaxBudget);
  if (c->kernel != KDTR_TREE_BUILD_AUTO && c->kernel != KDTR_TREE_BUILD_HEAP && c->kernel != KDTR_TREE_BUILD_SELECT)
    fail(KDTR_ERR_INVALID_ARGUMENT,
         std::string(op) + ": kernel " + std::to_string(c->kernel) + " is not AUTO (0), HEAP (1) or SELECT (2)");
  const bool b = c->B > 0, in3 = b && c->D > 0 && c->K > 0;
  ptr(op, "top_log_probs", c->top_log_probs, in3);
  ptr(op, "top_token_ids", c->top_token_ids, in3);
  ptr(op, "root_token_ids", c->root_token_ids, b);
  ptr(op, "budget", c->budget, b);
  ptr(op, "depth_limit", c->depth_limit, b);
  ptr(op, "node_count", c->node_count, b);
  ptr(op, "node_token_ids", c->node_token_ids, b);
  ptr(op, "node_depths", c->node_depths, b);
  ptr(op, "parents", c->parents, b);
  ptr(op, "next_token", c->next_token, b);
  ptr(op, "next_sibling", c->next_sibling, b);
  ptr(op, "visibility", c->visibility, b);
  ptr(op, "status", c->status, b);
  return *c;
}

void attn_dims(const char* op, int64_t B, int64_t T, int64_t H, int64_t S, int64_t Dqk, int64_t d_v, int32_t dtype) {
  dim(op, "B", B, kMaxAttnDim);
  dim(op, "T", T, kMaxAttnDim);
  dim(op, "H", H, kMaxAttnDim);
  dim(op, "S", S, kMaxAttnDim);
  dim(op, "Dqk", Dqk, kMaxAttnDim);
  if (T * H > kMaxAttnDim)
    fail(KDTR_ERR_INVALID_ARGUMENT,
         std::string(op) + ": T*H " + std::to_string(T * H) + " exceeds " + std::to_string(kMaxAttnDim));
  if (d_v < 1 || d_v > Dqk)
    fail(KDTR_ERR_INVALID_ARGUMENT,
         std::string(op) + ": d_v " + std::to_string(d_v) + " is outside [1, Dqk = " + std::to_string(Dqk) + "]");
  if (dtype != KDTR_DTYPE_F32 && dtype != KDTR_DTYPE_BF16)
    fail(KDTR_ERR_INVALID_ARGUMENT,
         std::string(op) + ": dtype " + std::to_string(dtype) + " is not F32 (0) or BF16 (1)");
}

const VerifyAttnProblem& verify_attn_checked(const kdtr_verify_attn_params* c, const char* op) {
  null_params(op, c);
  attn_dims(op, c->B, c->T, c->H, c->S, c->Dqk, c->d_v, c->dtype);
  if (c->kernel != KDTR_VERIFY_ATTN_AUTO && c->kernel != KDTR_VERIFY_ATTN_SIMT && c->kernel != KDTR_VERIFY_ATTN_MMA &&
      c->kernel != KDTR_VERIFY_ATTN_WGMMA)
    fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": kernel " + std::to_string(c->kernel) +
                                        " is not AUTO (0), SIMT (1), MMA (2) or WGMMA (3)");
  const bool b = c->B > 0, rows = b && c->T > 0 && c->H > 0;
  ptr(op, "q", c->q, rows);
  ptr(op, "kv_cache", c->kv_cache, b && c->S > 0);
  ptr(op, "prefix_len", c->prefix_len, b);
  ptr(op, "tree_len", c->tree_len, b);
  ptr(op, "visibility", c->visibility, b && c->T > 0);
  ptr(op, "out", c->out, rows);
  ptr(op, "lse", c->lse, rows);
  return *c;
}

// Which length check fails (the same codes as the device record's, verify_attn_launch.h).
enum LengthField : int32_t { kLengthOk = 0, kPrefixLen = 1, kTreeLen = 2, kCacheRows = 3 };

// The message of a failed length check, the same for the CPU entries' host check and the
// CUDA entries' device record: request b of `op`, lengths pl and tl (chain: the chain's
// rule prefix_len + T <= S, tl == T), T slots, S cache rows.
std::string length_message(const char* op, int64_t b, int32_t field, int64_t pl, int64_t tl, int64_t T, int64_t S,
                           bool chain) {
  const std::string req = std::string(op) + ": request " + std::to_string(b) + ": ";
  if (field == kPrefixLen) return req + "prefix_len " + std::to_string(pl) + " is negative";
  if (field == kTreeLen)
    return req + "tree_len " + std::to_string(tl) + " is outside [0, T = " + std::to_string(T) + "]";
  return req + "prefix_len " + std::to_string(pl) + " + " +
         (chain ? "T " + std::to_string(T) : "tree_len " + std::to_string(tl)) +
         " exceeds the cache rows S = " + std::to_string(S);
}

// The lengths verify_attn trusts (host memory): prefix_len >= 0, tree_len in [0, T] (or
// the chain's T when tree_len is null), prefix_len + tree_len <= S.
void attn_lengths(const char* op, const int32_t* prefix_len, const int32_t* tree_len, int64_t B, int64_t T, int64_t S) {
  for (int64_t b = 0; b < B; ++b) {
    const int64_t pl = prefix_len[b], tl = tree_len != nullptr ? tree_len[b] : T;
    const int32_t field = pl < 0                                       ? kPrefixLen
                          : tl < 0 || tl > T                           ? kTreeLen
                          : !cpu::verify_attn_lengths_ok(pl, tl, T, S) ? kCacheRows
                                                                       : kLengthOk;
    if (field != kLengthOk)
      fail(KDTR_ERR_INVALID_ARGUMENT, length_message(op, b, field, pl, tl, T, S, tree_len == nullptr));
  }
}

// Copies text into message (size bytes, NUL-terminated, truncated) where there is room.
void copy_message(const std::string& text, char* message, int64_t size) {
  if (message == nullptr || size <= 0) return;
  const size_t n = text.size() < static_cast<size_t>(size - 1) ? text.size() : static_cast<size_t>(size - 1);
  std::memcpy(message, text.data(), n);
  message[n] = '\0';
}

const TreeAcceptParams& tree_accept_checked(const kdtr_tree_accept_params* c, const char* op) {
  null_params(op, c);
  dim(op, "B", c->B, kMaxRowDim);
  dim(op, "T", c->T, kMaxRowDim);
  const bool b = c->B > 0, bt = b && c->T > 0;
  ptr(op, "node_token_ids", c->node_token_ids, bt);
  ptr(op, "next_token", c->next_token, bt);
  ptr(op, "next_sibling", c->next_sibling, bt);
  ptr(op, "node_count", c->node_count, b);
  ptr(op, "target_predict", c->target_predict, bt);
  ptr(op, "accepted_count", c->accepted_count, b);
  ptr(op, "accepted_path", c->accepted_path, bt);
  ptr(op, "proposed", c->proposed, bt);
  ptr(op, "status", c->status, b);
  return *c;
}

// The greedy_step chain's four stage structs from the op's struct (as
// kdtr::ops::greedy_step_params wires them for the binary).
GreedyStepStages greedy_step_checked(const kdtr_greedy_step_params* c, const char* op) {
  null_params(op, c);
  dim(op, "N (max_budget)", c->N, kMaxBudget);
  const int64_t T = c->N + 1;
  dim(op, "B", c->B, kMaxAttnDim);  // the chain's bound: the smallest over its ops
  dim(op, "D", c->D, kMaxIndexDim);
  dim(op, "K", c->K, kMaxIndexDim);
  attn_dims(op, c->B, T, c->H, c->S, c->Dqk, c->d_v, c->dtype);
  if (c->kernel != KDTR_VERIFY_ATTN_AUTO && c->kernel != KDTR_VERIFY_ATTN_SIMT && c->kernel != KDTR_VERIFY_ATTN_MMA &&
      c->kernel != KDTR_VERIFY_ATTN_WGMMA)
    fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": kernel " + std::to_string(c->kernel) +
                                        " is not AUTO (0), SIMT (1), MMA (2) or WGMMA (3)");
  const bool b = c->B > 0, in3 = b && c->D > 0 && c->K > 0, rows = b && c->H > 0;
  ptr(op, "top_log_probs", c->top_log_probs, in3);
  ptr(op, "top_token_ids", c->top_token_ids, in3);
  ptr(op, "root_token_ids", c->root_token_ids, b);
  ptr(op, "budget", c->budget, b);
  ptr(op, "depth_limit", c->depth_limit, b);
  ptr(op, "q", c->q, rows);
  ptr(op, "kv_cache", c->kv_cache, b && c->S > 0);
  ptr(op, "prefix_len", c->prefix_len, b);
  ptr(op, "target_predict", c->target_predict, b);
  ptr(op, "tree_build_node_count", c->tree_build_node_count, b);
  ptr(op, "tree_build_node_token_ids", c->tree_build_node_token_ids, b);
  ptr(op, "tree_build_node_depths", c->tree_build_node_depths, b);
  ptr(op, "tree_build_parents", c->tree_build_parents, b);
  ptr(op, "tree_build_next_token", c->tree_build_next_token, b);
  ptr(op, "tree_build_next_sibling", c->tree_build_next_sibling, b);
  ptr(op, "tree_build_visibility", c->tree_build_visibility, b);
  ptr(op, "tree_build_status", c->tree_build_status, b);
  ptr(op, "verify_attn_out", c->verify_attn_out, rows);
  ptr(op, "verify_attn_lse", c->verify_attn_lse, rows);
  ptr(op, "tree_accept_accepted_count", c->tree_accept_accepted_count, b);
  ptr(op, "tree_accept_accepted_path", c->tree_accept_accepted_path, b);
  ptr(op, "tree_accept_proposed", c->tree_accept_proposed, b);
  ptr(op, "tree_accept_status", c->tree_accept_status, b);
  ptr(op, "tree_len", c->tree_len, b);
  GreedyStepStages ch{};
  TreeBuildParams& tb = ch.build;
  tb.top_log_probs = c->top_log_probs;
  tb.top_token_ids = c->top_token_ids;
  tb.root_token_ids = c->root_token_ids;
  tb.budget = c->budget;
  tb.depth_limit = c->depth_limit;
  tb.node_count = c->tree_build_node_count;
  tb.node_token_ids = c->tree_build_node_token_ids;
  tb.node_depths = c->tree_build_node_depths;
  tb.parents = c->tree_build_parents;
  tb.next_token = c->tree_build_next_token;
  tb.next_sibling = c->tree_build_next_sibling;
  tb.visibility = c->tree_build_visibility;
  tb.status = c->tree_build_status;
  tb.B = c->B;
  tb.D = c->D;
  tb.K = c->K;
  tb.N = c->N;
  tb.kernel = KDTR_TREE_BUILD_AUTO;
  ch.tree_len.node_count = c->tree_build_node_count;
  ch.tree_len.tree_len = c->tree_len;
  ch.tree_len.B = c->B;
  ch.tree_len.T = T;
  VerifyAttnProblem& va = ch.attn;
  va.q = c->q;
  va.kv_cache = c->kv_cache;
  va.prefix_len = c->prefix_len;
  va.tree_len = c->tree_len;
  va.visibility = c->tree_build_visibility;
  va.out = c->verify_attn_out;
  va.lse = c->verify_attn_lse;
  va.B = c->B;
  va.T = T;
  va.H = c->H;
  va.S = c->S;
  va.Dqk = c->Dqk;
  va.d_v = c->d_v;
  va.sm_scale = c->sm_scale;
  va.dtype = c->dtype;
  va.kernel = c->kernel;
  TreeAcceptParams& ta = ch.accept;
  ta.node_token_ids = c->tree_build_node_token_ids;
  ta.next_token = c->tree_build_next_token;
  ta.next_sibling = c->tree_build_next_sibling;
  ta.node_count = c->tree_build_node_count;
  ta.target_predict = c->target_predict;
  ta.accepted_count = c->tree_accept_accepted_count;
  ta.accepted_path = c->tree_accept_accepted_path;
  ta.proposed = c->tree_accept_proposed;
  ta.status = c->tree_accept_status;
  ta.B = c->B;
  ta.T = T;
  return ch;
}

#ifndef KDTR_NO_CUDA

// ---------------------------------------------------------------------------------------
// CUDA: errors, kernel choice
// ---------------------------------------------------------------------------------------

void cuda_check(const char* op, const char* what, cudaError_t e) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // returned here: not the next call's launch error (a sticky one stays)
  fail(e == cudaErrorNotSupported ? KDTR_ERR_NOT_SUPPORTED : KDTR_ERR_CUDA,
       std::string(op) + ": " + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

int current_device(const char* op) {
  int device = 0;
  cuda_check(op, "cudaGetDevice", cudaGetDevice(&device));
  return device;
}

// The launchers' kernel-choice policy (tree_build_choose, verify_attn_choose), its
// NOT_SUPPORTED reason as the library's message.
int32_t configure_tree_build(const char* op, const TreeBuildParams& p, int32_t want, int device) {
  TreeBuildParams q = p;
  q.kernel = want;
  int32_t k = want;
  std::string why;
  const cudaError_t e = tree_build_choose(q, device, &k, &why);
  if (e == cudaErrorNotSupported) fail(KDTR_ERR_NOT_SUPPORTED, std::string(op) + ": " + why);
  cuda_check(op, "tree_build_choose", e);
  return k;
}

VerifyAttnPlan plan_verify_attn(const char* op, const VerifyAttnProblem& p, int32_t kernel, int device) {
  VerifyAttnProblem q = p;
  q.kernel = kernel;
  VerifyAttnPlan plan;
  std::string why;
  const cudaError_t e = verify_attn_choose(q, device, &plan, &why);
  if (e == cudaErrorNotSupported) fail(KDTR_ERR_NOT_SUPPORTED, std::string(op) + ": " + why);
  cuda_check(op, "verify_attn_choose", e);
  return plan;
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

static_assert(static_cast<int32_t>(kPrefixLen) == static_cast<int32_t>(kDeviceErrorPrefixLen) &&
                  static_cast<int32_t>(kTreeLen) == static_cast<int32_t>(kDeviceErrorTreeLen) &&
                  static_cast<int32_t>(kCacheRows) == static_cast<int32_t>(kDeviceErrorCacheRows),
              "one set of length-check codes for the host check and the device record");

#endif  // KDTR_NO_CUDA

#ifdef KDTR_NO_CUDA
int no_cuda(const char* op) {
  g_last_error = std::string(op) +
                 ": not built with CUDA (libkdtr_kernels.so is the CPU-only build: "
                 "make lib with nvcc on PATH and without NO_CUDA=1)";
  return KDTR_ERR_NO_CUDA;
}
#endif

// ddtree_decode: dims, pointers, and the values its CPU core trusts (the binary's input
// checks, docs/ops/ddtree_decode.md): Dv <= Dqk, draft_depth >= 1, draft_top_k in [1, V],
// prefix_len in [0, S], root_token_ids in [0, V), budget in [0, N], depth_limit in
// [0, draft_depth], every weight a multiple of 2^-6 within [-1, 1].
const DdtreeDecodeParams& ddtree_decode_checked(const kdtr_ddtree_decode_params* c, const char* op) {
  null_params(op, c);
  for (const auto& d : {std::make_pair("B", c->B), std::make_pair("R", c->R), std::make_pair("V", c->V),
                        std::make_pair("E", c->E), std::make_pair("N", c->N)})
    dim(op, d.first, d.second, kMaxIndexDim - 1);
  for (const auto& d : {std::make_pair("H", c->H), std::make_pair("Dqk", c->Dqk), std::make_pair("Dv", c->Dv),
                        std::make_pair("S", c->S)})
    dim(op, d.first, d.second, kMaxAttnDim);
  if (c->V < 1 || c->E < 1 || c->H < 1 || c->Dv < 1 || c->Dv > c->Dqk)
    fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": V, E, H, Dv >= 1 and Dv <= Dqk needed");
  if (c->draft_depth < 1) fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": draft_depth < 1");
  if (c->draft_top_k < 1 || c->draft_top_k > c->V)
    fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": draft_top_k outside [1, V]");
  const bool b = c->B > 0, br = b && c->R > 0;
  const std::pair<const char*, const void*> ptrs[] = {{"target_emb", c->target_emb},   {"target_w_q", c->target_w_q},
                                                      {"target_w_kv", c->target_w_kv}, {"target_w_o", c->target_w_o},
                                                      {"target_w_lm", c->target_w_lm}, {"draft_emb", c->draft_emb},
                                                      {"draft_w_lm", c->draft_w_lm}};
  for (const auto& q : ptrs) ptr(op, q.first, q.second, true);
  ptr(op, "kv_cache", c->kv_cache, b && c->S > 0);
  ptr(op, "final_kv_cache", c->final_kv_cache, b && c->S > 0);
  for (const auto& q : {std::make_pair("prefix_len", static_cast<const void*>(c->prefix_len)),
                        std::make_pair("root_token_ids", static_cast<const void*>(c->root_token_ids)),
                        std::make_pair("cache_len", static_cast<const void*>(c->cache_len))})
    ptr(op, q.first, q.second, b);
  for (const auto& q : {std::make_pair("budget", static_cast<const void*>(c->budget)),
                        std::make_pair("depth_limit", static_cast<const void*>(c->depth_limit)),
                        std::make_pair("node_count", static_cast<const void*>(c->node_count)),
                        std::make_pair("top_log_probs", static_cast<const void*>(c->top_log_probs)),
                        std::make_pair("top_token_ids", static_cast<const void*>(c->top_token_ids)),
                        std::make_pair("accepted_count", static_cast<const void*>(c->accepted_count)),
                        std::make_pair("accepted_path", static_cast<const void*>(c->accepted_path)),
                        std::make_pair("step_tokens", static_cast<const void*>(c->step_tokens)),
                        std::make_pair("attn_out", static_cast<const void*>(c->attn_out))})
    ptr(op, q.first, q.second, br);
  const int64_t sizes[] = {c->V * c->E, c->E * c->H * c->Dqk, c->E * c->Dqk, c->H * c->Dv * c->E,
                           c->E * c->V, c->V * c->E,          c->E * c->V};
  for (size_t k = 0; k < 7; ++k) {
    const uint16_t* w = static_cast<const uint16_t*>(ptrs[k].second);
    for (int64_t i = 0; i < sizes[k]; ++i) {
      const uint32_t u = static_cast<uint32_t>(w[i]) << 16;
      float f;
      std::memcpy(&f, &u, sizeof f);
      const float scaled = f * 64.0f;
      if (!(f >= -1.0f && f <= 1.0f) || scaled != static_cast<float>(static_cast<int>(scaled)))
        fail(KDTR_ERR_INVALID_ARGUMENT, std::string(op) + ": " + ptrs[k].first + " element " + std::to_string(i) +
                                            " is not a multiple of 2^-6 within [-1, 1]");
    }
  }
  for (int64_t r = 0; r < c->B; ++r) {
    const std::string req = std::string(op) + ": request " + std::to_string(r) + ": ";
    if (c->prefix_len[r] < 0 || c->prefix_len[r] > c->S)
      fail(KDTR_ERR_INVALID_ARGUMENT, req + "prefix_len outside [0, S]");
    if (c->root_token_ids[r] < 0 || c->root_token_ids[r] >= c->V)
      fail(KDTR_ERR_INVALID_ARGUMENT, req + "root_token_ids outside [0, V)");
    for (int64_t k = 0; k < c->R; ++k) {
      if (c->budget[r * c->R + k] < 0 || c->budget[r * c->R + k] > c->N)
        fail(KDTR_ERR_INVALID_ARGUMENT, req + "budget outside [0, N]");
      if (c->depth_limit[r * c->R + k] < 0 || c->depth_limit[r * c->R + k] > c->draft_depth)
        fail(KDTR_ERR_INVALID_ARGUMENT, req + "depth_limit outside [0, draft_depth]");
    }
  }
  return *c;
}

}  // namespace

extern "C" {

int kdtr_abi_version(void) { return KDTR_ABI_VERSION; }

int kdtr_has_cuda(void) {
#ifdef KDTR_NO_CUDA
  return 0;
#else
  return 1;
#endif
}

int64_t kdtr_params_size(const char* op) {
  if (op == nullptr) return 0;
  const abi::OpLayout* l = abi::layout(op);
  return l == nullptr ? 0 : static_cast<int64_t>(l->size);
}

const char* kdtr_describe(const char* op) {
  static thread_local std::string text;
  text = op == nullptr ? "" : abi::describe_json(op);
  return text.c_str();
}

const char* kdtr_last_error(void) { return g_last_error.c_str(); }

int kdtr_device_errors(int device, int clear, char* message, int64_t size) {
  g_last_error.clear();
  copy_message("", message, size);
#ifdef KDTR_NO_CUDA
  (void)device;
  (void)clear;
  return 0;  // nothing runs on a device: the CPU entries check the lengths on the host
#else
  try {
    DeviceErrorRecord r{};
    const cudaError_t e = device_errors(device, clear != 0, &r);
    if (e != cudaSuccess) {
      g_last_error = std::string("kdtr_device_errors: device ") + std::to_string(device) + ": " + cudaGetErrorName(e) +
                     ": " + cudaGetErrorString(e);
      copy_message(g_last_error, message, size);
      return -KDTR_ERR_CUDA;
    }
    if (r.count == 0) return 0;
    const bool chain = r.op == static_cast<int32_t>(VerifyAttnRule::GreedyStep);
    copy_message(length_message(chain ? "greedy_step" : "verify_attn", r.request, r.field, r.prefix_len, r.tree_len,
                                r.T, r.S, chain && r.field == kCacheRows),
                 message, size);
    return r.count > 0x7fffffffULL ? 0x7fffffff : static_cast<int>(r.count);
  } catch (...) {
    g_last_error = "kdtr_device_errors: internal error";
    copy_message(g_last_error, message, size);
    return -KDTR_ERR_INTERNAL;
  }
#endif
}

// ---- CPU backends ----------------------------------------------------------------------

int kdtr_tree_build_cpu(kdtr_tree_build_params* c) {
  return guarded([&] {
    TreeBuildParams p = tree_build_checked(c, "tree_build");
    p.kernel = c->kernel == KDTR_TREE_BUILD_SELECT ? TREE_BUILD_KERNEL_SELECT : TREE_BUILD_KERNEL_HEAP;
    cpu::tree_build(p);
    c->kernel_ran = p.kernel == TREE_BUILD_KERNEL_SELECT ? "cpu_select" : "cpu_heap";
    return KDTR_OK;
  });
}

int kdtr_verify_attn_cpu(kdtr_verify_attn_params* c) {
  return guarded([&] {
    const VerifyAttnProblem p = verify_attn_checked(c, "verify_attn");
    if (c->kernel != KDTR_VERIFY_ATTN_AUTO)
      fail(KDTR_ERR_INVALID_ARGUMENT, "verify_attn: kernel SIMT / MMA / WGMMA applies to the CUDA entry only");
    attn_lengths("verify_attn", p.prefix_len, p.tree_len, p.B, p.T, p.S);
    cpu::verify_attn(p);
    c->kernel_ran = "cpu_f64";
    return KDTR_OK;
  });
}

int kdtr_tree_accept_cpu(kdtr_tree_accept_params* c) {
  return guarded([&] {
    cpu::tree_accept(tree_accept_checked(c, "tree_accept"));
    return KDTR_OK;
  });
}

int kdtr_greedy_step_cpu(kdtr_greedy_step_params* c) {
  return guarded([&] {
    GreedyStepStages ch = greedy_step_checked(c, "greedy_step");
    if (c->kernel != KDTR_VERIFY_ATTN_AUTO)
      fail(KDTR_ERR_INVALID_ARGUMENT, "greedy_step: kernel SIMT / MMA / WGMMA applies to the CUDA entry only");
    attn_lengths("greedy_step", c->prefix_len, nullptr, c->B, c->N + 1, c->S);
    ch.build.kernel = TREE_BUILD_KERNEL_HEAP;
    cpu::greedy_step(ch);
    c->kernel_ran = "cpu_f64";
    return KDTR_OK;
  });
}

int kdtr_ddtree_decode_cpu(kdtr_ddtree_decode_params* c) {
  return guarded([&] {
    const DdtreeDecodeParams& p = ddtree_decode_checked(c, "ddtree_decode");
    if (c->kernel != KDTR_VERIFY_ATTN_AUTO)
      fail(KDTR_ERR_INVALID_ARGUMENT, "ddtree_decode: kernel SIMT / MMA / WGMMA applies to the CUDA entry only");
    const std::string why = cpu::ddtree_decode(p);
    if (!why.empty()) fail(KDTR_ERR_INVALID_ARGUMENT, "ddtree_decode: " + why);
    c->kernel_ran = "cpu_f64";
    return KDTR_OK;
  });
}

// ---- CUDA kernels ----------------------------------------------------------------------

#ifdef KDTR_NO_CUDA

int kdtr_tree_build_cuda(kdtr_tree_build_params*, void*) { return no_cuda("tree_build"); }
int kdtr_verify_attn_cuda(kdtr_verify_attn_params*, void*) { return no_cuda("verify_attn"); }
int kdtr_tree_accept_cuda(kdtr_tree_accept_params*, void*) { return no_cuda("tree_accept"); }
int kdtr_greedy_step_cuda(kdtr_greedy_step_params*, void*) { return no_cuda("greedy_step"); }
int kdtr_ddtree_decode_cuda(kdtr_ddtree_decode_params*, void*) { return no_cuda("ddtree_decode"); }

#else

int kdtr_tree_build_cuda(kdtr_tree_build_params* c, void* stream) {
  return guarded([&] {
    const char* op = "tree_build";
    TreeBuildParams p = tree_build_checked(c, op);
    if (p.B == 0) {
      c->kernel_ran = c->kernel == KDTR_TREE_BUILD_HEAP ? "heap" : "select";
      return KDTR_OK;
    }
    p.kernel = configure_tree_build(op, p, c->kernel, current_device(op));
    cuda_check(op, "launch_tree_build", launch_tree_build(p, as_stream(stream)));
    c->kernel_ran = p.kernel == TREE_BUILD_KERNEL_SELECT ? "select" : "heap";
    return KDTR_OK;
  });
}

int kdtr_verify_attn_cuda(kdtr_verify_attn_params* c, void* stream) {
  return guarded([&] {
    const char* op = "verify_attn";
    const VerifyAttnProblem p = verify_attn_checked(c, op);
    const VerifyAttnPlan plan = plan_verify_attn(op, p, c->kernel, current_device(op));
    cuda_check(op, "launch_verify_attn", launch_verify_attn(p, plan, as_stream(stream)));
    c->kernel_ran = plan.name;
    return KDTR_OK;
  });
}

int kdtr_tree_accept_cuda(kdtr_tree_accept_params* c, void* stream) {
  return guarded([&] {
    const char* op = "tree_accept";
    cuda_check(op, "launch_tree_accept", launch_tree_accept(tree_accept_checked(c, op), as_stream(stream)));
    return KDTR_OK;
  });
}

int kdtr_greedy_step_cuda(kdtr_greedy_step_params* c, void* stream) {
  return guarded([&] {
    const char* op = "greedy_step";
    GreedyStepStages ch = greedy_step_checked(c, op);
    const int device = current_device(op);
    const VerifyAttnPlan plan = plan_verify_attn(op, ch.attn, c->kernel, device);
    c->kernel_ran = plan.name;
    if (c->B == 0) return KDTR_OK;
    ch.build.kernel = configure_tree_build(op, ch.build, TREE_BUILD_KERNEL_AUTO, device);
    const cudaStream_t s = as_stream(stream);
    cuda_check(op, "launch_tree_build", launch_tree_build(ch.build, s));
    cuda_check(op, "launch_greedy_step_tree_len", launch_greedy_step_tree_len(ch.tree_len, s));
    cuda_check(op, "launch_verify_attn", launch_verify_attn(ch.attn, plan, s, VerifyAttnRule::GreedyStep));
    cuda_check(op, "launch_tree_accept", launch_tree_accept(ch.accept, s));
    return KDTR_OK;
  });
}

// Not through this entry (kdtr_kernels.h; the binary runs the device loop).
int kdtr_ddtree_decode_cuda(kdtr_ddtree_decode_params* c, void*) {
  return guarded([&] {
    null_params("ddtree_decode", c);
    fail(KDTR_ERR_NOT_SUPPORTED,
         "ddtree_decode: no CUDA entry in this library (kdtr_ddtree_decode --backend cuda runs the device loop)");
    return KDTR_OK;
  });
}

#endif  // KDTR_NO_CUDA

}  // extern "C"
