"""Where each thing of a repo lives: its keys, the same on every store (docs/repo-layout.md).

A key is a ``/``-separated path relative to the repo's root (``names/ranker%2Fmlp/versions/3/capture.json``);
a :class:`~modulelens.repo.store.Store` maps it to a file in a directory or an object in a bucket.
What differs between stores (how a tombstone is written, the files only a directory has: locks,
staging, summaries, verification markers) is each store's own business.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, MutableMapping
from urllib.parse import quote, unquote

from modulelens.errors import CorruptCaptureError, InvalidNameError
from modulelens.format.hashing import HASH_ALGORITHM, HEX64
from modulelens.format.provenance import PROVENANCE_FIELD, field_line, field_lines
from modulelens.repo.names import validate_alias, validate_name

# 3: per-name indexes kept by every writer (a head and, in a directory, a log of entries), no empty
# reports/ folder per version. 2: small payloads in packs, per-name summaries kept as caches.
# Older layouts are read as they are; the first write into one rewrites the marker, so an older
# modulelens refuses the repo instead of misreading it (docs/repo-layout.md, "Layout versions").
LAYOUT_VERSION = 3
MARKER = "modulelens-repo.json"
CAPTURE_FILE = "capture.json"
SUMMARY_FILE = "summary.json"  # a name's index head (layout 3) or its summary (layout 2)
REPORTS = "reports"
NOTES_FILE = "notes.json"  # a name's descriptions and edited tags (repo/notes.py)
_SUMMARY_LOG = re.compile(r"summary-[0-9]+\.log")
#: The highest version number a name can have: a folder or an index naming a higher one is not a
#: version (a forged ``used = 10**30`` would otherwise make the next save ``v1000...001``).
MAX_VERSION = 10**9
_MAX_DIGITS = len(str(MAX_VERSION))

# How large each kind of file a load or a listing parses may be (issue 35: one hostile file must not
# cost gigabytes of memory before it is refused). Metadata (a capture.json, a name's index) grows with
# what was captured: a call of a million tensors writes ~210 MiB of capture.json, under the default;
# the others are small by construction.
_METADATA_MIB = 512
_ALIAS_BYTES = 64  # "<version number>\n"
_MARKER_BYTES = 4 << 10  # modulelens-repo.json: {"layout_version": N}
_REPORT_BYTES = 64 << 20  # a tool's report (profile, verify...)
NOTES_BYTES = 4 << 20  # a name's notes (repo/notes.py: thousands of described versions)


def max_metadata_bytes() -> int:
    """The largest ``capture.json`` or index file (head or log) modulelens reads:
    ``MODULELENS_MAX_METADATA_MIB`` MiB (default 512)."""
    try:
        return max(1, int(float(os.environ.get("MODULELENS_MAX_METADATA_MIB", _METADATA_MIB)) * (1 << 20)))
    except ValueError:
        return _METADATA_MIB << 20


def read_limit(key: str) -> tuple[int, str]:
    """The most bytes a store reads at ``key`` (by the kind of file it names), and what its refusal
    adds (how to raise the limit, where one can): a larger file is refused before any of it is read
    (:func:`modulelens.repo.files.too_large`)."""
    parts = key.split("/")
    if parts[-1] == MARKER:
        return _MARKER_BYTES, ""
    if len(parts) >= 2 and parts[-2] == "aliases":
        return _ALIAS_BYTES, ""
    if len(parts) >= 2 and parts[-2] == REPORTS:
        return _REPORT_BYTES, ""
    if parts[-1] == NOTES_FILE:
        return NOTES_BYTES, ""
    return max_metadata_bytes(), " (MODULELENS_MAX_METADATA_MIB raises the limit)"


def is_version_number(text: str) -> bool:
    """Whether a folder (or key segment) names a version: 1 to :data:`MAX_VERSION` in ASCII digits,
    no leading zero (a number beyond it is not a version, so it never makes a save take it plus one)."""
    return text.isascii() and text.isdigit() and text[0] != "0" and (
        len(text) < _MAX_DIGITS or (len(text) == _MAX_DIGITS and int(text) <= MAX_VERSION))


def summary_log(generation: int) -> str:
    """The file name of a name's index log (layout 3, stores that append: repo/index.py)."""
    return f"summary-{int(generation)}.log"


def is_summary_log(filename: str) -> bool:
    return _SUMMARY_LOG.fullmatch(filename) is not None


def marker_json(layout: int = LAYOUT_VERSION) -> bytes:
    """The bytes of ``modulelens-repo.json``."""
    return json.dumps({"layout_version": layout}).encode()


def name_key(name: str) -> str:
    """``names/<quoted name>`` (validates the name: no key can leave the repo)."""
    return "names/" + quote(validate_name(name), safe="")


def versions_key(name: str) -> str:
    return name_key(name) + "/versions"


def version_key(name: str, version: int) -> str:
    return f"{name_key(name)}/versions/{int(version)}"


def capture_key(name: str, version: int) -> str:
    return f"{version_key(name, version)}/{CAPTURE_FILE}"


def reports_key(name: str, version: int) -> str:
    return f"{version_key(name, version)}/{REPORTS}"


def notes_key(name: str) -> str:
    return f"{name_key(name)}/{NOTES_FILE}"


def aliases_key(name: str) -> str:
    return name_key(name) + "/aliases"


def alias_key(name: str, alias: str) -> str:
    return f"{name_key(name)}/aliases/{validate_alias(alias)}"


def blob_key(digest: str) -> str:
    """``blobs/<2 hex>/<64 hex>`` of a payload hash ``blake3:<64 hex>``.

    Raises:
        CorruptCaptureError: ``digest`` is not a well-formed payload hash.
    """
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != HASH_ALGORITHM or not HEX64.fullmatch(hexdigest):
        raise CorruptCaptureError(f"malformed payload hash {digest!r}")
    return f"blobs/{hexdigest[:2]}/{hexdigest}"  # one format, not three joins: a load asks per blob


def unquote_name(quoted: str) -> str | None:
    """The capture name a ``names/`` folder stands for, or ``None`` when it is not one.

    A valid name quotes to letters, digits, ``._-`` and ``%2F`` (its slashes), so a plain replace
    does; ``unquote`` only for anything else (a listing unquotes every name folder)."""
    plain = quoted.replace("%2F", "/")
    name = plain if "%" not in plain else unquote(quoted)
    try:
        validate_name(name)
    except InvalidNameError:
        return None
    return name


def capture_json(metadata: MutableMapping[str, object], seal: Callable[[list[str]], dict[str, object]] | None = None) -> bytes:
    """A capture's ``capture.json``: one line per top-level field. Indented JSON goes through the
    pure-Python encoder, a third of a 5,000-tensor save (benchmarks/bench_repo.py); compact values
    use the C encoder and the file stays readable field by field. ``seal`` (a new capture saved
    into a store that signs: :func:`modulelens.repo.trust.capture_sealer`) signs those very lines,
    so signing costs no second encoding, and its ``provenance`` field is set in ``metadata`` and
    written last."""
    fields = field_lines(metadata) if seal is not None else [field_line(k, v) for k, v in metadata.items()]
    if seal is not None:
        metadata[PROVENANCE_FIELD] = seal(fields)
        fields.append(field_line(PROVENANCE_FIELD, metadata[PROVENANCE_FIELD]))
    return ("{\n" + ",\n".join(fields) + "\n}\n").encode()
