"""KernelBench's evaluator contract, run on the CPU: how it loads a problem and checks a candidate.

Written from ScalingIntelligence/KernelBench ``src/kernelbench/eval.py`` at commit
423217d9fda91e0c2d67e4a43bf62f96f6d104f1 (read with the ``fetch`` tool; no code copied):

- ``load_original_model_and_inputs``: ``compile`` then ``exec`` of the problem's text into a fresh
  dict (no ``__file__``); ``Model``, ``get_init_inputs``, ``get_inputs`` are read from that dict;
- ``eval_kernel_against_ref``: ``set_seed(seed)``, ``init_inputs = get_init_inputs()``, every tensor
  cast to the precision and moved to the device (``_process_input_tensor``); under ``no_grad``,
  ``set_seed(seed)`` then ``Model(*init_inputs)``; the candidate's text is exec'd into the SAME dict
  (``load_custom_model``), ``set_seed(seed)`` then ``ModelNew(*init_inputs)``; both models
  ``.to(device=device, dtype=precision)``;
- ``run_and_check_correctness``: ``torch.manual_seed(seed)``, one trial seed per trial drawn with
  ``torch.randint(0, 2**32 - 1, (1,))``; per trial ``set_seed(trial_seed)``, ``inputs = get_inputs()``,
  each top-level tensor cast and moved, ``model(*inputs)`` and then ``model_new(*inputs)`` on the
  same list under ``no_grad``; a shape mismatch fails, values must pass ``torch.allclose`` with
  ``atol = rtol = get_tolerance_for_precision(precision)`` (fp32 1e-4, fp16/bf16 1e-2).

Their evaluator cannot run here: it asserts ``torch.cuda.is_available()`` and calls
``torch.cuda.synchronize``, and the package needs network to install. So this follows the same
contract with ``device="cpu"``; the one difference is that tensors are not moved to a GPU (a problem
whose tensors sit inside containers is marked by the exporter, since KernelBench would not move them).

On top of KernelBench's Model-vs-ModelNew check, :func:`evaluate` compares ``Model``'s output in each
trial with the *recorded* output of the call ``get_inputs()`` returned (found by its inputs in the
problem's data), at KernelBench's tolerance: the exported problem must reproduce the real job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCES = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
SEED = 42


@dataclass
class Evaluation:
    """What the contract found for one problem."""

    compiled: bool = False
    correct_trials: int = 0
    trials: int = 0
    reproduced_trials: int = 0
    error: str | None = None
    max_diff_vs_recorded: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def correctness(self) -> bool:
        """KernelBench's verdict: every trial of ModelNew matches Model."""
        return self.compiled and self.trials > 0 and self.correct_trials == self.trials

    @property
    def reproduces_recorded(self) -> bool:
        """Model's output matched the recorded output in every trial."""
        return self.correctness and self.reproduced_trials == self.trials


def _set_seed(seed: int) -> None:
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)  # as KernelBench does; a no-op without CUDA


def _process(value: Any, precision: torch.dtype) -> Any:
    return value.to(dtype=precision).to(device="cpu") if isinstance(value, torch.Tensor) else value


def evaluate(problem_dir: Path, custom_source: str = "ModelNew = Model\n", trials: int = 5,
             precision: str | None = None) -> Evaluation:
    """Run the exported problem in ``problem_dir`` through KernelBench's contract with
    ``custom_source`` as the candidate, and check Model against the recorded outputs."""
    manifest = json.loads((problem_dir / "manifest.json").read_text())
    dtype = PRECISIONS[precision or manifest.get("kernelbench_precision") or "fp32"]
    tolerance = TOLERANCES[dtype]
    result = Evaluation(trials=trials)
    context: dict[str, Any] = {}
    try:
        exec(compile((problem_dir / "problem.py").read_text(), "<string>", "exec"), context)
        _set_seed(SEED)
        init_inputs = [_process(x, dtype) for x in context["get_init_inputs"]()]
        with torch.no_grad():
            _set_seed(SEED)
            original = context["Model"](*init_inputs)
        exec(compile(custom_source, "<string>", "exec"), context)
        with torch.no_grad():
            _set_seed(SEED)
            custom = context["ModelNew"](*init_inputs)
            original = original.to(device="cpu", dtype=dtype)
            custom = custom.to(device="cpu", dtype=dtype)
        result.compiled = True
        _trials(context["get_inputs"], original, custom, dtype, tolerance, problem_dir, manifest, result)
    except Exception as error:  # a problem that does not load or run is a finding, not a crash
        result.error = f"{type(error).__name__}: {error}"[:300]
    return result


def _trials(get_inputs: Any, original: torch.nn.Module, custom: torch.nn.Module, dtype: torch.dtype, tolerance: float,
            problem_dir: Path, manifest: dict[str, Any], result: Evaluation) -> None:
    data = problem_dir / "data"
    recorded_inputs = load_file(str(data / "inputs.safetensors"))
    recorded_outputs = load_file(str(data / "outputs.safetensors"))
    torch.manual_seed(SEED)
    seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(result.trials)]
    with torch.no_grad():
        for seed in seeds:
            _set_seed(seed)
            inputs = [_process(x, dtype) for x in get_inputs()]
            _set_seed(seed)  # KernelBench seeds before each model's .to(), not between the two forwards
            output = original(*inputs)
            output_new = custom(*inputs)
            if not isinstance(output, torch.Tensor) or output.shape != output_new.shape:
                result.notes.append("output is not one tensor of the same shape")
                continue
            if torch.allclose(output, output_new, atol=tolerance, rtol=tolerance):
                result.correct_trials += 1
            want = _recorded_output(inputs, manifest, recorded_inputs, recorded_outputs, dtype)
            if want is None:
                result.notes.append("the trial's inputs match no exported call")
            elif want.shape == output.shape and torch.allclose(output, want, atol=tolerance, rtol=tolerance):
                result.reproduced_trials += 1
            if want is not None and want.shape == output.shape:
                diff = float((output.double() - want.double()).abs().nan_to_num(0.0).max()) if output.numel() else 0.0
                result.max_diff_vs_recorded = max(result.max_diff_vs_recorded, diff)


def _recorded_output(inputs: list[Any], manifest: dict[str, Any], recorded_inputs: dict[str, torch.Tensor],
                     recorded_outputs: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor | None:
    """The recorded output (cast like KernelBench casts the models) of the exported call whose
    top-level tensor inputs are the trial's."""
    for call in manifest["calls"]:
        arguments = call["arguments"]
        if len(arguments) != len(inputs):
            continue
        same = all(not isinstance(x, torch.Tensor) or (a.get("kind") == "tensor" and torch.equal(
            x, _process(recorded_inputs[a["key"]], dtype))) for a, x in zip(arguments, inputs, strict=True))
        tensor_leaves = [leaf for leaf in call["outputs"] if leaf["kind"] == "tensor"]
        if same and len(tensor_leaves) == 1:
            return recorded_outputs[tensor_leaves[0]["key"]].to(dtype)
    return None
