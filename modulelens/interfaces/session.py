"""What every interface does first: open a repo, find a ref, load it with a dtype and a device.

The CLI, the MCP server, the IPython magics and the shell all go through these functions, so a
dtype string, a device that is not there, or a misspelt ref reads the same one-line error
everywhere. Nothing here imports torch at module level: ``ls`` and ``show`` must start fast.
"""

from __future__ import annotations

from modulelens.errors import CaptureNotFoundError, UsageError

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    import torch

    from modulelens.repo import Repo, VersionInfo
    from modulelens.restore.loader import Capture


def open_repo(path: str | None = None, *, create: bool = False) -> Repo:
    """The repo at ``path`` (default: ``$MODULELENS_REPO`` or ``~/.cache/modulelens/repo``).

    Args:
        path: a repo directory, an fsspec URL (``s3://bucket/prefix``: a repo in object storage), or
            ``None`` for the default.
        create: create an empty repo when there is none (listing an empty default repo is fine;
            loading from a repo that does not exist is an error).

    Returns:
        The :class:`~modulelens.repo.Repo`.

    Raises:
        RepoError: ``path`` is not a repo and ``create`` is false, or it cannot be created.
    """
    from modulelens.repo import Repo

    return Repo(path, create=create)


def list_versions(store: Repo, prefix: str | None = None) -> list[VersionInfo]:
    """Every version of every name equal to ``prefix`` or under ``prefix/`` (all when ``None``).

    Example::

        [v.ref for v in list_versions(open_repo(), "ranker")]   # ['ranker/mlp:v1', 'ranker/mlp:v2']
    """
    if prefix is None:
        return store.list()
    under = prefix.rstrip("/") + "/"
    return [info for info in store.list() if info.name == prefix or info.name.startswith(under)]  # one walk


def open_ref(ref: str, repo: str | Repo | None = None) -> tuple[Repo, str]:
    """The repo and ref a command argument names: ``wandb://ENTITY/PROJECT/COLLECTION:alias``
    resolves through the W&B Registry into the local cache; anything else is a ref in ``repo``.

    Raises:
        MissingDependencyError, RemoteRepoError: a ``wandb://`` ref without the SDK or the network.
    """
    from modulelens.repo import Repo

    if ref.startswith("wandb://"):
        from modulelens.interfaces._errors import wandb_errors
        from modulelens.repo.wandb_registry import resolve_wandb_ref

        with wandb_errors():
            return resolve_wandb_ref(ref)
    return (repo if isinstance(repo, Repo) else open_repo(repo)), ref


def resolve(store: Repo, ref: str) -> tuple[str, int]:
    """``store.resolve(ref)``, with the closest stored names in the error when the name is unknown.

    Raises:
        CaptureNotFoundError: no such name, version or alias; a misspelt name lists the closest
            ones (``did you mean: wlm/encoder:v1``).
    """
    try:
        return store.resolve(ref)
    except CaptureNotFoundError as error:
        name = ref.partition(":")[0]
        known = store.names()
        if name in known:
            raise
        import difflib  # here: only a misspelt name needs it (`show` starts without it, issue 37)

        close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
        close += [n for n in known if n not in close and (name in n or n.rsplit("/", 1)[-1] in name)][:3 - len(close)]
        hint = f"; did you mean: {', '.join(close)}?" if close else (
            f"; stored names: {', '.join(known[:8])}{' ...' if len(known) > 8 else ''}" if known else "")
        raise CaptureNotFoundError(f"{error}{hint}") from None


def parse_dtype(name: str | None) -> torch.dtype | None:
    """``"bfloat16"`` -> ``torch.bfloat16`` (``None`` stays ``None``).

    Raises:
        UsageError: an unknown dtype name (the message lists the valid ones).
    """
    if name is None:
        return None
    from modulelens.errors import UnsupportedValueError
    from modulelens.format.tensors import dtype_from_name, dtype_names

    try:
        return dtype_from_name(name.removeprefix("torch."))
    except UnsupportedValueError:
        raise UsageError(f"unknown dtype {name!r} (one of: {', '.join(dtype_names())})") from None


def parse_int_list(text: str | None, option: str, *, positive: bool = False) -> list[int] | None:
    """``"0,2,3"`` -> ``[0, 2, 3]`` (``None`` for an empty value), for ``--calls``/``--batch-sizes``.

    Raises:
        UsageError: a part is not an integer, or (``positive``) not >= 1.
    """
    if not text:
        return None
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(f"{option} takes integers separated by commas (0,2 or 1,8,64), not {text!r}") from None
    if positive and values and min(values) < 1:
        raise UsageError(f"{option} takes positive integers separated by commas (1,8,64), not {text!r}")
    return values or None


def check_device(device: str | None) -> str | None:
    """``device`` when this machine has it.

    Raises:
        UsageError: the device string is invalid, or names an accelerator this machine does not
            have (``--device cuda`` on a CPU-only machine).
    """
    if device is None:
        return None
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise UsageError(f"invalid device {device!r}: {error}") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {device!r}: CUDA is not available here "
                             f"(torch {torch.__version__}, built with CUDA {torch.version.cuda or 'none'})")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UsageError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif parsed.type not in ("cpu", "meta"):
        backend = getattr(torch, parsed.type, None)
        available = getattr(backend, "is_available", None)
        if available is not None and not available():
            raise UsageError(f"device {device!r}: {parsed.type} is not available here")
    return device


def load_capture(ref: str, repo: str | Repo | None = None, *, device: str | None = None,
                 dtype: str | None = None, trust_source: bool | None = None) -> Capture:
    """Load ``ref`` with a dtype given by name and a device checked to exist.

    Args:
        ref: ``NAME``, ``NAME:vN`` or ``NAME:alias`` (or a ``wandb://`` URL: :func:`open_ref`).
        repo: a repo directory or an open :class:`~modulelens.repo.Repo` (default repo if ``None``).
        device: move the module and inputs there (``cpu``, ``cuda``, ``cuda:1``).
        dtype: cast floating weights and inputs (``float32``, ``bfloat16``...).
        trust_source: run source stored with the capture (``None``: the repo's own setting;
            docs/security.md).

    Returns:
        The loaded :class:`~modulelens.restore.loader.Capture`.

    Raises:
        UsageError: an unknown dtype or a device this machine does not have.
        CaptureNotFoundError: no such ref (with the closest names).
        RestoreError, CorruptCaptureError: the capture cannot be rebuilt or read.
        UntrustedCodeError: the capture names code the trust rules refuse.
    """
    # The repo and the ref first, before torch is imported (seconds): a missing capture, an offline
    # cache without it or an unreachable server is said at once.
    store, ref = open_ref(ref, repo)
    name, version = resolve(store, ref)
    from modulelens.restore.loader import load

    torch_dtype = parse_dtype(dtype)
    check_device(device)
    return load(f"{name}:v{version}", repo=store, device=device, dtype=torch_dtype, trust_source=trust_source)


def aliased_versions(store: Repo, ref: str) -> dict[str, list[str]]:
    """The versions ``store.remove(ref)`` would remove that carry aliases (``latest`` aside).

    Returns:
        ``{"name:vN": ["golden", ...]}``; empty when nothing aliased would go.

    Raises:
        CaptureNotFoundError: ``ref`` does not exist (with the closest names).
    """
    from modulelens.repo.names import LATEST, parse_ref

    parsed = parse_ref(ref)
    name, version = resolve(store, ref)
    versions = store.version_numbers(name) if parsed.selector is None else [version]
    found: dict[str, list[str]] = {}
    for alias, target in sorted(store.aliases(name).items()):
        if target in versions and alias != LATEST:
            found.setdefault(f"{name}:v{target}", []).append(alias)
    return found


def interactive() -> bool:
    """Whether a person can answer a question (stdin and stderr are terminals)."""
    import sys

    return sys.stdin.isatty() and sys.stderr.isatty()
