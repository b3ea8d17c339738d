"""``modulelens agent install``: Agent Skills spec rules, the Cursor rule, idempotency and --force."""

from __future__ import annotations

import json
import re
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import agents_support as support
import pytest
import yaml
from typer.testing import CliRunner

from modulelens.interfaces.cli import app

SKILL = Path(".claude/skills/modulelens")
RULE = Path(".cursor/rules/modulelens.mdc")
# agentskills.io specification (skills-ref validator): exactly these top-level keys
ALLOWED_FIELDS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}


def split_frontmatter(text: str) -> tuple[str, str]:
    match = re.match(r"\A---\n(.*?)\n---\n(.*)\Z", text, re.S)
    assert match, "file must start with a --- frontmatter block"
    return match.group(1), match.group(2)


def validate_skill(skill_dir: Path) -> dict[str, Any]:
    """The Agent Skills rules for one skill folder; returns the parsed frontmatter."""
    skill_md = skill_dir / "SKILL.md"
    assert skill_md.is_file()
    front_text, body = split_frontmatter(skill_md.read_text(encoding="utf-8"))
    meta = yaml.safe_load(front_text)
    assert isinstance(meta, dict)
    assert set(meta) <= ALLOWED_FIELDS, f"unknown frontmatter keys {set(meta) - ALLOWED_FIELDS}"
    name = unicodedata.normalize("NFKC", meta["name"])
    assert 1 <= len(name) <= 64
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), "lowercase letters, digits, single inner hyphens"
    assert name == skill_dir.name, "name must equal the folder name"
    description = meta["description"]
    assert isinstance(description, str) and 1 <= len(description) <= 1024
    assert "\n" not in description.strip()
    assert "Use when" in description  # what it does and when to use it
    if "compatibility" in meta:
        assert isinstance(meta["compatibility"], str) and 1 <= len(meta["compatibility"]) <= 500
    if "metadata" in meta:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta["metadata"].items())
    assert len(body.splitlines()) < 500
    # relative links point at files in the skill, one level deep
    for target in re.findall(r"\]\(([^)#]+)\)", body):
        if "://" in target:
            continue
        assert len(Path(target).parts) <= 2, target
        assert (skill_dir / target).is_file(), target
    return meta


def validate_cursor_rule(path: Path) -> dict[str, Any]:
    front_text, body = split_frontmatter(path.read_text(encoding="utf-8"))
    keys = [line.split(":", 1)[0] for line in front_text.splitlines() if line.strip()]
    assert set(keys) == {"description", "globs", "alwaysApply"}
    meta = yaml.safe_load(front_text)
    assert isinstance(meta["alwaysApply"], bool)
    assert isinstance(meta["description"], str) and meta["description"]
    assert body.strip()
    return meta


def install(project: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["agent", "install", "--dir", str(project), "--json", *args])
    assert result.exit_code == 0, result.output
    envelope = json.loads(result.stdout)
    assert envelope["schema"] == "modulelens.cli/1" and envelope["command"] == "agent install" and envelope["ok"]
    return {f["path"]: f["status"] for f in envelope["result"]["files"]}


def snapshot(project: Path) -> dict[str, bytes]:
    return {str(p.relative_to(project)): p.read_bytes() for p in sorted(project.rglob("*")) if p.is_file()}


def test_install_writes_a_valid_skill_and_cursor_rule(tmp_path: Path) -> None:
    statuses = install(tmp_path, "--claude", "--cursor")
    expected = {f"{SKILL}/SKILL.md", f"{SKILL}/references/REFERENCE.md", f"{SKILL}/scripts/find_capture.py",
                f"{SKILL}/scripts/check_candidate.py", f"{SKILL}/assets/candidate_template.py", str(RULE)}
    assert statuses == dict.fromkeys(expected, "created")
    meta = validate_skill(tmp_path / SKILL)
    assert meta["name"] == "modulelens"
    rule = validate_cursor_rule(tmp_path / RULE)
    assert rule["alwaysApply"] is False
    body = (tmp_path / SKILL / "SKILL.md").read_text()
    steps = ("ls --json", "show NAME --json", "replay NAME --json", "verify NAME --candidate", "profile NAME --json")
    for step in steps:
        assert step in body, step
    assert (tmp_path / SKILL / "scripts/find_capture.py").stat().st_mode & 0o111
    manifest = json.loads((tmp_path / SKILL / ".modulelens-install.json").read_text())
    assert set(manifest["files"]) == expected


def test_without_cursor_only_the_skill(tmp_path: Path) -> None:
    install(tmp_path)
    assert (tmp_path / SKILL / "SKILL.md").is_file() and not (tmp_path / ".cursor").exists()


def test_install_is_idempotent(tmp_path: Path) -> None:
    install(tmp_path, "--cursor")
    before = snapshot(tmp_path)
    statuses = install(tmp_path, "--cursor")
    assert set(statuses.values()) == {"unchanged"}
    assert snapshot(tmp_path) == before


def test_user_edits_are_kept_unless_force(tmp_path: Path) -> None:
    install(tmp_path, "--cursor")
    skill_md = tmp_path / SKILL / "SKILL.md"
    edited = skill_md.read_text() + "\n## Team notes\nUse the staging repo.\n"
    skill_md.write_text(edited)
    (tmp_path / RULE).write_text("---\ndescription: mine\nglobs:\nalwaysApply: true\n---\nmine\n")
    (tmp_path / SKILL / "references/REFERENCE.md").unlink()

    result = CliRunner().invoke(app, ["agent", "install", "--cursor", "--dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "kept 2 file(s)" in result.output and "--force" in result.output
    statuses = install(tmp_path, "--cursor")
    assert statuses[f"{SKILL}/SKILL.md"] == "kept-modified" and statuses[str(RULE)] == "kept-modified"
    assert statuses[f"{SKILL}/references/REFERENCE.md"] == "unchanged"  # recreated by the run above
    assert skill_md.read_text() == edited

    statuses = install(tmp_path, "--cursor", "--force")
    assert statuses[f"{SKILL}/SKILL.md"] == "overwritten" and statuses[str(RULE)] == "overwritten"
    assert "Team notes" not in skill_md.read_text()
    validate_skill(tmp_path / SKILL)
    assert set(install(tmp_path, "--cursor").values()) == {"unchanged"}


def test_files_written_by_an_older_version_are_updated(tmp_path: Path) -> None:
    install(tmp_path)
    reference = tmp_path / SKILL / "references/REFERENCE.md"
    old = b"# reference from an older modulelens\n"
    reference.write_bytes(old)
    manifest_path = tmp_path / SKILL / ".modulelens-install.json"
    manifest = json.loads(manifest_path.read_text())
    from modulelens.interfaces.agent_skill import _sha256

    manifest["files"][f"{SKILL}/references/REFERENCE.md"] = _sha256(old)
    manifest_path.write_text(json.dumps(manifest))
    assert install(tmp_path)[f"{SKILL}/references/REFERENCE.md"] == "updated"
    assert reference.read_bytes() != old


def test_missing_project_dir_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["agent", "install", "--dir", str(tmp_path / "nope"), "--json"])
    assert result.exit_code == 2  # a usage error: the folder given does not exist
    envelope = json.loads(result.stdout)
    assert envelope["ok"] is False and envelope["command"] == "agent install"
    assert "does not exist" in envelope["error"]["message"] and envelope["error"]["exit_code"] == 2


def test_bundled_skill_matches_package_data() -> None:
    """The source files validate too (what ships is what the test checks)."""
    from importlib import resources

    root = Path(str(resources.files("modulelens.interfaces.agent_skill") / "files"))
    tmp_skill = root / "skill"
    meta = yaml.safe_load(split_frontmatter((tmp_skill / "SKILL.md").read_text())[0])
    assert meta["name"] == "modulelens"
    pyproject = (support.WORKTREE / "pyproject.toml").read_text()
    assert '"interfaces/agent_skill/files/**/*"' in pyproject


def test_helper_scripts_and_candidate_template(tmp_path: Path) -> None:
    repo = support.make_repo(tmp_path / "repo")
    install(tmp_path)
    proc = subprocess.run([support.python(), str(tmp_path / SKILL / "scripts/find_capture.py"), "gate", "--repo",
                           str(repo)], capture_output=True, text=True, timeout=120,
                          env=support.subprocess_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert [m["ref"] for m in found["matches"]] == ["toy/gate:v1"] and found["repo_error"] is None



SCRIPT_MODEL = """
import torch


class ScriptGate(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return torch.tanh(self.lin(x))
"""


def test_template_and_check_candidate_for_a_class_only_in_stored_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import sys

    import torch

    import modulelens

    gone = tmp_path / "gone"  # the model's module exists only while capturing (like a deleted script)
    gone.mkdir()
    (gone / "vanishing_model.py").write_text(SCRIPT_MODEL)
    monkeypatch.syspath_prepend(str(gone))
    import vanishing_model

    with modulelens.track_init():
        model = vanishing_model.ScriptGate(4)
    repo = tmp_path / "repo"
    with modulelens.capture(model, targets="ScriptGate", repo=repo, name="job"):
        model(torch.randn(3, 4))
    del sys.modules["vanishing_model"]
    shutil.rmtree(gone)
    [ref] = [info.ref for info in modulelens.Repo(repo).list()]

    modulelens.Repo(repo).trust_source = True  # the user's own repo: `modulelens trust --repo DIR`
    install(tmp_path)
    candidate = tmp_path / "cand.py"
    candidate.write_text((tmp_path / SKILL / "assets/candidate_template.py").read_text())
    env = support.subprocess_env(tmp_path, MODULELENS_CAPTURE=ref, MODULELENS_REPO=str(repo))
    proc = subprocess.run([support.python(), str(tmp_path / SKILL / "scripts/check_candidate.py"), ref,
                           "--candidate", f"{candidate}:Candidate", "--repo", str(repo)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert list(summary)[:2] == ["passed", "ref"] and summary["passed"] is True  # verdict first
    assert summary["replay"] == {"passed": True, "status": "PASS", "mode": "bit-exact", "calls": 1, "failures": [],
                                 "cannot_verify": []}
    assert summary["verify"]["passed"] is True and summary["verify"]["failures"] == []
    assert summary["profile"]["median_ms"] > 0
    assert len(proc.stdout) < 1000  # compact: no per-leaf tables

    # a failing candidate: the summary keeps the verdict and the first failures (a real verify report)
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_candidate", tmp_path / SKILL / "scripts/check_candidate.py")
    assert spec and spec.loader
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    capture = modulelens.load(ref, repo=repo)

    class Doubled(capture.module_type):  # type: ignore[misc, name-defined]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    report = modulelens.verify(capture, Doubled, timing=None, store=False)
    compact = check.verify_summary({"ok": True, "result": report.to_dict()})
    assert compact["passed"] is False and compact["failures"][0].startswith("call 0: output")


def test_installed_skill_stands_alone(tmp_path: Path) -> None:
    """Nothing in the project points into this repository, and the exit codes match the README."""
    import modulelens.errors as errors

    install(tmp_path, "--cursor")
    texts = {p: p.read_text() for p in (tmp_path / ".claude").rglob("*") if p.is_file() and p.suffix in (".md", ".py")}
    texts[tmp_path / RULE] = (tmp_path / RULE).read_text()
    for path, text in texts.items():
        assert "docs/" not in text and "README" not in text, path
    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.ModulelensError)}
    reference = (tmp_path / SKILL / "references/REFERENCE.md").read_text()
    skill = (tmp_path / SKILL / "SKILL.md").read_text()
    readme = (support.WORKTREE / "README.md").read_text()
    for code in codes:
        assert f"| {code} |" in reference, code
        assert re.search(rf"\b{code} [a-z`]", skill), code
        assert re.search(rf"\b{code} [a-z`]", readme.split("stable non-zero exit code")[1][:400]), code


@pytest.mark.parametrize("helper", ["find_capture.py", "check_candidate.py"])
def test_helper_scripts_compile(helper: str, tmp_path: Path) -> None:
    install(tmp_path)
    source = (tmp_path / SKILL / "scripts" / helper).read_text()
    compile(source, helper, "exec")
    assert source.startswith("#!/usr/bin/env python3")
