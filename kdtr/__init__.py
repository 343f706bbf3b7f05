"""kdtr: golden-file conformance harness for greedy DDTree speculative-decoding kernels.

Public API: :func:`save`, :func:`load`, :class:`KdtrError` (the KDTR v1 format,
docs/kdtr-format.md), the numpy reference ops in :mod:`kdtr.ops`, and the comparison
engine in :mod:`kdtr.compare`.
"""

from .errors import KdtrError
from .format import KdtrFile, load, save

__all__ = ["KdtrError", "KdtrFile", "load", "save"]
__version__ = "0.1.0"
