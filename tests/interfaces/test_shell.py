"""``modulelens shell`` driven non-interactively: commands piped into a subprocess."""

from __future__ import annotations

import subprocess
from pathlib import Path

import agents_support as support

SCRIPT = """\
print("TYPES", [type(x).__name__ for x in (capture, module, calls, args, kwargs, output)])
print("SAME", torch.equal(module(*args, **kwargs)[0], output[0]))
print("CALL", capture.ref, len(calls), tuple(args[0].shape), sorted(kwargs))
print("REPLAY", capture.replay().passed)
"""


def test_shell_binds_names_and_lists_them(tmp_path: Path) -> None:
    repo = support.make_repo(tmp_path / "repo")
    env = support.subprocess_env(tmp_path)
    proc = subprocess.run(
        [support.python(), "-m", "modulelens", "shell", "toy/gate:v1", "--repo", str(repo), "--call", "1",
         "--", "--colors=nocolor"],
        input=SCRIPT, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    banner = out[: out.index("In [1]")]
    assert banner.startswith("modulelens shell: toy/gate:v1 (agents_support:Gate)")
    for name in ("capture", "module", "calls", "args", "kwargs", "output"):
        assert f"\n  {name} " in banner, name
    assert "call 1 inputs: tuple of 1: (float32[5, 8] cpu)" in banner
    assert "Tip:" not in banner and "Traceback" not in out
    assert "TYPES ['Capture', 'Gate', 'list', 'tuple', 'dict', 'tuple']" in out
    assert "SAME True" in out
    assert "CALL toy/gate:v1 2 (5, 8) ['mask']" in out
    assert "REPLAY True" in out


def test_shell_unknown_capture_is_one_line_error(tmp_path: Path) -> None:
    repo = support.make_repo(tmp_path / "repo")
    proc = subprocess.run([support.python(), "-m", "modulelens", "shell", "toy/nope", "--repo", str(repo)],
                          input="", capture_output=True, text=True, timeout=120, env=support.subprocess_env(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no capture named 'toy/nope'") and "Traceback" not in proc.stderr
