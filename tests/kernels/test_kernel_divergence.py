"""``modulelens kernel verify`` on the CPU names the first op where a failing candidate parts from
the reference: its worker traces the failing sample again, the reference is traced here."""

from __future__ import annotations

from pathlib import Path

import torch
from diverge_models import TinyGPT, tokens

import modulelens
from modulelens.kernels.options import CandidatePolicy, KernelChecks
from modulelens.kernels.verify import verify_kernel

CANDIDATES = Path(__file__).resolve().parent.parent / "support" / "kernel_candidates"


def test_a_failing_kernel_candidate_is_located_to_its_op(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    torch.manual_seed(0)
    model = TinyGPT().eval()
    with modulelens.capture(model, "", repo=repo, name="gpt"):  # no op trace needed: both sides are traced anew
        model(tokens())
    report = verify_kernel("gpt", CANDIDATES / "gpt_mask_off_by_one.py", repo=repo, device="cpu",
                           checks=KernelChecks(random_samples=1),
                           policy=CandidatePolicy(timeout=300, allow_torch_ops=True, allow=("no_kernel",)))
    assert not report.passed
    divergence = report.data["divergence"]
    assert divergence["sample"] == "call 0" and divergence["compared"] == "the kernel candidate against the reference module"
    first = divergence["first"]
    assert (first["reference"]["module"], first["reference"]["op"]) == ("blocks.2.attn", "aten::triu")
    assert first["candidate"]["source"].endswith("in forward") and "kernel.py:" in first["candidate"]["source"]
    assert divergence["last_agreeing"]["module"] == "blocks.2.attn"
    assert "per-dtype kernel tolerances" in divergence["rule"]
    assert "first divergence at blocks.2.attn aten::triu" in str(report)
    stored = repo.reports("gpt:v1", "kernel")[-1]
    assert stored["divergence"]["first"]["reference"]["op"] == "aten::triu"
