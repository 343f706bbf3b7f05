/* kdtr_abi.h -- what every op's parameter header (<op>_params.h) shares: the field
 * declarator of the X-macro field lists, and the dtype codes of an input that takes
 * several dtypes.
 *
 * An op's parameter struct is laid out by one rule from the op's spec (kdtr.ops.OPS;
 * docs/binaries.md, "The op signature"), the same for the kernels, the CPU cores, the
 * binaries and libkdtr_kernels.so, and rebuilt from the spec by kdtr/kernels.py:
 *   1. one pointer per input tensor (rank >= 1), in spec order: `const T*` for a fixed
 *      dtype, `const void*` for one of several;
 *   2. one pointer per output, in spec order, named as the output with '.' -> '_';
 *   3. one pointer per buffer of the spec's abi_buffers (workspace or optional outputs);
 *   4. each scalar input (rank 0) that is not a dim, as a value of its dtype;
 *   5. each dim of the spec's abi_dims, as int64_t, in that order (a dim may be a scalar
 *      input: verify_attn's d_v);
 *   6. int32_t dtype, where an input takes several dtypes: the index of the tensor's dtype
 *      in the spec's "a|b" list (KDTR_DTYPE_* below);
 *   7. where the op has kernels: int32_t kernel (0 = auto, k + 1 = the spec's kernels[k]),
 *      then const char* kernel_ran (out: the kernel instance that ran, a static string).
 * Fields are fixed-width C types with their natural alignment; C99 and C++ alike.
 */
#ifndef KDTR_ABI_H
#define KDTR_ABI_H

#include <stdint.h>

/* One field of an X-macro field list: X(type, name). */
#define KDTR_ABI_DECLARE(type, name) type name;

/* verify_attn / greedy_step: the dtype of q and kv_cache (index in "f32|bf16"). */
enum { KDTR_DTYPE_F32 = 0, KDTR_DTYPE_BF16 = 1 };

#endif /* KDTR_ABI_H */
