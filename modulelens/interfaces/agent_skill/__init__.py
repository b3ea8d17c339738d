"""``modulelens agent install``: write the modulelens Agent Skill (and a Cursor rule) into a project.

Files come from the package data next to this module (``files/``)::

    <project>/.claude/skills/modulelens/SKILL.md                  Claude Code and Cursor read this
    <project>/.claude/skills/modulelens/references/REFERENCE.md
    <project>/.claude/skills/modulelens/scripts/*.py
    <project>/.claude/skills/modulelens/assets/candidate_template.py
    <project>/.claude/skills/modulelens/.modulelens-install.json  hashes of what was written
    <project>/.cursor/rules/modulelens.mdc                        with --cursor

Installing is idempotent. A file whose content differs from what modulelens last wrote (per the
manifest) was edited by someone and is kept unless ``force=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from modulelens.errors import UsageError

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from Python 3.11

SKILL_NAME = "modulelens"
SKILL_DIR = Path(".claude") / "skills" / SKILL_NAME
CURSOR_RULE = Path(".cursor") / "rules" / "modulelens.mdc"
MANIFEST = SKILL_DIR / ".modulelens-install.json"
MANIFEST_SCHEMA = "modulelens.agent-install/1"


@dataclass
class InstallResult:
    """What ``install`` did, file by file (paths relative to ``project``)."""

    project: str
    skill_dir: str
    files: list[dict[str, str]] = field(default_factory=list)

    @property
    def kept(self) -> list[str]:
        """Files left alone because they were edited after modulelens wrote them."""
        return [f["path"] for f in self.files if f["status"] == "kept-modified"]

    def to_dict(self) -> dict[str, object]:
        return {"project": self.project, "skill_dir": self.skill_dir, "files": self.files, "kept_modified": self.kept}


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def bundled_files(cursor: bool) -> dict[Path, bytes]:
    """``{path relative to the project: content}`` of everything ``install`` writes."""
    root = resources.files(__package__) / "files"
    out: dict[Path, bytes] = {}

    def walk(node: Traversable, rel: Path) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name == "__pycache__" or child.name.endswith(".pyc"):
                continue
            if child.is_dir():
                walk(child, rel / child.name)
            else:
                out[SKILL_DIR / rel / child.name] = child.read_bytes()

    walk(root / "skill", Path())
    if cursor:
        out[CURSOR_RULE] = (root / "cursor" / "modulelens.mdc").read_bytes()
    return out


def _read_manifest(project: Path) -> dict[str, str]:
    # A missing or hand-damaged manifest only means "no file is known to be ours": every file is
    # then treated as edited by someone and kept (unless --force).
    try:
        data = json.loads((project / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return dict(files) if isinstance(files, dict) else {}


def install(
    project: str | os.PathLike[str] | None = None, *, cursor: bool = False, force: bool = False
) -> InstallResult:
    """Write the skill (and with ``cursor`` the Cursor rule) under ``project`` (default: cwd).

    Per file the status is ``created``, ``unchanged``, ``updated`` (modulelens' own earlier copy
    replaced), ``kept-modified`` (edited by someone: left alone) or ``overwritten`` (edited, but
    ``force``)."""
    root = Path(project if project is not None else os.getcwd()).expanduser().absolute()
    if not root.is_dir():
        raise UsageError(f"project directory {root} does not exist")
    manifest = _read_manifest(root)
    result = InstallResult(project=str(root), skill_dir=str(root / SKILL_DIR))
    written: dict[str, str] = dict(manifest)
    for rel, content in bundled_files(cursor).items():
        target = root / rel
        key = rel.as_posix()
        new_hash = _sha256(content)
        if not target.exists():
            status = "created"
        else:
            current = _sha256(target.read_bytes())
            if current == new_hash:
                status = "unchanged"
            elif manifest.get(key) == current:
                status = "updated"
            elif force:
                status = "overwritten"
            else:
                result.files.append({"path": key, "status": "kept-modified"})
                continue
        if status != "unchanged":
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".modulelens-tmp")
            tmp.write_bytes(content)
            if rel.parent.name == "scripts":
                tmp.chmod(0o755)
            os.replace(tmp, target)
        written[key] = new_hash
        result.files.append({"path": key, "status": status})
    manifest_data = {"schema": MANIFEST_SCHEMA, "note": "hashes of the files modulelens wrote; "
                     "edited files are kept on reinstall unless --force", "files": dict(sorted(written.items()))}
    (root / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_text(json.dumps(manifest_data, indent=1) + "\n")
    return result
