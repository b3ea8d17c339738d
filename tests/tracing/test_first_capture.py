"""The first capture of a process imports neither torch.compile's machinery nor DTensor's when the
job uses neither (issue 11: ~8 s of ``torch._dynamo`` plus ~4 s of ``torch.distributed.tensor``);
a job that compiles its model after the capture attached is recorded
all the same."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from child_process import PYTHON, subprocess_env

CHILD = textwrap.dedent('''
    import json, sys, tempfile, time
    import torch, modulelens
    from torch import nn
    modulelens.track_init()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as repo:
        with modulelens.capture(model, targets=["0"], repo=repo, name="x") as cap:
            model(torch.randn(2, 8))
        saved = [v.ref for v in cap.saved]
    print(json.dumps({"saved": saved, "seconds": time.perf_counter() - start,
                      "imported": [m for m in ("torch._dynamo", "torch.distributed.tensor") if m in sys.modules]}))
''')


def test_first_capture_imports_no_compiler_or_dtensor(tmp_path: Path) -> None:
    result = subprocess.run([PYTHON, "-c", CHILD], capture_output=True, text=True, env=subprocess_env(),
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["saved"] == ["x/0:v1"]
    assert out["imported"] == []


COMPILED_AFTER = textwrap.dedent('''
    import json, sys, tempfile, warnings
    import torch, modulelens
    from torch import nn
    modulelens.track_init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    out = {}
    with tempfile.TemporaryDirectory() as repo:
        with modulelens.capture(model, targets=["", "0", "2"], repo=repo, name="x",
                                record=modulelens.Recording(max_calls=3)) as cap:
            out["dynamo_at_attach"] = "torch._dynamo" in sys.modules
            compiled = torch.compile(model, backend=sys.argv[1])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for step in range(3):
                    compiled(torch.randn(4, 8)).sum().backward()
        out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        out["calls"] = {v.ref: v.calls for v in cap.wait()}
        out["replayed"] = {ref: modulelens.load(ref, repo=repo).replay().passed for ref in out["calls"]}
    print(json.dumps(out))
''')


def test_a_model_compiled_after_the_capture_attached_is_recorded(tmp_path: Path) -> None:
    """The hooks are put on before torch.compile is imported (no compiler cost for a job that
    compiles nothing); the job's torch.compile(model) then traced them into its graph, and the
    capture of every target failed ("'NoneType' object has no attribute 'key'", with dynamo's
    warnings about tracing them). They run eagerly at graph breaks now: every call recorded."""
    result = subprocess.run([PYTHON, "-c", COMPILED_AFTER, "aot_eager"], capture_output=True, text=True,
                            env=subprocess_env(), timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["dynamo_at_attach"] is False
    assert out["warnings"] == []
    assert out["calls"] == {"x:v1": 3, "x/0:v1": 3, "x/2:v1": 3}
    assert all(out["replayed"].values()), out["replayed"]


DISABLE_FAILS = textwrap.dedent('''
    import json, tempfile
    import torch, modulelens
    from torch import nn

    def broken(*args, **kwargs):
        raise RuntimeError("torch.compiler.disable is broken here")

    torch.compiler.disable = broken
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    with tempfile.TemporaryDirectory() as repo:
        with modulelens.capture(model, targets=["0"], repo=repo, name="x"):
            import torch._dynamo  # the job's import: the post-import hook fails to wrap
            out = torch.compile(model, backend="eager")(torch.randn(4, 8))
    print(json.dumps({"shape": list(out.shape)}))
''')


def test_a_failing_wrap_at_the_compilers_import_leaves_the_import_and_the_job_running(tmp_path: Path) -> None:
    """wrapt passes an exception of a post-import hook on to the import that ran it: the job's
    ``import torch._dynamo`` (its torch.compile) would fail. The hook never raises."""
    result = subprocess.run([PYTHON, "-c", DISABLE_FAILS], capture_output=True, text=True, env=subprocess_env(),
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"shape": [4, 1]}


FULLGRAPH_AFTER = textwrap.dedent('''
    import json, sys, tempfile, warnings
    import torch, modulelens
    from torch import nn
    if sys.argv[1] == "imported":
        import torch._dynamo
    modulelens.track_init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    out = {}
    with tempfile.TemporaryDirectory() as repo:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with modulelens.capture(model, targets=["0", "2"], repo=repo, name="x",
                                    record=modulelens.Recording(max_calls=3)) as cap:
                out["dynamo_at_attach"] = "torch._dynamo" in sys.modules
                model[0](torch.randn(4, 8))  # an eager call of one target, before the compile
                compiled = torch.compile(model, backend="eager", fullgraph=True)
                for step in range(3):
                    compiled(torch.randn(4, 8)).sum().backward()
        out["warnings"] = sorted({str(w.message) for w in caught if issubclass(w.category, modulelens.CaptureWarning)})
        out["calls"] = {v.ref: v.calls for v in cap.wait()}
        out["replayed"] = {ref: modulelens.load(ref, repo=repo).replay().passed for ref in out["calls"]}
    print(json.dumps(out))
''')


@pytest.mark.parametrize("dynamo", ["imported", "not imported"])
def test_a_fullgraph_compile_after_the_capture_attached_leaves_the_job_running(tmp_path: Path, dynamo: str) -> None:
    """A ``torch.compile(fullgraph=True)`` made after the attach (a fullgraph module at attach is
    dropped there) refuses the graph break the hooks run at: the job's first compiled call stopped
    with dynamo's "Skip calling torch.compiler.disable()d function". Now the hooks skip inside such
    a graph, each target says so once, and the calls made eagerly are recorded, whether
    ``torch._dynamo`` was imported before the attach (hooks wrapped at once) or after (at its import)."""
    result = subprocess.run([PYTHON, "-c", FULLGRAPH_AFTER, dynamo], capture_output=True, text=True,
                            env=subprocess_env(), timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["dynamo_at_attach"] is (dynamo == "imported")
    assert out["calls"] == {"x/0:v1": 1}
    assert out["replayed"] == {"x/0:v1": True}
    skipped = [f"modulelens: {target} runs in a torch.compile(fullgraph=True) graph, where its hooks cannot run: its "
               "calls there are not recorded; compile with fullgraph=False while capturing" for target in ("0", "2")]
    assert out["warnings"] == sorted([*skipped, "modulelens: 2 (Linear) ran only in a torch.compile(fullgraph=True) "
                                      "graph, where its hooks cannot run; compile with fullgraph=False while "
                                      "capturing; nothing saved"]), out["warnings"]
