"""``kdtr convert SRC DST``: KDTR <-> .npz / .safetensors (the work is in :mod:`kdtr.convert`).

Exit 0 on success (one line on stdout), 2 on any error: one line on stderr naming the
file and the field (tensor, metadata entry, suffix), as the other commands do.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import click

from kdtr.errors import KdtrError
from kdtr.text import printable


def _fail(msg: str) -> None:
    click.echo(f"kdtr: error: {printable(msg)}", err=True)
    sys.exit(2)


@contextlib.contextmanager
def _refusals(kconvert, path: str) -> Iterator[None]:
    """Every error of reading or writing ``path`` as one line and exit 2: a ConvertError
    (it names the file and field itself), a format error, a missing optional package
    (ImportError, e.g. safetensors) or an OSError (both named with ``path``)."""
    try:
        yield
    except kconvert.ConvertError as exc:
        _fail(str(exc))
    except KdtrError as exc:
        _fail(f"{type(exc).__name__}: {exc}")
    except ImportError as exc:
        _fail(f"{path}: {exc}")
    except OSError as exc:
        _fail(f"{path}: {exc.strerror or exc}")


@click.command("convert")
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
@click.option("--compress", is_flag=True, help="Deflate the members of an .npz DST (np.savez_compressed's way).")
def convert(src: str, dst: str, force: bool, compress: bool) -> None:
    """Convert SRC to DST between KDTR (.kdtr), .npz and .safetensors; the suffixes pick
    the formats.

    Tensors keep their names, dtypes (bf16 included), shapes and order; KDTR metadata
    (int, float, str, bool) is kept in reserved entries that the converse conversion reads
    back (docs/convert.md). DST is written atomically and never replaced without --force.
    Exit 2 with one line naming the file and the tensor or field on any refusal.
    """
    from kdtr import convert as kconvert  # here, not at import: it imports ml_dtypes (slow)

    try:
        kconvert.check_paths(src, dst, force=force, compress=compress)
    except kconvert.ConvertError as exc:
        _fail(str(exc))
        return
    with _refusals(kconvert, src):
        contents = kconvert.read(src)
    with _refusals(kconvert, dst):
        kconvert.write(dst, contents, compress=compress)
    click.echo(printable(f"{dst}: {len(contents.tensors)} tensors, {len(contents.metadata)} metadata entries "
                         f"(from {src})"))
