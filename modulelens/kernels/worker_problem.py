"""Self-check process of ``modulelens export --format kernelbench`` (internal; ``python -P .../worker_problem.py SPEC``).

``problem.py`` is generated from a capture, and its inlined class source may be code a capture
carried (with the user's trust), so the exporter never runs it in its own process: this script runs
it in a fresh process of its own process group, killed after a timeout (:mod:`.process`, as the
kernel verifier's workers), from a scratch folder, without ``$MODULELENS_REPO``.

It loads the file the way KernelBench does (``exec`` of its text, no ``__file__``), seeds torch,
builds ``Model(*get_init_inputs())``, runs every exported call (``_ML_CALLS``) under ``no_grad`` and
writes the outputs (``outputs.safetensors`` + ``result.json``); the exporter compares them with the
recorded outputs. Like the candidate worker it imports nothing from modulelens: its one helper
(:mod:`.exchange`, torch only) is loaded by file path.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch


def _load_helper(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_exchange = _load_helper("_modulelens_kernel_exchange", Path(__file__).resolve().parent / "exchange.py")


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Exec the problem, run its calls, save their outputs; ``error`` says where it stopped."""
    out = Path(spec["out_dir"])
    result: dict[str, Any] = {"calls": [], "phase": "exec"}
    tensors: dict[str, torch.Tensor] = {}
    try:
        namespace: dict[str, Any] = {"__name__": "modulelens_problem_check"}
        exec(compile(Path(spec["problem"]).read_text(), "<string>", "exec"), namespace)
        result["phase"] = "Model(*get_init_inputs())"
        torch.manual_seed(0)
        with torch.no_grad():
            model = namespace["Model"](*namespace["get_init_inputs"]())
            inputs = namespace["_ml_read_safetensors"](Path(namespace["DATA_DIR"]) / "inputs.safetensors")
            for i, build in enumerate(namespace["_ML_CALLS"]):
                result["phase"] = f"call {i}"
                result["calls"].append(_exchange.flatten_output(model(*build(inputs)), f"call{i}", tensors))
        result["phase"] = "done"
    except Exception as error:  # reported in the manifest; the written files are still useful to read
        result["error"] = _exchange.error_text(error)
    _exchange.save_tensors(out / "outputs.safetensors", tensors)
    _exchange.write_json(out / "result.json", result)
    return result


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))
