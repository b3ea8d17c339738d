"""The first-divergence locator (modulelens/restore/divergence.py) through the tools that report it:
a bug planted at one op of one block is named by module path and op by ``verify``, the pytest helper,
``replay`` (in a fresh process, against the recorded job's trace), the CLI, ``--json`` and the UI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from child_process import SUPPORT_DIR, subprocess_env
from diverge_models import (
    FusedBlockGPT,
    MaskOffByOneGPT,
    SoftmaxHalfGPT,
    TinyGPT,
    WrongFusedGPT,
    tokens,
)
from starlette.testclient import TestClient
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.server import UiSettings, create_app
from modulelens.restore.divergence import DivergenceRule, locate, trace_call
from modulelens.testing import MatchError, assert_matches

MODELS = SUPPORT_DIR / "diverge_models.py"
SOFTMAX_LINE = "weights = torch.softmax(scores, dim=-1)"


def _line(source: str | None) -> str:
    """The text of a trace's source line (``/path/file.py:LINE in function``)."""
    assert source is not None
    path, _, line = source.rpartition(" in ")[0].rpartition(":")
    return Path(path).read_text().splitlines()[int(line) - 1].strip()


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> modulelens.Capture:
    """TinyGPT recorded with its op trace (eval mode: the planted bugs are the only differences)."""
    repo = modulelens.Repo(tmp_path_factory.mktemp("diverge-repo"))
    torch.manual_seed(0)
    model = TinyGPT().eval()
    with modulelens.capture(model, "", repo=repo, name="gpt", record=modulelens.Recording(op_trace=True)):
        model(tokens())
    return modulelens.load("gpt", repo=repo)


def test_verify_names_a_softmax_computed_in_another_dtype(gpt: modulelens.Capture) -> None:
    report = modulelens.verify(gpt, SoftmaxHalfGPT, timing=None, store=False)
    assert not report.passed
    divergence = report.calls[0].divergence
    assert divergence is not None and divergence.found
    first = divergence.first
    assert first is not None and (first.reference.module, first.reference.op) == ("blocks.2.attn", "aten::_softmax")
    assert _line(first.reference.source) == SOFTMAX_LINE  # the reference's line; the candidate's is its own
    assert "scores.half()" in _line(first.candidate.source if first.candidate else None)
    assert first.dtype == "float32" and first.candidate_dtype == "float16" and first.max_ulps is not None
    assert first.max_ulps > 1000  # float16 rounding, counted in float32 ULPs
    assert divergence.last_agreeing is not None
    assert (divergence.last_agreeing.module, divergence.last_agreeing.op) == ("blocks.2.attn", "aten::masked_fill.Scalar")
    assert any("first divergence at blocks.2.attn aten::_softmax" in line for line in report.failures)
    assert report.to_dict()["calls"][0]["divergence"]["first"]["reference"]["op"] == "aten::_softmax"


def test_verify_names_a_causal_mask_one_diagonal_off(gpt: modulelens.Capture) -> None:
    report = modulelens.verify(gpt, MaskOffByOneGPT, timing=None, store=False)
    first = report.calls[0].divergence.first if report.calls[0].divergence else None
    assert first is not None and (first.reference.module, first.reference.op) == ("blocks.2.attn", "aten::triu")
    assert first.dtype == "bool" and first.mismatched == 11 and first.numel == 144  # one more visible token per row


def test_the_pytest_helper_says_where(gpt: modulelens.Capture) -> None:
    with pytest.raises(MatchError, match=r"first divergence at blocks\.2\.attn aten::_softmax at diverge_models\.py"):
        assert_matches(SoftmaxHalfGPT, gpt)


def test_a_correct_fused_rewrite_passes_and_a_wrong_one_is_compared_at_its_fused_boundary(
        gpt: modulelens.Capture) -> None:
    assert modulelens.verify(gpt, FusedBlockGPT, timing=None, store=False).passed
    report = modulelens.verify(gpt, WrongFusedGPT, timing=None, store=False)
    divergence = report.calls[0].divergence
    assert divergence is not None and divergence.first is not None
    assert divergence.first.reference.module == "blocks.2.mlp" and divergence.first.reference.index == -1
    assert "compared at its boundary" in divergence.summary()
    region = next(r for r in divergence.fused if r["region"] == "blocks.2.mlp")
    assert region["modules"] == ["blocks.2.mlp.up", "blocks.2.mlp.act", "blocks.2.mlp.down"]
    assert divergence.last_agreeing is not None and divergence.last_agreeing.module.startswith("blocks.2.mlp")


class _Branches(torch.nn.Module):
    """``sigmoid(f(x)) * tanh(g(x))``; the rewrite computes ``g`` first, skips a no-op, copies a value
    it never needed, and (``bug``) shifts ``tanh``'s result."""

    def __init__(self, rewrite: bool = False, bug: bool = False) -> None:
        super().__init__()
        self.f, self.g = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.rewrite, self.bug = rewrite, bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.rewrite:
            a = torch.sigmoid(self.f(x)) * 1.0
            b = torch.tanh(self.g(x))
            return a * b
        b = torch.tanh(self.g(x))
        if self.bug:
            b = b + 1e-3
        a = torch.sigmoid(self.f(x))
        a.clone()
        return a * b


def test_alignment_survives_reordered_skipped_and_inserted_ops() -> None:
    torch.manual_seed(1)
    reference = _Branches()
    x = torch.randn(4, 8)
    _, expected, _ = trace_call(reference, lambda: reference(x))
    for bug in (False, True):
        rewrite = _Branches(rewrite=True, bug=bug)
        rewrite.load_state_dict(reference.state_dict())
        _, actual, _ = trace_call(rewrite, lambda: rewrite(x))  # noqa: B023 - called at once
        divergence = locate(expected, actual, DivergenceRule(), compared="test")
        if not bug:
            assert not divergence.found and divergence.first_difference is None  # the same values, in another order
            continue
        assert divergence.first is not None and divergence.first.reference.op == "aten::mul.Tensor"
        assert divergence.first.reference.index == len(expected.ops) - 1  # a * b: the shift itself has no counterpart
        assert divergence.last_agreeing is not None and divergence.last_agreeing.op == "aten::tanh"


def _planted_source(tmp_path: Path) -> Path:
    """A copy of the test model as the job's own file (``planted_gpt``), importable from ``tmp_path/src``."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(MODELS, src / "planted_gpt.py")
    return src


def _record_from_file(src: Path, repo: Path) -> None:
    script = ("import torch, modulelens, planted_gpt\nmodulelens.track_init()\ntorch.manual_seed(0)\n"
              "model = planted_gpt.TinyGPT().eval()\n"
              f"with modulelens.capture(model, '', repo={str(repo)!r}, name='job', "
              "record=modulelens.Recording(op_trace=True)):\n    model(planted_gpt.tokens())\n")
    done = subprocess.run([sys.executable, "-c", script], env=subprocess_env(PYTHONPATH=str(src)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("edit", "op"), [
    ((SOFTMAX_LINE, "weights = torch.softmax(scores.half() if self.block_index == 2 else scores, dim=-1).float()"),
     "aten::_softmax"),
    ("mask = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(diagonal)",
     "aten::triu"),
], ids=["softmax-dtype", "mask-off-by-one"])
def test_a_replay_in_a_fresh_process_names_the_first_op_that_differs_from_the_job(
        tmp_path: Path, edit: Any, op: str) -> None:
    src, repo = _planted_source(tmp_path), tmp_path / "repo"
    _record_from_file(src, repo)
    code = (src / "planted_gpt.py").read_text()
    if op == "aten::triu":
        edit = (edit, edit.replace("triu(diagonal)", "triu(diagonal + (self.block_index == 2))"))
    assert edit[0] in code
    (src / "planted_gpt.py").write_text(code.replace(edit[0], edit[1]))  # the job's code, edited since
    done = subprocess.run([sys.executable, "-m", "modulelens", "replay", "job", "--repo", str(repo), "--json"],
                          env=subprocess_env(PYTHONPATH=str(src)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)["result"]
    divergence = result["calls"][0]["divergence"]
    assert divergence["compared"] == "this replay against the recorded job's trace" and divergence["rule"] == "bit-exact"
    first = divergence["first"]["reference"]
    assert (first["module"], first["op"]) == ("blocks.2.attn", op)
    assert first["source"].startswith(str(src / "planted_gpt.py"))  # the line in the job's file
    assert divergence["last_agreeing"]["module"] == "blocks.2.attn"
    # and the text output says the same in one line
    text = subprocess.run([sys.executable, "-m", "modulelens", "replay", "job", "--repo", str(repo)],
                          env=subprocess_env(PYTHONPATH=str(src), COLUMNS="200"), capture_output=True, text=True,
                          timeout=300)
    assert f"first divergence at blocks.2.attn {op} at planted_gpt.py" in " ".join(text.stdout.split())


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory) -> modulelens.Capture:
    """TinyGPT recorded with its op trace but no values kept (fingerprints and statistics only)."""
    repo = modulelens.Repo(tmp_path_factory.mktemp("lean-repo"))
    torch.manual_seed(0)
    model = TinyGPT().eval()
    with modulelens.capture(model, "", repo=repo, name="lean",
                            record=modulelens.Recording(op_trace=True, op_trace_values=0)):
        model(tokens())
    return modulelens.load("lean", repo=repo)


def test_without_kept_values_the_fingerprints_still_name_the_op(lean: modulelens.Capture) -> None:
    report = lean.replay(module=_rewrite(lean, SoftmaxHalfGPT))
    first = report.calls[0].divergence.first if report.calls[0].divergence else None
    assert first is not None and (first.reference.module, first.reference.op) == ("blocks.2.attn", "aten::_softmax")
    assert first.measured == "fingerprint" and "the bits differ" in first.message


def test_without_kept_values_a_tolerance_is_judged_from_the_statistics(lean: modulelens.Capture) -> None:
    report = lean.replay(module=_rewrite(lean, MaskOffByOneGPT), rtol=1e-4, atol=1e-5)
    divergence = report.calls[0].divergence
    assert divergence is not None and divergence.rule == "rtol=0.0001, atol=1e-05, normwise"
    # the mask's bits differ but a bool tensor's statistics cannot say by how much; the masked scores'
    # count of -inf can: one fewer masked position per row
    assert [(d.reference.op, d.verdict) for d in divergence.unmeasured] == [("aten::triu", "unknown")]
    first = divergence.first
    assert first is not None and (first.reference.module, first.reference.op) == ("blocks.2.attn", "aten::masked_fill.Scalar")
    assert first.measured == "statistics" and "non-finite values instead of" in first.message


def _rewrite(capture: modulelens.Capture, cls: type[TinyGPT]) -> TinyGPT:
    """A planted-bug rewrite of the recorded model, with the capture's weights."""
    rewrite = cls().eval()
    rewrite.load_state_dict(capture.state_dict())
    return rewrite


def test_a_capture_without_a_trace_says_how_to_get_one(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    model = TinyGPT().eval()
    with modulelens.capture(model, "", repo=repo, name="plain"):
        model(tokens())
    plain = modulelens.load("plain", repo=repo)
    report = plain.replay(module=_rewrite(plain, SoftmaxHalfGPT))
    assert report.status == "FAIL" and report.calls[0].divergence is None
    assert any("Recording(op_trace=True)" in note and "--op-trace" in note for note in report.notes)
    result = CliRunner().invoke(app, ["diverge", "plain", "--repo", str(repo.root), "--json"])
    assert result.exit_code == 2 and "holds no op trace" in json.loads(result.stdout)["error"]["message"]


def test_the_diverge_command_in_the_cli_json_and_the_ui(gpt: modulelens.Capture, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(SUPPORT_DIR))
    repo = str(gpt.repo.root)
    runner = CliRunner()
    passed = runner.invoke(app, ["diverge", "gpt", "--repo", repo, "--json", "--no-store"])
    assert passed.exit_code == 0, passed.stdout
    assert json.loads(passed.stdout)["result"]["divergence"] is None  # the replay matches the job: nothing to name
    failed = runner.invoke(app, ["diverge", "gpt", "--repo", repo, "-c", f"{MODELS}:SoftmaxHalfGPT", "--json"])
    assert failed.exit_code == 1, failed.stdout
    result = json.loads(failed.stdout)["result"]
    assert result["compared"] == "the candidate against the rebuilt reference" and result["passed"] is False
    assert result["divergence"]["first"]["reference"]["op"] == "aten::_softmax" and result["report_path"]
    text = runner.invoke(app, ["diverge", "gpt", "--repo", repo, "-c", f"{MODELS}:MaskOffByOneGPT", "--call", "0"],
                         env={"COLUMNS": "200"})
    assert text.exit_code == 1 and "first divergence at blocks.2.attn aten::triu" in " ".join(text.stdout.split())
    bad = runner.invoke(app, ["diverge", "gpt", "--repo", repo, "--call", "7", "--json"])
    assert bad.exit_code == 2 and "has 1 recorded call" in json.loads(bad.stdout)["error"]["message"]
    # the UI's report page shows where, from the stored diverge report
    web = TestClient(create_app(RepoView(gpt.repo, scan_jobs=False), UiSettings()), base_url="http://127.0.0.1:8765")
    page = web.get(f"/capture/{gpt.ref}/reports").text
    assert "first divergence" in page and "blocks.2.attn" in page and "aten::triu" in page and "aten::_softmax" in page
    capture_page = web.get(f"/capture/{gpt.ref}").text  # the counts; the ops are on the call's page
    assert "op trace: 218 ops in" in capture_page and f'href="/capture/{gpt.ref}/call/0#op-trace"' in capture_page
    call_page = web.get(f"/capture/{gpt.ref}/call/0").text
    assert "op trace: 218 ops in" in call_page and "aten::native_layer_norm" in call_page


def test_replay_json_and_show_ops(gpt: modulelens.Capture) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["show", "gpt", "--repo", str(gpt.repo.root), "--ops", "--json"])
    assert shown.exit_code == 0, shown.stdout
    call = json.loads(shown.stdout)["result"]["calls"][0]
    assert call["op_trace"]["ops"] == len(call["ops"]) == 218
    softmax = next(op for op in call["ops"] if op["op"] == "aten::_softmax")
    assert softmax["module"] == "blocks.0.attn" and softmax["outputs"][0]["dtype"] == "float32"
    assert softmax["outputs"][0]["fingerprint"].startswith("xxh3_128:") and softmax["outputs"][0]["kept"] is True
    text = runner.invoke(app, ["show", "gpt", "--repo", str(gpt.repo.root)], env={"COLUMNS": "200"})
    assert "op trace of call 0: 218 ops in" in text.stdout and "show --ops lists them" in text.stdout
    replayed = runner.invoke(app, ["replay", "gpt", "--repo", str(gpt.repo.root), "--json"])
    assert json.loads(replayed.stdout)["result"]["calls"][0]["divergence"] is None


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_mcp_tool(gpt: modulelens.Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    mcp = pytest.importorskip("mcp")
    from modulelens.interfaces.mcp_server import build_server

    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])  # the candidate's child process imports the models
    async with mcp.Client(build_server(str(gpt.repo.root)), raise_exceptions=True) as client:
        replayed = await client.call_tool("locate_divergence", {"ref": "gpt"})  # no candidate: in this process
        assert not replayed.is_error and replayed.structured_content["passed"] is True
        located = await client.call_tool("locate_divergence", {"ref": "gpt", "candidate": f"{MODELS}:MaskOffByOneGPT"})
        assert not located.is_error, located.content
        first = located.structured_content["divergence"]["first"]["reference"]
        assert (first["module"], first["op"]) == ("blocks.2.attn", "aten::triu")


def _with_trace_document(gpt: modulelens.Capture, change: Any, name: str) -> str:
    """A copy of ``gpt`` saved as ``name`` whose op trace document was changed by ``change`` (its
    payload hashed and stored as any other: the trace is hostile, not corrupt on disk)."""
    repo = gpt.repo
    meta = json.loads(json.dumps(gpt.metadata))
    meta.pop("packs", None)
    meta.pop("provenance", None)
    payloads: dict[str, Any] = {}
    for tid, entry in meta["tensors"].items():
        entry.pop("pack", None)
        if "payload" in entry:
            payloads[tid] = memoryview(gpt.fresh_tensor(tid).contiguous().view(torch.uint8).numpy().tobytes())
            entry["payload"] = None
    text_id = meta["calls"][0]["op_trace"]["text_id"]
    document = json.loads(bytes(payloads[text_id]).decode())
    change(document)
    raw = json.dumps(document).encode()
    payloads[text_id] = memoryview(raw)
    meta["tensors"][text_id].update(shape=[len(raw)], stride=[1], nbytes=len(raw))
    return repo.save_version(name, meta, payloads).ref


def test_a_hostile_trace_is_refused_by_each_reader_and_the_replay_still_reports(gpt: modulelens.Capture) -> None:
    ref = _with_trace_document(gpt, lambda d: d["ops"][5].update(module=10**6), "hostile")
    capture = modulelens.load(ref, repo=gpt.repo)
    with pytest.raises(modulelens.CorruptCaptureError, match=r"calls\[0\]\.op_trace: ops\[5\]\.module"):
        _ = capture.calls[0].op_trace
    report = capture.replay(module=_rewrite(capture, SoftmaxHalfGPT))
    assert report.status == "FAIL" and report.calls[0].divergence is None
    assert any("op trace of call 0 cannot be read" in note for note in report.notes)
    shown = CliRunner().invoke(app, ["show", ref, "--repo", str(gpt.repo.root), "--ops", "--json"])
    assert shown.exit_code == 3 and json.loads(shown.stdout)["error"]["type"] == "CorruptCaptureError"
    web = TestClient(create_app(RepoView(gpt.repo, scan_jobs=False), UiSettings()), base_url="http://127.0.0.1:8765")
    assert web.get(f"/capture/{ref}").status_code == 200
    page = web.get(f"/capture/{ref}/call/0")  # where the ops are read and listed
    assert page.status_code == 200 and "the op trace cannot be read" in page.text

