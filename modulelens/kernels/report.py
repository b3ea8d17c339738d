"""The data of a ``kernel verify`` report (``KernelReport.data``, written as JSON: docs/kernels.md),
typed once so that the functions that fill it in (verify, judging, exploits) say which fields
they touch.

Its sections are open records (dicts of JSON values) because each check adds the facts it found;
the top level is fixed.
"""

from __future__ import annotations

from typing import Any, TypedDict


class ReportData(TypedDict, total=False):
    """One candidate judged against a capture. Every key but ``report_path``, ``divergence`` and
    ``timing``'s details is present from the start (``_new_report``)."""

    schema: str
    kind: str
    ref: str
    module_class: str
    candidate: dict[str, Any]  # path, origin, hash, entry, backend, source, load_error
    status: str  # PASS, FAIL or UNVERIFIED
    passed: bool
    unverified: list[str]
    failures: list[str]
    failed_checks: list[str]
    notes: list[str]
    static: dict[str, Any]
    tolerances: dict[str, dict[str, Any]]  # per output dtype: the rule and its numbers
    tolerance_overrides: dict[str, Any]
    settings: dict[str, Any]
    runtime: dict[str, Any]
    samples: list[dict[str, Any]]  # one entry per sample judged
    checks: dict[str, Any]
    correctness: dict[str, Any]
    timing: dict[str, Any]
    review_required: bool
    review_reasons: list[str]
    environment: dict[str, Any]
    divergence: dict[str, Any]
    report_path: str
