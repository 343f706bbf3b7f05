"""The closed KDTR dtype set (docs/kdtr-format.md section 2) and its numpy mapping.

bf16 maps to ``ml_dtypes.bfloat16``, a real numpy dtype, so bf16 tensors load as arrays
that numpy can widen exactly with ``.astype(np.float32)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class Dtype:
    """One KDTR dtype: its code in the file, its short name and its numpy dtype."""

    code: int
    name: str
    numpy: np.dtype

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


_TABLE = [
    Dtype(1, "bool", np.dtype(np.bool_)),
    Dtype(2, "u8", np.dtype("<u1")),
    Dtype(3, "i8", np.dtype("<i1")),
    Dtype(4, "i16", np.dtype("<i2")),
    Dtype(5, "u16", np.dtype("<u2")),
    Dtype(6, "i32", np.dtype("<i4")),
    Dtype(7, "u32", np.dtype("<u4")),
    Dtype(8, "i64", np.dtype("<i8")),
    Dtype(9, "u64", np.dtype("<u8")),
    Dtype(10, "f16", np.dtype("<f2")),
    Dtype(11, "bf16", np.dtype(ml_dtypes.bfloat16)),
    Dtype(12, "f32", np.dtype("<f4")),
    Dtype(13, "f64", np.dtype("<f8")),
]

DTYPE_BY_CODE: dict[int, Dtype] = {d.code: d for d in _TABLE}
DTYPE_BY_NAME: dict[str, Dtype] = {d.name: d for d in _TABLE}


def code_of_dtype(dt: np.dtype) -> int | None:
    """The KDTR code of a numpy dtype, or None if KDTR cannot store it."""
    for d in _TABLE:
        if dt == d.numpy:
            return d.code
    return None


def name_of_dtype(dt: np.dtype) -> str:
    """The KDTR short name of a numpy dtype (``"i32"``), or ``str(dt)`` if it has none."""
    code = code_of_dtype(dt)
    return DTYPE_BY_CODE[code].name if code is not None else str(dt)
