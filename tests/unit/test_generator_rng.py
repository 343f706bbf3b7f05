"""kdtr.generators.rng.Rng: the generators' draws, made by kdtr from PCG64's raw stream.

The fingerprint pins the draws of one seed: it holds on every numpy version whose PCG64
and SeedSequence keep their stream (NEP 19 promises it) and on every CPU, and it fails
when kdtr's own transforms change (bump the generators' GENERATOR_VERSION then).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kdtr.generators.rng import Rng

FINGERPRINT = "5b50707134ebfd64b492e47ad88f49677736afdcd09dcde570ae0e21846de197"


def draws(r: Rng) -> list:
    return [r.random(5), r.integers(0, 32000, 5), r.integers(-2, 3, (2, 3)), r.standard_normal(7),
            r.gamma(np.array([0.05, 0.5, 1.0, 3.0])), r.uniform(0.03, 1.0, 3),
            r.choice(np.array([0.0, -0.5, -1.0, -2.0]), 6, p=[0.4, 0.3, 0.2, 0.1]), r.choice(32000, 8, replace=False),
            np.array([r.random(), r.integers(5, 9), r.standard_normal()])]


def test_fingerprint_of_one_seed():
    h = hashlib.sha256()
    for p in draws(Rng(12345)):
        a = np.ascontiguousarray(p)
        h.update(str(a.dtype).encode())
        h.update(a.tobytes())
    assert h.hexdigest() == FINGERPRINT


def test_raw_stream_is_numpys_pcg64():
    assert np.array_equal(Rng(7).raw(4), np.random.PCG64(7).random_raw(4))
    assert Rng(7).random() == np.random.default_rng(7).random()  # the same 53-bit rule


def test_scalars_and_arrays_agree():
    a, b = Rng(3), Rng(3)
    assert [a.integers(10, 1000) for _ in range(5)] == b.integers(10, 1000, 5).tolist()
    assert [a.random() for _ in range(5)] == b.random(5).tolist()
    assert a.integers(2**32) == b.integers(0, 2**32, 1)[0]  # the widest range: word >> 32


def test_distributions_are_sane():
    r = Rng(11)
    z = r.standard_normal(200_000)
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1) < 0.02
    k = r.integers(-2, 3, 100_000)
    assert set(np.unique(k).tolist()) == {-2, -1, 0, 1, 2} and abs((k == 2).mean() - 0.2) < 0.01
    for shape in (0.05, 0.5, 1.0, 4.0):
        g = r.gamma(shape, size=50_000)
        assert (g >= 0).all() and abs(g.mean() - shape) < 0.05 * max(shape, 0.3), shape
    c = r.choice(np.array([10, 20, 30]), 60_000, p=[0.5, 0.3, 0.2])
    assert abs((c == 10).mean() - 0.5) < 0.01 and abs((c == 30).mean() - 0.2) < 0.01
    d = r.choice(50, 50, replace=False)
    assert sorted(d.tolist()) == list(range(50))
    u = r.uniform(0.03, 1.0, (4, 5))
    assert u.shape == (4, 5) and (u >= 0.03).all() and (u < 1.0).all()


def test_refusals():
    r = Rng(0)
    with pytest.raises(ValueError, match="low >= high"):
        r.integers(3, 3)
    with pytest.raises(ValueError, match="over 2\\^32"):
        r.integers(0, 2**33)
    with pytest.raises(ValueError, match="shape"):
        r.gamma(0.0)
    with pytest.raises(ValueError, match="one finite weight"):
        r.choice(3, p=[0.5, 0.5])
    with pytest.raises(ValueError, match="distinct draws"):
        r.choice(3, 4, replace=False)
    with pytest.raises(ValueError, match="empty"):
        r.choice([])
