"""Every exception and warning modulelens raises on purpose.

Every error a user can cause derives from :class:`ModulelensError` and carries the process exit
code the CLI uses for it, so interfaces print one line and exit non-zero, while programming errors
(``TypeError``, ``AttributeError``...) still surface as ordinary tracebacks::

    ModulelensError                   exit 1   base class; never raised directly
    ├── UsageError                    exit 2   a bad option or argument (targets, ranks, budgets, CLI flags)
    │   ├── ToolError                 exit 2   a tool (profile, verify, diff) cannot do what it was asked
    │   └── CandidateError            exit 2   a candidate cannot be found, imported or built
    ├── CaptureNotFoundError          exit 2   a name, version or alias does not exist
    ├── InvalidNameError              exit 2   a capture name or alias breaks the naming rules
    ├── CorruptCaptureError           exit 3   stored metadata or a payload is damaged
    ├── RestoreError                  exit 4   a capture cannot be turned back into a module
    │   └── UntrustedCodeError        exit 4   loading would run code the capture names (docs/security.md)
    ├── ReplayMismatchError           exit 5   a replay or verification did not pass
    │   └── MatchError                         (also an AssertionError, so pytest reports a failure)
    ├── UnsupportedValueError         exit 1   a value has no lossless encoding
    ├── CaptureError                  exit 1   capture could not record what it was asked (strict mode)
    │   └── NothingCapturedError      exit 6   ``modulelens run`` finished without capturing any target
    ├── RepoError                     exit 1   a repo cannot be opened or written
    │   ├── StorageError              exit 8   the filesystem refused (disk full, read-only, permission denied)
    │   └── RemoteRepoError           exit 7   a remote repo is unreachable or lacks conditional writes
    │       └── RepoBusyError         exit 7   gc is running, an alias moved concurrently, or a lock was held past its wait
    ├── KernelError                   exit 1   a kernel problem cannot be exported or a candidate run
    ├── SigningKeyError               exit 1   the per-user signing key cannot be used (caught: nothing is signed)
    └── MissingDependencyError        exit 1   an optional dependency is not installed

    ModulelensWarning (UserWarning)
    ├── CaptureWarning                         capture met a problem; the job was left running
    └── SourceChangedWarning                   a captured class's code changed since the capture
"""

from __future__ import annotations


class ModulelensError(Exception):
    """Base class of every error modulelens raises on purpose; raise a subclass."""

    exit_code = 1


class UsageError(ModulelensError):
    """An option or argument is invalid (targets, ranks, byte budgets, CLI flags)."""

    exit_code = 2


class ToolError(UsageError):
    """A tool (profile, verify, diff) cannot do what it was asked (bad option, nothing to run)."""


class CandidateError(UsageError):
    """A candidate cannot be found, imported or built."""


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


class UntrustedCodeError(RestoreError):
    """Loading would run code named by, or stored in, the capture without the user's trust
    (a denied import path, a class of the wrong kind, stored source without ``trust_source``)."""


class ReplayMismatchError(ModulelensError):
    """Raised by helpers that assert a replay or verification passed."""

    exit_code = 5


class MatchError(ReplayMismatchError, AssertionError):
    """A module did not reproduce a capture (an ``AssertionError``, so pytest reports it as a failure)."""


class CaptureError(ModulelensError):
    """Capture could not record what it was asked to (raised in strict mode; otherwise a warning)."""


class RepoError(ModulelensError):
    """A repo cannot be opened or written (unsupported location, newer layout, no free version)."""


class StorageError(RepoError):
    """The filesystem refused an operation on the repo: disk full, quota, read-only, permission
    denied. ``errno`` is the underlying ``OSError``'s (``None`` when there was none)."""

    exit_code = 8

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class KernelError(ModulelensError):
    """A kernel problem cannot be exported, or a candidate kernel cannot be run."""


class SigningKeyError(ModulelensError):
    """The per-user key that marks captures as your own cannot be used: missing, unreadable, or not
    private (docs/security.md). Saving then signs nothing (one warning) and loading trusts nothing
    extra; the message says which file and why."""


class MissingDependencyError(ModulelensError):
    """An optional dependency is not installed; the message names the extra that brings it."""


class ModulelensWarning(UserWarning):
    """Base class of modulelens's warnings."""


class CaptureWarning(ModulelensWarning):
    """Something went wrong inside capture; the job was left running."""


class SourceChangedWarning(ModulelensWarning):
    """The code of a captured class differs from the code it was captured with."""


class NothingCapturedError(CaptureError):
    """``modulelens run``: the command finished but no target was captured (names the closest modules)."""

    exit_code = 6


class RemoteRepoError(RepoError):
    """A remote repo (``s3://``, ``memory://``, ...) cannot be reached, or its storage lacks an
    operation modulelens needs to stay correct (conditional writes)."""

    exit_code = 7


class RepoBusyError(RemoteRepoError):
    """Another process holds the repo (``gc`` waits for saves to finish and saves wait for ``gc``)
    longer than the wait allows, or moved an alias between our read and our write; nothing was
    changed."""
