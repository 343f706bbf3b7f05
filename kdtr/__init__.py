"""kdtr: golden-file conformance harness for greedy DDTree speculative-decoding kernels.

Public API: :func:`save`, :func:`load`, :class:`KdtrError` (the KDTR v1 format,
docs/kdtr-format.md), the numpy reference ops in :mod:`kdtr.ops`, and the comparison
engine in :mod:`kdtr.compare`.
"""

import os as _os
import sys as _sys

# One BLAS thread: the harness starts binaries (fork + exec) from worker threads while other
# threads run numpy matmuls (the references, kdtr.detmath.matmul_exact), and OpenBLAS's
# pre-fork handler joins its own worker threads, which wait for the GIL the forking thread
# holds: a deadlock (seen in `kdtr run --invariance` on ddtree_decode, 2026-12-03). kdtr's
# results never depend on BLAS threading (every golden's bits are exact in any order), so
# this costs speed only; set before numpy loads, and never over a value the user set.
if "numpy" not in _sys.modules:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        _os.environ.setdefault(_var, "1")

from .errors import KdtrError  # noqa: E402
from .format import KdtrFile, load, save  # noqa: E402

__all__ = ["KdtrError", "KdtrFile", "load", "save"]
__version__ = "0.1.0"
