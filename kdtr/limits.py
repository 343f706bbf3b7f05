"""Resource limits of the reference ops and the test binaries (docs/binaries.md, "Resource limits").

A golden's inputs cost what the file holds; what an op allocates on top of them is sized by
dims and metadata the caller declares -- ``max_budget`` (``n_max``) above all, which no
input shape bounds: B = D = K = 1 with N = 2^31 - 2 implies a 4.6e18-byte visibility
output. So before allocating, the reference ops and the C++ binaries compute the bytes of

- the op's outputs, all together, as the contract defines them (f32 ``out`` and ``lse``,
  u8 ``visibility``, ...), against :data:`MAX_OUTPUT_BYTES`, and
- their largest working array (the "scratch"), against :data:`MAX_SCRATCH_BYTES`,

and refuse what exceeds them: the Python reference with a ``ValueError`` naming the
argument, a binary with exit 2 and one line naming the file and the field. The values are
the same as ``kMaxOutputBytes`` / ``kMaxScratchBytes`` in cuda_tests/include/kdtr_cli.hpp
(tests/binaries/test_binary_limits.py checks it). The environment variables
``KDTR_MAX_OUTPUT_BYTES`` and ``KDTR_MAX_SCRATCH_BYTES`` (decimal byte counts) replace them
for one process -- and for the binaries it starts, which inherit the environment.
"""

from __future__ import annotations

import os

MAX_OUTPUT_BYTES = 4 << 30
"""Default limit on the bytes of one op call's outputs, all together (4 GiB)."""

MAX_SCRATCH_BYTES = 1 << 30
"""Default limit on an op's largest working array (1 GiB)."""

MAX_OUTPUT_BYTES_ENV = "KDTR_MAX_OUTPUT_BYTES"
MAX_SCRATCH_BYTES_ENV = "KDTR_MAX_SCRATCH_BYTES"


def _limit(env: str, default: int) -> int:
    """The byte count in ``$env`` if set and non-empty, else ``default``.

    Raises:
        ValueError: ``$env`` is not a decimal integer >= 0 (the message names the variable).
    """
    text = os.environ.get(env, "")
    if text == "":
        return default
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"environment {env}={text!r}: not a byte count (a decimal integer, e.g. {default})")
    return int(text)


def max_output_bytes() -> int:
    """The output limit in force: ``$KDTR_MAX_OUTPUT_BYTES`` or :data:`MAX_OUTPUT_BYTES`.

    Raises:
        ValueError: the variable is set to something other than a decimal integer.
    """
    return _limit(MAX_OUTPUT_BYTES_ENV, MAX_OUTPUT_BYTES)


def max_scratch_bytes() -> int:
    """The scratch limit in force: ``$KDTR_MAX_SCRATCH_BYTES`` or :data:`MAX_SCRATCH_BYTES`.

    Raises:
        ValueError: the variable is set to something other than a decimal integer.
    """
    return _limit(MAX_SCRATCH_BYTES_ENV, MAX_SCRATCH_BYTES)


def bytes_text(n: int) -> str:
    """``4294967296 bytes (4 GiB)``; ``4.61e18 bytes (4 EiB)`` from 10^15 on (as the binaries print)."""
    s = f"{n} bytes" if n < 10**15 else f"{n:.3g}".replace("e+", "e") + " bytes"
    v, unit = float(n), ""
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"):
        if v < 1024.0:
            break
        v, unit = v / 1024.0, u
    return f"{s} ({v:.3g} {unit})" if unit else s


def check_output_bytes(nbytes: int, argument: str, dims: str) -> None:
    """Refuse outputs of ``nbytes`` bytes over :func:`max_output_bytes`.

    Args:
        nbytes: the bytes of every output of the call (Python int: no overflow).
        argument: the argument that implies the size, named in the message (e.g. ``"n_max"``).
        dims: the dims behind ``nbytes``, for the message (e.g. ``"B = 1, T = n_max + 1 = 2147483647"``).

    Raises:
        ValueError: ``"<argument>: outputs would need <n> bytes for <dims>, over the limit of
            <limit> bytes; set KDTR_MAX_OUTPUT_BYTES to a larger byte count to allow it"``.
    """
    _check(nbytes, max_output_bytes(), "outputs", argument, dims, MAX_OUTPUT_BYTES_ENV)


def check_scratch_bytes(nbytes: int, argument: str, dims: str) -> None:
    """Refuse a working array of ``nbytes`` bytes over :func:`max_scratch_bytes`.

    Args and the message: as :func:`check_output_bytes`, with "scratch" and
    KDTR_MAX_SCRATCH_BYTES.

    Raises:
        ValueError: over the limit.
    """
    _check(nbytes, max_scratch_bytes(), "scratch", argument, dims, MAX_SCRATCH_BYTES_ENV)


def _check(nbytes: int, limit: int, what: str, argument: str, dims: str, env: str) -> None:
    if nbytes > limit:
        raise ValueError(
            f"{argument}: {what} would need {bytes_text(nbytes)} for {dims}, over the limit of "
            f"{bytes_text(limit)}; set {env} to a larger byte count to allow it"
        )


def tree_build_output_bytes(b: int, t: int) -> int:
    """Bytes of tree_build's outputs for ``b`` requests of ``t`` slots (the op table in kdtr_ops.hpp alike).

    node_count, status i32 [B]; node_token_ids i64 [B,T]; node_depths, parents,
    next_token, next_sibling i32 [B,T]; visibility u8 [B,T,T].
    """
    return b * 8 + b * t * 24 + b * t * t


def verify_attn_output_bytes(b: int, t: int, h: int, d_v: int) -> int:
    """Bytes of verify_attn's outputs: out f32 [B,T,H,d_v] and lse f32 [B,T,H]."""
    return b * t * h * d_v * 4 + b * t * h * 4


def tree_accept_output_bytes(b: int, t: int) -> int:
    """Bytes of tree_accept's outputs: accepted_count, status i32 [B]; accepted_path i32 [B,T]; proposed i64 [B,T]."""
    return b * 8 + b * t * 12


def greedy_step_output_bytes(b: int, t: int, h: int, d_v: int) -> int:
    """Bytes of greedy_step's outputs: tree_build's, verify_attn's and tree_accept's, for T = max_budget + 1."""
    return tree_build_output_bytes(b, t) + verify_attn_output_bytes(b, t, h, d_v) + tree_accept_output_bytes(b, t)


def check_cpu_scratch_bytes(nbytes: int, argument: str, dims: str) -> None:
    """Refuse a CPU backend's working memory of ``nbytes`` bytes over :func:`max_scratch_bytes`,
    in the words of the binaries (``"<argument>: CPU backend scratch would need ..."``):
    for kdtr.kernels, whose CPU entries run the binaries' CPU backends.

    Raises:
        ValueError: over the limit.
    """
    _check(nbytes, max_scratch_bytes(), "CPU backend scratch", argument, dims, MAX_SCRATCH_BYTES_ENV)


# The CPU backends' scratch (cuda_tests/include/kdtr_cli.hpp, tree_build_scratch_bytes and
# verify_attn_scratch_bytes; the struct sizes of cuda_tests/kernels/tree_build.cuh).
TREE_BUILD_CAND_BYTES = 24  # sizeof(TreeBuildCand): a double and four int32
TREE_SELECT_BINS = 1024  # kTreeSelectBins


def tree_build_cpu_scratch_bytes(n: int, d: int, k: int, select: bool) -> int:
    """Bytes of the CPU tree_build's scratch (allocated once, whatever B, so also for B = 0):
    the heap's N + 1 candidates, 5 slot arrays of T = N + 1 int32, an ancestor path of
    min(D, N) + 1 int32, and for the select build its candidate set (room for
    ``tree_select_room(N, K)`` entries: the capacity N + N/8 + 64 and up to three times as
    many again, at most N * K more) and the log-probs widened to float64 (D * K)."""
    t = n + 1
    total = t * TREE_BUILD_CAND_BYTES + t * 5 * 4 + (min(d, n) + 1) * 4
    if select:
        cap = n + n // 8 + 64
        room = cap + (3 * cap if k > 0 and n > (3 * cap) // k else n * k)  # tree_select_room
        total += room * (8 + 8 + 4 * 5) + TREE_SELECT_BINS * 4 + 16 + ((room + 15) // 16) * 16 + d * k * 8
    return total


def verify_attn_cpu_scratch_bytes(keys: int, dqk: int, d_v: int) -> int:
    """Bytes of the CPU verify_attn's scratch for a request attending to ``keys`` keys
    (prefix_len + tree_len): the keys widened to float64 [keys, Dqk], scores float64 and a
    visible flag u8 per key, the q row float64 [Dqk] and an accumulator float64 [d_v]."""
    return keys * dqk * 8 + keys * (8 + 1) + (dqk + d_v) * 8
