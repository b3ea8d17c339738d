"""AST checks of a kernel candidate's source against known reward hacks (see docs/kernels.md).

The checker parses the candidate (comments and docstrings never count), resolves import aliases
(``import torch as T``, ``from torch.cuda import Stream as S``, ``s = torch.cuda``,
``getattr(torch.cuda, "Stream")``) and reports findings by rule. Errors fail verification;
warnings are reported. Rules (error unless noted):

- ``syntax``, ``entry_point``: unparsable, or neither ``class ModelNew`` nor ``def kernel_function``
- ``no_kernel``: no ``@triton.jit``/``@triton.autotune`` kernel and no CUDA source (``load_inline``)
- ``reference_call``: imports modulelens or the reference's module, uses the reference class (or,
  for a torch builtin reference, its module/functional form), or KernelBench's ``Model``
- ``cached_output``: reads recorded data (strings naming outputs/expected/capture.json/blobs/the
  repo), loads pickles (``torch.load``/``pickle``), or keys a cache on ``data_ptr()``/``id()``
- ``timing_patch`` / ``monkey_patch``: assigns to (or ``setattr``s) attributes of imported modules
  (timers, ``torch.cuda.synchronize``, ``time.*``, ``triton.testing``...), or uses ``mock``
- ``stream_injection``: creates or switches CUDA streams, ``wait_stream``/``record_stream``
- ``thread_injection``: threads, processes, ``asyncio``, ``subprocess``, ``os.fork``/``system``
- ``lazy_eval``: ``torch.Tensor`` subclasses, ``_make_subclass``, ``__torch_function__``/``__torch_dispatch__``
- ``precision_downgrade`` (only when the reference output is fp32/fp64): half/bf16/fp8 dtypes and
  casts, TF32 switches (``allow_tf32``, ``set_float32_matmul_precision``, ``input_precision="tf32"``)
- ``introspection`` / ``dynamic_code``: frames, ``gc``, ``inspect``, ``ctypes``, ``globals()``,
  ``sys.modules``, ``exec``/``eval``/``compile``/``__import__``/``importlib``
- ``env_write``, ``network``: writing ``os.environ``; sockets/HTTP
- ``fallback``: an ``except`` block that computes with torch or calls the reference
- ``dynamic_getattr``: ``getattr(torch..., <computed name>)``, ``operator.attrgetter(<computed>)``
  (a warning when the object is not torch)
- warnings: ``pytorch_compute`` (torch compute ops), ``tf32_dot`` (``tl.dot`` without
  ``input_precision="ieee"`` on fp32), ``try_except``, ``file_read``, ``input_mutation``,
  ``forward_call``, ``global_state``, ``embedded_data``, ``torch_compile``, ``star_import``.

A static check is a filter, not a proof: the candidate worker also counts, at run time, the heavy
aten ops (matmul, convolution, attention) the candidate's forward runs through PyTorch
(:mod:`modulelens.format.op_watch`).
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

ERROR = "error"
WARNING = "warning"

_THREAD_MODULES = ("threading", "_thread", "multiprocessing", "concurrent", "asyncio", "subprocess")
_NETWORK_MODULES = ("socket", "urllib", "http", "requests", "httpx", "aiohttp", "ftplib", "smtplib")
_INTROSPECTION_MODULES = ("inspect", "gc", "ctypes", "builtins", "traceback", "__main__")
_DYNAMIC_MODULES = ("importlib", "runpy", "code", "codeop")
_SERIALIZATION_MODULES = ("pickle", "cPickle", "dill", "marshal", "shelve", "joblib", "cloudpickle")
_MOCK_MODULES = ("unittest.mock", "mock", "pytest")
_PROCESS_CALLS = ("os.system", "os.popen", "os.fork", "os.forkpty", "os.execv", "os.execve", "os.execl",
                  "os.execvp", "os.spawnl", "os.spawnv", "os.posix_spawn", "os.kill")
_STREAM_CALLS = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.ExternalStream", "torch.cuda.set_stream",
                 "torch.Stream", "torch.cuda.StreamContext", "torch.cuda.streams.Stream", "torch.cuda.current_stream",
                 "torch.xpu.Stream", "torch.cuda.graphs.graph", "torch.cuda.graph")
_STREAM_METHODS = ("wait_stream", "record_stream", "wait_event")
_TIMING_WORDS = ("Event", "synchronize", "perf_counter", "elapsed_time", "record", "do_bench", "time", "monotonic",
                 "Timer", "benchmark", "testing")
_FRAME_ATTRS = ("f_locals", "f_globals", "f_back", "f_code", "f_builtins", "gi_frame", "tb_frame", "cr_frame",
                "__globals__", "__closure__", "__code__", "__subclasses__", "__builtins__", "__dict__", "__self__")
_LOW_DTYPES = ("float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
               "float8e4nv", "float8e5", "float8e4b15", "float8e4b8", "float8e5b16", "fp8e4nv", "fp8e5")
_LOW_METHODS = ("half", "bfloat16")
_TORCH_COMPUTE = {
    "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "einsum", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "relu", "relu_", "sigmoid", "tanh", "softmax", "log_softmax", "gelu",
    "layer_norm", "batch_norm", "group_norm", "instance_norm", "embedding", "embedding_bag", "logsumexp", "cumsum",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "dropout", "linear",
    "bilinear", "clamp", "erf", "exp", "cross_entropy", "nll_loss", "mse_loss", "addcmul", "addcdiv", "lerp",
    "scaled_dot_product_attention", "outer", "dot", "tensordot", "inner", "kron", "mv", "chain_matmul", "sum", "mean",
    "prod", "norm", "var", "std", "silu", "hardtanh", "elu", "selu", "mish", "softplus", "abs", "where",
}
_TENSOR_COMPUTE_METHODS = {"matmul", "mm", "bmm", "addmm", "einsum", "softmax", "log_softmax", "relu", "sigmoid",
                           "tanh", "conv2d", "baddbmm", "cumsum", "logsumexp"}
_NN_ALLOWED = {"Module", "Parameter", "ParameterList", "ParameterDict", "ModuleList", "ModuleDict", "init",
               "Buffer", "functional", "utils", "modules", "parameter"}
_SUSPICIOUS_STRINGS = ("outputs.safetensors", "expected.safetensors", "capture.json", "/blobs", "MODULELENS_REPO",
                       "modulelens/repo", "reference.json", ".pth", ".pkl")
_FILE_READS = ("builtins.open", "io.open", "numpy.load", "numpy.fromfile", "numpy.loadtxt", "numpy.genfromtxt",
               "numpy.memmap", "torch.from_file", "json.load", "safetensors.torch.load_file", "safetensors.safe_open",
               "safetensors.torch.load", "os.read", "mmap.mmap")
_PATH_READS = ("read_bytes", "read_text")
_PICKLE_LOADS = ("torch.load", "torch.serialization.load", "numpy.load")  # numpy.load(allow_pickle) included
_EMBEDDED_LIMIT = 256


@dataclass
class Finding:
    """One static-check result."""

    rule: str
    severity: str
    line: int
    message: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class StaticReport:
    """All findings for one candidate, plus what the checker learned about it."""

    findings: list[Finding] = field(default_factory=list)
    backend: str = "none"  # "triton", "cuda", "triton+cuda" or "none"
    entry: str | None = None  # "ModelNew" or "kernel_function"
    allowed: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def passed(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "backend": self.backend, "entry": self.entry, "allowed_rules": self.allowed,
                "errors": [f.to_dict() for f in self.errors], "warnings": [f.to_dict() for f in self.warnings]}


@dataclass
class ReferenceInfo:
    """What the checker knows about the reference: its class path and output dtypes."""

    class_path: str = ""  # "package.module:ClassName"
    output_dtypes: set[str] = field(default_factory=set)

    @property
    def module(self) -> str:
        return self.class_path.partition(":")[0]

    @property
    def class_name(self) -> str:
        return self.class_path.partition(":")[2].rsplit(".", 1)[-1]

    @property
    def is_torch_builtin(self) -> bool:
        return self.module == "torch" or self.module.startswith("torch.")

    @property
    def functional_name(self) -> str:
        """``GELU`` -> ``gelu``, ``EmbeddingBag`` -> ``embedding_bag``, ``Conv2d`` -> ``conv2d``."""
        return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", self.class_name).lower()

    @property
    def wants_full_precision(self) -> bool:
        return not self.output_dtypes or bool(self.output_dtypes & {"float32", "float64", "complex64", "complex128"})


RULES = ("syntax", "entry_point", "no_kernel", "reference_call", "cached_output", "timing_patch", "monkey_patch",
         "stream_injection", "thread_injection", "lazy_eval", "precision_downgrade", "introspection", "dynamic_code",
         "env_write", "network", "fallback", "pytorch_compute", "tf32_dot", "try_except", "file_read",
         "input_mutation", "forward_call", "dynamic_getattr", "global_state", "embedded_data", "torch_compile",
         "star_import")


def check_source(source: str, reference: ReferenceInfo | None = None, *, allow: Sequence[str] = ()) -> StaticReport:
    """Check a candidate's source. ``allow`` turns the named error rules into warnings.

    Example::

        report = check_source(Path("kernel.py").read_text(), ReferenceInfo("torch.nn.modules.activation:GELU"))
        for finding in report.errors:
            print(finding.line, finding.rule, finding.message)
    """
    unknown = [rule for rule in allow if rule not in RULES]
    if unknown:
        raise ValueError(f"unknown static-check rule(s) {unknown}; rules: {', '.join(RULES)}")
    report = StaticReport(allowed=list(allow))
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        report.findings.append(Finding("syntax", ERROR, error.lineno or 0, f"cannot parse the candidate: {error.msg}"))
        return report
    checker = _Checker(tree, reference or ReferenceInfo())
    checker.run()
    report.backend = checker.backend()
    report.entry = checker.entry
    if report.entry is None:
        checker.add("entry_point", 0, "defines neither class ModelNew (KernelBench) nor def kernel_function (KernelAgent)")
    if report.backend == "none":
        checker.add("no_kernel", 0, "no @triton.jit/@triton.autotune kernel and no CUDA source (load_inline): "
                                    "this is not a custom kernel")
    seen = set()
    for finding in checker.findings:
        if finding.rule in allow and finding.severity == ERROR:
            finding.severity = WARNING
            finding.message += " (allowed)"
        key = (finding.rule, finding.line, finding.message)
        if key not in seen:
            seen.add(key)
            report.findings.append(finding)
    report.findings.sort(key=lambda f: (f.severity != ERROR, f.line, f.rule))
    return report


class _Checker:
    def __init__(self, tree: ast.Module, reference: ReferenceInfo) -> None:
        self.tree = tree
        self.reference = reference
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}
        self.local_names: set[str] = set()
        self.entry: str | None = None
        self.triton_kernels = 0
        self.cuda_sources = 0
        self.in_except = 0
        self.parents: dict[ast.AST, ast.AST] = {}

    # ------------------------------------------------------------------ helpers

    def add(self, rule: str, line: int, message: str, severity: str = ERROR) -> None:
        self.findings.append(Finding(rule, severity, line, message))

    def warn(self, rule: str, line: int, message: str) -> None:
        self.add(rule, line, message, WARNING)

    def backend(self) -> str:
        kinds = [k for k, n in (("triton", self.triton_kernels), ("cuda", self.cuda_sources)) if n]
        return "+".join(kinds) if kinds else "none"

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted path an expression names (``T.cuda.Stream`` -> ``torch.cuda.Stream``), if known."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id not in self.local_names and hasattr(builtins, node.id):
                return f"builtins.{node.id}"
            return None
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and self.resolve(node.func) == "builtins.getattr" and len(node.args) >= 2:
            base = self.resolve(node.args[0])
            name = node.args[1]
            if base and isinstance(name, ast.Constant) and isinstance(name.value, str):
                return f"{base}.{name.value}"
        return None

    @staticmethod
    def _starts(path: str | None, prefixes: Iterable[str]) -> bool:
        return path is not None and any(path == p or path.startswith(p + ".") for p in prefixes)

    # ------------------------------------------------------------------ passes

    def run(self) -> None:
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self._collect_names()
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
                self.entry = "ModelNew"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "kernel_function" \
                    and self.entry is None:
                self.entry = "kernel_function"
        for node in ast.walk(self.tree):
            method = getattr(self, f"visit_{type(node).__name__.lower()}", None)
            if method is not None:
                method(node)
        self._strings()

    def _collect_names(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.local_names.add(node.name)
            elif isinstance(node, ast.arg):
                self.local_names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.local_names.add(node.id)
        for _ in range(3):  # simple aliases: s = torch.cuda; Stream = getattr(torch.cuda, "Stream")
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    path = self.resolve(node.value)
                    if path and not path.startswith("builtins."):
                        self.aliases[node.targets[0].id] = path

    # ------------------------------------------------------------------ imports

    def visit_import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._imported(alias.name, node.lineno)

    def visit_importfrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            return
        module = node.module or ""
        flagged = self._imported(module, node.lineno)
        for alias in node.names:
            if alias.name == "*":
                self.warn("star_import", node.lineno, f"from {module} import *: names cannot be checked")
            elif not flagged:
                self._imported(f"{module}.{alias.name}", node.lineno, submodule=True)

    def _imported(self, name: str, line: int, submodule: bool = False) -> bool:
        """Check one imported module name; True when it was reported as a reference import."""
        ref = self.reference
        if self._starts(name, ("modulelens",)):
            self.add("reference_call", line, f"imports {name}: candidates may not use modulelens (it holds the reference)")
            return True
        if ref.module and not ref.is_torch_builtin and self._starts(name, (ref.module,)):
            self.add("reference_call", line, f"imports {name}, the module that defines the reference {ref.class_name}")
            return True
        if submodule:
            return False
        if self._starts(name, _THREAD_MODULES):
            self.add("thread_injection", line, f"imports {name}: no threads or processes in a kernel")
        elif self._starts(name, _NETWORK_MODULES):
            self.add("network", line, f"imports {name}: no network access in a kernel")
        elif self._starts(name, _INTROSPECTION_MODULES):
            self.add("introspection", line, f"imports {name}: introspection can reach the harness's data")
        elif self._starts(name, _DYNAMIC_MODULES):
            self.add("dynamic_code", line, f"imports {name}: dynamic imports/code hide what runs")
        elif self._starts(name, _SERIALIZATION_MODULES):
            self.add("cached_output", line, f"imports {name}: a kernel has no reason to load serialized results")
        elif self._starts(name, _MOCK_MODULES):
            self.add("monkey_patch", line, f"imports {name}: mocking is patching")
        return False

    # ------------------------------------------------------------------ definitions

    def visit_classdef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            path = self.resolve(base) or ""
            if path in ("torch.Tensor", "torch._C._TensorBase", "torch._C.TensorBase") or path.endswith(".Tensor"):
                self.add("lazy_eval", node.lineno, f"class {node.name} subclasses torch.Tensor (lazy/fake outputs)")
            if isinstance(base, ast.Name) and base.id == "Model":
                self.add("reference_call", node.lineno, f"class {node.name} subclasses Model, the KernelBench reference")
            self._reference_name(base, node.lineno)
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name in ("__torch_function__", "__torch_dispatch__"):
                self.add("lazy_eval", item.lineno, f"defines {item.name}: intercepting torch calls")

    def visit_functiondef(self, node: ast.FunctionDef) -> None:
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            path = self.resolve(target) or ""
            if path in ("triton.jit", "triton.autotune", "triton.heuristics", "triton.runtime.jit.jit",
                        "triton.language.jit") or path.startswith("triton.jit"):
                self.triton_kernels += 1
        if node.name in ("kernel_function", "forward"):
            params = {a.arg for a in node.args.args + node.args.kwonlyargs} - {"self"}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name) \
                        and sub.func.value.id in params and sub.func.attr.endswith("_") and not sub.func.attr.endswith("__"):
                    self.warn("input_mutation", sub.lineno, f"{sub.func.value.id}.{sub.func.attr}(): modifies an input in place")
                if isinstance(sub, (ast.Assign, ast.AugAssign)):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                    for t in targets:
                        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in params:
                            self.warn("input_mutation", sub.lineno, f"assigns into input {t.value.id}[...]")

    visit_asyncfunctiondef = visit_functiondef

    def visit_global(self, node: ast.Global) -> None:
        self.warn("global_state", node.lineno, f"global {', '.join(node.names)}: state kept across calls (a cache?)")

    def visit_try(self, node: ast.Try) -> None:
        computes = []
        for handler in node.handlers:
            for sub in ast.walk(handler):
                if isinstance(sub, ast.Call):
                    path = self.resolve(sub.func) or ""
                    if self._is_torch_compute(path, sub) or self._is_reference(path, sub.func):
                        computes.append(path or ast.unparse(sub.func))
        if computes:
            self.add("fallback", node.lineno, f"an except block computes with {computes[0]}: a fallback hides a failing kernel")
        else:
            self.warn("try_except", node.lineno, "try/except in a kernel: make sure no fallback path exists")

    visit_trystar = visit_try

    # ------------------------------------------------------------------ assignments

    def visit_assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._assigned(target, node.lineno, node.value)

    def visit_augassign(self, node: ast.AugAssign) -> None:
        self._assigned(node.target, node.lineno, node.value)

    def visit_annassign(self, node: ast.AnnAssign) -> None:
        self._assigned(node.target, node.lineno, node.value)

    def visit_delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._assigned(target, node.lineno, None)

    def _assigned(self, target: ast.AST, line: int, value: ast.AST | None) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._assigned(element, line, value)
            return
        if isinstance(target, ast.Subscript):
            path = self.resolve(target.value)
            if path == "os.environ":
                self.add("env_write", line, "writes os.environ")
            elif path == "sys.modules":
                self.add("introspection", line, "writes sys.modules")
            return
        if not isinstance(target, ast.Attribute):
            return
        if target.attr in ("allow_tf32", "allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"):
            if self.reference.wants_full_precision and not (isinstance(value, ast.Constant) and value.value is False):
                self.add("precision_downgrade", line, f"sets {ast.unparse(target)}: reduced-precision math on a fp32 reference")
            return
        path = self.resolve(target.value)
        if path is None or (path.startswith("builtins.") and path != "builtins"):
            return
        root = path.split(".")[0]
        if root in self.aliases.values() or path in self.aliases.values() or root in ("torch", "time", "triton", "os", "sys"):
            full = f"{path}.{target.attr}"
            rule = "timing_patch" if any(w in full for w in _TIMING_WORDS) else "monkey_patch"
            self.add(rule, line, f"assigns {full}: patching a library (timers, synchronize, ...) is refused")

    # ------------------------------------------------------------------ calls

    def visit_call(self, node: ast.Call) -> None:
        path = self.resolve(node.func)
        line = node.lineno
        attr = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if path:
            self._call_path(path, node, line)
        if attr in _STREAM_METHODS:
            self.add("stream_injection", line, f".{attr}(): work on other streams escapes the timing")
        if attr in _LOW_METHODS and not node.args and self.reference.wants_full_precision:
            self.add("precision_downgrade", line, f".{attr}() on a fp32 reference")
        if attr == "to" or attr == "type":
            for arg in [*node.args, *(k.value for k in node.keywords if k.arg == "dtype")]:
                self._low_dtype(arg, line)
        if attr == "forward" and not (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call)
                                      and self.resolve(node.func.value.func) == "builtins.super"):
            self.warn("forward_call", line, f"calls {ast.unparse(node.func)}(): is this the reference's forward?")
        if attr in _PATH_READS:
            self.warn("file_read", line, f".{attr}(): the candidate reads files")
        if attr == "data_ptr" or path == "builtins.id":
            self._pointer_key(node, line)
        if attr in _TENSOR_COMPUTE_METHODS and path is None:
            self.warn("pytorch_compute", line, f".{attr}(): PyTorch computes this, not the kernel")
        for keyword in node.keywords:
            if keyword.arg == "dtype":
                self._low_dtype(keyword.value, line)
            if keyword.arg == "input_precision" and isinstance(keyword.value, ast.Constant) \
                    and str(keyword.value.value).lower() != "ieee" and self.reference.wants_full_precision:
                self.add("precision_downgrade", line, f"input_precision={keyword.value.value!r}: TF32-class math on fp32")
            if keyword.arg == "allow_tf32" and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is False) \
                    and self.reference.wants_full_precision:
                self.add("precision_downgrade", line, "allow_tf32 on a fp32 reference")
        if path == "triton.language.dot" and self.reference.wants_full_precision and not any(
                k.arg in ("input_precision", "allow_tf32") for k in node.keywords):
            self.warn("tf32_dot", line, 'tl.dot without input_precision="ieee": on NVIDIA GPUs fp32 inputs use TF32 '
                                        "(about 1e-3 error)")
        self._reference_name(node.func, line)

    def _call_path(self, path: str, node: ast.Call, line: int) -> None:
        if path in ("torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load",
                    "cupy.RawKernel", "cupy.RawModule", "cuda.core.experimental.Program"):
            self.cuda_sources += 1
        if path in ("triton.jit",) or path.startswith("triton.autotune"):
            self.triton_kernels += 1
        if self._starts(path, _STREAM_CALLS):
            self.add("stream_injection", line, f"{path}(): work on other streams escapes the timing")
        elif path in _PROCESS_CALLS:
            self.add("thread_injection", line, f"{path}(): no processes in a kernel")
        elif path in ("builtins.exec", "builtins.eval", "builtins.compile", "builtins.__import__"):
            self.add("dynamic_code", line, f"{path.split('.')[-1]}(): dynamic code hides what runs")
        elif path in ("builtins.globals", "builtins.locals", "builtins.vars", "sys._getframe", "sys.settrace",
                      "sys.setprofile", "sys._current_frames"):
            self.add("introspection", line, f"{path}(): introspection can reach the harness's data")
        elif path in ("builtins.setattr", "builtins.delattr") and node.args:
            target = self.resolve(node.args[0])
            if target and not target.startswith("builtins"):
                rule = "timing_patch" if any(w in target for w in _TIMING_WORDS) else "monkey_patch"
                self.add(rule, line, f"{path.split('.')[-1]}({target}, ...): patching a library is refused")
        elif path == "builtins.getattr" and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant):
            self._dynamic_getattr(self.resolve(node.args[0]), line)
        elif path in ("operator.attrgetter", "operator.methodcaller") and node.args \
                and not isinstance(node.args[0], ast.Constant):
            self.add("dynamic_getattr", line, f"{path}() with a computed name: hides which torch op runs")
        elif path in _PICKLE_LOADS:
            self.add("cached_output", line, f"{path}(): loading saved results (pickle) is refused")
        elif path in _FILE_READS:
            self.warn("file_read", line, f"{path}(): the candidate reads files")
        elif path in ("os.putenv", "os.unsetenv") or (self._starts(path, ("os.environ",)) and path.split(".")[-1] in (
                "update", "setdefault", "pop", "clear", "__setitem__", "popitem")):
            self.add("env_write", line, f"{path}(): writes the environment")
        elif path == "torch.set_float32_matmul_precision" and self.reference.wants_full_precision:
            value = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            if value != "highest":
                self.add("precision_downgrade", line, f"torch.set_float32_matmul_precision({value!r}) on a fp32 reference")
        elif path in ("torch.compile", "torch._dynamo.optimize"):
            self.warn("torch_compile", line, f"{path}(): generated by torch.compile, not a hand-written kernel")
        elif path in ("torch.Tensor._make_subclass", "torch.Tensor.__new__", "torch._C._TensorBase.__new__",
                      "torch.Tensor.as_subclass") or path.endswith("._make_subclass"):
            self.add("lazy_eval", line, f"{path}(): tensor subclasses can fake outputs")
        elif self._starts(path, ("unittest.mock", "mock")):
            self.add("monkey_patch", line, f"{path}(): mocking is patching")
        if self._is_reference(path, node.func):
            pass  # reported by _reference_name
        elif self._is_torch_compute(path, node):
            self.warn("pytorch_compute", line, f"{path}(): PyTorch computes this, not the kernel")

    def _dynamic_getattr(self, target: str | None, line: int) -> None:
        """``getattr(torch..., computed)`` is an error (``getattr(F, "lin" + "ear")`` reaches the
        reference's own op past every name-based rule); on other objects a warning."""
        if target is not None and (target == "torch" or target.startswith("torch.")):
            self.add("dynamic_getattr", line, f"getattr({target}, <computed name>): dynamic access to torch compute "
                                              "hides which op runs")
        else:
            self.warn("dynamic_getattr", line, "getattr with a computed name: the checker cannot see what is used")

    def _is_torch_compute(self, path: str, node: ast.Call) -> bool:
        if not path:
            return False
        if path.startswith("torch.nn.functional.") or path.startswith("torch.ops.aten.") or path.startswith("torch._C._nn."):
            return True
        if path.startswith("torch.nn.") and path.split(".")[2] not in _NN_ALLOWED:
            return True
        parts = path.split(".")
        return len(parts) == 2 and parts[0] == "torch" and parts[1] in _TORCH_COMPUTE

    def _is_reference(self, path: str | None, func: ast.AST) -> bool:
        ref = self.reference
        if isinstance(func, ast.Name) and func.id == "Model":
            return True
        if not ref.class_name:
            return False
        if ref.is_torch_builtin and path:
            last = path.split(".")[-1]
            if path.startswith("torch.nn.") and last == ref.class_name:
                return True
            if last == ref.functional_name and (path.startswith("torch.nn.functional.") or (path.count(".") == 1
                                                and path.startswith("torch."))):
                return True
        return False

    def _reference_name(self, node: ast.AST, line: int) -> None:
        path = self.resolve(node)
        if self._is_reference(path, node):
            what = "Model, the KernelBench reference" if isinstance(node, ast.Name) and node.id == "Model" else (
                f"{path}, the reference module itself" if self.reference.is_torch_builtin else path)
            self.add("reference_call", line, f"uses {what}")

    def _low_dtype(self, node: ast.AST, line: int) -> None:
        if not self.reference.wants_full_precision:
            return
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ("torch.float16", "float16",
                                                                                              "torch.bfloat16", "bfloat16"):
            self.add("precision_downgrade", line, f"casts to {node.value} on a fp32 reference")

    def _pointer_key(self, node: ast.Call, line: int) -> None:
        parent = self.parents.get(node)
        hops = 0
        while parent is not None and hops < 4:
            if isinstance(parent, ast.Subscript) and node in ast.walk(parent.slice):
                self.add("cached_output", line, "a cache keyed on tensor addresses (data_ptr()/id()) returns stale results")
                return
            if isinstance(parent, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops):
                self.add("cached_output", line, "a cache keyed on tensor addresses (data_ptr()/id()) returns stale results")
                return
            if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr in (
                    "get", "setdefault", "pop", "__contains__", "__getitem__"):
                self.add("cached_output", line, "a cache keyed on tensor addresses (data_ptr()/id()) returns stale results")
                return
            if isinstance(parent, ast.Dict):
                self.add("cached_output", line, "a cache keyed on tensor addresses (data_ptr()/id()) returns stale results")
                return
            parent = self.parents.get(parent)
            hops += 1

    # ------------------------------------------------------------------ attributes and names

    def visit_attribute(self, node: ast.Attribute) -> None:
        if node.attr in _FRAME_ATTRS and not (node.attr == "__dict__" and isinstance(node.value, ast.Name)
                                              and node.value.id == "self"):
            self.add("introspection", node.lineno, f".{node.attr}: reaching into frames/modules/closures")
        path = self.resolve(node)
        if path == "sys.modules":
            self.add("introspection", node.lineno, "sys.modules: reaching other modules' objects")
        if path and (path.startswith("triton.language.") or path.startswith("torch.")) and \
                path.split(".")[-1] in _LOW_DTYPES and self.reference.wants_full_precision and \
                not isinstance(self.parents.get(node), ast.Attribute):
            self.add("precision_downgrade", node.lineno, f"uses {path} on a fp32 reference")
        if isinstance(node.ctx, ast.Load) and not self._is_callee_or_base(node):
            self._reference_name(node, node.lineno)

    def visit_name(self, node: ast.Name) -> None:
        if node.id == "__builtins__":
            self.add("introspection", node.lineno, "__builtins__: patching or reaching builtins")
        ref = self.reference
        if not isinstance(node.ctx, ast.Load) or node.id in self.local_names:
            return
        if ref.class_name and not ref.is_torch_builtin and node.id == ref.class_name:
            self.add("reference_call", node.lineno, f"uses {node.id}, the reference class")
        elif node.id == "Model":
            self.add("reference_call", node.lineno, "uses Model, the KernelBench reference")
        elif node.id in self.aliases and not self._is_callee_or_base(node):
            self._reference_name(node, node.lineno)

    def _is_callee_or_base(self, node: ast.AST) -> bool:
        """True when ``node`` is the function of a call or the object of an attribute (checked there)."""
        parent = self.parents.get(node)
        return (isinstance(parent, ast.Call) and parent.func is node) or isinstance(parent, ast.Attribute)

    def visit_binop(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.warn("pytorch_compute", node.lineno, "a @ b: PyTorch computes this matmul, not the kernel")

    def visit_list(self, node: ast.List) -> None:
        self._embedded(node)

    def visit_tuple(self, node: ast.Tuple) -> None:
        self._embedded(node)

    def _embedded(self, node: ast.List | ast.Tuple) -> None:
        if isinstance(self.parents.get(node), (ast.List, ast.Tuple)):
            return
        numbers = sum(1 for sub in ast.walk(node) if isinstance(sub, ast.Constant) and isinstance(sub.value, (int, float)))
        if numbers > _EMBEDDED_LIMIT:
            self.warn("embedded_data", node.lineno, f"a literal with {numbers} numbers: embedded data (cached outputs?)")

    def _strings(self) -> None:
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            text = node.value
            if "__global__" in text:
                self.cuda_sources += 1
                if "cudaStreamCreate" in text or "cudaStreamNonBlocking" in text:
                    self.add("stream_injection", node.lineno, "the CUDA source creates streams")
                if self.reference.wants_full_precision and re.search(r"__half|__float2half|__nv_bfloat16|half2", text):
                    self.add("precision_downgrade", node.lineno, "the CUDA source computes in half/bf16 on a fp32 reference")
                continue
            parent = self.parents.get(node)
            if isinstance(parent, ast.Expr):  # a docstring or a bare string: not code
                continue
            lowered = text.lower()
            for word in _SUSPICIOUS_STRINGS:
                if word.lower() in lowered:
                    self.add("cached_output", node.lineno, f"string {text[:60]!r} points at recorded data or saved results")
                    break
