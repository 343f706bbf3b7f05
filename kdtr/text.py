"""Text from files and binaries made safe for terminals and reports.

Tensor names, metadata, file names and a binary's stderr are data: they may hold control
characters (an ANSI escape that clears the screen, a newline that forges a table row) or
lone surrogates (file names that are not UTF-8). Everything kdtr prints or writes into a
report (terminal, JSON, JUnit XML, Markdown) passes through :func:`printable` first, which
spells such characters the way the C++ tools do (``kdtr::escape_control``): ``\\xNN``.
"""

from __future__ import annotations

from typing import Any


def _escape_char(ch: str) -> str:
    if ch.isprintable():  # false for controls, format characters (bidi overrides),
        return ch  # line/paragraph separators, surrogates, unassigned code points
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def printable(text: Any) -> str:
    """``str(text)`` on one line, every character that is not printable (controls, newlines
    and tabs included; format characters such as bidi overrides; lone surrogates;
    unassigned code points, which covers XML's U+FFFE/U+FFFF) spelled ``\\xNN``,
    ``\\uNNNN`` or ``\\UNNNNNNNN``. Printable text, backslashes included, is unchanged."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(_escape_char(c) for c in s)


def printable_lines(text: Any) -> str:
    """Like :func:`printable`, but keeps ``\\n`` line breaks: each line escaped on its own."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


MULTILINE_KEYS = frozenset({"stderr"})


def printable_tree(value: Any, _multiline: bool = False) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings, numbers) with every string,
    keys included, passed through :func:`printable` -- one spelling for a name wherever it
    appears -- except the values of :data:`MULTILINE_KEYS` (a binary's stderr), which keep
    their line breaks (:func:`printable_lines`)."""
    if isinstance(value, str):
        return printable_lines(value) if _multiline else printable(value)
    if isinstance(value, dict):
        return {printable(k) if isinstance(k, str) else k: printable_tree(v, k in MULTILINE_KEYS)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v, _multiline) for v in value]
    return value


def terminal_columns(default: int = 160) -> int:
    """$COLUMNS where it is a width in [20, 1000] (ASCII digits), else ``default``: the
    width of piped output (CI logs, files). A malformed $COLUMNS is ignored, never an error."""
    import os

    text = os.environ.get("COLUMNS", "")
    return int(text) if text.isascii() and text.isdigit() and 20 <= int(text) <= 1000 else default
