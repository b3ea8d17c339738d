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
    ├── ReplayMismatchError           exit 5   a replay or verification did not pass
    │   └── MatchError                         (also an AssertionError, so pytest reports a failure)
    ├── UnsupportedValueError         exit 1   a value has no lossless encoding
    ├── CaptureError                  exit 1   capture could not record what it was asked (strict mode)
    ├── RepoError                     exit 1   a repo cannot be opened or written
    │   └── RemoteRepoError           exit 6   a remote repo cannot be reached or lacks conditional writes
    │       └── RepoBusyError         exit 6   another process holds the repo longer than the wait allows
    ├── KernelError                   exit 1   a kernel problem cannot be exported or a candidate run
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


class ReplayMismatchError(ModulelensError):
    """Raised by helpers that assert a replay or verification passed."""

    exit_code = 5


class MatchError(ReplayMismatchError, AssertionError):
    """A module did not reproduce a capture (an ``AssertionError``, so pytest reports it as a failure)."""


class CaptureError(ModulelensError):
    """Capture could not record what it was asked to (raised in strict mode; otherwise a warning)."""


class RepoError(ModulelensError):
    """A repo cannot be opened or written (unsupported location, newer layout, no free version)."""


class RemoteRepoError(RepoError):
    """A remote repo (``s3://``, ``memory://``, ...) cannot be reached, or its storage lacks an
    operation modulelens needs to stay correct (conditional writes)."""

    exit_code = 6


class RepoBusyError(RemoteRepoError):
    """Another process holds the repo (``gc`` waits for saves to finish and saves wait for ``gc``)
    longer than the wait allows; nothing was changed."""


class KernelError(ModulelensError):
    """A kernel problem cannot be exported, or a candidate kernel cannot be run."""


class MissingDependencyError(ModulelensError):
    """An optional dependency is not installed; the message names the extra that brings it."""


class ModulelensWarning(UserWarning):
    """Base class of modulelens's warnings."""


class CaptureWarning(ModulelensWarning):
    """Something went wrong inside capture; the job was left running."""


class SourceChangedWarning(ModulelensWarning):
    """The code of a captured class differs from the code it was captured with."""
