"""The one resolver of the classes and functions a capture names, and the constructor decoder.

Load, replay, export and verify all go through :class:`ClassResolver`: an import path from the
metadata becomes an object only under the import rules of :mod:`modulelens.format.imports`
(importable, not denied, of the kind its use needs, checked before anything is called). When a
class is not importable here and the capture stored its source, that source runs only if the user
trusts it (``trust_source``; docs/security.md); without trust the error says how to give it.

A capture of *your own* (its provenance verifies: this user saved it into this repo,
:func:`modulelens.repo.trust.own_capture`) needs no trust for its own classes: a module it recorded
is imported from the current directory when that is the very file it recorded, and its stored
source runs when the text still has the hash it was signed with. The signature is checked only
when one of those is about to be needed.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from modulelens.errors import RestoreError, UnsupportedValueError, UntrustedCodeError
from modulelens.format.imports import Kind, check_kind, import_checked
from modulelens.format.sources import source_hash
from modulelens.format.spec import Construction, SourceFile
from modulelens.format.values import DecodeContext, decode_value
from modulelens.repo.trust import Provenance, TrustPolicy
from modulelens.restore.source import lookup, module_from_source, source_changes

TRUST_HINT = ("load(..., trust_source=True), --trust-source on the command line, or "
              "`modulelens trust --repo DIR` for a repo of your own")


class ClassResolver:
    """``resolve(path, kind)`` for one capture; ``notes`` collects what happened.

    Args:
        sources: the capture's ``sources`` (stored source text per module).
        ref: the capture's reference, for messages.
        trust: what may run (:class:`~modulelens.repo.trust.TrustPolicy`, resolved once by ``load()``):
            here, whether stored source may run.
        forbidden: folders nothing is imported from (the repo).
        read_text: reads a stored source file by its ``text_id`` (a blob of the capture).
        provenance: checks whether the capture is the user's own (the policy's
            :meth:`~modulelens.repo.trust.TrustPolicy.provenance` of this capture), called at most
            once, when that decides; ``None``: never (not a local repo).
    """

    def __init__(self, sources: dict[str, SourceFile], ref: str, *, trust: TrustPolicy = TrustPolicy(),
                 forbidden: Iterable[str | os.PathLike[str]] = (),
                 read_text: Callable[[str], str] | None = None,
                 provenance: Callable[[], Provenance] | None = None) -> None:
        self.sources = sources if isinstance(sources, dict) else {}
        self.ref = ref
        self.trust = trust
        self.forbidden = [os.fspath(f) for f in forbidden]
        self.notes: list[str] = []
        self._cache: dict[str, Any] = {}
        self._pending_notes: dict[str, str] = {}  # path -> the note its first use adds (stored source ran)
        self._read_text = read_text
        self._check_provenance = provenance
        self._provenance: Provenance | None = None

    def text(self, module_name: str) -> str | None:
        """The stored source of ``module_name``: a blob referenced by ``"text_id"``, or inline
        ``"text"`` (captures made before source blobs); ``None`` when none was stored."""
        entry = self.sources.get(module_name)
        if not isinstance(entry, dict):
            return None
        if isinstance(entry.get("text"), str):
            return entry["text"]
        if isinstance(entry.get("text_id"), str) and self._read_text is not None:
            return self._read_text(entry["text_id"])
        return None

    def resolve(self, path: str, kind: Kind = "value") -> Any:
        """The object ``path`` names, of kind ``kind`` (see :func:`modulelens.format.imports.resolve_import`).

        Raises:
            UntrustedCodeError: refused by the import rules, or stored source without trust.
            RestoreError: not importable here and no usable stored source.
        """
        if path not in self._cache:
            self._cache[path] = self._resolve(path)
        note = self._pending_notes.pop(path, None)
        if note is not None and note not in self.notes:
            self.notes.append(note)
        return check_kind(self._cache[path], kind, path)

    def prefetch(self, paths: Iterable[str]) -> None:
        """Resolve ``paths`` now, so that their imports (and the stored source that trust allows)
        run before any constructor does: a module imported while a rebuild constructs would build
        its module-level modules with meta weights (restore/construction.py). A path that fails is
        left to its use, which reports it; a note (stored source ran) waits for that use too."""
        for path in paths:
            if path in self._cache:
                continue
            try:
                self._cache[path] = self._resolve(path)
            except Exception:  # the use of this path raises it, with its context
                continue

    @property
    def trust_source(self) -> bool:
        """Whether stored source may run (the policy's ``stored_source``)."""
        return self.trust.stored_source

    def provenance(self) -> Provenance:
        """Whether the capture is the user's own, saved into this repo (checked once, when asked)."""
        if self._provenance is None:
            self._provenance = (self._check_provenance() if self._check_provenance is not None
                                else Provenance(False, "it is not in a local repo"))
        return self._provenance

    def allow_code(self, what: str) -> None:
        """Code stored as data in the capture (an fx graph decides which functions run, with which
        arguments) is built only under the trust stored source needs: ``trust_source``, or a
        capture of your own (docs/security.md).

        Raises:
            UntrustedCodeError: neither.
        """
        if self.trust_source or self.provenance().own:
            return
        raise UntrustedCodeError(
            f"{self.ref}: {what} is code stored in the capture (which functions run, with which arguments); it "
            f"runs only if you trust this capture (it is not one you saved into this repo: {self.provenance().why}): "
            f"{TRUST_HINT}")

    def allow_here(self, module_name: str, spec: importlib.machinery.ModuleSpec) -> bool:
        """Whether the top-level module ``module_name``, found in the current directory, may be
        imported: it is (the package of) a file this capture recorded, and the capture is your own."""
        found = [os.path.realpath(spec.origin)] if spec.has_location and spec.origin else []
        folders = [os.path.realpath(f) for f in spec.submodule_search_locations or []]
        for name, entry in self.sources.items():
            file = entry.get("file") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not isinstance(file, str) or not os.path.isabs(file):
                continue
            real = os.path.realpath(file)
            recorded = (real in found if name == module_name else
                        name.startswith(module_name + ".") and any(real.startswith(f + os.sep) for f in folders))
            if recorded:
                return self.provenance().own
        return False

    def source_changes(self) -> list[str]:
        """Messages about captured classes whose code changed since the capture (also noted)."""
        changed = source_changes(self.sources, self.forbidden, self.allow_here)
        self.notes.extend(changed)
        return changed

    def _resolve(self, path: str) -> Any:
        if not isinstance(path, str):
            raise UntrustedCodeError(f"{self.ref}: malformed import path {path!r}")
        module_name, _, qualname = path.partition(":")
        entry = self.sources.get(module_name)
        entry = entry if isinstance(entry, dict) else None
        importable = module_name != "__main__" or self._running_captured_script(entry)
        reason = "it is defined in a script (__main__) other than the one running"
        if importable and "<locals>" not in qualname:
            try:
                return import_checked(path, self.forbidden, self.allow_here)
            except (ImportError, AttributeError) as error:
                reason = str(error)
        elif "<locals>" in qualname:
            reason = "it was defined inside a function"
        if entry is None or not (isinstance(entry.get("text"), str) or isinstance(entry.get("text_id"), str)):
            raise RestoreError(f"{self.ref}: cannot import {path} ({reason}{self._not_yours()}) and the capture holds "
                               "no source for it")
        own = not self.trust_source and self.provenance().own
        if not self.trust_source and not own:
            raise UntrustedCodeError(
                f"{self.ref}: {path} cannot be imported here ({reason}); the capture stores its source "
                f"({entry.get('file')}), which runs only if you trust this capture (it is not one you saved "
                f"into this repo: {self.provenance().why}): {TRUST_HINT}")
        return self._from_source(module_name, qualname, entry, own=own)

    def _not_yours(self) -> str:
        """Why the capture is not the user's own, when that was checked (and so decided a refusal)."""
        checked = self._provenance
        return f"; it is not one you saved into this repo: {checked.why}" if checked and not checked.own else ""

    def _from_source(self, module_name: str, qualname: str, entry: SourceFile, *, own: bool) -> object:
        text = self.text(module_name)
        if own and text is not None and source_hash(text) != entry.get("hash"):
            # The signature covers the hash, not the text: a blob changed after the save is not yours.
            raise UntrustedCodeError(f"{self.ref}: the source stored for {module_name} is not the one this capture "
                                     f"was saved with (its hash differs); it runs only if you trust it: {TRUST_HINT}")
        try:
            if text is None:
                raise KeyError("text")
            obj = lookup(module_from_source(module_name, entry, text, qualname), qualname, entry)
        except (AttributeError, KeyError, SyntaxError, NameError, TypeError) as error:
            raise RestoreError(f"{self.ref}: the source stored for {module_name} does not define {qualname} "
                               f"({type(error).__name__}: {error})") from None
        whose = "your own capture" if own else "the capture"
        self._pending_notes[f"{module_name}:{qualname}"] = (f"classes of {module_name} were rebuilt from the source "
                                                            f"stored with {whose} ({entry.get('file')})")
        return obj

    @staticmethod
    def _running_captured_script(entry: SourceFile | None) -> bool:
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        file = entry.get("file") if entry is not None else None
        if entry is None or not file or not main_file:
            return entry is None
        try:
            return os.path.samefile(main_file, file)
        except (OSError, TypeError, ValueError):
            return False


def module_class(resolver: ClassResolver, path: str) -> type[torch.nn.Module]:
    """The ``nn.Module`` subclass at ``path``, as :class:`RestoreError` when it cannot be had."""
    try:
        return resolver.resolve(path, "module")
    except (ImportError, AttributeError) as error:
        raise RestoreError(f"{resolver.ref}: cannot import module class {path}: {error}") from None


def decode_construction(entry: Construction, resolver: ClassResolver,
                        ctx: DecodeContext) -> tuple[type[torch.nn.Module], tuple[object, ...], dict[str, object]]:
    """The class and decoded constructor arguments of a recorded construction; the class is
    resolved (and checked to be an ``nn.Module`` subclass) before any argument is decoded, and
    nothing is called.

    Raises:
        UntrustedCodeError: the class or a value names something the import rules refuse.
        RestoreError: the class or an argument cannot be decoded here.
    """
    cls = module_class(resolver, entry["class"])
    if holds_graph([entry["args"], entry["kwargs"]]):  # format/fx_codecs.py: a graph is code
        resolver.allow_code(f"the fx graph {entry['class']} is built from")
    try:
        args = tuple(decode_value(a, ctx) for a in entry["args"])
        kwargs = {k: decode_value(v, ctx) for k, v in entry["kwargs"].items()}
    except (UnsupportedValueError, ImportError, AttributeError) as error:
        raise RestoreError(f"{resolver.ref}: cannot decode constructor arguments of {entry['class']}: "
                           f"{error}") from None
    return cls, args, kwargs



def construction_paths(constructions: Mapping[str, object], mid: str | None) -> list[str]:
    """Every import path that building construction record ``mid`` names: its class, what its
    arguments name, and the same for the modules among its arguments (their own records)."""
    paths: list[str] = []
    pending, seen = [mid], set()
    while pending:
        current = pending.pop()
        entry = constructions.get(current) if isinstance(current, str) and current not in seen else None
        if not isinstance(entry, dict):
            continue
        seen.add(current)
        paths += named_paths(entry)
        pending += _module_refs([entry.get("args"), entry.get("kwargs")])
    return paths


def _module_refs(encoded: object) -> Iterator[str]:
    if isinstance(encoded, list):
        for item in encoded:
            yield from _module_refs(item)
    elif isinstance(encoded, dict):
        if encoded.get("$type") == "module" and isinstance(encoded.get("ref"), str):
            yield encoded["ref"]
        for value in encoded.values():
            if isinstance(value, (list, dict)):
                yield from _module_refs(value)


def named_paths(encoded: object) -> Iterator[str]:
    """Every import path an encoded value (or construction record, or a document of them) names:
    ``import`` values, the classes of namedtuples, dataclasses and codec values, construction classes."""
    if isinstance(encoded, list):
        for item in encoded:
            yield from named_paths(item)
    elif isinstance(encoded, dict):
        tag = encoded.get("$type")
        if tag == "import" and isinstance(encoded.get("path"), str):
            yield encoded["path"]
        elif isinstance(encoded.get("class"), str) and (tag in ("namedtuple", "dataclass", "codec") or tag is None):
            yield encoded["class"]
        for value in encoded.values():
            if isinstance(value, (list, dict)):
                yield from named_paths(value)


def holds_graph(encoded: object) -> bool:
    """Whether an encoded value holds an fx graph (format/fx_codecs.py)."""
    if isinstance(encoded, list):
        return any(holds_graph(item) for item in encoded)
    if isinstance(encoded, dict):
        if encoded.get("$type") == "codec" and encoded.get("codec") == "torch.fx.Graph":
            return True
        return any(holds_graph(value) for value in encoded.values() if isinstance(value, (list, dict)))
    return False
