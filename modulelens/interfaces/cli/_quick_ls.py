"""A plain ``modulelens ls`` of a local repo read straight from its index files, importing nothing
but ``json`` and ``xxhash`` (issue 37: ``ls`` in a fresh process within 1.5x of plain Python
printing the index).

Going through :class:`~modulelens.repo.Repo` imports the whole repo package (stores, trust,
garbage collection, packs, hashing, dataclasses: ~20 ms of a ~70 ms ``ls``, ``python -X
importtime``), about what the listing itself costs. This module reads the same files the listing
reads (docs/repo-layout.md: the layout marker, each name's index head ``summary.json`` and its log
of entries) and prints what ``browse.list_captures`` prints, byte for byte, but only for a repo in
the plain state a healthy repo is in: a local directory of the current layout, every head intact
(its checksum, every field of the type and range the repo's reader checks), no write in progress
(no reservation, removal or alias move), no edited notes, every entry complete and plainly typed,
every printed string printable. Anything else
(a URL, a damaged or forged head, a link where a file belongs, a name to be skipped, a filter
other than a name prefix) is *declined*: :func:`listing_text` returns ``None`` having printed
nothing, and the command runs through ``Repo`` as before, which repairs, skips, refuses or explains
as it always has. So this reader never decides anything the repo's own reader would decide
otherwise; it only skips importing it when there is nothing to decide.

What it knows of the layout (file names, the head's format, its limits) is pinned to
``repo/layout.py`` and ``repo/index.py`` by tests/interfaces/test_cli_quick_ls.py, which also
compares its output with the full path's on healthy and on damaged repos.
"""

from __future__ import annotations

import json
import os
import stat
import sys

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh start)
if _TYPE_CHECKING:
    from typing import Any

LAYOUT_VERSION = 3  # repo/layout.py: the only layout read here (older ones are read by Repo)
MARKER = "modulelens-repo.json"
SUMMARY_FILE = "summary.json"
NOTES_FILE = "notes.json"
HEAD_FORMAT = 2  # repo/index.py FORMAT
MAX_VERSION = 10**9
MARKER_BYTES = 4 << 10
METADATA_BYTES = 512 << 20  # repo/layout.py max_metadata_bytes() when MODULELENS_MAX_METADATA_MIB is unset
JSON_SCHEMA = "modulelens.cli/1"  # interfaces/output.py
LATEST = "latest"
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_NAME_REST = _NAME_FIRST | frozenset(".-")
# getattr: these are POSIX's (elsewhere the reader declines: see listing_text)
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class DeclinedError(Exception):
    """The repo is not in the plain state this reader handles: ``Repo`` answers instead."""


def listing_text(keywords: dict[str, Any]) -> str | None:
    """What ``modulelens ls`` prints for ``keywords`` (the ``browse.list_captures`` keywords), or
    ``None`` when this reader declines (see the module docstring); nothing is printed here.

    Example::

        listing_text({"repo": "/data/captures", "as_json": True})   # '{\\n "schema": ...'
    """
    if set(keywords) - {"name", "repo", "as_json", "sort"} or keywords.get("sort", "name") != "name":
        return None  # --class, --tag, --since and the other orders: listing.py's, through Repo
    if "MODULELENS_MAX_METADATA_MIB" in os.environ or os.name != "posix":
        return None  # another size limit (layout.max_metadata_bytes()); a system without O_NOFOLLOW
    try:
        location = repo_directory(keywords.get("repo"))
        rows = _rows(location, keywords.get("name"))
        return _json_text(rows) if keywords.get("as_json") else _table_text(location, rows, sys.stdout.isatty())
    except (DeclinedError, OSError, ValueError, RecursionError):
        return None


def repo_directory(repo: str | None) -> str:
    """The repo's directory as ``Repo(repo).location`` names it: ``Path(...).expanduser().absolute()``
    (repo/registry.py, repo/location.py), without importing pathlib; a URL is declined."""
    if repo is None:
        text = os.environ.get("MODULELENS_REPO") or ""
        if not text:
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            text = f"{cache}/modulelens/repo"
    else:
        text = repo
    if "://" in text or text.startswith("file:"):
        raise DeclinedError  # an object store, or a file:// URL
    parts = _parts(text)
    if not text.startswith("/") and parts and parts[0].startswith("~"):  # Path.expanduser: the first part only
        home = os.path.expanduser(parts[0])
        if not home or home.startswith("~"):
            raise DeclinedError  # no home directory: Repo says so
        text = "/".join([home, *parts[1:]])
        parts = _parts(text)
    if not text.startswith("/"):
        parts = _parts(f"{os.getcwd()}/{text}")
    return "/" + "/".join(parts)


def _parts(path: str) -> list[str]:
    """The parts of ``path`` as pathlib keeps them (no empty or ``.`` part; ``..`` stays)."""
    if path.startswith("//") and not path.startswith("///"):
        raise DeclinedError  # pathlib keeps a leading "//" (POSIX leaves its meaning to the system)
    return [part for part in path.split("/") if part and part != "."]


def read_file(path: str, limit: int) -> bytes:
    """A regular file's bytes (never through a link, never a FIFO), as ``repo/files.read_regular``
    reads it; a file over ``limit`` is declined (Repo refuses or rebuilds). Raises
    ``FileNotFoundError`` when it is absent and ``OSError`` on the rest."""
    fd = os.open(path, _READ)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise DeclinedError
        data = os.read(fd, info.st_size + 1)
        if len(data) != info.st_size:
            raise DeclinedError  # it changed while read: Repo reads it again
        return data
    finally:
        os.close(fd)


def _whole_number(value: object, high: int) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise DeclinedError
    return value


def _rows(root: str, prefix: str | None) -> list[dict[str, Any]]:
    """``VersionInfo.to_dict()`` of every version ``Repo(root).list()`` lists under ``prefix``, in
    ``ls``'s order (name, then version)."""
    check_layout(root)
    under = None if prefix is None else prefix.rstrip("/") + "/"
    rows: list[dict[str, Any]] = []
    with os.scandir(f"{root}/names") as found:
        folders = sorted(entry.name for entry in found if entry.is_dir(follow_symlinks=False))
    for quoted in folders:
        folder = f"{root}/names/{quoted}"
        try:
            raw = read_file(f"{folder}/{SUMMARY_FILE}", METADATA_BYTES)
        except FileNotFoundError:
            if os.path.lexists(f"{folder}/versions"):
                raise DeclinedError from None  # a name without a head: Repo rebuilds its index
            continue  # not a name (Repo skips it too)
        name = capture_name(quoted)
        if os.path.lexists(f"{folder}/{NOTES_FILE}"):
            raise DeclinedError  # tags edited after capture: repo/note_edits.py
        if prefix is not None and name != prefix and not name.startswith(under or ""):
            continue
        rows += _name_rows(name, f"{folder}/versions/", folder, raw)
    rows.sort(key=lambda row: (row["name"], row["version"]))
    return rows


def check_layout(root: str) -> None:
    """Decline unless ``root`` is a repo of the current layout (its marker intact) with a real
    ``names`` folder."""
    marker = json.loads(read_file(f"{root}/{MARKER}", MARKER_BYTES))
    if type(marker) is not dict or type(marker.get("layout_version")) is not int \
            or marker["layout_version"] != LAYOUT_VERSION:
        raise DeclinedError  # an older layout (read by Repo as it is), a newer one, or a damaged marker
    if not stat.S_ISDIR(os.lstat(f"{root}/names").st_mode):
        raise DeclinedError


def capture_name(quoted: str) -> str:
    """The capture name of a ``names/`` folder, declined unless it is one ``repo/names.py``
    accepts (a folder that is not a name is skipped by Repo: declined here, not decided)."""
    name = quoted.replace("%2F", "/")
    if "%" in name or not 0 < len(name) <= 512:
        raise DeclinedError
    for segment in name.split("/"):
        if not 0 < len(segment) <= 128 or segment[0] not in _NAME_FIRST or not set(segment) <= _NAME_REST:
            raise DeclinedError
    return name


def _name_rows(name: str, versions_folder: str, folder: str, raw: bytes) -> list[dict[str, Any]]:
    """The rows of one name from its head ``raw`` and its log (:func:`name_index`)."""
    index = name_index(folder, raw)
    return [listing_row(name, number, versions_folder, index.aliases_of.get(number, ()), entry)
            for number, entry in sorted(index.entries.items())]


class NameIndex:
    """One name's index as :func:`name_index` read it (a plain class: a dataclass or NamedTuple
    would import what ``ls`` starts without)."""

    __slots__ = ("aliases", "aliases_of", "entries", "latest")
    latest: int  # the head's latest version, 0 when none
    aliases: dict[str, int]  # the head's aliases
    aliases_of: dict[int, tuple[str, ...]]  # version -> the aliases `ls` lists, `latest` first
    entries: dict[int, dict[str, Any]]  # version -> its log entry


def name_index(folder: str, raw: bytes) -> NameIndex:
    """One name's index from its head ``raw`` (read from ``folder``'s ``summary.json``) and its
    log, checked as ``repo/index.py`` checks them (``_checked_head``, ``_head_fields``,
    ``_log_entries``); anything it would not use as it is (so rebuild, adopt or skip) is declined."""
    import xxhash  # the head's checksum, as the repo computes it

    if raw[:10] != b'{"check":"' or raw[26:28] != b'",' \
            or xxhash.xxh3_64_hexdigest(raw[28:].rstrip()).encode() != raw[10:26]:
        raise DeclinedError
    head = json.loads(raw)
    if type(head) is not dict or head.get("summary") != HEAD_FORMAT:
        raise DeclinedError
    used = _whole_number(head.get("used"), MAX_VERSION)
    latest = _whole_number(head.get("latest"), used)
    _whole_number(head.get("count", 0), MAX_VERSION)
    if head.get("reserved", {}) != {} or head.get("changing", {}) != {} or head.get("removing", []) != [] \
            or type(head.get("aliases")) is not dict:
        raise DeclinedError  # a write in progress: Repo looks at each one
    aliases = head["aliases"]
    if not all(type(number) is int and 1 <= number <= used for number in aliases.values()):
        raise DeclinedError
    log = _whole_number(head.get("log"), MAX_VERSION)
    _whole_number(head.get("dead", 0), MAX_VERSION)
    log_bytes = _whole_number(head.get("log_bytes"), METADATA_BYTES)
    entries: dict[int, dict[str, Any]] = {}
    if log:
        data = read_file(f"{folder}/summary-{log}.log", METADATA_BYTES)
        if len(data) < log_bytes:
            raise DeclinedError
        entries = _log_entries(data[:log_bytes], used)
    stored_latest = latest
    if latest not in entries:
        latest = max(entries, default=0)
    by_version: dict[int, tuple[str, ...]] = {}
    for alias, number in sorted(aliases.items()):
        by_version[number] = (*by_version.get(number, ()), alias)
    if latest:
        by_version[latest] = (LATEST, *by_version.get(latest, ()))
    index = NameIndex()
    index.latest, index.aliases, index.aliases_of, index.entries = stored_latest, aliases, by_version, entries
    return index


def _log_entries(data: bytes, used: int) -> dict[int, dict[str, Any]]:
    """The entries a log's valid bytes leave, as ``repo/index.py``'s ``_parse_log`` reads them
    (later lines win; an ``rm`` line removes); declined where it would rebuild the index."""
    if not data:
        return {}
    lines = json.loads(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]")
    if not all(type(line) is dict for line in lines):
        raise DeclinedError
    entries: dict[int, dict[str, Any]] = {}
    try:
        if all("v" in line for line in lines):  # the usual log: entries only
            entries = {line["v"]: line for line in lines}
        else:
            for line in lines:
                if "rm" in line:
                    entries.pop(line["rm"], None)
                else:
                    entries[line["v"]] = line
    except (KeyError, TypeError):  # a line without a number, or a number that is a table or a list
        raise DeclinedError from None
    if not all(type(number) is int and 1 <= number <= used for number in entries):
        raise DeclinedError
    return entries


def listing_row(name: str, number: int, versions_folder: str, aliases: tuple[str, ...],
         entry: dict[str, Any]) -> dict[str, Any]:
    """``VersionInfo.to_dict()`` of one entry; declined unless every field is plainly typed (Repo
    reads an oddly typed one leniently, and a pending entry from its capture file)."""
    created, tags, nbytes = entry.get("created", ""), entry.get("tags"), entry.get("nbytes", 0)
    module_class, calls, problem = entry.get("module_class", ""), entry.get("calls", 0), entry.get("problem")
    if "blobs" not in entry or type(created) is not str or type(tags) is not list \
            or not all(type(tag) is str for tag in tags) or type(nbytes) is not int or type(module_class) is not str \
            or type(calls) is not int or not (problem is None or type(problem) is str):
        raise DeclinedError
    return {"name": name, "version": number, "ref": f"{name}:v{number}", "path": f"{versions_folder}{number}",
            "created": created, "tags": tags, "aliases": list(aliases), "payload_bytes": nbytes,
            "module_class": module_class, "calls": calls, "problem": problem}


def _json_text(rows: list[dict[str, Any]]) -> str:
    """``output.emit_json("ls", result=rows)``'s text."""
    return json.dumps({"schema": JSON_SCHEMA, "command": "ls", "ok": True, "result": rows}, indent=1) + "\n"


def _table_text(location: str, rows: list[dict[str, Any]], terminal: bool) -> str:
    """What ``browse.list_captures`` prints: a title line and ``output.text_table``'s lines; on a
    ``terminal``, the last columns dropped until a line fits its width and the header bold (as
    ``output.echo`` styles it there, through click's ``secho``)."""
    from modulelens.format.human import human_bytes

    if not rows:
        lines = [f"no captures in {location}"]
        bold = None
    else:
        cells = [["ref", "aliases", "module class", "calls", "tags", "payload", "created"]]
        cells += [[row["ref"], ", ".join(row["aliases"]),
                   "damaged (see show)" if row["problem"] else row["module_class"].rsplit(":", 1)[-1],
                   str(row["calls"]), ", ".join(row["tags"]), human_bytes(row["payload_bytes"]), row["created"]]
                  for row in rows]
        widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
        if terminal:
            import shutil  # here: only a terminal has a width (shutil imports bz2 and lzma: 2 ms)

            fits = shutil.get_terminal_size().columns
            while len(widths) > 1 and sum(widths) + 2 * (len(widths) - 1) > fits:
                widths.pop()
        lines = [f"captures in {location}"]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip()
                  for row in cells]
        bold = 1
    if not all(line.isprintable() for line in lines):
        raise DeclinedError  # output.safe_text would escape something: Repo's path does
    if terminal and bold is not None:
        lines[bold] = f"\x1b[1m{lines[bold]}\x1b[0m"  # click.style(bold=True)
    return "\n".join(lines) + "\n"
