"""Publishing new versions of a name: numbers reserved in its index, each version made visible in
one step (a rename, or a conditional create), then recorded (repo/index.py); written once over the
:class:`~modulelens.repo.store.Store` interface for ``Repo.save_version`` and push/pull's commits."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from modulelens.errors import CaptureWarning, RepoError
from modulelens.repo.index import NameIndex, version_entry
from modulelens.repo.layout import CAPTURE_FILE, capture_json, max_metadata_bytes, name_key, version_key

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo
    from modulelens.repo.versions import VersionInfo


def publish(repo: Repo, name: str, metadatas: list[dict[str, Any]],
             seal: Callable[[list[str]], dict[str, Any]] | None,
             contents: list[str | None], depth: int = 0) -> list[VersionInfo]:
    """Reserve numbers in the name's index (above every number ever used), publish each
    version in one step (a rename, or a conditional create), then record them in the index
    (repo/index.py). A number the index did not know was taken (a writer it never saw) makes
    the index be rebuilt from the folders, and that version tries again."""
    prefix = name_key(name)
    numbers, unused = repo._summaries.reserve(name, prefix, len(metadatas))
    entries: dict[int, dict[str, Any]] = {}
    retry: list[int] = []
    for index, (metadata, number) in enumerate(zip(metadatas, numbers, strict=True)):
        metadata["version"] = number
        metadata["name"] = name
        document = capture_json(metadata, seal)
        if len(document) > max_metadata_bytes():
            warnings.warn(f"{name}:v{number}: its capture.json is {len(document):,} bytes, more than the "
                          f"{max_metadata_bytes():,} a load reads by default; load it with "
                          "MODULELENS_MAX_METADATA_MIB set higher (fewer recorded calls keep it smaller)",
                          CaptureWarning, stacklevel=2)
        if repo.store.publish(version_key(name, number), {CAPTURE_FILE: document}, unused=unused):
            entries[number] = version_entry(metadata)
            if contents[index] is not None:
                entries[number]["content"] = contents[index]
        else:
            retry.append(index)
    released = [numbers[i] for i in retry]
    head = repo._summaries.finish(name, prefix, entries, released=released)
    infos = {number: repo._infos(name, NameIndex(latest=head.latest, aliases=head.aliases,
                                                  versions={number: entry}))[0]
             for number, entry in entries.items()}
    if retry:
        if depth >= 10:
            raise RepoError(f"could not allocate a version for {name!r} in {repo.location}: every number "
                            "the index reserved was taken")
        repo._summaries.rebuild(name, prefix)
        for index in retry:
            [info] = publish(repo, name, [metadatas[index]], seal, [contents[index]], depth + 1)
            infos[info.version] = info
    return [infos[metadata["version"]] for metadata in metadatas]
