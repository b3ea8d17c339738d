"""The IPython extension driven headlessly through an ``InteractiveShell`` (no kernel)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agents_support as support

from modulelens.interfaces.html import FAIL_COLOR, PASS_COLOR, esc, result_html
from modulelens.restore.loader import Capture, load


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return support.make_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture
def ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    shell.run_line_magic("load_ext", "modulelens")
    yield shell
    InteractiveShell.clear_instance()


def html_of(ip: Any, obj: Any) -> str:
    data, _ = ip.display_formatter.format(obj)
    assert "text/plain" in data
    return data["text/html"]


def test_extension_registers_magics(ip: Any) -> None:
    line_magics = ip.magics_manager.magics["line"]
    assert {"ml_ls", "ml_load", "ml_replay", "ml_profile", "ml_verify", "ml_diff", "ml_export"} <= set(line_magics)
    ip.run_line_magic("unload_ext", "modulelens")
    assert "ml_load" not in ip.magics_manager.magics["line"]


def test_ls(ip: Any, repo: Path) -> None:
    listing = ip.run_line_magic("ml_ls", f"--repo {repo}")
    assert [r["ref"] for r in listing.rows] == ["toy/gate:v1", "toy/head:v1", "toy/noisy:v1"]
    assert "toy/gate:v1" in repr(listing) and "Gate" in repr(listing)
    assert "toy/head:v1" in html_of(ip, listing)
    assert [r["ref"] for r in ip.run_line_magic("ml_ls", f"toy/head --repo {repo}").rows] == ["toy/head:v1"]


def test_load_binds_capture_module_and_inputs(ip: Any, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("ml_load", f"toy/gate --repo {repo}") is None
    said = capsys.readouterr().out
    for name in ("capture", "module", "args", "kwargs"):
        assert f"  {name} " in said
    assert "loaded toy/gate:v1" in said
    ns = ip.user_ns
    assert isinstance(ns["capture"], Capture) and ns["capture"].ref == "toy/gate:v1"
    assert type(ns["module"]).__name__ == "Gate"
    assert ns["args"][0].shape == (3, 8) and set(ns["kwargs"]) == {"mask"}
    out, gate = ns["module"](*ns["args"], **ns["kwargs"])
    recorded = ns["capture"].calls[0].output
    assert torch.equal(out, recorded[0]) and torch.equal(gate, recorded[1])
    # the bound inputs are a private copy: changing them leaves the recorded call intact
    ns["args"][0].zero_()
    assert not torch.equal(ns["capture"].calls[0].args[0], ns["args"][0])


def test_load_as_var_and_call(ip: Any, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("ml_load", f"toy/gate as g --repo {repo} --call 1")
    said = capsys.readouterr().out
    assert all(f"  {n} " in said for n in ("g", "g_module", "g_args", "g_kwargs"))
    assert ip.user_ns["g_args"][0].shape == (5, 8)
    assert "capture" not in ip.user_ns


def test_replay_pass_then_fail_after_edit(ip: Any, repo: Path) -> None:
    report = ip.run_line_magic("ml_replay", f"toy/gate --repo {repo}")
    assert report.passed
    html = html_of(ip, report)
    assert PASS_COLOR in html and "PASS" in html and "toy/gate:v1" in html
    # edits to the module's weights: replay uses the recorded weights unless asked for the current ones
    ip.run_line_magic("ml_load", f"toy/gate --repo {repo}")
    ip.run_cell("module.down.bias.data += 1")
    report = ip.run_line_magic("ml_replay", "capture --current-weights")
    assert not report.passed and report.weights == "current"
    html = html_of(ip, report)
    assert FAIL_COLOR in html and "FAIL" in html
    assert "replay toy/gate:v1 on cpu (bit-exact, the module's current weights): FAIL" in repr(report)
    ip.run_cell("module.down.weight.mul_(2)")
    report = ip.run_line_magic("ml_replay", "capture --current-weights")
    assert not report.passed
    report = ip.run_line_magic("ml_replay", "capture")
    assert report.passed and "(bit-exact, recorded weights): PASS" in repr(report)


def test_errors_are_one_line_usage_errors(ip: Any, repo: Path) -> None:
    from IPython.core.error import UsageError

    for line in (f"%ml_replay nope/x --repo {repo}", "%ml_load", f"%ml_load toy/gate as --repo {repo}",
                 f"%ml_load toy/gate as 1x --repo {repo}", f"%ml_load toy/gate --call 7 --repo {repo}"):
        result = ip.run_cell(line)
        assert isinstance(result.error_in_exec, UsageError), line
    assert "no capture named 'nope/x'" in str(ip.run_cell(f"%ml_replay nope/x --repo {repo}").error_in_exec)


CANDIDATES = """
import torch
from agents_support import Gate


class SameGate(Gate):
    def forward(self, x, mask=None):
        gate = torch.sigmoid(self.up(x))
        if mask is not None:
            gate = gate * mask.unsqueeze(-1)
        return self.down(gate) * self.scale, gate


class OffByOneGate(Gate):
    def forward(self, x, mask=None):
        out, gate = super().forward(x, mask)
        return out + 1, gate
"""


def test_verify_shows_verdict_then_failures(ip: Any, repo: Path, tmp_path: Path) -> None:
    candidates = tmp_path / "cands.py"
    candidates.write_text(CANDIDATES)
    view = ip.run_line_magic("ml_verify", f"toy/gate --candidate {candidates}:SameGate --no-timing --repo {repo}")
    assert view.passed is True
    html = html_of(ip, view)
    assert html.index(">PASS<") < html.index("SameGate") and PASS_COLOR in html
    assert repr(view).startswith("verify ") and "PASS" in repr(view).splitlines()[0]

    ip.user_ns["Wrong"] = ip.ev(f"__import__('runpy').run_path({str(candidates)!r})['OffByOneGate']")
    view = ip.run_line_magic("ml_verify", f"toy/gate --candidate Wrong --no-timing --repo {repo}")
    assert view.passed is False
    html = html_of(ip, view)
    verdict, failures = html.index(">FAIL<"), html.index("output[0]")
    assert verdict < failures < html.index("<table")  # failures come before the per-call table
    assert ip.run_cell(f"%ml_verify toy/gate --repo {repo}").error_in_exec is not None  # --candidate is required
    error = ip.run_cell(f"%ml_verify toy/gate --candidate {tmp_path}/none.py:X --repo {repo}").error_in_exec
    assert "none.py" in str(error)


def test_profile_summary_with_inline_plot(ip: Any, repo: Path) -> None:
    view = ip.run_line_magic("ml_profile", f"toy/head --iters 3 --warmup 1 --batch-sizes 1,4 --repo {repo}")
    html = html_of(ip, view)
    assert html.index("median") < html.index("<table")  # latency first
    assert '<img alt="latency vs batch size" src="data:image/png;base64,' in html
    assert repr(view).startswith("profile toy/head:v1")
    error = ip.run_cell(f"%ml_profile toy/head --batch-sizes 1,x --repo {repo}").error_in_exec
    assert "--batch-sizes" in str(error)
    error = ip.run_cell(f"%ml_profile toy/head --call 9 --repo {repo}").error_in_exec
    assert "there is no call 9" in str(error)


def test_diff_and_export(ip: Any, repo: Path, tmp_path: Path) -> None:
    view = ip.run_line_magic("ml_diff", f"toy/gate toy/gate:v1 --repo {repo}")
    html = html_of(ip, view)
    assert "5/5 tensors identical" in html and "diff toy/gate:v1" in html
    view = ip.run_line_magic("ml_export", f"toy/head --output {tmp_path / 'problem'} --repo {repo}")
    assert (tmp_path / "problem" / "problem.py").is_file()
    assert "KernelBench compatible" in html_of(ip, view) and "exported toy/head:v1" in repr(view)
    error = ip.run_cell(f"%ml_export toy/head --output {tmp_path / 'problem'} --repo {repo}").error_in_exec
    assert error is not None and "\n" not in str(error)  # a non-empty folder without --force: one line


def test_capture_and_call_render_as_tables(ip: Any, repo: Path) -> None:
    capture = load("toy/gate", repo=repo)
    html = html_of(ip, capture)
    for header in ("name", "shape", "dtype", "device", "min", "max", "mean", "std", "non-finite"):
        assert f">{header}</th>" in html
    for path in ("up.weight", "calls", "args[0]", "kwargs[&#x27;mask&#x27;]", "output[0]", "output[1]"):
        assert f">{path}</td>" in html, path
    assert "[3, 8]" in html and "float32" in html and "&quot;scale&quot;: 0.5" in html
    call = capture.calls[1]
    assert "args[0]" in html_of(ip, call) and "[5, 8]" in html_of(ip, call)
    text = repr(call)
    assert "\n" not in text and len(text) < 200
    assert text == ("<Call 1 of toy/gate:v1 (train): inputs float32[5, 8], float32[5] -> "
                    "output float32[5, 8], float32[5, 16]>")
    assert repr(capture) == "<Capture toy/gate:v1 Gate: 2 call(s), 1 state(s)>"


def test_html_escapes_and_flags_nan() -> None:
    assert esc("<script>") == "&lt;script&gt;"
    html = result_html("verify <x>", {"note": "<b>", "ok": True}, passed=True)
    assert "<b>" not in html.replace("<b>verify", "") and "&lt;b&gt;" in html
    from modulelens.format.shape_only import tensor_stats
    from modulelens.interfaces.html import tensor_table

    stats = tensor_stats(torch.tensor([1.0, float("nan"), float("inf"), 3.0]), quantiles=False)
    assert stats == {"numel": 4, "zero_fraction": 0.0, "nonfinite": 2, "min": 1.0, "max": 3.0, "mean": 2.0,
                     "std": 1.0}
    row = {"path": "x", "kind": "tensor", "shape": [4], "dtype": "float32", "device": "cpu", "stats": stats}
    html = tensor_table([row])
    assert FAIL_COLOR in html  # non-finite values highlighted
    bools = {"path": "b", "kind": "tensor", "shape": [2], "dtype": "bool", "device": "cpu",
             "stats": tensor_stats(torch.tensor([True, False]))}
    assert ">0.5</td>" in tensor_table([bools])  # the mean of a bool tensor is its fraction of True
