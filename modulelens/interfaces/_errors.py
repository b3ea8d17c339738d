"""The one place that turns an error into what a person or an agent sees.

Every interface (the CLI, the MCP server, the IPython magics, the shell) catches exactly
:data:`KNOWN_ERRORS` and shows :func:`error_message`; anything else (``TypeError``,
``AttributeError``...) is a bug and keeps its traceback. ``OSError`` is known because a user
causes it (a candidate file that does not exist, a full or read-only repo) and the operating
system's message names the path; one that says the filesystem refused (:data:`STORAGE_ERRNOS`)
becomes the documented ``StorageError`` (exit 8) whichever command or interface hit it.

Like ``huggingface_hub/cli/_errors.py``'s ``format_known_exception``.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from modulelens.errors import ModulelensError, RemoteRepoError, RepoError, StorageError, UsageError

KNOWN_ERRORS: tuple[type[BaseException], ...] = (ModulelensError, OSError)
#: ``OSError`` numbers that mean the filesystem refused: disk full, quota, read-only, no permission.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def as_modulelens_error(error: BaseException) -> ModulelensError:
    """``error`` as a :class:`ModulelensError` (an ``OSError`` becomes one with a clear message).

    Args:
        error: an instance of one of :data:`KNOWN_ERRORS`.

    Returns:
        ``error`` itself when it is a ``ModulelensError``; for an ``OSError``, a
        :class:`~modulelens.errors.StorageError` (exit 8) when the filesystem refused (disk full,
        quota, read-only, permission denied: :data:`STORAGE_ERRNOS`), a
        :class:`~modulelens.errors.UsageError` (exit 2) when a path the user gave is missing or is
        the wrong kind, else a :class:`~modulelens.errors.RepoError` (exit 1: an I/O error).

    Raises:
        TypeError: ``error`` is not a known error (a bug must keep its traceback).
    """
    if isinstance(error, ModulelensError):
        return error
    if not isinstance(error, OSError):
        raise TypeError(f"not a user-caused error: {type(error).__name__}") from error
    where = f"{error.filename}: " if error.filename else ""
    reason = error.strerror or str(error)
    if error.errno in STORAGE_ERRNOS:
        # The filesystem refused (a read-only or full repo): the documented StorageError, exit 8,
        # whatever the command, so scripts can tell "fix the disk" from "fix the arguments".
        converted: ModulelensError = StorageError(f"{where}{reason}", error.errno)
    elif isinstance(error, (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError,
                            FileExistsError)):
        converted = UsageError(f"{where}{reason}")
    else:
        converted = RepoError(f"{where}{reason}")
    converted.__cause__ = error
    return converted


def error_message(error: BaseException) -> str:
    """One line that says what failed: the error's message, never a traceback.

    Example::

        >>> error_message(FileNotFoundError(2, "No such file or directory", "cand.py"))
        'cand.py: No such file or directory'
    """
    return str(as_modulelens_error(error)).strip() or type(error).__name__


def exit_code(error: BaseException) -> int:
    """The process exit code for a known error (``ModulelensError.exit_code``; see the README)."""
    return as_modulelens_error(error).exit_code


@contextlib.contextmanager
def wandb_errors() -> Iterator[None]:
    """Around a call into the W&B SDK (``push --to wandb://``, ``pull wandb://``, a ``wandb://``
    ref): the SDK's own errors (no login, no network, no such artifact) become a one-line
    :class:`~modulelens.errors.RemoteRepoError` (exit 7) instead of a 55-line traceback.

    Only ``wandb.errors.Error``, the SDK's documented base class for what a user causes, is
    converted; anything else keeps its traceback.
    """
    try:
        yield
    except Exception as error:
        wandb_base = _wandb_error_class()
        if wandb_base is None or not isinstance(error, wandb_base):
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        hint = ("; or set WANDB_API_KEY, or WANDB_MODE=offline to log into a local run directory"
                if "api key" in message.lower() else "")
        raise RemoteRepoError(f"W&B: {message}{hint}") from error


def _wandb_error_class() -> type[BaseException] | None:
    import sys

    errors = sys.modules.get("wandb.errors")
    base = getattr(errors, "Error", None)
    return base if isinstance(base, type) else None
