"""Exceptions raised by modulelens.

Every error a user can cause derives from :class:`ModulelensError`, so the CLI can print it as one
line and exit non-zero, while programming errors still surface as ordinary tracebacks.
"""

from __future__ import annotations


class ModulelensError(Exception):
    """Base class of every error modulelens raises on purpose."""

    exit_code = 1


class UnsupportedValueError(ModulelensError):
    """A value (constructor argument, call input) has no lossless encoding."""


class CaptureNotFoundError(ModulelensError):
    """A name, version or alias does not exist in the repo."""

    exit_code = 2


class InvalidNameError(ModulelensError):
    """A capture name or alias breaks the naming rules."""

    exit_code = 2


class CorruptCaptureError(ModulelensError):
    """Stored metadata or a payload is damaged (bad JSON, wrong hash, truncated file)."""

    exit_code = 3


class RestoreError(ModulelensError):
    """A capture cannot be turned back into a module (class missing, no constructor record...)."""

    exit_code = 4


class ReplayMismatchError(ModulelensError):
    """Raised by helpers that assert a replay or verification passed."""

    exit_code = 5


class RemoteRepoError(ModulelensError):
    """A remote repo (``s3://``, ``memory://``, ...) cannot be reached, or its storage lacks an
    operation modulelens needs to stay correct (conditional writes)."""

    exit_code = 6


class RepoBusyError(RemoteRepoError):
    """Another process holds the repo (``gc`` waits for saves to finish and saves wait for ``gc``)
    longer than the wait allows; nothing was changed."""
