"""The kernel workers' by-path helpers import nothing from modulelens (issue 24).

``kernels/worker_candidate.py`` and ``kernels/worker_problem.py`` run as plain scripts and load their
torch-only helpers by file path (``exchange.py``, ``format/op_watch.py``, ``tools/timing.py``, and for the op
trace of a failing sample ``format/op_trace.py`` and ``format/shape_only.py``): importing the
modulelens package there would hand a kernel candidate the reference and the recorded data. No
import check sees a by-path load, so this test is that dependency's check: each helper, loaded the
way the workers load it with every ``modulelens`` import refused, works and imports nothing from
modulelens; and the workers name exactly these helpers.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import modulelens

PACKAGE = Path(modulelens.__file__).resolve().parent
WORKERS = [PACKAGE / "kernels" / "worker_candidate.py", PACKAGE / "kernels" / "worker_problem.py"]
HELPERS = {PACKAGE / "kernels" / "exchange.py", PACKAGE / "format" / "op_watch.py", PACKAGE / "tools" / "timing.py",
           PACKAGE / "format" / "shape_only.py", PACKAGE / "format" / "op_trace.py"}

PROBE = r"""
import importlib.abc, importlib.util, json, sys
from pathlib import Path

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "modulelens" or fullname.startswith("modulelens."):
            raise ImportError("refused: " + fullname)

sys.meta_path.insert(0, Refuse())
loaded = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("_helper_" + Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    loaded[Path(path).stem] = module
timing = loaded.get("timing")
if timing is not None:  # the functions the workers call run without modulelens too
    stats = timing.timing_stats([1.0, 2.0, 3.0, 4.0], warmup=1)
    assert stats["median_ms"] == 2.5, stats
    assert timing.compare_timings(stats, stats)["speedup"] == 1.0
    import torch
    ref, cand = timing.time_pair(lambda: None, lambda: None, torch.device("cpu"), timing.TimingConfig(warmup=1, iters=3))
    assert ref.iterations == cand.iterations == 3
op_trace, shape_only = loaded.get("op_trace"), loaded.get("shape_only")
if op_trace is not None:  # the candidate worker's trace of a failing sample, recorded without modulelens
    import torch
    linear = torch.nn.Linear(2, 2)
    recorder = op_trace.OpRecorder(linear, stats=shape_only.tensor_stats)
    recorder.start()
    try:
        out = linear(torch.ones(1, 2))
    finally:
        trace = recorder.stop(out)
    assert recorder.error is None and trace.ops[-1].op == "aten::addmm", [o.op for o in trace.ops]
    assert trace.to_json(lambda tensor, path: "v0")["format"] == "modulelens.op-trace"
print(json.dumps(sorted(n for n in sys.modules if n == "modulelens" or n.startswith("modulelens."))))
"""


def _by_path_loads(worker: Path) -> set[Path]:
    """The files a worker loads with ``_load_helper(name, path)`` (by reading its AST)."""
    tree = ast.parse(worker.read_text())
    here = worker.parent
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_load_helper":
            path = ast.unparse(node.args[1])
            resolved = eval(path, {"_HERE": here, "Path": Path, "__file__": str(worker)})
            found.add(Path(resolved).resolve())
    return found


def test_the_workers_load_exactly_these_helpers_by_path() -> None:
    loaded = set().union(*(_by_path_loads(w) for w in WORKERS))
    assert loaded == HELPERS


def test_helpers_import_no_modulelens_at_module_level() -> None:
    for helper in HELPERS:
        for node in ast.parse(helper.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "modulelens" or n.startswith("modulelens.") for n in names), (helper, names)


def test_helpers_load_and_work_with_modulelens_refused() -> None:
    run = subprocess.run([sys.executable, "-P", "-c", PROBE, *map(str, sorted(HELPERS))], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def test_the_candidate_worker_starts_without_modulelens() -> None:
    """The worker's module-level code (its helper loads) runs with modulelens refused."""
    code = PROBE.split("loaded = {}")[0] + (
        "import runpy\nrunpy.run_path(sys.argv[1], run_name='not_main')\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith('modulelens'))))\n")
    for worker in WORKERS:
        run = subprocess.run([sys.executable, "-P", "-c", code, str(worker)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout.strip().splitlines()[-1]) == [], worker
