"""Bounded reading of a child process's stdout and stderr.

A test binary (or a compiler a mutant breaks) can print without end: gigabytes, no newline,
binary junk, one endless line. Whatever it prints, kdtr keeps a bounded amount of it, in
time linear in what was printed:

- :class:`Capped` keeps a stream's first :data:`HEAD` bytes and last :data:`TAIL` bytes
  (the start names what went wrong first, the end holds the last message) and counts the
  rest, which its text replaces by one line ``[... N bytes not kept ...]``;
- :class:`Lines` splits a stream into lines of at most :data:`MAX_LINE` bytes for a
  callback (the batch result lines); a longer line is never buffered whole: it goes on to
  the :class:`Capped` sink in pieces, and the callback never sees it;
- :func:`communicate` is ``Popen.communicate`` with both streams :class:`Capped`, and
  :func:`run` is ``subprocess.run(capture_output=True)`` built on it.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections import deque
from collections.abc import Callable

HEAD = 1 << 18  # 256 KiB kept from the start of a stream
TAIL = 1 << 20  # 1 MiB kept from its end
MAX_LINE = 1 << 16  # 64 KiB: the longest line handed to a line callback
_READ = 1 << 16


class Capped:
    """A byte stream's first ``head`` and last ``tail`` bytes and its total length.

    ``add`` costs O(len(chunk)) amortised; memory stays under ``head + tail`` plus one chunk.
    """

    def __init__(self, head: int = HEAD, tail: int = TAIL) -> None:
        self.head_cap, self.tail_cap = head, tail
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
            if not chunk:
                return
        self._tail.append(bytes(chunk))
        self._tail_len += len(chunk)
        while self._tail and self._tail_len - len(self._tail[0]) >= self.tail_cap:
            self._tail_len -= len(self._tail.popleft())

    @property
    def dropped(self) -> int:
        """Bytes neither in the head nor in the tail."""
        return self.total - len(self.head) - min(self._tail_len, self.tail_cap)

    def value(self) -> bytes:
        """Head + tail; where bytes were dropped between them, a line saying how many."""
        tail = b"".join(self._tail)[-self.tail_cap:] if self._tail else b""
        dropped = self.dropped
        if dropped <= 0:
            return bytes(self.head) + tail
        return bytes(self.head) + f"\n[... {dropped} bytes not kept ...]\n".encode() + tail

    def text(self) -> str:
        """:meth:`value` decoded as UTF-8, undecodable bytes replaced."""
        return self.value().decode(errors="replace")


class Lines:
    """Splits a byte stream into lines (``\\n`` kept) of at most ``max_line`` bytes, each
    handed to ``on_line``; the bytes of longer lines, and of a last line without a newline,
    go to ``sink`` instead, as they come (never buffered whole). Linear time: each byte is
    scanned once."""

    def __init__(self, on_line: Callable[[bytes], None], sink: Callable[[bytes], None],
                 max_line: int = MAX_LINE) -> None:
        self.on_line, self.sink, self.max_line = on_line, sink, max_line
        self._pending = bytearray()
        self._overlong = False  # inside a line already sent to the sink

    def feed(self, chunk: bytes) -> None:
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl + 1]
            start += len(piece)
            if self._overlong:
                self.sink(piece)
            elif len(self._pending) + len(piece) > self.max_line:
                self.sink(bytes(self._pending))
                self.sink(piece)
                self._pending.clear()
                self._overlong = True
            elif nl < 0:
                self._pending += piece
                continue
            else:
                line = bytes(self._pending) + piece
                self._pending.clear()
                self.on_line(line)
            if nl >= 0:
                self._overlong = False

    def close(self) -> None:
        """The stream ended: a last line without a newline goes to the sink."""
        if self._pending:
            self.sink(bytes(self._pending))
            self._pending.clear()


def communicate(proc: subprocess.Popen, timeout: float | None = None, text: bool = True,
                head: int = HEAD, tail: int = TAIL) -> tuple[str | bytes | None, str | bytes | None]:
    """``proc.communicate(timeout)`` for a child started with binary (not text) pipes, each
    stream :class:`Capped`; returns (stdout, stderr), None for a stream that is not a pipe,
    decoded (errors replaced) when ``text``.

    Raises:
        subprocess.TimeoutExpired: ``timeout`` seconds passed (the child is left running:
            the caller kills it).
    """
    streams = {s: Capped(head, tail) for s in (proc.stdout, proc.stderr) if s is not None}
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for s in streams:
            sel.register(s, selectors.EVENT_READ)
        while sel.get_map():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, _READ)
                if chunk:
                    streams[key.fileobj].add(chunk)
                else:
                    sel.unregister(key.fileobj)
    for pipe in streams:
        pipe.close()
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    proc.wait(remaining)

    def result(s) -> str | bytes | None:
        if s is None:
            return None
        return streams[s].text() if text else streams[s].value()

    return result(proc.stdout), result(proc.stderr)


def run(cmd: list[str], timeout: float | None = None, text: bool = True, **popen_kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, timeout=timeout)`` with both streams
    :class:`Capped` (stdin from /dev/null unless given). On the time-out or any exception
    the child is killed and reaped.

    Raises:
        OSError: the program cannot be started.
        subprocess.TimeoutExpired: ``timeout`` seconds passed.
    """
    popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen_kwargs)
    try:
        out, err = communicate(proc, timeout, text)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        for s in (proc.stdout, proc.stderr):
            s.close()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
