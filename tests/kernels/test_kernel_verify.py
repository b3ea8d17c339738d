"""`modulelens kernel verify` on CPU (Triton interpreter): correct kernels pass, wrong ones and cheats fail."""

from __future__ import annotations

import importlib.util
import json
import textwrap
import time
from pathlib import Path

import pytest
from kernel_models import capture_all
from typer.testing import CliRunner

import modulelens
from modulelens.errors import ModulelensError, UsageError
from modulelens.interfaces.cli import app
from modulelens.kernels.export import export_kernelbench
from modulelens.kernels.options import CandidatePolicy, KernelChecks
from modulelens.kernels.static_check import ReferenceInfo, check_source
from modulelens.kernels.verify import read_candidate, verify_kernel

CANDIDATES = Path(__file__).resolve().parent.parent / "support" / "kernel_candidates"
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (pip install 'modulelens[kernels]')")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("kernel-verify-repo"))
    capture_all(path)
    return path


@needs_triton
def test_correct_triton_kernel_function_passes_and_is_stored(repo: str) -> None:
    report = verify_kernel("km/act", CANDIDATES / "scaled_gelu.py", repo=repo, policy=CandidatePolicy(timeout=120))
    d = report.to_dict()
    assert report.passed, report.failures
    assert d["candidate"]["entry"] == "kernel_function" and d["candidate"]["backend"] == "triton"
    kinds = [s["kind"] for s in d["samples"]]
    assert kinds.count("recorded") == 2 and kinds.count("random") == 5
    assert all(s["passed"] and s["triton_launches"] == 1 for s in d["samples"])
    assert d["correctness"] == {"passed": True, "samples": 7, "passed_samples": 7, "recorded_samples": 2,
                                "random_samples": 5, "skipped_samples": 0, "fp32_passes_at_1e-3": True}
    assert d["samples"][2]["randomized"][0]["arg"] == "x"
    assert d["runtime"]["triton_interpret"] is True
    assert d["timing"]["measured"] is False and "TRITON_INTERPRET=1" in d["timing"]["reason"]
    assert d["checks"]["determinism"]["identical"] is True
    stored = modulelens.Repo(repo).reports("km/act", "kernel")
    assert stored and stored[-1]["passed"] is True and stored[-1]["candidate"]["hash"] == d["candidate"]["hash"]
    assert "def kernel_function" in stored[-1]["candidate"]["source"]


@needs_triton
def test_modelnew_with_keyword_only_argument_passes(repo: str) -> None:
    steps: list[str] = []
    report = verify_kernel("km/mlp", CANDIDATES / "linear_relu_modelnew.py", repo=repo, policy=CandidatePolicy(timeout=120),
                           progress=steps.append)
    assert report.passed, report.failures
    # the step that runs is told as it starts (the CLI shows it on a terminal, issue 23)
    assert steps[0] == "static check of the candidate" and steps[-1] == "storing the report"
    assert any(s.startswith("reference process: rebuilding LinearRelu, running 2 recorded call(s) and 5 random")
               for s in steps)
    assert "candidate process: starting" in steps and any("comparing" in s for s in steps)
    d = report.to_dict()
    assert d["candidate"]["entry"] == "ModelNew"
    assert sorted(d["checks"]["weights"]["loaded"]) == ["fc.bias", "fc.weight"]


@needs_triton
def test_subtly_wrong_kernel_fails_naming_the_call_and_error_size(repo: str) -> None:
    report = verify_kernel("km/act", CANDIDATES / "scaled_gelu_tanh.py", repo=repo, policy=CandidatePolicy(timeout=120), store=False)
    assert not report.passed and report.to_dict()["failed_checks"] == ["correctness"]
    first = report.failures[0]
    # judged against the float64 oracle by default: thousands of float32 ULPs where the reference is off by one
    assert first.startswith("call 0 (recorded): output: not within the oracle rule: ")
    assert "ULPs rms against the float64 oracle, over 4x the reference's own" in first and "max abs error 0.000" in first
    sample = report.to_dict()["samples"][0]
    assert 1e-4 < sample["max_abs_error"] < 1e-3 and sample["passes_at_1e-3"] is True and sample["max_ulps"] > 1000
    assert sample["leaves"][0]["rule"] == "oracle" and sample["leaves"][0]["oracle"]["failed"] == ["rms", "max"]
    assert report.to_dict()["correctness"]["fp32_passes_at_1e-3"] is True
    # without the oracle: KernelBench's fixed fp32 tolerance, as before
    fixed = verify_kernel("km/act", CANDIDATES / "scaled_gelu_tanh.py", repo=repo, policy=CandidatePolicy(timeout=120),
                          checks=KernelChecks(oracle=False, random_samples=1), store=False)
    assert not fixed.passed and "elements differ (rtol=0.0001, atol=0.0001)" in fixed.failures[0]
    assert fixed.to_dict()["tolerances"]["float32"]["rule"] == "tolerance"


@needs_triton
def test_cached_output_is_caught_statically_and_by_random_inputs(repo: str, tmp_path: Path) -> None:
    problem = export_kernelbench("km/act", tmp_path / "act", repo=repo)
    candidate = tmp_path / "cached.py"
    candidate.write_text((CANDIDATES / "scaled_gelu_cached.py").read_text().replace("@DATA@", str(problem.directory / "data")))
    d = verify_kernel("km/act", candidate, repo=repo, policy=CandidatePolicy(timeout=120), store=False).to_dict()
    assert not d["passed"]
    assert any(f["rule"] == "cached_output" for f in d["static"]["errors"])
    by_id = {s["sample"]: s for s in d["samples"]}
    assert by_id["call 0"]["passed"] is True  # the cached output is right for the call it came from...
    assert by_id["call 1"]["passed"] is False  # ...and wrong for every other input
    assert all(by_id[f"random {i}"]["passed"] is False for i in range(5))


@needs_triton
def test_input_mutation_is_caught(repo: str) -> None:
    d = verify_kernel("km/act", CANDIDATES / "scaled_gelu_inplace.py", repo=repo,
                      policy=CandidatePolicy(timeout=120), store=False).to_dict()
    assert not d["passed"]
    assert all(s["mutated_inputs"] == ["x"] for s in d["samples"])
    assert "call 0 (recorded): modified its input(s) in place: x" in d["failures"]


@needs_triton
def test_heavy_torch_op_counter_sees_composite_and_direct_ops() -> None:
    import torch

    from modulelens.format.op_watch import OpCounter

    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with OpCounter() as ops:
        torch.nn.functional.linear(x, w)
        torch.ops.aten.mm.default(x, w.t())
        _ = x @ w.t()
        torch.einsum("ij,kj->ik", x, w)
        torch.nn.functional.conv1d(torch.randn(1, 2, 5), torch.randn(3, 2, 2))
        torch.relu(x)
    heavy = ops.heavy()
    assert heavy.get("mm", 0) + heavy.get("addmm", 0) + heavy.get("bmm", 0) >= 4, heavy
    assert any("conv" in name for name in heavy) and "relu" not in heavy
    with OpCounter() as ops:
        torch.nn.functional.dropout(x, 0.5, training=True)
    assert ops.random_ops() and not ops.heavy()


# Candidates that reach PyTorch for the heavy op (the matmul of km/mlp = LinearRelu) by a route the
# name-based static rules cannot see, with a token Triton kernel for the epilogue. Every one must
# fail at run time (aten ops counted in the candidate process), whatever the static check says.
CHEATS = [  # (file, static error rules expected: set() = only the run-time check catches it)
    ("getattr_linear.py", {"dynamic_getattr"}),
    ("matmul_torch_bias_triton.py", set()),
    ("aten_mm.py", set()),
    ("exec_string.py", {"dynamic_code"}),
    ("lambda_in_dict.py", set()),
    ("module_dict.py", {"introspection"}),
    ("importlib_nn.py", {"dynamic_code"}),
]


@needs_triton
@pytest.mark.parametrize(("name", "static_rules"), CHEATS)
def test_cheats_reaching_torch_for_the_heavy_op_fail(repo: str, name: str, static_rules: set[str]) -> None:
    d = verify_kernel("km/mlp", CANDIDATES / "cheats" / name, repo=repo, policy=CandidatePolicy(timeout=120),
                      checks=KernelChecks(max_calls=1, random_samples=0), store=False).to_dict()
    assert not d["passed"]
    assert {f["rule"] for f in d["static"]["errors"]} == static_rules
    assert d["correctness"]["passed"] is True, d["failures"]  # right numbers: only the checks catch it
    assert d["checks"]["torch_heavy_ops"], d["checks"]
    assert any("ran heavy ops through PyTorch (aten." in f for f in d["failures"]), d["failures"]


@needs_triton
def test_mixed_candidate_passes_only_with_allow_torch_ops(repo: str) -> None:
    d = verify_kernel("km/mlp", CANDIDATES / "cheats" / "matmul_torch_bias_triton.py", repo=repo,
                      policy=CandidatePolicy(timeout=120, allow_torch_ops=True),
                      checks=KernelChecks(max_calls=1, random_samples=0), store=False).to_dict()
    assert d["passed"], d["failures"]
    assert d["settings"]["allow_torch_ops"] is True and d["checks"]["torch_heavy_ops"]
    assert any("accepted (allow_torch_ops)" in n for n in d["notes"])


@needs_triton
def test_calling_the_reference_is_caught(repo: str) -> None:
    d = verify_kernel("km/act", CANDIDATES / "scaled_gelu_calls_reference.py", repo=repo, policy=CandidatePolicy(timeout=120),
                      store=False).to_dict()
    assert not d["passed"]
    rules = {f["rule"] for f in d["static"]["errors"]}
    assert rules == {"reference_call"}
    assert "may not import kernel_models" in d["candidate"]["load_error"]  # blocked at run time too


@needs_triton
def test_hanging_candidate_is_killed_by_the_timeout(repo: str) -> None:
    start = time.perf_counter()
    d = verify_kernel("km/act", CANDIDATES / "scaled_gelu_hangs.py", repo=repo,
                      policy=CandidatePolicy(timeout=30, reference_timeout=600), store=False).to_dict()
    assert not d["passed"]
    assert d["runtime"]["candidate_process"]["timed_out"] is True, d["failures"]
    assert any("timed out after 30 s" in f and "call 0" in f for f in d["failures"])
    assert time.perf_counter() - start < d["runtime"]["reference_process"]["seconds"] + 90


@needs_triton
def test_cli_verify_json_and_exit_code(repo: str) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["kernel", "verify", "km/act", "--candidate", str(CANDIDATES / "scaled_gelu_tanh.py"),
                                 "--repo", repo, "--random", "1", "--atol", "1e-3", "--rtol", "1e-3", "--json"])
    payload = json.loads(result.stdout)
    assert result.exit_code == 0, payload  # passes once the tolerance is loosened, and says so
    assert payload["command"] == "kernel verify" and payload["result"]["passed"] is True
    assert payload["result"]["tolerances"]["float32"] == {"rtol": 1e-3, "atol": 1e-3, "exact": False, "rule": "tolerance",
                                                          "oracle_factor": None, "ulps": None}
    missing = runner.invoke(app, ["kernel", "verify", "km/nothing", "--candidate", str(CANDIDATES / "scaled_gelu.py"),
                                  "--repo", repo, "--json"])
    assert missing.exit_code == 2 and json.loads(missing.stdout)["error"]["type"] == "CaptureNotFoundError"


def test_agent_without_kernelagent_prints_the_commands(repo: str, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["kernel", "agent", "km/act", "-o", str(tmp_path / "p"), "--repo", repo, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)["result"]
    assert payload["kernelagent_available"] is False and payload["agent"] is None
    assert any("Fuser.auto_agent --problem" in c and "--test-paths" in c for c in payload["commands"])
    assert (tmp_path / "p" / "problem.py").exists()
    # a second run keeps the first one's folder (its problem, an agent's kernel) unless --force
    (tmp_path / "p" / "kernel.py").write_text("# the kernel an earlier run produced\n")
    again = runner.invoke(app, ["kernel", "agent", "km/act", "-o", str(tmp_path / "p"), "--repo", repo, "--json"])
    assert again.exit_code == 2 and "is not empty (use --force" in json.loads(again.stdout)["error"]["message"]
    assert (tmp_path / "p" / "kernel.py").read_text() == "# the kernel an earlier run produced\n"
    forced = runner.invoke(app, ["kernel", "agent", "km/act", "-o", str(tmp_path / "p"), "--force", "--repo", repo, "--json"])
    assert forced.exit_code == 0, forced.output


@needs_triton
def test_agent_with_kernelagent_verifies_and_stores_its_kernel(repo: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-kernelagent" / "Fuser"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "auto_agent.py").write_text(textwrap.dedent(f"""
        import json, sys
        args = sys.argv[1:]
        assert args[args.index("--problem") + 1].endswith("problem.py")
        assert args[args.index("--test-paths") + 1].endswith("test_modulelens.py")
        print("routing...")
        code = open({str(CANDIDATES / "scaled_gelu.py")!r}).read()
        print(json.dumps({{"route": "kernelagent", "success": True, "details": {{}}, "kernel_code": code}}, indent=2))
    """))
    monkeypatch.syspath_prepend(str(fake.parent))
    before = len(modulelens.Repo(repo).reports("km/act", "kernel"))
    result = CliRunner().invoke(app, ["kernel", "agent", "km/act", "-o", str(tmp_path / "p"), "--repo", repo, "--json"])
    payload = json.loads(result.stdout)["result"]
    assert result.exit_code == 0, payload
    assert payload["agent"]["success"] is True and payload["verify"]["passed"] is True
    assert (tmp_path / "p" / "kernel.py").exists() and (tmp_path / "p" / "agent_result.json").exists()
    assert len(modulelens.Repo(repo).reports("km/act", "kernel")) == before + 1


def test_candidate_from_a_kernelagent_result_json(tmp_path: Path) -> None:
    result = tmp_path / "agent_result.json"
    result.write_text("routing...\n" + json.dumps({"route": "kernelagent", "success": True, "kernel_code": "x = 1\n"}))
    assert read_candidate(result) == ("x = 1\n", f"kernel_code of {result}")
    result.write_text(json.dumps({"route": None, "success": False, "details": {}}))
    with pytest.raises(ModulelensError, match="no kernel_code"):
        read_candidate(result)


@pytest.mark.parametrize(("source", "rule"), [
    ("import time\ntime.perf_counter = lambda: 0.0", "timing_patch"),
    ("import torch as T\nT.cuda.synchronize = lambda *a: None", "timing_patch"),
    ("import torch\nsetattr(torch.cuda.Event, 'elapsed_time', lambda s, e: 1.0)", "timing_patch"),
    ("import torch\ns = torch.cuda.Stream()", "stream_injection"),
    ("from torch.cuda import Stream as S\ns = S()", "stream_injection"),
    ("import torch\nStream = getattr(torch.cuda, 'Stream')\ns = Stream()", "stream_injection"),
    ("import torch\ndef f(x, s):\n    x.record_stream(s)", "stream_injection"),
    ("import threading", "thread_injection"),
    ("from concurrent.futures import ThreadPoolExecutor", "thread_injection"),
    ("def f(x):\n    return x.half()", "precision_downgrade"),
    ("import torch\ndef f(x):\n    return x.to(torch.bfloat16)", "precision_downgrade"),
    ("import triton.language as tl\ndef f(a, b):\n    return tl.dot(a, b, input_precision='tf32')", "precision_downgrade"),
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True", "precision_downgrade"),
    ("import torch\nclass Lazy(torch.Tensor):\n    pass", "lazy_eval"),
    ("import torch\ndef f(x):\n    return torch.Tensor._make_subclass(object, x)", "lazy_eval"),
    ("import sys\nf = sys._getframe(1).f_locals", "introspection"),
    ("import gc", "introspection"),
    ("import __main__\nf = __main__.same_bits", "introspection"),  # the worker's own helpers
    ("g = globals()", "introspection"),
    ("exec('x = 1')", "dynamic_code"),
    ("import torch\ndef f(x, w):\n    return getattr(torch.nn.functional, 'lin' + 'ear')(x, w)", "dynamic_getattr"),
    ("import torch.nn.functional as F\nname = 'linear'\ndef f(x, w):\n    return getattr(F, name)(x, w)",
     "dynamic_getattr"),
    ("import operator\ndef f(m, n):\n    return operator.attrgetter(n)(m)", "dynamic_getattr"),
    ("import os\nos.environ['TRITON_INTERPRET'] = '0'", "env_write"),
    ("import modulelens", "reference_call"),
    ("def f(x):\n    return Model()(x)", "reference_call"),
    ("import torch\n_c = {}\ndef f(x):\n    return _c[x.data_ptr()]", "cached_output"),
    ("import torch\ndef f(p):\n    return torch.load(p)", "cached_output"),
    ("import torch\nimport torch.nn.functional as F\ndef f(x):\n    try:\n        return k(x)\n"
     "    except Exception:\n        return F.gelu(x)", "fallback"),
])
def test_static_check_catches(source: str, rule: str) -> None:
    kernel = "import triton\n@triton.jit\ndef k(x_ptr):\n    pass\ndef kernel_function(x):\n    return x\n"
    report = check_source(kernel + source, ReferenceInfo("kernel_models:ScaledGelu", {"float32"}))
    assert rule in {f.rule for f in report.errors}, report.to_dict()


def test_static_check_builtin_reference_and_clean_kernels() -> None:
    gelu = ReferenceInfo("torch.nn.modules.activation:GELU", {"float32"})
    cheat = ("import torch.nn.functional as F\nimport triton\n@triton.jit\ndef k(p):\n    pass\n"
             "def kernel_function(x):\n    return F.gelu(x)\n")
    assert [f.rule for f in check_source(cheat, gelu).errors] == ["reference_call"]
    assert {f.rule for f in check_source("def kernel_function(x):\n    return x\n", gelu).errors} == {"no_kernel"}
    assert {f.rule for f in check_source("x = 1\n", gelu).errors} == {"entry_point", "no_kernel"}
    for name in ("scaled_gelu.py", "scaled_gelu_tanh.py", "linear_relu_modelnew.py"):
        report = check_source((CANDIDATES / name).read_text(), ReferenceInfo("kernel_models:ScaledGelu", {"float32"}))
        assert report.passed and not report.warnings, (name, report.to_dict())
    half = check_source("def kernel_function(x):\n    return x.half()\n", ReferenceInfo("m:C", {"float16"}))
    assert "precision_downgrade" not in {f.rule for f in half.findings}
    allowed = check_source("import threading\n" + (CANDIDATES / "scaled_gelu.py").read_text(),
                           ReferenceInfo("m:C", {"float32"}), allow=["thread_injection"])
    assert allowed.passed and allowed.warnings[0].rule == "thread_injection"


def test_timing_summary_speedups_geomean_and_review_flag() -> None:
    from modulelens.kernels.verify import _timing
    from modulelens.tools.timing import timing_stats

    stats = timing_stats([1.0, 2.0, 3.0, 4.0], warmup=2)
    assert stats["mean_ms"] == 2.5 and stats["median_ms"] == 2.5 and stats["trials"] == 4 and stats["warmup"] == 2
    assert abs(stats["std_ms"] - 1.2909944) < 1e-6
    ref = timing_stats([2.0] * 5, 10)
    info = {"l2_flush_bytes": 1 << 27, "samples": [
        {"id": "call 0", "shapes": "float32[4]", "reference": {"timing": ref}},
        {"id": "random 0", "shapes": "float32[8]", "reference": {"timing": ref}},
        {"id": "random 1", "shapes": "float32[16]", "reference": {"timing": ref}}]}
    result = {"samples": [{"id": "call 0", "timing": timing_stats([1.0] * 5, 10)},
                          {"id": "random 0", "timing": timing_stats([0.5] * 5, 10)},
                          {"id": "random 1", "timing": timing_stats([0.1] * 5, 10)}]}
    report = {"settings": {"warmup": 10, "trials": 100}, "review_required": False, "review_reasons": [], "notes": [],
              "samples": [{"passed": True}, {"passed": True}, {"passed": False}]}
    _timing(report, info, result)
    timing = report["timing"]
    assert [row["speedup"] for row in timing["samples"]] == [2.0, 4.0, 20.0]
    assert timing["speedup_samples"] == 2 and abs(timing["speedup_geomean"] - 8 ** 0.5) < 1e-9  # passing samples only
    assert report["review_required"] and "above 10x on 1 sample" in report["review_reasons"][0]
    assert timing["trusted"] is True  # steady series, each shape once (the noise rule: test_timing_noise.py)


def test_random_inputs_keep_shapes_dtypes_and_index_structure() -> None:
    import torch

    from modulelens.kernels.worker_reference import _randomize

    notes: list[dict[str, str]] = []
    generator = torch.Generator().manual_seed(0)
    indices = torch.tensor([3, 17, 5, 9, 12, 4])
    offsets = torch.tensor([0, 2, 5])
    mask = torch.tensor([True, False, True, True])
    x = torch.randn(64, 8) * 3 + 1
    new_indices, new_offsets, new_mask, new_x, scale = (
        _randomize(v, generator, name, notes) for v, name in
        [(indices, "input"), (offsets, "offsets"), (mask, "mask"), (x, "x"), (2.0, "scale")])
    assert new_indices.dtype == torch.int64 and new_indices.shape == (6,) and not torch.equal(new_indices, indices)
    assert int(new_indices.min()) >= 3 and int(new_indices.max()) <= 17  # stays a valid index
    assert torch.equal(new_offsets, offsets)  # sorted offsets are structure: kept
    assert new_mask.dtype == torch.bool and new_mask.shape == (4,)
    assert new_x.dtype == torch.float32 and new_x.shape == (64, 8) and not torch.equal(new_x, x)
    assert abs(float(new_x.mean()) - float(x.mean())) < 1.0 and scale == 2.0
    assert [n["arg"] for n in notes] == ["input", "offsets", "mask", "x"]
    assert notes[1]["how"].startswith("kept") and notes[3]["how"].startswith("normal(")


def test_option_groups_refuse_bad_values_when_built(repo: str) -> None:
    with pytest.raises(UsageError, match="max_calls >= 1"):
        KernelChecks(max_calls=0)
    with pytest.raises(UsageError, match="atol must be >= 0"):
        KernelChecks(atol=-1.0)
    with pytest.raises(UsageError, match="timeouts must be > 0"):
        CandidatePolicy(timeout=0)
    assert CandidatePolicy(timeout=30).reference_seconds == 120.0 and CandidatePolicy(timeout=200).reference_seconds == 200.0
    assert KernelChecks(calls=[1, 0]).calls == (1, 0)
    with pytest.raises(UsageError, match="fixed number of trials"):
        verify_kernel("km/act", CANDIDATES / "scaled_gelu.py", repo=repo, timing=modulelens.TimingConfig(iters=None))


def test_cli_defaults_are_the_option_groups_defaults() -> None:
    """The CLI repeats the defaults as literals (importing the groups would import torch at --help)."""
    import inspect

    from modulelens.interfaces.cli.kernel import kernel_verify_cmd
    from modulelens.kernels.options import KERNEL_TIMING

    cli = {name: p.default for name, p in inspect.signature(kernel_verify_cmd).parameters.items()}
    checks, policy = KernelChecks(), CandidatePolicy()
    assert (cli["max_calls"], cli["random"], cli["seed"]) == (checks.max_calls, checks.random_samples, checks.seed)
    assert (cli["timeout"], cli["warmup"], cli["trials"]) == (policy.timeout, KERNEL_TIMING.warmup, KERNEL_TIMING.iters)
    assert (cli["allow_torch_ops"], cli["rtol"], cli["atol"]) == (policy.allow_torch_ops, checks.rtol, checks.atol)
