"""Reading the small text files a user hands kdtr: golden/MANIFEST.json, golden/known_failures.json,
the mutant catalogues mutants/<op>.toml and mutants/generic_triage.toml, the C++ sources a
catalogue edits.

Every reader here refuses, with one :class:`UserFileError` naming the file and what is
wrong, instead of blocking, exhausting memory or dying of a traceback:

- a path that is not a regular file (a FIFO, a directory, a device, a socket): refused at
  once, never opened for a blocking read (:class:`kdtr.errors.Io`, an ``OSError``);
- a file over :data:`MAX_TEXT_BYTES` (checked on the open descriptor, and the read stops
  there however the file grows);
- bytes that are not UTF-8;
- malformed JSON or TOML, and nesting too deep for the parser (Python's recursion limit).

What the documents must hold (their schema) is checked by their loaders, which say which
entry and field is wrong.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import format as kformat

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

MAX_TEXT_BYTES = 64 << 20
"""The largest text file kdtr reads (64 MiB): a manifest of 100,000 goldens is under 40 MiB.
It is a constant of this module; a larger file is refused, naming this limit."""


class UserFileError(ValueError):
    """A user file that cannot be used: too large, not UTF-8, malformed JSON or TOML, or
    (raised by the loaders) an entry or field of the wrong type or value.

    Attributes:
        path: the file.
        detail: what is wrong, naming the field where there is one.
    """

    def __init__(self, path: str | os.PathLike, detail: str):
        self.path = os.fspath(path)
        self.detail = detail
        super().__init__(f"{self.path}: {detail}")


def read_bounded(path: str | os.PathLike, max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    Args:
        what: the file's role in words ("manifest", "catalogue"), for the message.

    Raises:
        kdtr.errors.Io: not a regular file (never blocks on a FIFO).
        UserFileError: larger than ``max_bytes`` (at the open, or grown while read).
        OSError: the operating system's own failures (no such file, permission denied).
    """
    p = os.fspath(path)
    fd = kformat._open_regular(p)  # O_NONBLOCK open, refused unless S_ISREG
    with open(fd, "rb", closefd=True) as fh:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise UserFileError(p, f"{size} bytes, over the {max_bytes}-byte limit for a {what}")
        # read what fstat said in one go (no buffer of the limit's size), then on in
        # chunks only if the file grew meanwhile
        data = fh.read(size)
        more = bytearray()
        while len(data) + len(more) <= max_bytes:
            chunk = fh.read(min(1 << 20, max_bytes + 1 - len(data) - len(more)))
            if not chunk:
                break
            more += chunk
    if len(data) + len(more) > max_bytes:
        raise UserFileError(p, f"grew past the {max_bytes}-byte limit for a {what} while read")
    return data + bytes(more) if more else data


def read_text(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> str:
    """The UTF-8 text of ``path`` (:func:`read_bounded`), at most ``max_bytes`` (default
    :data:`MAX_TEXT_BYTES`).

    Raises:
        UserFileError: too large, or not UTF-8 (naming the offset of the first bad byte).
        kdtr.errors.Io, OSError: as :func:`read_bounded`.
    """
    if max_bytes is None:
        max_bytes, what = MAX_TEXT_BYTES, f"{what} (kdtr.userfiles.MAX_TEXT_BYTES)"
    data = read_bounded(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def parse_json(text: str | bytes, path: str | os.PathLike, where: str = "", **kwargs: Any) -> Any:
    """``json.loads(text, **kwargs)``, every failure one :class:`UserFileError`.

    Args:
        where: the field that holds the text, for the message ("" for the whole file).

    Raises:
        UserFileError: not JSON (line and column), not UTF-8, or nested too deep.
    """
    at = f"{where}: " if where else ""
    try:
        return json.loads(text, **kwargs)
    except json.JSONDecodeError as exc:
        raise UserFileError(path, f"{at}not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise UserFileError(path, f"{at}not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except RecursionError:
        raise UserFileError(path, f"{at}JSON nested too deep to parse") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise UserFileError(path, f"{at}not valid JSON ({exc})") from None


def load_json(path: str | os.PathLike, what: str) -> Any:
    """The JSON document in ``path``.

    Raises:
        UserFileError: too large, not UTF-8, malformed, nested too deep.
        kdtr.errors.Io, OSError: as :func:`read_bounded`.
    """
    return parse_json(read_text(path, what), path)


def load_toml(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The TOML document in ``path``.

    Raises:
        UserFileError: too large, not UTF-8, malformed, nested too deep.
        kdtr.errors.Io, OSError: as :func:`read_bounded`.
    """
    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserFileError(path, f"not valid TOML ({exc})") from None
    except RecursionError:
        raise UserFileError(path, "TOML nested too deep to parse") from None
    except ValueError as exc:  # an integer of more digits than Python converts, ...
        raise UserFileError(path, f"not valid TOML ({exc})") from None
