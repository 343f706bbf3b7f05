"""The closed KDTR dtype set (docs/kdtr-format.md section 2) and its numpy mapping.

bf16 maps to ``ml_dtypes.bfloat16``, a real numpy dtype, so bf16 tensors load as arrays
that numpy can widen exactly with ``.astype(np.float32)``. ml_dtypes is imported on the
first use of bf16 only (:func:`bfloat16`: reading or writing a bf16 tensor, asking for the
bf16 entry's ``numpy``): importing it costs more than a second of CPU, and most commands
(``kdtr list``, ``kdtr --help``, a run of integer or f32 goldens) never touch bf16.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

_BF16: list[np.dtype] = []  # the bf16 numpy dtype, once ml_dtypes is imported


def bfloat16() -> np.dtype:
    """``np.dtype(ml_dtypes.bfloat16)``, importing ml_dtypes on the first call.

    Raises ImportError when ml_dtypes is not installed (it is a dependency of kdtr)."""
    if not _BF16:
        import ml_dtypes

        _BF16.append(np.dtype(ml_dtypes.bfloat16))
    return _BF16[0]


@dataclass(frozen=True)
class Dtype:
    """One KDTR dtype: its code in the file, its short name, its item size in bytes and
    its numpy dtype (:attr:`numpy`; bf16's is resolved, importing ml_dtypes, on first use)."""

    code: int
    name: str
    itemsize: int
    _numpy: np.dtype | None  # None for bf16: see bfloat16()

    @property
    def numpy(self) -> np.dtype:
        return self._numpy if self._numpy is not None else bfloat16()


def _fixed(code: int, name: str, dt) -> Dtype:
    dt = np.dtype(dt)
    return Dtype(code, name, dt.itemsize, dt)


_TABLE = [
    _fixed(1, "bool", np.bool_),
    _fixed(2, "u8", "<u1"),
    _fixed(3, "i8", "<i1"),
    _fixed(4, "i16", "<i2"),
    _fixed(5, "u16", "<u2"),
    _fixed(6, "i32", "<i4"),
    _fixed(7, "u32", "<u4"),
    _fixed(8, "i64", "<i8"),
    _fixed(9, "u64", "<u8"),
    _fixed(10, "f16", "<f2"),
    Dtype(11, "bf16", 2, None),  # ml_dtypes.bfloat16, resolved on first use
    _fixed(12, "f32", "<f4"),
    _fixed(13, "f64", "<f8"),
]

DTYPE_BY_CODE: dict[int, Dtype] = {d.code: d for d in _TABLE}
DTYPE_BY_NAME: dict[str, Dtype] = {d.name: d for d in _TABLE}


def code_of_dtype(dt: np.dtype) -> int | None:
    """The KDTR code of a numpy dtype, or None if KDTR cannot store it."""
    for d in _TABLE:
        if d._numpy is not None:
            if dt == d._numpy:
                return d.code
        elif "ml_dtypes" in sys.modules and dt == bfloat16():  # without ml_dtypes no dtype is bf16
            return d.code
    return None


def name_of_dtype(dt: np.dtype) -> str:
    """The KDTR short name of a numpy dtype (``"i32"``), or ``str(dt)`` if it has none."""
    code = code_of_dtype(dt)
    return DTYPE_BY_CODE[code].name if code is not None else str(dt)
