"""Exclusive use of a report directory for one ``kdtr run``."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .. import fsutil
from ..goldens import UsageError

REPORT_LOCK = ".kdtr-run.lock"


class ReportDirLock:
    """Exclusive use of a report directory for one ``kdtr run`` (an advisory ``flock`` on
    ``<report_dir>/.kdtr-run.lock``, released when the process ends, however it ends).

    Two runs sharing a report directory would overwrite each other's obtained outputs and
    judge each other's files; the second one is refused at once instead. The lock file is
    opened without following a link (:func:`kdtr.fsutil.open_lock`) and gets this run's
    pid only once it is known to be a regular file of kdtr's: a link, a FIFO, a directory,
    a file with other hard links or more than a pid's bytes is refused, untouched.

    Raises (on enter):
        UsageError: the directory cannot be created or written, the lock file is not one
            kdtr made (the message names it), or another run holds it.
    """

    def __init__(self, report_dir: Path) -> None:
        self.report_dir = report_dir
        self._fd: int | None = None

    def __enter__(self) -> ReportDirLock:
        path = self.report_dir / REPORT_LOCK
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            fd = fsutil.open_lock(path)
        except fsutil.UnsafePath as exc:
            raise UsageError(str(exc)) from None
        except OSError as exc:
            raise UsageError(f"report directory {self.report_dir}: not writable ({exc.strerror or exc})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise UsageError(
                f"report directory {self.report_dir} is in use by another kdtr run (pid {holder}); "
                "wait for it or give this run its own --report-dir"
            ) from exc
        try:
            fsutil.write_pid(fd)
        except OSError as exc:
            os.close(fd)
            raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from exc
        if not os.access(self.report_dir, os.W_OK):
            os.close(fd)
            raise UsageError(f"report directory {self.report_dir}: not writable")
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
