"""Writing outputs so that a failed write (a full disk, a read-only folder, a quota) is one clear
error, never a traceback, and never leaves half a file that looks whole.

* :func:`write_text_atomic`: the text goes to ``<name>.tmp`` beside the target, then
  :func:`os.replace` renames it over the target (atomic on POSIX); on any :class:`OSError` the
  temporary file is removed and the target keeps its previous content (or stays absent).
* :class:`OutputWriteError`: the one error shape of a failed write, naming the path and the
  operating system's reason; every command prints it as one line and exits with
  :data:`EXIT_WRITE_ERROR`.

Append-only files (``eval``'s ``predictions.jsonl``) are cut back to their last complete batch
by their writer instead (:func:`noulengine.eval.runner.run_eval`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from noulengine.records.errors import NoulEngineError

# sysexits.h EX_IOERR, "an error occurred while doing I/O on some file"; beside train's 75
# (EX_TEMPFAIL, a paused run) and 2 (refused input).
EXIT_WRITE_ERROR = 74


class OutputWriteError(NoulEngineError):
    """Writing an output failed.

    Attributes:
        path: the file or folder that could not be written.
        cause: the :class:`OSError` raised by the operating system.
        note: what was kept (e.g. "the rows written before stay; rerun the same command to resume").
    """

    def __init__(self, path: str | Path, cause: OSError, note: str = ""):
        self.path = Path(path)
        self.cause = cause
        self.note = note
        reason = cause.strerror or str(cause)
        code = f" ({errno.errorcode.get(cause.errno, cause.errno)})" if cause.errno else ""
        super().__init__(f"cannot write {self.path}: {reason}{code}" + (f"; {note}" if note else ""))


def write_atomic(path: str | Path, write, *, binary: bool = False, encoding: str = "utf-8",
                 make_parent: bool = False) -> Path:
    """Call ``write(fh)`` on ``<path>.tmp`` (its folder made first with ``make_parent``), then
    rename it over ``path``: a failed write leaves the previous file or none, never half of one.

    Raises:
        OutputWriteError: the folder, the temporary file or the rename failed (a full disk, a
            read-only folder), naming ``path``; the temporary file is removed, the target unchanged.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        if make_parent:
            path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") if binary else open(tmp, "w", encoding=encoding) as fh:
            write(fh)
            fh.flush()
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise OutputWriteError(path, exc, "its previous content, if any, is unchanged") from exc
    return path


def write_text_atomic(path: str | Path, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` through ``<path>.tmp`` and a rename (:func:`write_atomic`).

    Raises:
        OutputWriteError: the temporary file could not be written or renamed (it is removed; the
            target is unchanged).
    """
    return write_atomic(path, lambda fh: fh.write(text), encoding=encoding)


def saving(path: str | Path, what: str = ""):
    """A context for a library's own write (``torch.save``, safetensors, peft's ``save_pretrained``):
    any :class:`OSError`, or the ``RuntimeError`` / ``SafetensorError`` those libraries raise for a
    failed write, becomes :class:`OutputWriteError` naming ``path``; a partial temporary folder is
    the caller's to leave unmarked (checkpoints are renamed into place only when whole)."""
    import contextlib

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except OutputWriteError:
            raise
        except OSError as exc:
            raise OutputWriteError(exc.filename or path, exc, what) from exc
        except Exception as exc:  # noqa: BLE001 - torch: RuntimeError, safetensors: SafetensorError
            if type(exc).__name__ not in ("RuntimeError", "SafetensorError"):
                raise
            raise OutputWriteError(path, OSError(None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"),
                                   what) from exc

    return guard()


# the errnos of a write the disk or the folder refused (not a file that is missing or unreadable)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def is_write_failure(exc: BaseException) -> bool:
    """True for an :class:`OutputWriteError`, or an :class:`OSError` a full disk, a quota, a file
    size limit or a read-only file system raised (:data:`WRITE_ERRNOS`): what a command reports as
    one line and :data:`EXIT_WRITE_ERROR`."""
    return isinstance(exc, OutputWriteError) or (isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS)


def write_error_from(exc: OSError, fallback: str | Path | None = None) -> OutputWriteError:
    """An :class:`OutputWriteError` for an OSError raised by a library's own write (torch, peft,
    matplotlib), naming the file the OS names, else ``fallback``."""
    if isinstance(exc, OutputWriteError):
        return exc
    return OutputWriteError(exc.filename or fallback or "an output file", exc)
