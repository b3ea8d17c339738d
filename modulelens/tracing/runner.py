"""`modulelens run`: capture from an unmodified program.

The parent (:func:`run_command`) starts the user's command with this package's ``_bootstrap``
folder first on ``PYTHONPATH`` and the settings in ``MODULELENS_RUN_CONFIG``; every Python process
of the job then loads ``_bootstrap/sitecustomize.py``, which calls :func:`activate_from_env`:

1. constructor tracking goes on before any user code is imported;
2. a global forward pre-hook looks at each module the first time it is called; the first one whose
   tree contains a target becomes a root, and a :class:`Tracer` is attached to it;
3. once every target is recorded the global hook is removed and the captures are saved (and with
   ``--exit-after-capture`` the job ends cleanly with exit code 0);
4. at exit, whatever was captured is saved and a summary for the parent is written.
"""

from __future__ import annotations

import atexit
import difflib
import json
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modulelens.tracing.budget import PayloadPolicy

ENV_CONFIG = "MODULELENS_RUN_CONFIG"
ENV_SUMMARY = "MODULELENS_RUN_SUMMARY_DIR"
BOOTSTRAP_DIR = Path(__file__).with_name("_bootstrap")


@dataclass
class RunConfig:
    targets: list[str]
    warmup: int = 0
    max_calls: int = 1
    exit_after_capture: bool = False
    repo: str | None = None
    name: str | None = None
    ranks: str = "0"
    strict: bool = False
    tags: list[str] = field(default_factory=list)
    backward: bool = False  # also record gradients (capture(backward=True))
    shape_only_over: int | None = None  # PayloadPolicy: bigger call tensors are stored shape-only
    max_bytes: int | None = None  # PayloadPolicy: payload budget per capture
    list_modules: bool = False  # report the module tree of the first model called, then end the job

    def policy(self) -> PayloadPolicy | None:
        """The payload policy of ``--shape-only-over``/``--max-bytes`` (``None`` when neither is set)."""
        from modulelens.tracing.budget import PayloadPolicy  # imports torch: only in the job's processes

        if self.shape_only_over is None and self.max_bytes is None:
            return None
        return PayloadPolicy(shape_only_over=self.shape_only_over, max_bytes=self.max_bytes)


MAX_ROOTS = 4  # module trees reported to the parent (for --list-modules and "did you mean")
MAX_MODULES = 5000  # modules per reported tree


def closest_modules(pattern: str, modules: list[list[str]], limit: int = 5) -> list[list[str]]:
    """The recorded ``[qualified name, class]`` pairs closest to a target that matched nothing.

    A pattern contained in a name or class comes first (``lin`` -> ``1.lin``), then names and
    classes that ``difflib`` finds close (``encoder.layer.0`` -> ``encoder.layers.0``).

    Example::

        closest_modules("lin", [["0", "torch.nn:Embedding"], ["1.lin", "torch.nn:Linear"]])
        # [["1.lin", "torch.nn:Linear"]]
    """
    needle = pattern.lower().strip("*")
    found = [m for m in modules if needle and needle in m[0].lower()]
    found += [m for m in modules if needle and m not in found and needle in m[1].lower().rsplit(":", 1)[-1]]
    keys = {m[0]: m for m in modules if m[0]}
    keys.update({m[1].rsplit(":", 1)[-1]: m for m in modules})
    for key in difflib.get_close_matches(pattern, list(keys), n=limit, cutoff=0.6):
        if keys[key] not in found:
            found.append(keys[key])
    return found[:limit]


# ------------------------------------------------------------------------------------------ parent


def run_command(command: list[str], config: RunConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Run ``command`` with capture on; returns exit code, what was saved and what was missed."""
    from modulelens.errors import StorageError
    from modulelens.repo.local import Repo
    from modulelens.repo.local import default_repo_path as repo_default

    requested = config.repo
    try:
        repo = Repo(config.repo)  # create it now so every process of the job agrees on it
    except (OSError, StorageError) as error:  # fail open: the job runs, captures go elsewhere
        from modulelens.tracing.save import copy_back_hint, describe_storage_error, fallback_repo

        repo = fallback_repo()
        print(f"modulelens: cannot use repo {requested or repo_default()} ({describe_storage_error(error)}); "
              f"captures go to {repo.root}; copy them back with: {copy_back_hint(repo, requested)}",
              file=sys.stderr, flush=True)
    config.repo = repo.location  # a path, or the URL of a remote repo
    with tempfile.TemporaryDirectory(prefix="modulelens-run-") as summary_dir:
        env = dict(os.environ)
        env[ENV_CONFIG] = json.dumps(asdict(config))
        env[ENV_SUMMARY] = summary_dir
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH", "")) if p)
        try:
            completed = subprocess.run(command, env=env, check=False, stdout=sys.stderr if quiet else None)
        except FileNotFoundError:
            from modulelens.errors import UsageError

            raise UsageError(f"command not found: {command[0]}") from None
        summaries = [json.loads(p.read_text()) for p in sorted(Path(summary_dir).glob("*.json"))]
    saved = [s for summary in summaries for s in summary["saved"]]
    captured_patterns = {p for summary in summaries for p in summary["resolved"]}
    roots = [root for summary in summaries for root in summary.get("roots", [])]
    modules = [m for root in roots for m in root["modules"]]
    missing = [t for t in config.targets if t not in captured_patterns]
    return {
        "exit_code": completed.returncode,
        "command": command,
        "repo": config.repo,
        "requested_repo": requested if requested is not None else str(repo_default()),
        "saved": saved,
        "missing_targets": missing,
        "suggestions": {t: closest_modules(t, modules) for t in missing},
        "roots": roots,
        "processes": summaries,
    }


# ------------------------------------------------------------------------------------------ child


class _Session:
    """Capture state of one process of the job."""

    def __init__(self, config: RunConfig) -> None:
        import torch

        from modulelens.tracing.init_tracking import track_init

        self.config = config
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.tracers: list[Any] = []
        self.resolved: set[str] = set()
        self.saved: list[dict[str, Any]] = []
        self.failed: list[str] = []
        self.roots: list[dict[str, Any]] = []  # module trees of the first models called
        self._seen: set[int] = set()
        self._prefixes: dict[int, str] = {}  # tracer id -> capture name prefix
        self._saved_tracers: set[int] = set()
        self._lock = threading.RLock()
        self._done = False
        track_init()
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._on_module_call)
        atexit.register(self.finish)

    def _on_module_call(self, module: Any, _inputs: Any) -> None:
        if id(module) in self._seen:
            return
        try:
            self._consider_root(module)
        except Exception as error:
            if self.config.strict:
                raise
            warnings.warn(f"modulelens: could not attach capture: {error}", stacklevel=2)

    def _consider_root(self, module: Any) -> None:
        from modulelens.tracing.tracer import Tracer, find_targets, matches, unwrap_model

        with self._lock:
            for sub in module.modules():
                self._seen.add(id(sub))
            if len(self.roots) < MAX_ROOTS:
                self._note_root(unwrap_model(module))
            pending = [p for p in self.config.targets if p not in self.resolved]
            found = find_targets(module, pending)
            if not found:
                return
            patterns = [p for p in pending if any(matches(p, n, m) for n, m in found.items())]
            self.resolved.update(patterns)
            tracer = Tracer(module, patterns, warmup=self.config.warmup, max_calls=self.config.max_calls,
                            on_complete=self._on_tracer_complete, strict=self.config.strict,
                            backward=self.config.backward, ranks=self.config.ranks)
            self.tracers.append(tracer)
            self._prefixes[id(tracer)] = self.config.name or type(unwrap_model(module)).__name__
            if len(self.resolved) == len(self.config.targets):
                self._hook.remove()

    def _note_root(self, model: Any) -> None:
        def cls(m: Any) -> str:
            return f"{type(m).__module__}:{type(m).__qualname__}"

        modules = [[name, cls(m)] for name, m in model.named_modules()][:MAX_MODULES]
        self.roots.append({"class": cls(model), "modules": modules})
        if self.config.list_modules:
            self._hook.remove()
            self._write_summary()
            self._done = True
            print("modulelens: module tree written; ending the job (--list-modules)", file=sys.stderr, flush=True)
            raise SystemExit(0)

    def _on_tracer_complete(self, tracer: Any) -> None:
        with self._lock:
            self._save(tracer)
            everything = len(self.resolved) == len(self.config.targets) and all(t.finished for t in self.tracers)
        if everything:
            self._write_summary()
            if self.config.exit_after_capture:
                print("modulelens: everything captured and saved; ending the job (--exit-after-capture)",
                      file=sys.stderr, flush=True)
                self._done = True
                raise SystemExit(0)

    def _save(self, tracer: Any) -> None:
        from modulelens.tracing.save import save_records

        if id(tracer) in self._saved_tracers:
            return
        self._saved_tracers.add(id(tracer))
        tracer.stop()
        prefix = self._prefixes[id(tracer)]
        try:
            infos = save_records(tracer, self.config.repo, prefix, tags=self.config.tags,
                                 policy=self.config.policy())
        except Exception as error:
            if self.config.strict:
                raise
            self.failed.append(str(error))
            warnings.warn(f"modulelens: saving captures failed: {error}", stacklevel=2)
            return
        for info in infos:
            self.saved.append(info.to_dict())
            print(f"modulelens: saved {info.ref}", file=sys.stderr, flush=True)

    def finish(self) -> None:
        """At exit: save whatever was captured and report to the parent."""
        if self._done:
            return
        self._done = True
        with self._lock:
            self._hook.remove()
            for tracer in self.tracers:
                self._save(tracer)
            self._write_summary()

    def _write_summary(self) -> None:
        folder = os.environ.get(ENV_SUMMARY)
        if not folder or not os.path.isdir(folder):
            return
        summary = {"pid": os.getpid(), "rank": self.rank, "resolved": sorted(self.resolved),
                   "saved": self.saved, "failed": self.failed, "roots": self.roots}
        target = Path(folder) / f"{os.getpid()}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary))
        os.replace(tmp, target)


_session: _Session | None = None


def activate_from_env() -> None:
    """Called by the bootstrap in each process of a `modulelens run` job."""
    global _session
    raw = os.environ.get(ENV_CONFIG)
    if not raw or _session is not None:
        return
    # Every rank gets a session, recording or not: ranks that don't record still take part in the
    # gathers of sharded tensors (the Tracer decides from `ranks` who records and who saves).
    _session = _Session(RunConfig(**json.loads(raw)))
