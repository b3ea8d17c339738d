"""A plain ``modulelens show REF`` of a local repo read without the repo package (issue 37: ``show``
in a fresh process within 1.5x of plain Python printing the index).

Going through :class:`~modulelens.repo.Repo` imports the whole repo package (stores, trust,
garbage collection, packs, index, locks: ~25 ms of a ~60 ms ``show``, ``python -X importtime``),
more than everything else ``show`` does. This module finds the version the way ``Repo.resolve``
does (the name's index head and log, read and checked by ``_quick_ls.py``; an alias also from its
own file), reads its ``capture.json`` as the local store reads it (a regular file, never through a
link, within the same size limit) and checks it with the same validator before anything of it is
used (``format/validated.py``); ``show`` then describes it with the same function
(``restore/summary.describe_metadata``) and prints it with the same code (``browse.print_show``),
so the bytes printed are the ``Repo`` path's, terminal styling and escaping included.

It does so only for the plain case: ``show REF`` or ``show REF --json`` (no ``--ops`` or ``--all``) of a
local repo of the current layout whose name's head is intact, with no write in progress, no edited
notes, no report the repo would leave out and no running ``modulelens ui`` (whose address ``show``
would print). Anything else, a damaged, forged or invalid ``capture.json`` included, is *declined*:
:func:`printer` returns ``None`` having printed nothing, and ``show`` runs through ``Repo``,
which refuses, repairs or explains exactly as it always has. tests/interfaces/test_cli_quick_show.py
compares the two paths byte for byte and checks each refusal.
"""

from __future__ import annotations

import gc
import json
import os
import stat

from modulelens.interfaces.cli._quick_ls import (
    LATEST,
    METADATA_BYTES,
    SUMMARY_FILE,
    DeclinedError,
    capture_name,
    check_layout,
    listing_row,
    name_index,
    read_file,
    repo_directory,
)

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if _TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

CAPTURE_FILE = "capture.json"  # repo/layout.py
REPORTS = "reports"  # repo/layout.py
REPORT_BYTES = 64 << 20  # repo/layout.py read_limit() of a report
NOTES_FILE = "notes.json"  # repo/layout.py
UI_PREFIX = "ui-"  # interfaces/ui/discovery.py: a running server's announcement file
_ALIAS_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ALIAS_REST = _ALIAS_FIRST | frozenset("0123456789._-")


def printer(keywords: dict[str, object]) -> Callable[[], None] | None:
    """What prints a plain ``show`` of the version ``keywords`` names (the ``browse.show_capture``
    keywords), read and checked; ``None`` when this reader declines (see the module docstring).
    Nothing is printed here, and nothing is left to check when it prints.

    Example::

        show = printer({"ref": "team/mlp:v2", "repo": "/data/captures"})
        if show is not None:
            show()   # what `modulelens show team/mlp:v2 --repo /data/captures` prints
    """
    if set(keywords) - {"ref", "repo", "as_json"} or "MODULELENS_MAX_METADATA_MIB" in os.environ or os.name != "posix":
        return None  # --ops, --all; another size limit; a system without O_NOFOLLOW
    repo, ref, as_json = keywords.get("repo"), keywords.get("ref"), keywords.get("as_json", False)
    if not isinstance(ref, str) or not (repo is None or isinstance(repo, str)) or type(as_json) is not bool:
        return None
    from modulelens.errors import CorruptCaptureError

    try:
        root = repo_directory(repo)
        if not as_json and _ui_announced():
            return None  # `show` prints a running UI's address for the capture: discovery.py's to find
        return _printer(root, ref, as_json)
    except (DeclinedError, OSError, ValueError, RecursionError, CorruptCaptureError):
        return None  # the Repo path reads it again and says what is wrong, as it always has


def _printer(root: str, ref: str, as_json: bool) -> Callable[[], None]:
    check_layout(root)
    name, _, selector = ref.partition(":")
    quoted = name.replace("/", "%2F")
    if capture_name(quoted) != name or (":" in ref and not selector):
        raise DeclinedError  # not a name repo/names.py accepts: Repo says why
    folder = f"{root}/names/{quoted}"
    for real_folder in (folder, f"{folder}/versions"):
        if not stat.S_ISDIR(os.lstat(real_folder).st_mode):
            raise DeclinedError  # a link where a folder belongs: the store refuses it
    if os.path.lexists(f"{folder}/{NOTES_FILE}"):
        raise DeclinedError  # tags edited after capture: repo/note_edits.py
    index = name_index(folder, read_file(f"{folder}/{SUMMARY_FILE}", METADATA_BYTES))
    version = _version(folder, index.latest, index.aliases, selector)
    if version not in index.entries or (index.latest and index.latest not in index.entries):
        # pending, removed or never there: Repo explains; a head whose latest is not in the log
        # (the listing would name another version latest than Repo.info does)
        raise DeclinedError
    version_folder = f"{folder}/versions/{version}"
    if not stat.S_ISDIR(os.lstat(version_folder).st_mode):
        raise DeclinedError  # a linked version folder: the store refuses it
    where = f"{version_folder}/{CAPTURE_FILE}"
    raw = read_file(where, METADATA_BYTES)
    from modulelens.format.validated import validated_capture

    # parsed and checked as Repo.read_metadata does, the collector paused as there (parsing makes
    # many objects and no cycle); the validator raises CorruptCaptureError: declined
    collecting = gc.isenabled()
    gc.disable()
    try:
        meta: dict[str, Any] = json.loads(raw)
        validated_capture(meta, raw, where)
    finally:
        if collecting:
            gc.enable()
    from modulelens.restore.summary import describe_metadata

    listed = listing_row(name, version, f"{folder}/versions/", index.aliases_of.get(version, ()), {
        "created": meta.get("created", ""), "tags": list(meta.get("tags", ())),  # repo/index.py version_entry
        "nbytes": sum(t["nbytes"] for t in meta.get("tensors", {}).values() if t.get("payload")),
        "module_class": meta.get("module", {}).get("class", ""), "calls": len(meta.get("calls", ())), "blobs": []})
    result = describe_metadata(meta, listed, _reports(f"{version_folder}/{REPORTS}"))
    if as_json:  # as browse.show_capture prints it: the one JSON object, no browser address
        from modulelens.interfaces.output import emit_json

        return lambda: emit_json("show", result=result)
    from modulelens.interfaces.cli.browse import print_show

    return lambda: print_show(result, meta)


def _version(folder: str, latest: int, aliases: dict[str, int], selector: str) -> int:
    """The version ``selector`` names, as ``Repo.resolve`` finds it: ``vN`` itself, ``latest`` (or
    nothing) the head's, an alias its own file's, declined unless the head agrees."""
    if selector in ("", LATEST):
        if not latest:
            raise DeclinedError  # no versions: Repo's error
        return latest
    if selector[0] == "v" and selector[1:].isdigit():
        if not selector[1:].isascii() or selector[1] == "0":
            raise DeclinedError  # not a version repo/names.py reads, nor an alias: Repo's error
        return int(selector[1:])
    if len(selector) > 64 or selector[0] not in _ALIAS_FIRST or not set(selector) <= _ALIAS_REST \
            or selector not in aliases:
        raise DeclinedError  # an invalid or unknown alias: Repo's error
    number = int(read_file(f"{folder}/aliases/{selector}", 64).decode("ascii").strip())
    if number != aliases[selector]:
        raise DeclinedError  # an alias being moved: Repo reads its file and looks again
    return number


def _reports(folder: str) -> list[dict[str, object]]:
    """The version's reports as ``Repo.reports`` gives them (repo/reports.py: each ``*.json`` file
    of its ``reports`` folder, in name order, checked by ``format/reports.validate_report``, with
    its ``path``), declined where it would leave one out (a link, a file too large, not JSON, not a
    report) or find the folder itself unusable."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise DeclinedError  # a link or a file where the folder belongs
    except FileNotFoundError:
        return []  # no report stored
    from modulelens.format.reports import validate_report

    with os.scandir(folder) as found:
        entries = sorted((entry.name, entry.is_file(follow_symlinks=False)) for entry in found)
    reports: list[dict[str, object]] = []
    for file_name, plain in entries:
        if not file_name.endswith(".json"):
            continue
        if not plain:
            raise DeclinedError  # a link or a folder named like a report: Repo leaves it out
        path = f"{folder}/{file_name}"
        reports.append({"path": path, **validate_report(json.loads(read_file(path, REPORT_BYTES)), path)})
    return reports


def _ui_announced() -> bool:
    """Whether any ``modulelens ui`` announced itself (interfaces/ui/discovery.py ``discovery_dir``),
    running or stale: deciding which is the discovery module's."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        folder = f"{runtime}/modulelens"
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = f"{cache}/modulelens/ui"
    try:
        with os.scandir(folder) as found:
            return any(entry.name.startswith(UI_PREFIX) and entry.name.endswith(".json") for entry in found)
    except FileNotFoundError:
        return False
