"""What a listing says about one stored version (:class:`VersionInfo`), built lazily from its
index entry: a listing makes one per version, up to hundreds of thousands at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast


class NameListing:
    """What the versions of one name in one listing share: built once per name, not per version."""

    __slots__ = ("aliases", "folder", "name", "numbered")

    def __init__(self, name: str, folder: str, aliases: dict[int, tuple[str, ...]], *, numbered: bool) -> None:
        self.name = name
        self.folder = folder  # numbered: the folder of the versions, each one's number appended
        self.aliases = aliases
        self.numbered = numbered



class VersionInfo:
    """One stored version, as a listing describes it: a snapshot (changing it changes nothing
    stored).

    Example:
        >>> [info.ref for info in modulelens.Repo().list("ranker/0")]  # doctest: +SKIP
        ['ranker/0:v1', 'ranker/0:v2']

    A listing builds one per version, up to hundreds of thousands at a time, so one holds only its
    number, the index entry it was read from (a fresh dict per listing, shared with nothing) and
    what its name's versions share; every other field is read from those when asked. Building each
    field eagerly cost 40% of reading the index itself at 10,000 versions (benchmarks/bench_scale.py).
    """

    __slots__ = ("_entry", "_of", "version")

    def __init__(self, name: str, version: int, folder: str, created: str, tags: tuple[str, ...] = (),
                 aliases: tuple[str, ...] = (), nbytes: int = 0, module_class: str = "", calls: int = 0,
                 problem: str | None = None) -> None:
        self.version = version
        self._of = NameListing(name, folder, {version: tuple(aliases)}, numbered=False)
        self._entry: dict[str, Any] = {"created": created, "tags": tuple(tags), "nbytes": nbytes,
                                       "module_class": module_class, "calls": calls, "problem": problem}

    @property
    def name(self) -> str:
        return self._of.name

    @property
    def folder(self) -> str:
        """The version's folder, or its URL in a remote repo (a str: building thousands of Paths
        was most of a listing)."""
        return f"{self._of.folder}{self.version}" if self._of.numbered else self._of.folder

    @property
    def aliases(self) -> tuple[str, ...]:
        return self._of.aliases.get(self.version, ())

    # The fields below are read from the entry as stored, as the listing used to copy them; a
    # field an entry lacks (a hand-edited or hostile log line) reads as empty, never as a KeyError
    # raised far from the listing.
    @property
    def created(self) -> str:
        return cast(str, self._entry.get("created", ""))

    @property
    def tags(self) -> tuple[str, ...]:
        tags = self._entry.get("tags")
        return tuple(tags) if isinstance(tags, (list, tuple)) else ()

    @property
    def nbytes(self) -> int:
        return cast(int, self._entry.get("nbytes", 0))

    @property
    def module_class(self) -> str:
        return cast(str, self._entry.get("module_class", ""))

    @property
    def calls(self) -> int:
        return cast(int, self._entry.get("calls", 0))

    @property
    def problem(self) -> str | None:
        """Why its metadata cannot be read (a damaged version still lists); ``None`` when it can."""
        return cast("str | None", self._entry.get("problem"))

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    @property
    def path(self) -> Path:
        """The version's folder (``capture.json``, ``reports/``) in a local repo; for a remote repo
        use :attr:`folder` (its URL) or ``repo.version_path()`` (the cached copy)."""
        return Path(self.folder)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name, "version": self.version, "ref": self.ref, "path": self.folder,
            "created": self.created, "tags": list(self.tags), "aliases": list(self.aliases),
            "payload_bytes": self.nbytes, "module_class": self.module_class, "calls": self.calls,
            "problem": self.problem,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VersionInfo):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # equal by value and changeable: unhashable, as the dataclass was

    def __repr__(self) -> str:
        fields = ", ".join(f"{key}={value!r}" for key, value in (
            ("name", self.name), ("version", self.version), ("folder", self.folder), ("created", self.created),
            ("tags", self.tags), ("aliases", self.aliases), ("nbytes", self.nbytes),
            ("module_class", self.module_class), ("calls", self.calls), ("problem", self.problem)))
        return f"VersionInfo({fields})"

