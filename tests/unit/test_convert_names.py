"""A conversion keeps every tensor name exactly or refuses, naming it (kdtr/convert.py;
docs/convert.md "Names").

npz cannot hold a name with a NUL (zip cuts member names there: "w.npy\\x00junk" came back
as "w", and two such names as two members "a"), nor ``X.npy`` beside a tensor ``X`` (np.load
looks a key up as a member name first, so it would read X's member under that name).
Everything else a KDTR name can be survives both containers, checked by reading the file
back with kdtr and with the container's own reader.
"""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy
from click.testing import CliRunner

import kdtr
from kdtr import convert as kconvert
from kdtr.cli.convert_cmd import convert as convert_cmd


def run(*args: object):
    return CliRunner().invoke(convert_cmd, [str(a) for a in args], catch_exceptions=False)


def refused(r, *fragments: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kdtr: error: "), r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def _golden(path, names, metadata=None) -> None:
    kdtr.save(path, {n: np.arange(i + 2, dtype=np.int32) for i, n in enumerate(names)}, metadata or {})


@pytest.mark.parametrize("names, bad", [
    (["w.npy\x00junk"], "w.npy\\x00junk"),
    (["a.npy\x00x", "a.npy\x00y"], "a.npy\\x00x"),
    (["a", "a.npy"], "a.npy"),
    (["a.npy", "a"], "a.npy"),
])
def test_npz_refuses_a_name_it_cannot_keep(tmp_path, names, bad):
    _golden(tmp_path / "g.kdtr", names)
    refused(run(tmp_path / "g.kdtr", tmp_path / "g.npz"), "g.npz", f"tensor '{bad}'", "cannot keep")
    assert not (tmp_path / "g.npz").exists()


def test_npz_refuses_a_name_that_shadows_a_reserved_member(tmp_path):
    _golden(tmp_path / "g.kdtr", ["__kdtr_metadata__.npy"], {"k": 1})
    refused(run(tmp_path / "g.kdtr", tmp_path / "g.npz"), "tensor '__kdtr_metadata__.npy'", "cannot keep")
    _golden(tmp_path / "h.kdtr", ["__kdtr_metadata__.npy"])  # no metadata, no such member: kept
    assert run(tmp_path / "h.kdtr", tmp_path / "h.npz").exit_code == 0
    assert list(np.load(tmp_path / "h.npz")) == ["__kdtr_metadata__.npy"]


KEEPABLE = ["x/y", "a.npy", "é ü", "line\nbreak", "..", " ", "n" * 255, "\x01ctl", "a\\b", "w.npy.npy"]


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_every_other_name_survives_the_round_trip(tmp_path, fmt):
    names = KEEPABLE + (["w.npy\x00junk", "a.npy\x00x"] if fmt == "safetensors" else [])
    _golden(tmp_path / "g.kdtr", names)
    mid = tmp_path / f"g.{fmt}"
    assert run(tmp_path / "g.kdtr", mid).exit_code == 0
    assert [n for n, _ in kconvert.read(mid).tensors] == names
    if fmt == "npz":
        with np.load(mid) as f:
            assert list(f) == names
            for i, n in enumerate(names):
                assert f[n].shape == (i + 2,), n  # the member of this name, no other
    else:
        assert sorted(safetensors.numpy.load_file(mid)) == sorted(names)
    assert run(mid, tmp_path / "back.kdtr").exit_code == 0
    assert list(kdtr.load(tmp_path / "back.kdtr").tensors) == names


def test_names_kdtr_cannot_hold_are_refused_naming_them(tmp_path):
    safetensors.numpy.save_file({"": np.zeros(1, np.float32)}, tmp_path / "e.safetensors")
    refused(run(tmp_path / "e.safetensors", tmp_path / "e.kdtr"), "e.kdtr", "tensor name ''")
    np.savez(tmp_path / "l.npz", **{"n" * 256: np.zeros(1)})
    refused(run(tmp_path / "l.npz", tmp_path / "l.kdtr"), "l.kdtr", "tensor name 'nnn")


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_library_write_refuses_names_that_are_not_utf8(tmp_path, fmt):
    contents = kconvert.Contents([("bad\udcff", np.zeros(1))], [])
    with pytest.raises(kconvert.ConvertError, match="not UTF-8"):
        kconvert.write(tmp_path / f"o.{fmt}", contents)
    assert not (tmp_path / f"o.{fmt}").exists()
