"""Export a capture as a KernelBench / KernelAgent problem folder (``modulelens export --format kernelbench``).

The folder (see docs/kernels.md)::

    problem.py            class Model(nn.Module), get_inputs(), get_init_inputs(), get_benchmark_config()
    test_modulelens.py    a test for KernelAgent's --test-paths: kernel_function vs the recorded outputs
    manifest.json         capture ref/version/id, payload hashes, argument shapes/dtypes, tolerances,
                          kernelbench_compatible (+ reasons), the kernel_function calling convention
    data/weights.safetensors, data/inputs.safetensors, data/outputs.safetensors (+ data/init.safetensors)

``problem.py`` is self-contained: it inlines the module's source (:mod:`.inline`), reads the REAL
captured weights and inputs with a few-line safetensors reader from ``data/`` next to it (an
absolute path when it is exec'd from its text with no ``__file__``, as KernelBench loads it;
``$MODULELENS_PROBLEM_DATA`` overrides both).

:func:`export_kernelbench` validates and hands off to one private step per job: choose and bind the
calls (:mod:`.problems`), write the model's source (:mod:`.inline`, :mod:`.render`), collect the
data, render the two files (:mod:`.template`), write everything, and self-check.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from safetensors.torch import save_file

from modulelens.errors import KernelError, RestoreError, UnsupportedValueError, UsageError
from modulelens.format.op_watch import OpCounter
from modulelens.format.tensors import dtype_name, hash_bytes
from modulelens.format.values import is_state_object, state_attributes
from modulelens.kernels.exchange import load_tensors, read_json
from modulelens.kernels.inline import ClassSource, inlined_class_source
from modulelens.kernels.problems import (
    MAX_CALLS,
    CallBinding,
    bind_calls,
    check_recorded,
    construction_record,
    select_calls,
)
from modulelens.kernels.process import run_isolated, worker_env
from modulelens.kernels.render import HELPERS, SourceRenderer, comment_text, is_identifier, keyword_arguments, literal
from modulelens.kernels.template import DATA_ENV, PROBLEM, READER, TEST, fill
from modulelens.repo import Repo
from modulelens.repo.layout import CAPTURE_FILE
from modulelens.restore.compare import compare, tolerance_table
from modulelens.restore.loader import Capture, load
from modulelens.restore.replay import call_context
from modulelens.restore.source import built_from_stored_source
from modulelens.tools.working_copy import working_module

SCHEMA = "modulelens.kernelbench-problem/1"
TEST_FILE = "test_modulelens.py"
_KB_PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
MODES = ("recorded", "eval", "train")
CHECK_TIMEOUT = 300.0  # seconds for the self-check process (imports torch and the module's packages)
# run by path as a plain script (python -P), like the kernel verifier's candidate worker
_CHECK_WORKER = Path(__file__).absolute().with_name("worker_problem.py")


@dataclass
class _ModelSource:
    """How problem.py builds the module: its source, and the constructor call written as Python."""

    source: ClassSource
    renderer: SourceRenderer
    init_args: list[str]
    init_kwargs: list[str]
    plain_init: bool


@dataclass
class _Data:
    """The tensors written to data/ and what the manifest and the test say about them."""

    call_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    call_exprs: list[str] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    weight_entries: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    expected: list[list[dict[str, Any]]] = field(default_factory=list)
    call_entries: list[dict[str, Any]] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)


def export_kernelbench(
    ref: str | Capture,
    out_dir: str | os.PathLike[str],
    *,
    repo: Repo | str | os.PathLike[str] | None = None,
    calls: Sequence[int] | None = None,
    max_calls: int = MAX_CALLS,
    inline: bool = True,
    overwrite: bool = False,
    check: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    mode: str = "recorded",
    progress: Callable[[str], None] | None = None,
) -> ExportResult:
    """Write a KernelBench/KernelAgent problem folder for capture ``ref`` into ``out_dir``.

    Args:
        ref: a capture ref (``"ranker/top_mlp:v3"``) or a loaded :class:`Capture`.
        out_dir: the folder to write (created; must be empty unless ``overwrite``).
        repo: the repository (default: ``$MODULELENS_REPO`` or the default path).
        calls: recorded call positions to export (default: all, up to ``max_calls`` that share the
            first call's weights and training flag).
        max_calls: the most calls exported.
        inline: ``False`` imports the class by path instead of inlining its source.
        overwrite: replace the problem files of a non-empty ``out_dir``.
        check: exec the written ``problem.py`` as KernelBench does and record in the manifest
            whether its ``Model`` reproduces the recorded outputs.
        rtol: overrides the per-dtype relative tolerance written into the manifest and the test.
        atol: overrides the per-dtype absolute tolerance.
        mode: ``"recorded"`` (the calls' own training flag), ``"eval"`` or ``"train"``: the mode
            ``Model`` is put in.
        progress: called with a one-line description of each step as it starts (the CLI shows it
            on a terminal).

    Returns:
        An :class:`ExportResult` (the folder and the manifest).

    Raises:
        ModulelensError: bad options, a non-empty folder, unusable calls.
        RestoreError: no constructor record, or the class cannot be resolved.
        UnsupportedValueError: a recorded value cannot be written as Python.
        UsageError: an unknown ``mode``.

    Example::

        result = export_kernelbench("ranker/top_mlp:v3", "problems/top_mlp")
        print(result.manifest["kernelbench_compatible"], result.problem)
    """
    if mode not in MODES:
        raise UsageError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    say = progress or (lambda step: None)
    directory = Path(out_dir).expanduser().absolute()
    check_problem_folder(directory, overwrite=overwrite)  # before loading: a refusal costs no load
    capture, store = _open(ref, repo)
    _prepare_directory(directory, overwrite)
    say(f"reading the source of {capture.module_class.rpartition(':')[2]} and the recorded calls")
    left_out: list[dict[str, Any]] = []
    positions = select_calls(capture, calls, max_calls, same_state=True, left_out=left_out)
    binding = bind_calls(capture, positions)
    model = _model_source(capture, inline, binding)
    data = _collect_data(capture, positions, binding, model.renderer)
    recorded_training = capture.calls[positions[0]].training
    training = recorded_training if mode == "recorded" else mode == "train"
    tolerances = tolerance_table(data.output_dtypes or ["float32"], rtol, atol)
    reasons, precision = _compatibility(data.call_entries, data.weights)
    notes = _notes(model, binding, data, mode, recorded_training, training)
    if training:
        rng_ops = _rng_ops(capture, positions[0], binding)
        if rng_ops:
            reasons.append(f"Model runs in training mode and uses random ops ({', '.join(rng_ops)}): dropout or other "
                           "RNG changes its outputs from run to run, so KernelBench's correctness check fails even for the reference "
                           "(export with --eval to compare deterministic outputs)")
    data_dir = directory / "data"
    say(f"writing {directory}")
    _write_data(data_dir, data, model.renderer, capture.ref)
    problem_text, test_text, signature = _render_files(capture, binding, model, data, tolerances, data_dir, training)
    (directory / "problem.py").write_text(problem_text)
    (directory / TEST_FILE).write_text(test_text)
    manifest = _manifest(capture, store, directory, binding, model, data, left_out, tolerances, reasons, precision,
                         notes, signature, training, mode)
    if check:
        say("self-check: running problem.py in a separate process")
        manifest["self_check"] = check_problem(directory / "problem.py", data.outputs, data.expected, tolerances)
    for path in sorted([directory / "problem.py", directory / TEST_FILE, *data_dir.iterdir()]):
        manifest["files"][str(path.relative_to(directory))] = hash_bytes(path.read_bytes())
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    return ExportResult(directory, manifest)


def _open(ref: str | Capture, repo: Repo | str | os.PathLike[str] | None) -> tuple[Capture, Repo]:
    if isinstance(ref, Capture):
        return ref, ref.repo
    store = repo if isinstance(repo, Repo) else Repo(repo, create=False)
    return load(ref, repo=store), store


def check_problem_folder(directory: str | os.PathLike[str], *, overwrite: bool) -> None:
    """Refuse a folder that is not empty unless ``overwrite`` (``--force``): what :func:`export_kernelbench`
    checks first, for callers that load the capture themselves before exporting it.

    Raises:
        UsageError: ``directory`` exists, holds files, and ``overwrite`` is false.
    """
    folder = Path(directory)
    if not overwrite and folder.exists() and any(folder.iterdir()):
        raise UsageError(f"{folder} is not empty (use --force to replace its problem files, or -o another folder)")


def _prepare_directory(directory: Path, overwrite: bool) -> Path:
    if overwrite and directory.exists():
        for stale in ("problem.py", TEST_FILE, "manifest.json", "data"):
            target = directory / stale
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    return directory


def _model_source(capture: Capture, inline: bool, binding: CallBinding) -> _ModelSource:
    """The class source (resolved as ``load`` resolves it) and the constructor call as Python."""
    construction = construction_record(capture)
    if construction is None:
        raise RestoreError(f"{capture.ref}: no constructor record ({capture.metadata['module'].get('construction_missing')}); "
                           "a problem file needs the constructor arguments")
    cls = capture.module_type  # the trust rules apply here: untrusted stored source is refused, with how to trust
    # Stored source is code from the capture: it is inlined only when load ran it (with the user's
    # trust); a class imported from installed code is inlined from its own module's file.
    from_source = built_from_stored_source(cls)
    module_name = capture.module_class.partition(":")[0] if from_source else cls.__module__
    # a first pass over the constructor arguments learns which helper names of the module they use
    probe = SourceRenderer(capture, module_name if inline else None)
    for i, a in enumerate(construction["args"]):
        probe.encoded(a, f"constructor argument {i}")
    for k, v in construction["kwargs"].items():
        probe.encoded(v, f"constructor argument {k!a}")
    for values in binding.positional.values():  # call inputs too: a cache class of the module's own
        for value, name in zip(values, binding.names, strict=True):
            probe.value(value, name, {})
    stored = capture.stored_source(module_name) if from_source else None
    source = inlined_class_source(cls, probe.needed_names, inline=inline, module_name=module_name, text=stored)
    renderer = SourceRenderer(capture, source.module if source.origin == "inlined" else None)
    args = [renderer.encoded(a, f"constructor argument {i}") for i, a in enumerate(construction["args"])]
    kwargs = keyword_arguments(((k, renderer.encoded(v, f"constructor argument {k!a}"))
                                for k, v in construction["kwargs"].items()), "constructor keyword")
    return _ModelSource(source, renderer, args, kwargs, plain_init=False)


def _collect_data(capture: Capture, positions: list[int], binding: CallBinding, renderer: SourceRenderer) -> _Data:
    """Inputs (as Python expressions over the data file), weights and outputs of the chosen calls."""
    data = _Data()
    for position in positions:
        index = capture.calls[position].index
        items = [renderer.value(v, f"call{index}.{name}", data.call_tensors)
                 for v, name in zip(binding.positional[position], binding.names, strict=True)]
        data.call_exprs.append(f"    lambda t: [{', '.join(items)}],  # call {int(index)}")
    for name, default in binding.defaults_used.items():
        try:
            renderer.value(default, f"default of {name}", {})
        except UnsupportedValueError as error:
            raise KernelError(f"cannot export: {error}") from None
    _collect_weights(capture, capture.calls[positions[0]].state_index, data)
    for position in positions:
        _collect_call(capture, position, binding, renderer, data)
    return data


def _collect_weights(capture: Capture, state_index: int, data: _Data) -> None:
    states = capture.metadata.get("states", [])
    if not states:
        return
    state = states[state_index]
    for kind, group in (("parameter", state["parameters"]), ("buffer", state["buffers"])):
        for name, entry in group.items():
            data.weights[name] = capture.tensor(entry["tensor"])
            meta = capture.metadata["tensors"][entry["tensor"]]
            data.weight_entries.append({"name": name, "kind": kind, "shape": meta["shape"], "dtype": meta["dtype"],
                                        "payload": meta["payload"]})


def _collect_call(capture: Capture, position: int, binding: CallBinding, renderer: SourceRenderer, data: _Data) -> None:
    call = capture.calls[position]
    check_recorded(call.output, f"an output of call {call.index}")
    leaves: list[dict[str, object]] = []
    for n, (path, leaf) in enumerate(_output_leaves(call.output)):
        if isinstance(leaf, torch.Tensor):
            key = f"call{call.index}.out{n}"
            data.outputs[key] = leaf
            data.output_dtypes.append(dtype_name(leaf.dtype))
            leaves.append({"path": path, "kind": "tensor", "key": key, "shape": list(leaf.shape),
                           "dtype": dtype_name(leaf.dtype), "payload": capture.payload_of(leaf)})
        else:
            leaves.append({"path": path, "kind": "value", "value": leaf} if _is_literal(leaf) else
                          {"path": path, "kind": "object", "type": type(leaf).__qualname__})
    # None and objects (attention weights that were not computed, a cache) are not compared
    data.expected.append([{k: v for k, v in leaf.items() if k in ("path", "key", "value")} for leaf in leaves
                          if not _uncompared(leaf)])
    arguments = [_describe_arg(name, value, renderer.tensor_key, capture.payload_of)
                 for name, value in zip(binding.names, binding.positional[position], strict=True)]
    data.call_entries.append({"position": position, "index": call.index, "state": call.state_index,
                              "training": call.training, "autocast": call.autocast, "arguments": arguments,
                              "outputs": leaves})


def _rng_ops(capture: Capture, position: int, binding: CallBinding) -> list[str]:
    """Random aten ops (dropout, bernoulli, ...) that make a training-mode forward of the module
    differ from run to run: ops tagged random (``OpCounter``) whose output does change with the
    seed (``scaled_dot_product_attention`` is tagged, but with ``dropout_p=0`` it is not random)."""
    call = capture.calls[position]
    module = working_module(capture, call.state_index, private=True)  # a training forward may change buffers

    def run(seed: int) -> list[torch.Tensor]:
        # a cache argument is updated in place by forward: run on a copy, the capture keeps what it recorded
        positional = [copy.deepcopy(v) if is_state_object(v) else v for v in binding.positional[position]]
        n = len(positional) - len(binding.kw_names)
        with torch.random.fork_rng(devices=[]), call_context(call, torch.device("cpu")), torch.no_grad():
            torch.manual_seed(seed)
            out = module(*positional[:n], **dict(zip(binding.kw_names, positional[n:], strict=True)))
        return [leaf for leaf in pytree.tree_leaves(out) if isinstance(leaf, torch.Tensor)]

    module.train(True)
    counter = OpCounter()
    try:
        with counter:
            first = run(0)
        ops = counter.random_ops()
        if ops and all(torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)) for a, b in zip(first, run(1), strict=True)):
            return []
    except Exception as error:  # the module's own code (or its recorded arguments) failed: not an export bug
        raise KernelError(f"cannot export {capture.ref}: its forward raised {type(error).__name__} when run on call "
                          f"{call.index} in training mode (to find its random ops): {_one_line(error)}") from None
    return ops


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _notes(model: _ModelSource, binding: CallBinding, data: _Data, mode: str, recorded_training: bool,
           training: bool) -> list[str]:
    notes = list(model.source.notes)
    required = model.renderer.required_modules | model.source.imports
    if required:
        notes.append("problem.py imports " + ", ".join(sorted(required)) + ": they must be installed where the problem runs")
    notes.extend(binding.notes)
    if _unwrapped_output(data.call_entries):
        notes.append("the module returns one output tensor inside a container (a tuple, or with None or objects such as a "
                     "cache beside it); Model.forward returns only the tensor (KernelBench compares one tensor); None and "
                     "objects are not compared")
    if mode != "recorded" and training != recorded_training:
        notes.append(f"the calls were recorded in {'training' if recorded_training else 'eval'} mode; Model is put in "
                     f"{'training' if training else 'eval'} mode as asked (--{mode}), so outputs may differ from the "
                     "recorded ones")
    elif training:
        notes.append("the calls were recorded in training mode; Model stays in training mode "
                     "(outputs that depend on dropout/RNG will not match)")
    return notes


def _write_data(data_dir: Path, data: _Data, renderer: SourceRenderer, ref: str) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = {"capture": ref}
    files = {"weights": data.weights, "inputs": data.call_tensors, "outputs": data.outputs}
    if renderer.init_tensors:
        files["init"] = renderer.init_tensors
    for name, tensors in files.items():
        # safetensors refuses tensors that share memory (tied weights, views of one input): copy each
        save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()},
                  str(data_dir / f"{name}.safetensors"), metadata=meta)


def _init_body(model: _ModelSource, binding: CallBinding, training: bool) -> tuple[str, bool]:
    """``Model.__init__``'s body (the recorded constructor call, then the captured weights), and
    whether the constructor takes ``get_init_inputs()``."""
    plain_init = bool(binding.init_inputs) or not model.init_args
    body = []
    if model.renderer.init_tensors:
        body.append('        _ml_init = _ml_read_safetensors(DATA_DIR / "init.safetensors")')
    if plain_init:
        args_text = ", ".join(["*(init_inputs or get_init_inputs())", *model.init_kwargs])
    else:
        args_text = ", ".join([*model.init_args, *model.init_kwargs])
        body.append("        # the recorded constructor arguments are written here (they are not plain values)")
    body.append(f"        super().__init__({args_text})")
    body.append("        _ml_load_weights(self)")
    body.append("        self.train(True)  # training mode" if training else "        self.train(False)  # eval mode")
    return "\n".join(body), plain_init


def _forward_text(binding: CallBinding, class_short: str, copied: set[int], unwrap: bool) -> str:
    """``Model.forward`` taking keyword arguments by position (KernelBench passes ``*get_inputs()``),
    and working on copies of state arguments (``copied``: a transformers cache, which forward updates
    in place; KernelBench passes the same inputs to ``Model`` and then ``ModelNew``).

    With ``unwrap`` it returns the one tensor of an output whose other values are ``None`` (an
    attention's ``(output, None)``): KernelBench compares exactly one output tensor.

    Parameter names are the recorded ones when they are plain identifiers, else ``arg<N>``: a
    ``**kwargs`` key comes from the capture, and reaches the module as ``**{'key': arg<N>}``."""
    if not binding.kw_names and not copied and not unwrap:
        return ""
    params = _parameter_names(binding.names)
    passed = [f"copy.deepcopy({p})" if i in copied else p for i, p in enumerate(params)]
    n = len(binding.names) - len(binding.kw_names)
    call_args = passed[:n] + keyword_arguments(zip(binding.kw_names, passed[n:], strict=True), "keyword argument")
    what = [*(["its keyword arguments taken by position"] if binding.kw_names else []),
            *(["copies of its state arguments (updated in place)"] if copied else []),
            *(["only the tensor of its output (the rest is None)"] if unwrap else [])]
    call = f"super().forward({', '.join(call_args)})"
    return (f"\n    def forward(self, {', '.join(params)}):\n"
            f'        """{comment_text(class_short)}.forward with {", ".join(what)}."""\n'
            f"        return {f'_ml_only_tensor({call})' if unwrap else call}\n")


def _uncompared(leaf: dict[str, Any]) -> bool:
    """An output value that is not compared: ``None``, or an object that is not plain data (a cache)."""
    return leaf["kind"] == "object" or (leaf["kind"] == "value" and leaf.get("value") is None)


def _unwrapped_output(call_entries: list[dict[str, Any]]) -> bool:
    """Whether every exported call returned one tensor inside a container (a 1-tuple, or beside
    values that are not compared: None, a cache)."""
    return all(len([leaf for leaf in e["outputs"] if leaf["kind"] == "tensor"]) == 1
               and all(leaf["kind"] == "tensor" or _uncompared(leaf) for leaf in e["outputs"])
               and (len(e["outputs"]) > 1 or e["outputs"][0]["path"] != "output") for e in call_entries)


def _state_arguments(binding: CallBinding) -> set[int]:
    """Positions of arguments that are state objects (a transformers cache) in any exported call."""
    return {i for values in binding.positional.values() for i, v in enumerate(values) if is_state_object(v)}


def _parameter_names(names: list[str]) -> list[str]:
    params: list[str] = []
    for i, name in enumerate(names):
        params.append(name if is_identifier(name) and name not in params and name != "self" else f"arg{i}")
    return params


def _render_files(capture: Capture, binding: CallBinding, model: _ModelSource, data: _Data,
                  tolerances: dict[str, Any], data_dir: Path, training: bool) -> tuple[str, str, str]:
    """``problem.py`` and ``test_modulelens.py`` texts (both parsed before they are written), and the
    kernel_function signature."""
    # Every value below that comes from the capture is a checked identifier, a literal() or
    # comment_text() (kernels/render.py): the files must parse, and hold no statement from the capture.
    class_short = capture.module_type.__qualname__
    init_body, model.plain_init = _init_body(model, binding, training)
    source = model.source
    header = []
    if model.renderer.uses_importlib or source.class_expr.startswith("importlib."):
        header.append("import importlib")
    if model.renderer.uses_functools:
        header.append("import functools")
    copied = _state_arguments(binding)
    if copied:
        header.append("import copy")
    unwrap = _unwrapped_output(data.call_entries)
    if unwrap:
        model.renderer.helpers.add("_ml_only_tensor")
    header += [f"\n\n{HELPERS[name]}\n" for name in sorted(model.renderer.helpers)]
    data_dir_literal = literal(str(data_dir), "the data folder")
    problem_text = fill(PROBLEM, {
        "FUTURE": "from __future__ import annotations\n\n" if source.future_annotations else "",
        "REF": comment_text(capture.ref), "CLASS": comment_text(capture.module_class.replace(":", ".")),
        "QUALNAME": comment_text(capture.metadata["module"].get("qualified_name") or ""),
        "CALL_COUNT": str(len(binding.positions)), "DATA_ENV": DATA_ENV, "DATA_DIR": data_dir_literal,
        "READER": READER,
        "SOURCE": ("\n".join(header) + "\n" if header else "")
        + (source.code if source.origin == "inlined"
           else f"# {comment_text(capture.module_class)} is imported, not inlined\n"),
        "CLASS_EXPR": source.class_expr, "CLASS_SHORT": comment_text(class_short), "INIT_BODY": init_body,
        "FORWARD": _forward_text(binding, class_short, copied, unwrap),
        "INIT_INPUTS": literal(binding.init_inputs, "constructor arguments") if model.plain_init else "[]",
        "CALLS": "\n".join(data.call_exprs),
    })
    entries = data.weight_entries
    signature = f"kernel_function({', '.join(binding.names + [e['name'] for e in entries])})"
    test_text = fill(TEST, {
        "REF": comment_text(capture.ref), "CLASS_SHORT": comment_text(class_short),
        "SIGNATURE": comment_text(signature, limit=2000),
        "WEIGHT_LINES": "\n".join(f"        {comment_text(e['name'])}  {e['dtype']}{e['shape']}" for e in entries)
        or "        (none)",
        "OUTPUT_DESC": comment_text(_describe_outputs(data.call_entries[0]["outputs"]), limit=2000),
        "TOLERANCE_DESC": "; ".join(f"{d}: exact" if t["exact"] else f"{d}: rtol={t['rtol']:g}, atol={t['atol']:g}"
                                    for d, t in tolerances.items()),
        "DATA_ENV": DATA_ENV, "DATA_DIR": data_dir_literal,
        "TOLERANCES": literal({d: (float(t["rtol"]), float(t["atol"])) for d, t in tolerances.items() if not t["exact"]},
                              "tolerances"),
        "WEIGHT_NAMES": literal([e["name"] for e in entries], "weight names"), "CALLS": "\n".join(data.call_exprs),
        "EXPECTED": literal(data.expected, "expected outputs"), "READER": READER,
    })
    ast.parse(problem_text)
    ast.parse(test_text)
    return problem_text, test_text, signature


def _manifest(capture: Capture, store: Repo, directory: Path, binding: CallBinding, model: _ModelSource, data: _Data,
              left_out: list[dict[str, Any]], tolerances: dict[str, Any], reasons: list[str], precision: str | None,
              notes: list[str], signature: str, training: bool, mode: str) -> dict[str, Any]:
    capture_json = (store.version_path(capture.name, capture.version) / CAPTURE_FILE).read_bytes()
    source = model.source
    data_dir = directory / "data"
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "capture": {"ref": capture.ref, "name": capture.name, "version": capture.version,
                    "capture_id": hash_bytes(capture_json), "module_class": capture.module_class,
                    "qualified_name": capture.metadata["module"].get("qualified_name"),
                    "repo": store.location, "created": capture.metadata.get("created")},
        "model": {"source": source.origin, "class_expr": source.class_expr, "inlined_from": source.module,
                  "inlined_statements": source.included,
                  "init_inputs": binding.init_inputs if model.plain_init else [],
                  "constructor_inline": not model.plain_init, "training": training, "mode": mode,
                  "state": capture.calls[binding.positions[0]].state_index,
                  "forward_arguments": binding.names, "keyword_arguments": binding.kw_names,
                  "defaults_filled": sorted(binding.defaults_used),
                  "requires_modules": sorted(model.renderer.required_modules | source.imports)},
        "calls": data.call_entries,
        "left_out_calls": left_out,
        "weights": data.weight_entries,
        "tolerances": tolerances,
        "kernelbench_compatible": not reasons,
        "kernelbench_incompatible_reasons": reasons,
        "kernelbench_precision": precision,
        "kernel_function_signature": signature,
        "data_dir": str(data_dir),
        "data_dir_env": DATA_ENV,
        "files": {},
        "commands": _commands(capture, store, directory),
        "notes": notes,
    }


@dataclass
class ExportResult:
    """What :func:`export_kernelbench` wrote."""

    directory: Path
    manifest: dict[str, Any]

    @property
    def problem(self) -> Path:
        return self.directory / "problem.py"

    @property
    def test(self) -> Path:
        return self.directory / TEST_FILE

    def to_dict(self) -> dict[str, object]:
        return {"directory": str(self.directory), "problem": str(self.problem), "test": str(self.test),
                "manifest": self.manifest}


def _output_leaves(output: object) -> list[tuple[str, object]]:
    leaves, _ = pytree.tree_flatten_with_path(output)
    return [("output" + pytree.keystr(kp), leaf) for kp, leaf in leaves]


def _describe_arg(name: str, value: object, key_of: Callable[[torch.Tensor], str | None],
                  payload_of: Callable[[torch.Tensor], str | None]) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {"name": name, "kind": "tensor", "shape": list(value.shape), "dtype": dtype_name(value.dtype),
                "key": key_of(value), "payload": payload_of(value)}
    leaves = _leaves(value)
    if any(isinstance(v, torch.Tensor) for v in leaves):
        return {"name": name, "kind": type(value).__name__, "tensors": [
            {"shape": list(v.shape), "dtype": dtype_name(v.dtype), "key": key_of(v), "payload": payload_of(v)}
            for v in leaves if isinstance(v, torch.Tensor)]}
    try:
        json.dumps(value)
        return {"name": name, "kind": "value", "value": value}
    except (TypeError, ValueError):
        return {"name": name, "kind": "value", "value": repr(value)}




def _commands(capture: Capture, store: Repo, directory: Path) -> dict[str, str]:
    """Shell command lines (every path and name quoted: a capture's name is not a shell word)."""
    q = shlex.quote
    repo = "" if store.root == _default_root() else f" --repo {q(str(store.location))}"
    return {
        "kernelagent": f"python -m Fuser.auto_agent --problem {q(str(directory / 'problem.py'))} "
                       f"--test-paths {q(str(directory / TEST_FILE))} > {q(str(directory / 'agent_result.json'))}",
        "verify": f"modulelens kernel verify {q(capture.ref)} --candidate {q(str(directory / 'agent_result.json'))}{repo}",
        "test": f"cd <dir with kernel.py> && python {q(str(directory / TEST_FILE))}",
    }


def _leaves(value: object) -> list[object]:
    """The leaves of a call argument, looking inside state objects (a cache's tensors)."""
    leaves: list[object] = []
    for leaf in pytree.tree_leaves(value):
        leaves.extend(_leaves(list(state_attributes(leaf).values())) if is_state_object(leaf) else [leaf])
    return leaves


def _default_root() -> Path:
    from modulelens.repo import default_repo_path

    return default_repo_path().expanduser().absolute()


def _is_literal(value: object) -> bool:
    """Whether ``value`` can be written as a literal into the generated test."""
    try:
        literal(value, "")
        return True
    except UnsupportedValueError:
        return False


def _describe_outputs(leaves: list[dict[str, Any]]) -> str:
    parts = [f"{leaf['path']} {leaf['dtype']}{leaf['shape']}" if leaf["kind"] == "tensor"
             else f"{leaf['path']}: a {leaf['type']} (not compared)" if leaf["kind"] == "object"
             else f"{leaf['path']} = {leaf['value']!r}" for leaf in leaves]
    return "; ".join(parts) if parts else "nothing (None)"


def _compatibility(call_entries: list[dict[str, Any]], weights: dict[str, torch.Tensor]) -> tuple[list[str], str | None]:
    """Reasons KernelBench's evaluator would not reproduce the recorded calls, and its precision."""
    reasons: list[str] = []
    floating: set[str] = set()
    for entry in call_entries:
        for argument in entry["arguments"]:
            if argument["kind"] == "tensor":
                if argument["dtype"] in ("bool",) or not getattr(torch, argument["dtype"]).is_floating_point:
                    reasons.append(f"input {argument['name']!r} is {argument['dtype']}: KernelBench casts every input "
                                   "tensor to the evaluation precision (a float dtype), so integer/bool inputs break "
                                   "(KernelBench issue #151)")
                else:
                    floating.add(argument["dtype"])
            elif "tensors" in argument:
                reasons.append(f"argument {argument['name']!r} holds tensors inside a {argument['kind']}: KernelBench "
                               "moves and casts only top-level tensor arguments")
        leaves = [leaf for leaf in entry["outputs"] if not _uncompared(leaf)]  # Model drops them (_forward_text)
        tensor_leaves = [leaf for leaf in leaves if leaf["kind"] == "tensor"]
        if len(leaves) != 1 or len(tensor_leaves) != 1:
            what = ("no tensor" if not tensor_leaves else f"{len(tensor_leaves)} tensors") + (
                f" and {len(leaves) - len(tensor_leaves)} other value(s)" if len(leaves) > len(tensor_leaves) else "")
            reasons.append(f"call {entry['index']} returns {what}: KernelBench compares exactly one output tensor")
        elif getattr(torch, tensor_leaves[0]["dtype"]).is_floating_point:
            floating.add(tensor_leaves[0]["dtype"])
        if entry["autocast"]:
            reasons.append(f"call {entry['index']} ran under autocast {entry['autocast']}; problem.py runs without it")
    for tensor in weights.values():
        if tensor.dtype.is_floating_point:
            floating.add(dtype_name(tensor.dtype))
    precision = None
    if len(floating) > 1:
        reasons.append(f"floating tensors have several dtypes ({', '.join(sorted(floating))}): KernelBench casts the "
                       "model and every input to one precision")
    elif floating:
        only = next(iter(floating))
        precision = _KB_PRECISIONS.get(only)
        if precision is None:
            reasons.append(f"{only} is not a KernelBench precision (fp32, fp16, bf16)")
    seen = []
    for reason in reasons:
        if reason not in seen:
            seen.append(reason)
    return seen, precision


def check_problem(problem: Path, outputs: dict[str, torch.Tensor], expected: list[list[dict[str, Any]]],
                  tolerances: dict[str, Any], *, timeout: float = CHECK_TIMEOUT) -> dict[str, Any]:
    """Run ``problem.py`` as KernelBench loads it (``exec`` of its text, no ``__file__``) in a
    separate process (:mod:`.worker_problem`; its own process group, killed after ``timeout``
    seconds) and compare what ``Model(*get_init_inputs())`` returns on every exported call with the
    recorded outputs.

    Returns:
        ``reproduces_recorded_outputs``, per call ``passed``/``max_abs_error``, and ``error`` when
        the problem did not run (with the step it stopped at).
    """
    result: dict[str, Any] = {"reproduces_recorded_outputs": False, "calls": []}
    with tempfile.TemporaryDirectory(prefix="modulelens-problem-check-") as scratch:
        work = Path(scratch)
        (work / "out").mkdir()
        (work / "spec.json").write_text(json.dumps({"problem": str(problem), "out_dir": str(work / "out")}))
        command = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), str(_CHECK_WORKER),
                   str(work / "spec.json")]
        run = run_isolated(command, env=worker_env("cpu", candidate=True), cwd=work, timeout=timeout, logs=work / "logs")
        result["process"] = {"returncode": run["returncode"], "timed_out": run["timed_out"], "seconds": run["seconds"]}
        ran = read_json(work / "out" / "result.json")
        if run["timed_out"]:
            result["error"] = f"timed out after {timeout:g} s" + (f" (during {ran['phase']})" if ran else "")
            return result
        if ran is None:
            result["error"] = f"the check process died (exit {run['returncode']}): {run['stderr_tail'][-600:].strip()}"
            return result
        got_tensors = load_tensors(work / "out" / "outputs.safetensors")
    if ran.get("error"):
        result["error"] = f"{ran['error'].splitlines()[0]} (during {ran.get('phase')})"
    ok = not ran.get("error") and len(ran["calls"]) == len(expected)
    for i, flat in enumerate(ran["calls"]):
        got = [got_tensors[leaf["key"]] if "key" in leaf else leaf.get("value") for leaf in flat["leaves"]
               if "key" in leaf or not _uncompared_value(leaf.get("value"))]
        want = [outputs[leaf["key"]] if "key" in leaf else leaf.get("value") for leaf in expected[i]]
        worst = 0.0
        passed = len(got) == len(want)
        for w, g in zip(want, got, strict=False):
            dtype = dtype_name(w.dtype) if isinstance(w, torch.Tensor) else ""
            tol = tolerances.get(dtype, {"rtol": 0.0, "atol": 0.0, "exact": True})
            leaf = compare(w, g, exact=tol["exact"], rtol=tol["rtol"], atol=tol["atol"])[0]
            worst = max(worst, leaf.max_abs_error)
            passed = passed and leaf.passed
        result["calls"].append({"call": i, "passed": passed, "max_abs_error": worst})
        ok = ok and passed
    result["reproduces_recorded_outputs"] = ok
    return result


def _uncompared_value(value: object) -> bool:
    """None, or an object the worker could only describe (``{"repr": ...}``): not compared."""
    return value is None or (isinstance(value, dict) and "repr" in value)
