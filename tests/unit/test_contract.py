"""kdtr.contract: validation of every field, metadata round trip, every rejection."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kdtr
from kdtr.contract import EXACT, Contract

ROUND_TRIP = [
    Contract(),
    EXACT,
    Contract("allclose"),
    Contract("allclose", atol=1e-5, rtol=1e-6),
    Contract("allclose", atol=0.0, rtol=0.5, max_ulp=0, nan="equal"),
    Contract("allclose", atol=1e300, rtol=2.0**-24, max_ulp=2**40, nan="fail"),
    Contract("allclose", atol=5e-324, rtol=0.0, max_ulp=-1, nan="equal"),
]


@pytest.mark.parametrize("c", ROUND_TRIP, ids=str)
@pytest.mark.parametrize("name", ["lse", "verify_attn.lse"])
def test_round_trip(c: Contract, name: str) -> None:
    md = c.to_metadata(name)
    assert all(k.startswith(f"contract.{name}.") for k in md)
    back = Contract.from_metadata(md, name)
    assert back == c
    assert back.to_metadata(name) == md
    assert type(back.atol) is float and type(back.rtol) is float and type(back.max_ulp) is int


def test_round_trip_through_a_file(tmp_path) -> None:
    c = Contract("allclose", atol=1e-5, rtol=3e-7, max_ulp=4, nan="equal")
    path = tmp_path / "c.kdtr"
    kdtr.save(path, {"expected.x": np.zeros(2, np.float32)}, {**c.to_metadata("x"), **EXACT.to_metadata("y")})
    md = kdtr.load(path).metadata
    assert Contract.from_metadata(md, "x") == c and Contract.from_metadata(md, "y") == EXACT


def test_exact_metadata_is_kind_alone() -> None:
    assert EXACT.to_metadata("x") == {"contract.x.kind": "exact"}


def test_numbers_are_normalised() -> None:
    c = Contract("allclose", atol=1, rtol=np.float32(0.5), max_ulp=np.int64(3))
    assert (c.atol, c.rtol, c.max_ulp) == (1.0, 0.5, 3)
    assert type(c.atol) is float and type(c.rtol) is float and type(c.max_ulp) is int


def test_every_committed_golden_contract_parses_and_round_trips(repo_root) -> None:
    files = sorted((repo_root / "golden").glob("*/*.kdtr"))
    assert files, "no committed goldens found"
    for f in files:
        g = kdtr.load(f, verify=False)
        for t in g.tensors:
            if t.startswith("expected."):
                name = t[len("expected.") :]
                c = Contract.from_metadata(g.metadata, name)
                prefix = f"contract.{name}."
                mine = {k: v for k, v in g.metadata.items() if k.startswith(prefix) and "." not in k[len(prefix) :]}
                assert c.to_metadata(name) == mine, f"{f}: {name}"


BAD_FIELDS = [
    ({"atol": math.nan}, "atol"),
    ({"atol": math.inf}, "atol"),
    ({"atol": -math.inf}, "atol"),
    ({"atol": -1e-9}, "atol"),
    ({"atol": True}, "atol"),
    ({"atol": np.bool_(False)}, "atol"),
    ({"atol": "1e-5"}, "atol"),
    ({"atol": None}, "atol"),
    ({"atol": np.float32("nan")}, "atol"),
    ({"rtol": math.nan}, "rtol"),
    ({"rtol": math.inf}, "rtol"),
    ({"rtol": -0.5}, "rtol"),
    ({"rtol": False}, "rtol"),
    ({"rtol": "0"}, "rtol"),
    ({"max_ulp": -2}, "max_ulp"),
    ({"max_ulp": 1.0}, "max_ulp"),
    ({"max_ulp": 1.5}, "max_ulp"),
    ({"max_ulp": True}, "max_ulp"),
    ({"max_ulp": "3"}, "max_ulp"),
    ({"max_ulp": math.nan}, "max_ulp"),
    ({"nan": "ignore"}, "nan"),
    ({"nan": None}, "nan"),
    ({"nan": True}, "nan"),
]


@pytest.mark.parametrize("kwargs,field", BAD_FIELDS, ids=lambda x: repr(x))
def test_constructor_rejects(kwargs, field) -> None:
    with pytest.raises(ValueError, match=f"contract {field}"):
        Contract("allclose", **kwargs)


@pytest.mark.parametrize("kind", ["close", "EXACT", "", None, 1, True])
def test_unknown_kind(kind) -> None:
    with pytest.raises(ValueError, match="contract kind"):
        Contract(kind)


@pytest.mark.parametrize(
    "kwargs,field",
    [({"atol": 1e-3}, "atol"), ({"rtol": 1e-6}, "rtol"), ({"max_ulp": 0}, "max_ulp"), ({"nan": "equal"}, "nan")],
)
def test_exact_takes_no_tolerance(kwargs, field) -> None:
    with pytest.raises(ValueError, match=f"contract {field}: an exact contract takes no"):
        Contract("exact", **kwargs)


def test_to_metadata_rejects_bad_name() -> None:
    for name in ("", None, 3):
        with pytest.raises(ValueError, match="output name"):
            EXACT.to_metadata(name)
        with pytest.raises(ValueError, match="output name"):
            Contract.from_metadata({"contract..kind": "exact"}, name)


def _allclose_md(**over) -> dict:
    md = Contract("allclose", atol=1e-5, rtol=1e-6).to_metadata("lse")
    for k, v in over.items():
        if v is None:
            md.pop(f"contract.lse.{k}")
        else:
            md[f"contract.lse.{k}"] = v
    return md


def test_from_metadata_missing_is_keyerror() -> None:
    with pytest.raises(KeyError, match="contract.lse.kind"):
        Contract.from_metadata({"op": "verify_attn"}, "lse")
    # another output whose name extends this one is not this one's contract
    with pytest.raises(KeyError):
        Contract.from_metadata(EXACT.to_metadata("verify_attn.lse"), "verify_attn")


def test_from_metadata_defaults() -> None:
    c = Contract.from_metadata(_allclose_md(max_ulp=None, nan=None), "lse")
    assert c == Contract("allclose", atol=1e-5, rtol=1e-6, max_ulp=-1, nan="fail")
    assert Contract.from_metadata(_allclose_md(atol=0, rtol=1), "lse").rtol == 1.0  # int metadata is a number


BAD_METADATA = [
    (_allclose_md(atol="1e-5"), "contract.lse.atol"),
    (_allclose_md(atol=True), "contract.lse.atol"),
    (_allclose_md(atol=math.nan), "contract.lse.atol"),
    (_allclose_md(atol=math.inf), "contract.lse.atol"),
    (_allclose_md(atol=-1.0), "contract.lse.atol"),
    (_allclose_md(rtol="x"), "contract.lse.rtol"),
    (_allclose_md(rtol=-math.inf), "contract.lse.rtol"),
    (_allclose_md(max_ulp=2.0), "contract.lse.max_ulp"),
    (_allclose_md(max_ulp="4"), "contract.lse.max_ulp"),
    (_allclose_md(max_ulp=False), "contract.lse.max_ulp"),
    (_allclose_md(max_ulp=-7), "contract.lse.max_ulp"),
    (_allclose_md(nan="skip"), "contract.lse.nan"),
    (_allclose_md(nan=1), "contract.lse.nan"),
    (_allclose_md(kind="approx"), "contract.lse.kind"),
    (_allclose_md(kind=0), "contract.lse.kind"),
    (_allclose_md(kind=None), "contract.lse.kind"),  # atol given, kind missing
    (_allclose_md(atol=None), "contract.lse.atol"),  # allclose requires atol
    (_allclose_md(rtol=None), "contract.lse.rtol"),
    ({**_allclose_md(), "contract.lse.atoll": 1e-3}, "contract.lse.atoll"),
    ({"contract.lse.kind": "exact", "contract.lse.atol": 1e-3}, "contract.lse.atol"),
    ({"contract.lse.kind": "exact", "contract.lse.nan": "fail"}, "contract.lse.nan"),
    ({"contract.lse.kind": "exact", "contract.lse.max_ulp": -1}, "contract.lse.max_ulp"),
]


@pytest.mark.parametrize("md,key", BAD_METADATA, ids=lambda x: x if isinstance(x, str) else "")
def test_from_metadata_rejects_naming_the_key(md, key) -> None:
    with pytest.raises(ValueError) as ei:
        Contract.from_metadata(md, "lse")
    assert str(ei.value).startswith(key + ":"), str(ei.value)


def test_describe() -> None:
    assert EXACT.describe() == "exact"
    assert Contract("allclose", atol=1e-5, rtol=0.0).describe() == "allclose(atol=1e-05, rtol=0, nan=fail)"
    assert "max_ulp=3" in Contract("allclose", max_ulp=3).describe()
