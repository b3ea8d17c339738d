"""Actions of a server started with ``--allow-run``: replay, profile, run B on A's inputs.

Each action is a child process (:mod:`._action_worker`) that reports its progress as JSON lines;
a thread of the server reads them into a :class:`Job`, which the job page shows and refreshes.
One action runs at a time (the others wait as ``queued``): they measure and compete for the same
cores, and a profile timed next to a replay would be wrong.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from modulelens.interfaces.ui.shown import (
    REPORT_ROWS,
    as_text,
    listed,
    objects_in,
    shown_bytes,
    shown_ms,
    shown_number,
)

KINDS = ("replay", "profile", "diff")
_LOG_LINES = 200


@dataclass
class Job:
    """One action and what is known of it so far."""

    id: int
    kind: str
    refs: tuple[str, ...]
    state: str = "queued"  # queued, running, done, failed
    stage: str = "waiting for the action before it"
    done: int = 0
    total: int = 0
    passed: bool | None = None
    result: dict[str, Any] = field(default_factory=dict)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=_LOG_LINES))
    started: float = field(default_factory=time.time)
    ended: float | None = None

    @property
    def ref(self) -> str:
        return self.refs[0]

    @property
    def target(self) -> str:
        return " → ".join(self.refs)

    def view(self) -> dict[str, Any]:
        """What the job page shows: its state, and its result rendered for its kind (a verdict, the
        profile's numbers formatted, the diff's calls as a table), never as raw JSON."""
        elapsed = (self.ended or time.time()) - self.started
        return {"id": self.id, "kind": self.kind, "target": self.target, "ref": self.ref, "refs": list(self.refs), "state": self.state,
                "stage": self.stage, "done": self.done, "total": self.total, "passed": self.passed,
                "result": _shown_result(self.kind, self.result) if self.result else None,
                "log": "\n".join(self.log), "elapsed": f"{elapsed:.1f} s",
                "started": time.strftime("%H:%M:%S", time.localtime(self.started))}


def _shown_result(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    """A finished action's result for the job page: ``facts`` (label, text), and for a diff the
    per-call ``rows`` and whether B's outputs are the ``same`` as A's (a diff is no verdict: two
    versions a training step apart differ as they should, so it is never shown as FAIL)."""
    facts: list[tuple[str, str]] = []
    shown: dict[str, Any] = {"facts": facts, "rows": [], "same": None, "notes": listed(result.get("notes") or [], 20)}
    if kind == "replay":
        facts += [("verdict", as_text(result.get("status") or "-", 40)), ("calls replayed", as_text(result.get("calls"), 20)),
                  ("mode", as_text(result.get("mode") or "-", 60))]
    elif kind == "profile":
        facts += [("median latency (call 0)", shown_ms(result.get("median_ms"))),
                  ("peak memory", shown_bytes(result.get("peak_bytes"))), ("FLOPs", shown_number(result.get("flops"), "FLOP"))]
    elif kind == "diff":
        outputs = objects_in(result.get("outputs"))
        shown["same"] = result.get("same") if isinstance(result.get("same"), bool) else None
        differ = [o for o in outputs if o.get("same") is not True]
        facts += [("compared", f"{as_text(result.get('b'), 300)} on the recorded inputs of {as_text(result.get('a'), 300)}"),
                  ("outputs", f"the same on all {len(outputs)} calls" if outputs and not differ else
                              f"different on {len(differ)} of {len(outputs)} calls")]
        shown["rows"] = [(as_text(o.get("call"), 20), o.get("same") is True, shown_number(o.get("max_abs_error")),
                          as_text(o.get("error") or "", 500)) for o in outputs[:REPORT_ROWS]]
    if result.get("report"):
        facts.append(("report stored", as_text(str(result["report"]).replace("\\", "/").rsplit("/", 1)[-1], 200)))
    return shown


class JobRunner:
    """Starts actions as child processes, one at a time, and keeps their state.

    Args:
        repo_location: the repo the server shows (passed to each child as ``--repo``).
        omp_threads: ``OMP_NUM_THREADS`` for the children (``None``: unset, torch's default).
    """

    def __init__(self, repo_location: str, omp_threads: str | None = None) -> None:
        self.repo_location = repo_location
        self.omp_threads = omp_threads  # OMP_NUM_THREADS of the actions (the user's, before the server set its own)
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._one_at_a_time = threading.Lock()
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen[str]] = set()

    def start(self, kind: str, refs: tuple[str, ...]) -> Job:
        """Queue an action (the caller has checked that ``refs`` exist)."""
        if kind not in KINDS:
            raise ValueError(f"unknown action {kind!r}")
        job = Job(id=next(self._ids), kind=kind, refs=refs)
        with self._lock:
            self._jobs[job.id] = job
        threading.Thread(target=self._run, args=(job,), name=f"modulelens-ui-job-{job.id}", daemon=True).start()
        return job

    def get(self, job_id: int) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.id, reverse=True)

    def stop(self) -> None:
        """End every child still running (the server is stopping)."""
        with self._lock:
            children = list(self._children)
        for child in children:
            child.kill()

    def _run(self, job: Job) -> None:
        with self._one_at_a_time:
            job.state, job.stage, job.started = "running", "starting", time.time()
            command = [sys.executable, "-m", "modulelens.interfaces.ui._action_worker", job.kind, *job.refs,
                       "--repo", self.repo_location]
            env = dict(os.environ)
            if self.omp_threads is None:
                env.pop("OMP_NUM_THREADS", None)  # the server's own one-thread setting is not the action's
            else:
                env["OMP_NUM_THREADS"] = self.omp_threads
            try:
                child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         stdin=subprocess.DEVNULL, bufsize=1, env=env)
            except OSError as error:
                job.state, job.stage, job.ended = "failed", f"could not start: {error}", time.time()
                return
            with self._lock:
                self._children.add(child)
            try:
                self._follow(job, child)
            finally:
                with self._lock:
                    self._children.discard(child)
                job.ended = time.time()

    def _follow(self, job: Job, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        outcome: dict[str, Any] = {}
        for line in child.stdout:
            message = _message(line)
            if message is None:
                job.log.append(line.rstrip("\n"))
            elif "stage" in message:
                job.stage, job.done, job.total = str(message["stage"]), int(message["done"]), int(message["total"])
            else:
                outcome = message
        code = child.wait()
        if "result" in outcome and code == 0:
            job.result = dict(outcome["result"])
            job.passed = job.result.pop("passed", None)
            job.state, job.stage, job.done = "done", "finished", job.total
        else:
            job.state = "failed"
            job.stage = str(outcome.get("error") or f"the action's process exited with code {code}")


def _message(line: str) -> dict[str, Any] | None:
    """A progress or result line of the child, or ``None`` for any other output (a warning)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) and ({"stage", "done", "total"} <= data.keys() or "result" in data
                                                or "error" in data) else None
