"""Outcome categories of census captures, and the census table.

Every capture of every target ends in exactly one category. ``BIT_EXACT`` is the only pass; every
other category is a failure with its message. Categories before capture (``BUILD``, ``INPUTS``,
``RUN``) are decided in the probe process, where modulelens is never imported (``census/worker.py``):
the census could not make the target run (not counted in the bit-exact share, but listed). Every
later one is a failure of capture, storage or restore.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

BIT_EXACT = "bit-exact"
BUILD = "could not build the model"
INPUTS = "could not build inputs"
RUN = "could not run the model"  # in a mode, without modulelens: the census's inputs, not modulelens
JOB_BROKE = "job broke under capture"  # ran without modulelens, raises with it: the fail-open promise broken
CAPTURE_TIMEOUT = "capture timed out"  # ran without modulelens within the time limit, not under capture
PROBED = "runs (not captured: --probe-only)"  # a probe-only census: built and ran, nothing captured
DROPPED = "capture dropped"
CAPTURE_CRASH = "capture process crashed"
LOAD = "load"
REPLAY_ERROR = "replay error"
REPLAY_FAIL = "replay FAIL"
UNVERIFIED = "replay UNVERIFIED"
# ran and matched, but the recorded outputs hold nothing a module could get wrong (None, empty,
# only NaN or infinite; no calls): not bit-exact, as replay never PASSes vacuously (docs/tools.md)
NOTHING_TO_COMPARE = "replay UNVERIFIED: nothing to compare"
TOLERANCE = "replay PASS only within tolerance"
REPLAY_CRASH = "replay process crashed"
NOT_RUN = (BUILD, INPUTS, RUN)

# load errors by what they say (first match), so the table groups them by cause
_LOAD_REASONS = [
    (r"missing key|unexpected key|Missing key|Unexpected key|does not match the captured state",
     "state dict does not match the rebuilt module"),
    (r"unknown dtype", "unknown dtype"),
    (r"cannot be imported|not importable|No module named|has no attribute", "class not importable"),
    (r"structure|submodules that differ|changed after construction", "structure changed after construction"),
    (r"constructor|__init__\(\)|argument", "constructor arguments rejected"),
]


def load_category(error: str) -> str:
    for pattern, reason in _LOAD_REASONS:
        if re.search(pattern, error):
            return f"{LOAD}: {reason}"
    return f"{LOAD}: {error.split(':', 1)[0]}"


@dataclass
class Outcome:
    """One capture (target x submodule x mode), or one target that never got to capture."""

    family: str
    target: str
    category: str
    label: str = ""  # "<target>:<submodule>@<mode>", "" when the target never got to capture
    submodule: str | None = None
    mode: str | None = None
    message: str = ""
    ref: str | None = None
    warnings: list[str] = field(default_factory=list)
    known: str | None = None  # the documented reason (census/known.py) when this failure is expected
    differing: int | None = None  # replayed: output leaves compared and not matching (None: not replayed)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.category == BIT_EXACT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def from_replay(base: Outcome, result: dict[str, Any]) -> Outcome:
    """The outcome of a capture from ``tests/support/fidelity_replay.py``'s result for it."""
    base.seconds += float(result.get("seconds", 0.0))
    base.differing = result.get("differing")
    status = result.get("status")
    if status == "ERROR":
        error = result.get("error", "")
        base.category = load_category(error) if result.get("stage") == "load" else f"{REPLAY_ERROR}: {error.split(':', 1)[0]}"
        base.message = error
    elif status == "PASS" and result.get("mode") == "bit-exact":
        base.category = BIT_EXACT
    elif status == "PASS":
        base.category, base.message = TOLERANCE, f"mode {result.get('mode')}: {result.get('report', '')}"
    elif status == "UNVERIFIED" and result.get("nothing_to_compare"):
        base.category, base.message = NOTHING_TO_COMPARE, "; ".join(result.get("unverified") or [])
    elif status == "UNVERIFIED":
        base.category, base.message = UNVERIFIED, f"unrecorded {result.get('unrecorded')}: {result.get('report', '')}"
    else:
        base.category, base.message = REPLAY_FAIL, result.get("report", "")
    return base


@dataclass
class FamilyRow:
    family: str
    tried: int = 0  # targets (architectures / classes)
    built: int = 0  # targets the census could build and run (without capture)
    captured: int = 0  # targets with every chosen submodule saved in both modes
    exact: int = 0  # targets whose every capture replays bit-exact in a fresh process
    captures: int = 0
    captures_exact: int = 0
    seconds: float = 0.0  # wall
    cpu: float = 0.0  # CPU seconds of the family's processes (user + system)
    failures: Counter[str] = field(default_factory=Counter)  # category -> captures (or targets, before capture)


def rows(outcomes: list[Outcome], seconds: dict[str, float], cpu: dict[str, float] | None = None) -> list[FamilyRow]:
    table: dict[str, FamilyRow] = {}
    by_target: dict[tuple[str, str], list[Outcome]] = {}
    for outcome in outcomes:
        by_target.setdefault((outcome.family, outcome.target), []).append(outcome)
    for (family, _), group in by_target.items():
        row = table.setdefault(family, FamilyRow(family, seconds=seconds.get(family, 0.0),
                                                 cpu=(cpu or {}).get(family, 0.0)))
        row.tried += 1
        for outcome in group:
            if not outcome.passed and outcome.category != PROBED:
                row.failures[_short(outcome.category)] += 1
        if any(o.category in (BUILD, INPUTS) for o in group) or all(o.category == RUN for o in group):
            continue
        row.built += 1  # built and ran in at least one mode (a mode that did not run is listed as RUN)
        if any(o.category == PROBED for o in group):
            continue
        captures = [o for o in group if o.label and o.category != RUN]
        row.captures += len(captures)
        row.captures_exact += sum(o.passed for o in captures)
        row.captured += all(o.category not in (DROPPED, CAPTURE_CRASH, JOB_BROKE, CAPTURE_TIMEOUT) for o in group)
        row.exact += bool(captures) and all(o.passed for o in group if o.category != RUN)
    return sorted(table.values(), key=lambda r: r.family)


def _short(category: str) -> str:
    return category.split(":", 1)[0] if category.startswith(DROPPED) else category


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render(table: list[FamilyRow], wall: float | None = None) -> str:
    """The census table; the **all** row's wall is the whole run's (``wall``: families run side by side)."""
    lines = ["| family | tried | built | captured | bit-exact (targets) | bit-exact (captures) | wall s | CPU s "
             "| failures by reason |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    total = FamilyRow("**all**")
    for row in table:
        failures = "; ".join(f"{reason}: {count}" for reason, count in row.failures.most_common())
        lines.append(f"| {row.family} | {row.tried} | {row.built} | {row.captured} | {row.exact}/{row.built} "
                     f"({_pct(row.exact, row.built)}) | {row.captures_exact}/{row.captures} "
                     f"({_pct(row.captures_exact, row.captures)}) | {row.seconds:.0f} | {row.cpu:.0f} | {failures or '-'} |")
        for name in ("tried", "built", "captured", "exact", "captures", "captures_exact"):
            setattr(total, name, getattr(total, name) + getattr(row, name))
        total.seconds = wall if wall is not None else total.seconds + row.seconds
        total.cpu += row.cpu
        total.failures.update(row.failures)
    failures = "; ".join(f"{reason}: {count}" for reason, count in total.failures.most_common())
    lines.append(f"| {total.family} | {total.tried} | {total.built} | {total.captured} | {total.exact}/{total.built} "
                 f"({_pct(total.exact, total.built)}) | {total.captures_exact}/{total.captures} "
                 f"({_pct(total.captures_exact, total.captures)}) | {total.seconds:.0f} | {total.cpu:.0f} | {failures or '-'} |")
    return "\n".join(lines)


def summary(message: str) -> str:
    """The first line of a message and, for a replay report, its first failing call."""
    lines = message.strip().splitlines() or [""]
    failing = next((line.strip() for line in lines[1:] if "FAIL" in line or "max abs" in line), "")
    return f"{lines[0]} {failing}".strip()


def render_failures(outcomes: list[Outcome]) -> str:
    """Every failure, one line each: family, label, category, the first line of its message."""
    lines = []
    failed = (o for o in outcomes if not o.passed and o.category != PROBED)
    for o in sorted(failed, key=lambda o: (o.family, o.category, o.target, o.label)):
        message = summary(o.message).replace("|", "/")[:300]
        known = f" (known: {o.known})" if o.known else ""
        lines.append(f"- `{o.family}` `{o.label or o.target}`: **{o.category}**{known}: {message}")
    return "\n".join(lines)
