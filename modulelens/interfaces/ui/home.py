"""A capture's home: the page of a name (its versions, aliases, tags, descriptions and a timeline),
and what a capture page says about where a version came from and how to use it (lineage, the
"use this capture" snippets, its notes).

Everything here is read from the listing, the name's notes file and the versions' checked
metadata; nothing a capture names is imported. The snippets are text the user copies and runs
themselves: the ref and the repo are quoted for Python (``repr``) and for a POSIX shell
(``shlex.quote``), so a repo path with spaces or quotes stays one argument, and they never add
``trust_source=True`` (a copied snippet must not run a capture's stored code unasked).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from modulelens.interfaces.ui.repo_view import RepoView, StoredCapture
from modulelens.interfaces.ui.report_pages import report_anchor, report_line
from modulelens.interfaces.ui.shown import (
    LISTED,
    TIMELINE_REPORTS,
    VERSIONS_PER_PAGE,
    Window,
    as_text,
    href_with,
    listed,
    page_in_link,
    when,
)
from modulelens.interfaces.value_text import short_class

if TYPE_CHECKING:
    from modulelens.repo import VersionInfo, VersionNotes


def name_href(name: str) -> str:
    return "/name/" + quote(name, safe="/")


# ------------------------------------------------------------------------------------------ name


def name_page(view: RepoView, name: str, page: int = 1) -> dict[str, Any]:
    """A name's page: its versions newest first (:data:`~.shown.VERSIONS_PER_PAGE` a page) with
    their aliases, tags, descriptions and capturing jobs; its aliases; the two-version picker of the
    diff; and a timeline of what happened to the versions of the page (saved, reports made, notes
    edited), newest first.

    Raises:
        CaptureNotFoundError: no version of ``name`` (with the closest names).
    """
    infos = sorted(view.name_versions(name), key=lambda i: -i.version)
    notes, notes_problem = view.name_notes(name)
    window = Window.of(len(infos), page, VERSIONS_PER_PAGE)
    shown = infos[window.start:window.stop]
    aliases: dict[str, int] = {}
    rows = []
    for info in shown:
        note = notes.get(info.version)
        for alias in info.aliases:
            aliases.setdefault(alias, info.version)
        rows.append({"ref": info.ref, "version": info.version, "href": "/capture/" + quote(info.ref, safe="/:"),
                     "created": when(info.created), "aliases": list(info.aliases), "tags": list(info.tags[:LISTED]),
                     "description": as_text((note.description.splitlines() or [""])[0], 200) if note else "",
                     "cls": short_class(info.module_class), "calls": info.calls, "nbytes": info.nbytes,
                     "problem": info.problem, "job": view.job_line(info.ref)})
    for info in infos:  # aliases of versions on other pages too (a name has few)
        for alias in info.aliases:
            aliases.setdefault(alias, info.version)
    base = name_href(name)
    return {"title": name, "name": name, "rows": rows, "versions_counted": window.counted("versions"),
            "versions_pager": window.links(lambda p: href_with(base, {}, page=page_in_link(p))),
            "aliases": sorted(aliases.items(), key=lambda kv: (kv[0] != "latest", kv[0])),
            "latest": infos[0].ref if infos else None, "timeline": _timeline(view, shown, notes),
            "notes_problem": notes_problem, "version_refs": [info.ref for info in infos[:LISTED * 4]],
            "pick_a": rows[1]["ref"] if len(rows) > 1 else (rows[0]["ref"] if rows else ""),
            "pick_b": rows[0]["ref"] if rows else ""}


def _timeline(view: RepoView, infos: list[VersionInfo], notes: Mapping[int, VersionNotes]) -> list[dict[str, Any]]:
    """What happened to ``infos``' versions, newest first: saved (by which job), each report made
    on them (the newest :data:`~.shown.TIMELINE_REPORTS` of each, and how many more), notes edited.
    At the same second a version's reports and notes come before its save (they came after it)."""
    events: list[dict[str, Any]] = []

    def event(stamp: str, info: VersionInfo, rank: int, text: str, href: str, line: Mapping[str, Any] | None = None,
              kind: str = "saved") -> dict[str, Any]:
        return {"when": stamp, "ref": info.ref, "kind": kind, "text": text, "href": href,
                "passed": line["passed"] if line else None, "verdict": line["verdict"] if line else None,
                "order": (stamp, info.version, rank)}

    for info in infos:
        href = "/capture/" + quote(info.ref, safe="/:")
        job = view.job_line(info.ref)
        saved = "saved" + (f" by {job['command']} on {job['host']}" if job and job["command"] != "-" else "")
        if job and job["commit"] != "-":
            saved += f" at commit {job['commit']}"
        events.append(event(when(info.created), info, 0, saved, href))
        stored = view.reports(info.name, info.version)
        shown = [report_line(report) for report in stored.read(0, TIMELINE_REPORTS)[0]]
        for line in shown:
            events.append(event(when(line["created"]), info, 2, f"{line['kind']} report"
                                + (f" of {line['about']}" if line["about"] else ""),
                                f"{href}/reports#{report_anchor(line)}", line, kind=line["kind"]))
        older = len(stored) - TIMELINE_REPORTS  # (the newest files read: a damaged one is named on the reports page)
        if older > 0 and shown:  # right after the oldest report listed
            oldest = min(when(line["created"]) for line in shown)
            more = event("", info, 1, f"{older:,} older reports", f"{href}/reports", kind="more")
            more["order"] = (oldest, info.version, 1)
            events.append(more)
        note = notes.get(info.version)
        if note is not None and note.updated:
            events.append(event(when(note.updated), info, 3, f"description or tags edited by {as_text(note.by, 100)}",
                                f"{href}#notes", kind="notes"))
    return sorted(events, key=lambda e: e["order"], reverse=True)


# --------------------------------------------------------------------------------------- capture


def capture_home(view: RepoView, capture: StoredCapture, reports: list[dict[str, Any]], report_count: int) -> dict[str, Any]:
    """What a capture page shows beside the capture itself: its aliases and tags as they are now,
    its description, where it came from (lineage), and the snippets that use it. ``reports``: the
    newest of the version's ``report_count`` reports (at least :data:`~.shown.LISTED`, when it has them)."""
    listing = {info.version: info for info in view.name_versions(capture.name)}
    info = listing.get(capture.version, capture.info)
    notes, notes_problem = view.name_notes(capture.name)
    note = notes.get(capture.version)
    return {"aliases": list(info.aliases), "tags": [as_text(t, 300) for t in info.tags[:LISTED]],
            "tags_more": max(len(info.tags) - LISTED, 0),
            "tags_edited": note is not None and note.tags is not None,
            "captured_tags": listed(capture.metadata.get("tags") or []),
            "description": note.description if note else "", "notes_by": as_text(note.by, 300) if note else "",
            "notes_updated": when(note.updated) if note and note.updated else "", "notes_problem": notes_problem,
            "name_href": name_href(capture.name), "lineage": lineage(view, capture, reports, report_count),
            "snippets": snippets(capture, view.location, own=_own_source(view, capture))}


def _own_source(view: RepoView, capture: StoredCapture) -> bool:
    """Whether the capture's stored source loads without trust (its snippet says so): only a capture
    with stored source asks whether it is the user's own, and only what is known without encoding it
    again (not known yet: the snippet says how trust is given, which is never wrong, only cautious)."""
    if not capture.metadata.get("sources"):
        return False
    own = view.provenance(capture, settle=False)
    return own is not None and own[0]


def lineage(view: RepoView, capture: StoredCapture, reports: list[dict[str, Any]], report_count: int) -> dict[str, Any]:
    """Where a version came from and what used it: the capturing job (command, host, process, rank,
    git commit), the software, the repo it was copied from, whether it is this user's own signed
    capture (``None`` when only encoding its metadata again can tell and nobody has asked
    ``provenance_href`` yet: the page asks it after it is shown, a saved file says it was not
    checked), and the reports made on it (newest first)."""
    meta = capture.metadata
    env: dict[str, Any] = meta["environment"] if isinstance(meta.get("environment"), dict) else {}
    argv = env.get("argv")
    job = [("command", as_text(" ".join(str(a) for a in argv[:1000]), 1000) if isinstance(argv, list) else "-"),
           ("host", as_text(env.get("host") or "-", 200)), ("process", as_text(env.get("pid") or "-", 40)),
           ("git commit", as_text(env.get("git_commit") or "-", 80))]
    if env.get("world_size") not in (None, 1):
        job.append(("rank", f"{as_text(env.get('rank'), 20)} of {as_text(env.get('world_size'), 20)}"))
    software = ", ".join(f"{key} {as_text(env[key], 60)}" for key in ("python", "torch") if env.get(key))
    origin = meta.get("origin") if isinstance(meta.get("origin"), dict) else None
    return {"saved": when(meta.get("created") or capture.info.created), "job": job, "software": software or "-",
            "device": as_text(env.get("platform") or "-", 300),
            "origin": (as_text(origin.get("ref"), 300), as_text(origin.get("repo"), 500)) if origin else None,
            "own": view.provenance(capture, settle=False),
            "provenance_href": f"/capture/{quote(capture.ref, safe='/:')}/provenance",
            "reports": [{**line, "created": when(line["created"]),
                         "href": f"/capture/{quote(capture.ref, safe='/:')}/reports#{report_anchor(line)}"}
                        for line in (report_line(r) for r in reports[:LISTED])],
            "reports_more": max(report_count - min(len(reports), LISTED), 0)}


def snippets(capture: StoredCapture, location: str, *, own: bool) -> list[dict[str, str]]:
    """The "use this capture" snippets: Python (load, the module, a call, replay), a pytest check of
    a rewrite, and the command line (show, replay, shell, profile), for this ref in this repo.
    ``own``: the user's own signed capture, whose stored source loads without trust (else the
    Python snippet says how trust is given, without giving it)."""
    ref = capture.ref
    # the class name goes into a comment and a function name: letters, digits and "_" only (a capture's
    # class string is data, and a newline in it would end the comment)
    cls = _identifier(short_class(str((capture.metadata.get("module") or {}).get("class", ""))), title=True)
    stored = bool(capture.metadata.get("sources")) and not own
    trust = ("# its class is in the source stored with it: loading runs that source only with\n"
             "# trust_source=True, for captures you trust (docs/security.md)\n") if stored else ""
    python = (f"import modulelens\n\n{trust}"
              f"capture = modulelens.load({ref!r}, repo={location!r})\n"
              f"module = capture.module        # the {cls}, rebuilt with its recorded weights\n"
              "call = capture.calls[0]         # call.args, call.kwargs, call.output\n"
              "report = capture.replay()       # every recorded call, compared with the recorded output\n"
              "print(report)\n")
    test = ("from modulelens.testing import assert_matches\n\n\n"
            f"def test_my_{cls.lower()}_matches_the_recording():\n"
            f"    assert_matches(My{cls}, {ref!r}, repo={location!r})  # My{cls}: your rewrite of it\n")
    where = f"{shlex.quote(ref)} --repo {shlex.quote(location)}"
    shell = "\n".join(f"modulelens {command} {where}" for command in ("show", "replay", "shell", "profile")) + "\n"
    return [{"id": "snippet-python", "title": "Python", "text": python},
            {"id": "snippet-pytest", "title": "pytest", "text": test},
            {"id": "snippet-cli", "title": "command line", "text": shell}]


def _identifier(cls: str, *, title: bool = False) -> str:
    """A class name as a Python name in a snippet (``MLP`` -> ``mlp`` / ``MLP``); never anything a
    capture could use to break out of the line (letters, digits and ``_`` only)."""
    word = re.sub(r"\W", "_", cls, flags=re.ASCII).strip("_")[:60] or "module"
    if word[0].isdigit():
        word = "_" + word
    return word if title else word.lower()
