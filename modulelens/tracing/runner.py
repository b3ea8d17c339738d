"""`modulelens run`: capture from an unmodified program.

The parent (:func:`run_command`) starts the user's command with this package's ``_bootstrap``
folder first on ``PYTHONPATH`` and the settings in ``MODULELENS_RUN_CONFIG``; every Python process
of the job then loads ``_bootstrap/sitecustomize.py``, which calls :func:`activate_from_env`:

1. constructor tracking goes on before any user code is imported;
2. a global forward pre-hook looks at each module the first time it is called; the first one whose
   tree contains a target becomes a root, and a :class:`Tracer` is attached to it. A target that
   matches nothing in that tree is looked for in the tree of the module's outermost parent (from a
   global registration hook), so a submodule the job calls before its model (BART's encoder, called
   by ``generate()`` before the model's first forward) is still found by its name in the model;
3. each target is saved as soon as it is recorded, so a job that ends abruptly keeps it; once
   every target is, the global hook is removed (and with ``--exit-after-capture`` the job ends
   cleanly with exit code 0);
4. at exit, whatever was captured and not saved yet is saved and a summary for the parent is
   written.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported by the job's process only: `modulelens run` itself does not need it
    from torch import nn

    from modulelens.tracing.options import PayloadPolicy, Recording
    from modulelens.tracing.tracer import Tracer
    from modulelens.tracing.upload import Destination

ENV_CONFIG = "MODULELENS_RUN_CONFIG"
ENV_SUMMARY = "MODULELENS_RUN_SUMMARY_DIR"
STRICT_EXIT = 2  # the job's exit code when --strict stops it at a target that matches nothing
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
    backward: bool = False  # also record gradients (Recording(backward=True))
    shape_only_over: int | None = None  # PayloadPolicy: bigger call tensors are stored shape-only
    max_bytes: int | None = None  # PayloadPolicy: payload budget per capture
    list_modules: bool = False  # report the module tree of the first model called, then end the job
    depth: int | None = None  # a glob target matches at most this many levels below its fixed prefix
    op_trace: bool = False  # Recording(op_trace=True): each recorded call's aten ops
    op_trace_values: int = 16 << 20  # Recording(op_trace_values=...): bytes of op output values kept per call
    settle_at_return: bool = False  # Recording(settle_at_return=True): weights read before a recorded call returns

    def recording(self) -> Recording:
        """The :class:`Recording` of ``--warmup``/``--max-calls``/``--backward``/``--ranks``/``--op-trace``/
        ``--settle-at-return``."""
        from modulelens.tracing.options import Recording  # imports torch: only in the job's processes

        return Recording(warmup=self.warmup, max_calls=self.max_calls, backward=self.backward, ranks=self.ranks,
                         op_trace=self.op_trace, op_trace_values=self.op_trace_values,
                         settle_at_return=self.settle_at_return)

    def policy(self) -> PayloadPolicy | None:
        """The payload policy of ``--shape-only-over``/``--max-bytes`` (``None`` when neither is set)."""
        from modulelens.tracing.options import PayloadPolicy  # imports torch: only in the job's processes

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


_GLOB_CHARS = "*?["


def within_depth(pattern: str, qualified_name: str, depth: int | None) -> bool:
    """Whether ``--depth`` keeps a module that ``pattern`` matched.

    ``*`` in a target crosses dots (``layer1.*`` matches every module under ``layer1``, its
    children's children too). With a depth, a glob target keeps only the modules at most ``depth``
    levels below its fixed prefix, the dotted part before its first wildcard: ``layer1.*`` with
    depth 1 is ``layer1.0`` and ``layer1.1``, not ``layer1.0.conv1``. A class name or an exact
    name (no wildcard) is not limited.

    Example::

        within_depth("layer1.*", "layer1.0", 1)         # True
        within_depth("layer1.*", "layer1.0.conv1", 1)   # False
    """
    if depth is None:
        return True
    first = min((i for i, ch in enumerate(pattern) if ch in _GLOB_CHARS), default=None)
    if first is None:
        return True
    fixed = pattern[:first].rpartition(".")[0]
    levels = qualified_name.count(".") + 1 - (fixed.count(".") + 1 if fixed else 0)
    return levels <= depth


def _exact(name: str) -> str:
    """``name`` as a glob that matches only itself (fnmatch's wildcards bracketed)."""
    return "".join(f"[{ch}]" if ch in _GLOB_CHARS else ch for ch in name)


# ------------------------------------------------------------------------------------------ parent


def run_command(command: list[str], config: RunConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Run ``command`` with capture on; returns exit code, what was saved and what was missed."""
    from modulelens.errors import RemoteRepoError, StorageError
    from modulelens.repo import Repo
    from modulelens.repo import default_repo_path as repo_default

    requested = config.repo
    unreachable: RemoteRepoError | None = None
    try:
        repo = Repo(config.repo)  # create it now so every process of the job agrees on it
    except (OSError, StorageError) as error:  # fail open: the job runs, captures go elsewhere
        from modulelens.tracing.save import copy_back_hint, describe_storage_error, fallback_repo

        repo = fallback_repo()
        print(f"modulelens: cannot use repo {requested or repo_default()} ({describe_storage_error(error)}); "
              f"captures go to {repo.root}; copy them back with: {copy_back_hint(repo, requested)}",
              file=sys.stderr, flush=True)
    except RemoteRepoError as error:  # fail open, as capture() does: the job runs, captures wait locally
        from modulelens.tracing.upload import staging_repo

        unreachable, repo = error, staging_repo(str(requested))
        print(f"modulelens: {error}; the job runs anyway and its captures are kept in {repo.location}",
              file=sys.stderr, flush=True)
    config.repo = repo.location  # a path, or the URL of a remote repo
    print(f"modulelens: {_banner(config, command)}", file=sys.stderr, flush=True)  # the job may run long before a save
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
    kept = [k for summary in summaries for k in summary.get("kept", [])]
    if unreachable is not None:  # every capture went to the staging repo: none is in the repo asked for
        kept += [{**entry, "kept_in": repo.location, "url": str(requested), "reason": str(unreachable)} for entry in saved]
        saved = []
    # a pattern counts once a capture of it was saved, not when it merely matched a module
    captured_patterns = {p for summary in summaries for p in summary.get("captured", [])}
    matched_patterns = {p for summary in summaries for p in summary["resolved"]}
    roots = [root for summary in summaries for root in summary.get("roots", [])]
    modules = [m for root in roots for m in root["modules"]]
    missing = [t for t in config.targets if t not in captured_patterns]
    # what really happened to each target that matched a module and saved nothing (tracer.why_not_recorded)
    reasons = {p: why for summary in summaries for p, why in summary.get("not_captured", {}).items()}
    return {
        # ok: the job succeeded and every target pattern has at least one saved capture
        "ok": completed.returncode == 0 and bool(saved) and not missing,
        "exit_code": completed.returncode,
        "command": command,
        "repo": config.repo,
        "requested_repo": requested if requested is not None else str(repo_default()),
        "saved": saved,
        # captures the remote --repo could not take (unreachable at the start, or an upload that
        # failed): kept in a local repo, with why and the commands that push them there
        "kept": kept,
        "push_commands": push_commands(kept),
        "missing_targets": missing,  # never matched, or matched but never captured (or saved)
        # of those, the ones that matched a module that was never called (after warm-up) or whose save failed
        "matched_not_captured": [t for t in missing if t in matched_patterns],
        "not_captured": {t: reasons[t] for t in missing if t in reasons},
        "suggestions": {t: closest_modules(t, modules) for t in missing},
        "roots": roots,
        "processes": summaries,
        # why --strict stopped the job (a target that matches no module of the first model called)
        "stopped": next((s["stopped"] for s in summaries if s.get("stopped")), None),
    }


def _banner(config: RunConfig, command: list[str]) -> str:
    """What this run captures and where, said before the job starts: ``capturing top_mlp (its first
    call) as ranker/<module> into /data/repo; running python train.py``."""
    import shlex

    if config.list_modules:
        return f"listing the modules of the first model that {shlex.join(command)} calls"
    calls = "its first call" if config.max_calls == 1 else f"{config.max_calls} calls each"
    if config.warmup:
        calls += f", after {config.warmup} warm-up call{'s' if config.warmup > 1 else ''}"
    ranks = [] if config.ranks == "0" else ["on all ranks"] if config.ranks == "all" else [f"on ranks {config.ranks}"]
    extras = [calls, *(["with gradients"] if config.backward else []), *ranks]
    name = f"{config.name}/<module>" if config.name else "<model class>/<module>"
    return (f"capturing {', '.join(config.targets)} ({', '.join(extras)}) as {name} into {config.repo}; "
            f"running {shlex.join(command)}")


def push_commands(kept: Sequence[Mapping[str, object]]) -> list[str]:
    """One ``modulelens push`` per kept name, from the local repo it was kept in to the remote repo it
    was meant for (safe to run again: a version already there is not copied again)."""
    import shlex

    names = dict.fromkeys((str(entry["ref"]).partition(":")[0], str(entry["kept_in"]), str(entry["url"])) for entry in kept)
    return [shlex.join(["modulelens", "push", name, "--repo", where, "--to", url]) for name, where, url in names]


# ------------------------------------------------------------------------------------------ child


class _Session:
    """Capture state of one process of the job.

    Each target is saved as soon as it is complete (not only at exit), so a job that ends abruptly
    keeps it; what is left is saved when the main thread ends (``at_main_thread_exit``).
    """

    def __init__(self, config: RunConfig) -> None:
        import torch

        from modulelens.tracing.init_tracking import track_init

        self.config = config
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.tracers: list[Tracer] = []
        self.resolved: set[str] = set()
        self.captured: set[str] = set()  # patterns with at least one saved capture
        self.saved: list[dict[str, Any]] = []
        # versions kept in a local staging repo because their upload to the remote repo failed
        self.kept: list[dict[str, Any]] = []
        self._staged: dict[str, dict[str, Any]] = {}  # staged ref -> its VersionInfo, until uploaded
        self.failed: list[str] = []
        self.uploads: list[Any] = []  # background uploads to a remote repo (modulelens/tracing/upload.py)
        self.roots: list[dict[str, Any]] = []  # module trees of the first models called
        self._seen: set[int] = set()
        self._prefixes: dict[int, str] = {}  # tracer id -> capture name prefix
        self._patterns: dict[int, list[str]] = {}  # tracer id -> its target patterns as given
        self._saved_targets: set[tuple[int, str]] = set()  # (tracer id, qualified name)
        self._lock = threading.RLock()
        self._parents = _Parents()
        self._attached_late: dict[str, str] = {}  # pattern -> the method call under way when it attached
        self._done = False
        self._destination_of_repo: Destination | None = None  # config.repo, converted once (_destination)
        self.stopped: str | None = None  # why --strict ended the job early
        track_init()
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._on_module_call)
        from modulelens.tracing.upload import at_main_thread_exit

        at_main_thread_exit(self.finish)  # before thread pools stop: the last saves may upload

    def _destination(self) -> Destination:
        """``config.repo`` as every tracer's weights and every save use it: converted once
        (tracing/upload.py's ``Destination``)."""
        from modulelens.tracing.upload import Destination

        with self._lock:
            if self._destination_of_repo is None:
                self._destination_of_repo = Destination(self.config.repo)
            return self._destination_of_repo

    def _on_module_call(self, module: nn.Module, inputs: tuple[object, ...]) -> None:
        if id(module) in self._seen:
            return
        try:
            for tracer in self._consider_root(module):
                _record_root_call(tracer, module, inputs)
        except Exception as error:
            if self.config.strict:
                raise
            warnings.warn(f"modulelens: could not attach capture: {error}", stacklevel=2)

    def _consider_root(self, module: nn.Module) -> list[Tracer]:
        """The tracers attached at ``module``'s first call: on its own tree, and on its outermost
        parent's for targets only that tree holds."""
        from modulelens.tracing.targets import unwrap_model

        with self._lock:
            for sub in module.modules():
                self._seen.add(id(sub))
            first_root = not self.roots
            if len(self.roots) < MAX_ROOTS:
                self._note_root(unwrap_model(module))
            pending = [p for p in self.config.targets if p not in self.resolved]
            found, patterns = self._matching(module, pending)
            tracers = []
            outer = self._parents.outermost(module)
            if outer is not module and len(patterns) < len(pending):  # called before its model (see above)
                outer_found, outer_patterns = self._matching(outer, [p for p in pending if p not in patterns])
                if outer_found:
                    if len(self.roots) < MAX_ROOTS:
                        self._note_root(unwrap_model(outer))
                    for sub in outer.modules():
                        self._seen.add(id(sub))
                    tracers.append(self._attach(outer, outer_found, outer_patterns))
            if first_root and self.roots and self.config.strict:
                self._check_first_root(pending, [*patterns, *self.resolved])
            if found:
                tracers.append(self._attach(module, found, patterns))
            return tracers

    def _matching(self, root: nn.Module, pending: list[str]) -> tuple[dict[str, nn.Module], list[str]]:
        """The targets under ``root`` that ``pending`` select (``--depth`` applied), and those patterns."""
        from modulelens.tracing.targets import find_targets

        found = {n: m for n, m in find_targets(root, pending).items() if any(self._selects(p, n, m) for p in pending)}
        return found, [p for p in pending if any(self._selects(p, n, m) for n, m in found.items())]

    def _attach(self, module: nn.Module, found: Mapping[str, nn.Module], patterns: list[str]) -> Tracer:
        from modulelens.tracing.methods import split_target
        from modulelens.tracing.targets import unwrap_model
        from modulelens.tracing.tracer import Tracer

        with self._lock:
            self.resolved.update(patterns)
            # With --depth the tracer is given the exact names kept (its globs know no depth).
            targets = patterns if self.config.depth is None else [_exact_target(n) for n in found]
            tracer = Tracer(module, targets, record=self.config.recording(), on_complete=self._on_tracer_complete,
                            on_target_complete=self._on_target_complete, strict=self.config.strict,
                            blob_sink=self._destination().blob_writer)  # tracing/weights.py
            self.tracers.append(tracer)
            self._prefixes[id(tracer)] = self.config.name or type(unwrap_model(module)).__name__
            self._patterns[id(tracer)] = patterns
            for key, target in found.items():
                method = split_target(key)[1]
                if method is not None and _running(target, method):
                    for pattern in patterns:
                        if self._selects(pattern, key, target, module):
                            self._attached_late[pattern] = (
                                f"{key or '<root>'}: capture attached while its first call was under way (the job's "
                                f"first module call ran inside {method}()), so that call is not recorded; later "
                                f"calls are (or wrap that first call in modulelens.capture(model, [{key!r}]))")
            if len(self.resolved) == len(self.config.targets):
                self._hook.remove()
                self._parents.stop()
            return tracer

    # module: Any, as tracer.matches takes it: a saved record's module may be None here (records.py drops it)
    def _selects(self, pattern: str, qualified: str, module: Any, model: nn.Module | None = None) -> bool:
        """Whether target ``pattern`` (as the user wrote it) selects ``qualified``, a target key
        (``name`` or ``name:method``), ``--depth`` included."""
        from modulelens.tracing.methods import split_target
        from modulelens.tracing.targets import matches, normalise_pattern

        normalised = pattern if model is None else normalise_pattern(pattern, model)
        return matches(normalised, qualified, module) and within_depth(
            split_target(normalised)[0], split_target(qualified)[0], self.config.depth)

    def _check_first_root(self, pending: list[str], matched: list[str]) -> None:
        """``--strict``: at the first model's first call, end the job at a target that matches none
        of its modules (a typo is known now, not after the whole job ran). Without ``--strict`` a
        target is only reported unmatched when the job ended without capturing it (the parent
        says so): with several models, a later one may hold it."""
        unmatched = [p for p in pending if p not in matched]
        if not unmatched or self.rank != 0:
            return
        root = self.roots[0]
        model = root["class"].rsplit(":", 1)[-1]
        lines = []
        for pattern in unmatched:
            close = ", ".join(f"{n or '<root>'} ({c.rsplit(':', 1)[-1]})"
                              for n, c in closest_modules(pattern, root["modules"]))
            lines.append(f"target {pattern!r} matches no module of {model} (the first model called)"
                         + (f"; closest: {close}" if close else "; see modulelens run --list-modules -- CMD"))
        self.stopped = "; ".join(lines) + "; the job was stopped (--strict)"
        print(f"modulelens: {self.stopped}", file=sys.stderr, flush=True)
        self._hook.remove()
        self._write_summary()
        self._done = True
        raise SystemExit(STRICT_EXIT)

    def _on_target_complete(self, tracer: Tracer, qualified: str) -> None:
        with self._lock:
            self._save(tracer, [qualified])

    def _note_root(self, model: nn.Module) -> None:
        def cls(m: object) -> str:
            return f"{type(m).__module__}:{type(m).__qualname__}"

        modules = [[name, cls(m)] for name, m in model.named_modules()][:MAX_MODULES]
        self.roots.append({"class": cls(model), "modules": modules})
        if self.config.list_modules:
            self._hook.remove()
            self._write_summary()
            self._done = True
            print("modulelens: module tree written; ending the job (--list-modules)", file=sys.stderr, flush=True)
            raise SystemExit(0)

    def _on_tracer_complete(self, tracer: Tracer) -> None:
        with self._lock:
            tracer.stop()
            self._save(tracer, list(tracer.records))
            everything = len(self.resolved) == len(self.config.targets) and all(t.finished for t in self.tracers)
        if everything and self.config.exit_after_capture:
            print("modulelens: everything captured and saved; ending the job (--exit-after-capture)",
                  file=sys.stderr, flush=True)
            # finish() before the exit: it waits (bounded) for the uploads to a remote repo and
            # writes the summary with the uploaded versions; the exit hooks would find it done.
            self.finish()
            raise SystemExit(0)

    def _save(self, tracer: Tracer, qualified_names: list[str]) -> None:
        """Save those targets of ``tracer`` not saved yet (each once), then update the summary."""
        from modulelens.tracing.save import save_captures

        for qualified in qualified_names:
            if (id(tracer), qualified) in self._saved_targets:
                continue
            self._saved_targets.add((id(tracer), qualified))
            try:
                infos, upload = save_captures(tracer, self._destination(), self._prefixes[id(tracer)],
                                              tags=self.config.tags, policy=self.config.policy(), only=[qualified])
            except Exception as error:
                if self.config.strict:
                    raise
                self.failed.append(f"{qualified or '<root>'}: {type(error).__name__}: {error}")
                warnings.warn(f"modulelens: saving the capture of {qualified or '<root>'} failed: "
                              f"{type(error).__name__}: {error}", stacklevel=2)
                continue
            if infos:
                module = tracer.records[qualified].module
                raw = self._patterns[id(tracer)]  # as the user wrote them; tracer.patterns are normalised
                self.captured.update(r for r in raw if self._selects(r, qualified, module, tracer.model))
            if upload is not None:  # staged locally; the job goes on while it uploads
                self.uploads.append(upload)
                self._staged.update((info.ref, info.to_dict()) for info in infos)
                print(f"modulelens: saved {', '.join(upload.staged)} locally; uploading to {upload.url} in the "
                      "background", file=sys.stderr, flush=True)
                continue
            for info in infos:
                self.saved.append(info.to_dict())
                print(f"modulelens: saved {info.ref}", file=sys.stderr, flush=True)
        self._write_summary()

    def finish(self) -> None:
        """At exit: save whatever was captured and not saved yet, and report to the parent."""
        if self._done:
            return
        self._done = True
        with self._lock:
            self._hook.remove()
            self._parents.stop()
            for tracer in self.tracers:
                tracer.stop()
                self._save(tracer, list(tracer.records))
            self._finish_uploads()
            self._write_summary()

    def _finish_uploads(self) -> None:
        """Wait (bounded, like at any exit) for the background uploads; the summary then names the
        uploaded versions as the remote repo numbers them, and the ones that failed."""
        from modulelens.tracing.upload import exit_wait_s

        deadline = time.monotonic() + exit_wait_s()
        for upload in self.uploads:
            for info in upload.wait(max(0.0, deadline - time.monotonic())):
                self.saved.append(info.to_dict())
                print(f"modulelens: saved {info.ref} in {upload.url}", file=sys.stderr, flush=True)
            if len(upload.uploaded) < len(upload.staged):
                self.failed.append(f"upload to {upload.url} {'failed' if upload.done else 'unfinished'}: kept in "
                                   f"{upload.staging.location}; retry with: {upload.retry_command}")
                reason = str(upload.error) if upload.error is not None else "the upload did not finish before the job ended"
                self.kept += [{**self._staged.get(ref, {"ref": ref}), "kept_in": upload.staging.location, "url": upload.url,
                               "reason": reason} for ref in upload.staged if ref not in upload.uploaded]
        self.uploads = []

    def _not_captured(self) -> dict[str, str]:
        """For each target pattern that matched a module and has no saved capture: what happened."""
        reasons: dict[str, str] = {}
        for pattern in sorted(self.resolved - self.captured):
            found: list[str] = []
            for tracer in self.tracers:
                if pattern not in self._patterns.get(id(tracer), []):
                    continue
                for key, record in tracer.records.items():
                    if record.module is None or not self._selects(pattern, key, record.module, tracer.model):
                        continue
                    if record.calls:
                        found.append(f"{key or '<root>'}: recorded, but saving it failed")
                    else:
                        found.append(self._attached_late.get(pattern) or tracer.why_not_recorded(key))
            if found:
                reasons[pattern] = "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
        return reasons

    def _write_summary(self) -> None:
        folder = os.environ.get(ENV_SUMMARY)
        if not folder or not os.path.isdir(folder):
            return
        summary = {"pid": os.getpid(), "rank": self.rank, "resolved": sorted(self.resolved),
                   "captured": sorted(self.captured), "saved": self.saved, "kept": self.kept, "failed": self.failed,
                   "roots": self.roots, "stopped": self.stopped, "not_captured": self._not_captured()}
        from modulelens.repo.files import replace_file

        replace_file(Path(folder) / f"{os.getpid()}.json", json.dumps(summary).encode())


def _record_root_call(tracer: Tracer, module: nn.Module, inputs: tuple[object, ...]) -> None:
    """Record the call of ``module`` that is under way when its tracer attached (see
    :meth:`Tracer.record_call_in_progress`): the root's, or a target's called before its model. A
    global pre-hook gets no keyword arguments: they are read from torch's ``_call_impl`` frame, and
    only when it is unmistakably this call's frame."""
    if not any(r.module is module and r.method is None for r in tracer.records.values()):
        return
    frame = sys._getframe(2)  # _call_impl's inner() -> _on_module_call -> here
    try:
        names = frame.f_locals
        args, kwargs = names.get("args"), names.get("kwargs")
    finally:
        del frame
    if args is inputs and isinstance(kwargs, dict):
        tracer.record_call_in_progress(module, args, kwargs)
    else:
        warnings.warn("modulelens: the root model's first call could not be recorded (its inputs are not visible "
                      "from here); its next call will be", stacklevel=3)


class _Parents:
    """Each module's parent, from torch's global registration hook (on while capture looks for
    roots): a submodule called before its model leads to the model, whose names the targets use.
    Held by id with weak references: modules that define ``__eq__`` are unhashable."""

    def __init__(self) -> None:
        import torch

        self._parent: dict[int, tuple[Any, Any]] = {}  # id(child) -> (weakref(child), weakref(parent))
        self._handle: Any = torch.nn.modules.module.register_module_module_registration_hook(self._registered)

    def _registered(self, parent: nn.Module, _name: str, child: nn.Module | None) -> None:
        if child is not None:
            try:
                self._parent[id(child)] = (weakref.ref(child), weakref.ref(parent))
            except TypeError:  # not weakly referenceable
                pass

    def outermost(self, module: nn.Module) -> nn.Module:
        """The outermost live module that still holds ``module`` in its tree (``module`` itself if none)."""
        seen = {id(module)}
        while True:
            found = self._parent.get(id(module))
            if found is None or found[0]() is not module:
                return module
            parent = found[1]()
            if parent is None or id(parent) in seen or not any(c is module for c in parent._modules.values()):
                return module
            seen.add(id(parent))
            module = parent

    def stop(self) -> None:
        self._handle.remove()
        self._parent.clear()


def _running(module: object, method: str) -> bool:
    """Whether ``module.<method>`` is executing on this thread's stack now."""
    function = getattr(getattr(type(module), method, None), "__wrapped__", None) or getattr(type(module), method, None)
    code = getattr(function, "__code__", None)
    frame: Any = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code is code and frame.f_locals.get("self") is module:
                return True
            frame = frame.f_back
        return False
    finally:
        del frame


def _exact_target(key: str) -> str:
    """A target key (``name`` or ``name:method``) as a pattern that selects only it."""
    from modulelens.tracing.methods import split_target, target_key

    qualified, method = split_target(key)
    return target_key(_exact(qualified), method) if method is not None else _exact(key)


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
