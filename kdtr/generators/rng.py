"""The generators' random numbers: kdtr's own draws from PCG64's raw 64-bit output.

numpy guarantees the bit stream of its bit generators (``PCG64`` seeded through
``SeedSequence``) across versions, but not the values of ``Generator`` methods (NEP 19:
``standard_normal``, ``gamma``, ``choice`` ... may change for speed or a bug fix), and its
float transcendentals differ between CPUs. :class:`Rng` therefore keeps only
``PCG64(seed).random_raw`` from numpy and turns the raw words into values itself, with
integer arithmetic, IEEE elementwise operations and kdtr's own log (kdtr/detmath.py):
the same draws for a seed on every host and numpy version.

Its methods are a subset of ``numpy.random.Generator``'s, with the same names, arguments
and meaning (not the same values), so generator functions take either: tests may pass a
numpy Generator, ``generate()`` always uses :class:`Rng`.

- ``random``: the top 53 bits of a word, times 2^-53 (as numpy does).
- ``integers(low, high)``: low + floor(word * (high - low) / 2^64) (Lemire's multiply, no
  rejection: a bias below (high - low) / 2^64), for ranges up to 2^32.
- ``standard_normal``: Marsaglia's polar method (kdtr's log, IEEE sqrt).
- ``gamma``: Marsaglia and Tsang's method, with the U^(1/a) boost for shape a < 1.
- ``choice``: uniform by ``integers``; weighted by the cumulative weights (summed left to
  right in Python floats) searched with ``random``; without replacement by drawing until
  enough distinct values are seen, in draw order.
"""

from __future__ import annotations

import math
from itertools import accumulate
from typing import Any

import numpy as np

from kdtr.detmath import exp, log

_MASK32 = np.uint64(0xFFFFFFFF)
_TWO_M53 = math.ldexp(1.0, -53)


def _shape(size) -> tuple[int, ...]:
    if size is None:
        return ()
    return (int(size),) if np.ndim(size) == 0 else tuple(int(s) for s in size)


class Rng:
    """Host-independent random draws for a seed (module docstring).

    Args:
        seed: an int >= 0 (as ``numpy.random.default_rng``: PCG64 seeded by SeedSequence).
    """

    def __init__(self, seed: int) -> None:
        self._bg = np.random.PCG64(seed)

    def raw(self, n: int) -> np.ndarray:
        """n raw 64-bit words (uint64 [n]) of the PCG64 stream."""
        return self._bg.random_raw(int(n)) if n else np.zeros(0, np.uint64)

    def random(self, size=None) -> Any:
        """Uniform floats in [0, 1): float for ``size`` None, else float64 array of that shape."""
        if size is None:
            return (int(self._bg.random_raw()) >> 11) * _TWO_M53
        shape = _shape(size)
        return ((self.raw(int(np.prod(shape))) >> np.uint64(11)).astype(np.float64) * _TWO_M53).reshape(shape)

    def uniform(self, low: float = 0.0, high: float = 1.0, size=None) -> Any:
        """low + (high - low) * random(size)."""
        u = self.random(size)
        return low + (high - low) * u

    def integers(self, low: int, high: int | None = None, size=None, dtype=np.int64) -> Any:
        """Integers in [low, high) ([0, low) when ``high`` is None): an int for ``size`` None,
        else an array of that shape and ``dtype``.

        Raises:
            ValueError: high <= low, or a range over 2^32.
        """
        if high is None:
            low, high = 0, low
        low, high = int(low), int(high)
        span = high - low
        if span <= 0:
            raise ValueError(f"integers: low >= high ({low} >= {high})")
        if span > 1 << 32:
            raise ValueError(f"integers: range {span} over 2^32")
        if size is None:
            return low + ((int(self._bg.random_raw()) * span) >> 64)
        shape = _shape(size)
        w = self.raw(int(np.prod(shape)))
        r = np.uint64(span)
        hi = (w >> np.uint64(32)) * r + (((w & _MASK32) * r) >> np.uint64(32))  # = floor(w * span / 2^32)
        v = (hi >> np.uint64(32)).astype(np.int64) + low  # = floor(w * span / 2^64)
        return v.reshape(shape).astype(dtype)

    def standard_normal(self, size=None) -> Any:
        """Standard normal floats (Marsaglia's polar method): float or float64 array."""
        shape = _shape(size)
        n = int(np.prod(shape)) if shape else 1
        parts: list[np.ndarray] = []
        have = 0
        while have < n:
            pairs = (n - have + 1) // 2
            pairs = pairs + pairs // 3 + 8  # the acceptance is pi/4
            u = 2.0 * self.random(2 * pairs) - 1.0
            x, y = u[0::2], u[1::2]
            s = x * x + y * y
            ok = (s < 1.0) & (s > 0.0)
            x, y, s = x[ok], y[ok], s[ok]
            f = np.sqrt(-2.0 * log(s) / s)
            z = np.stack([x * f, y * f], axis=-1).reshape(-1)
            parts.append(z)
            have += z.size
        out = np.concatenate(parts)[:n]
        return float(out[0]) if size is None else out.reshape(shape)

    def gamma(self, shape, scale: float = 1.0, size=None) -> Any:
        """Gamma(shape, scale) floats (Marsaglia and Tsang; shape < 1 boosted by U^(1/shape)).

        ``shape`` is a float or an array (the output's shape when ``size`` is None).

        Raises:
            ValueError: a shape <= 0 or not finite.
        """
        a = np.asarray(shape, np.float64)
        out_shape = _shape(size) if size is not None else a.shape
        a = np.broadcast_to(a, out_shape).reshape(-1)
        if not (np.isfinite(a) & (a > 0)).all():
            raise ValueError("gamma: shape must be finite and > 0")
        boost = a < 1.0
        ae = np.where(boost, a + 1.0, a)
        d = ae - 1.0 / 3.0
        c = 1.0 / np.sqrt(9.0 * d)
        g = np.zeros(a.size)
        todo = np.arange(a.size)
        while todo.size:
            x = self.standard_normal(todo.size)
            u = self.random(todo.size)
            t = 1.0 + c[todo] * x
            v = t * t * t
            pos = v > 0
            with np.errstate(divide="ignore", invalid="ignore"):
                ok = pos & (log(u) < 0.5 * x * x + d[todo] - d[todo] * v + d[todo] * log(np.where(pos, v, 1.0)))
            g[todo[ok]] = d[todo[ok]] * v[ok]
            todo = todo[~ok]
        if boost.any():
            idx = np.flatnonzero(boost)
            u = self.random(idx.size)
            with np.errstate(divide="ignore"):
                g[idx] = g[idx] * exp(log(u) / a[idx])
        g = g * scale
        return float(g[0]) if size is None and a.ndim == 0 and np.ndim(shape) == 0 else g.reshape(out_shape)

    def choice(self, a, size=None, replace: bool = True, p=None) -> Any:
        """Elements of ``a`` (an array, or range(a) for an int): uniform, weighted by ``p``,
        or distinct (``replace=False``, uniform only). A scalar for ``size`` None.

        Raises:
            ValueError: an empty population, p of another length or with a negative or
                non-finite weight or a zero total, more distinct draws than elements, or
                p with replace=False.
        """
        pop = np.arange(a) if np.ndim(a) == 0 else np.asarray(a)
        n = pop.shape[0]
        if n == 0:
            raise ValueError("choice: empty population")
        shape = _shape(size)
        count = int(np.prod(shape)) if shape else 1
        if not replace:
            if p is not None:
                raise ValueError("choice: weights without replacement are not supported")
            if count > n:
                raise ValueError(f"choice: {count} distinct draws from {n} elements")
            seen: set[int] = set()
            picked: list[int] = []
            while len(picked) < count:
                for v in self.integers(0, n, max(8, 2 * (count - len(picked)))).tolist():
                    if v not in seen:
                        seen.add(v)
                        picked.append(v)
                        if len(picked) == count:
                            break
            idx = np.array(picked, np.int64)
        elif p is None:
            idx = self.integers(0, n, count)
        else:
            w = [float(x) for x in np.asarray(p, np.float64).reshape(-1)]
            if len(w) != n or any(not np.isfinite(x) or x < 0 for x in w):
                raise ValueError("choice: p must hold one finite weight >= 0 per element")
            cdf = list(accumulate(w))  # left to right, Python floats (IEEE)
            if cdf[-1] <= 0:
                raise ValueError("choice: the weights sum to 0")
            cdf_n = np.array([c / cdf[-1] for c in cdf])
            idx = np.minimum(np.searchsorted(cdf_n, self.random(count), side="right"), n - 1)
        vals = pop[idx]
        return vals[0] if size is None else vals.reshape(shape + pop.shape[1:])
