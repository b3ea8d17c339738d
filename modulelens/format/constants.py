"""The capture format's constants (spec: docs/format.md) and :func:`hooks_not_rebuilt`: the parts
of ``format/spec.py`` read at run time, here without ``typing`` (spec's ``TypedDict``\\ s import it,
~3 ms of a fresh ``modulelens show``, issue 37). ``format/spec.py`` re-exports each of them."""

from __future__ import annotations

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if _TYPE_CHECKING:
    from modulelens.format.spec import ModuleInfo

FORMAT_NAME = "modulelens.capture"
FORMAT_VERSION = 3  # the newest version this modulelens writes and reads (docs/format.md, "Versions")
# A document is written in the oldest version that can say what it holds, so older readers keep
# reading every capture they can: version 3 only adds ``module.method`` and ``calls[i].vmap``, which
# a version-2 reader would ignore (replaying ``encode``'s calls through ``forward``, an ensemble's
# stacked inputs unbatched).
METHODLESS_VERSION = 2
# Op traces (docs/format.md, "Op traces"), for the torch-free checker; format/op_trace.py, which the
# kernel worker loads by path and so imports nothing from here, has the same two (a test holds them equal).
OP_TRACE_FORMAT = "modulelens.op-trace"
OP_TRACE_VERSION = 1

# Sparse tensor values (``$type`` ``sparse``): layout name -> the parts it is stored as, in
# constructor order (format/layouts.py). Nested tensor values (``$type`` ``nested``) have these layouts.
SPARSE_PARTS: dict[str, tuple[str, ...]] = {
    "sparse_coo": ("indices", "values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
    "sparse_bsr": ("crow_indices", "col_indices", "values"),
    "sparse_csc": ("ccol_indices", "row_indices", "values"),
    "sparse_bsc": ("ccol_indices", "row_indices", "values"),
}
NESTED_LAYOUTS = ("strided", "jagged")

# CPU kernels pick their vector loops by the data's address: MKL's matrix-vector product (a
# Linear with one output) sums a weight that starts 4 or 8 bytes past a 64-byte boundary in
# another order than an aligned one, a 1-ULP difference (sentence-transformers' CrossEncoder head:
# transformers maps its safetensors weights at such addresses, a copy lands on a boundary). A
# recorded tensor keeps its address modulo this many bytes (AVX-512's vector width), and the load
# puts it at the same offset.
ADDRESS_ALIGNMENT = 64


def hooks_not_rebuilt(module: ModuleInfo) -> list[str]:
    """``"head: forward hook mypkg:clip"`` for each hook in ``module.tree`` that a rebuild does not
    register again: the job added it after construction (docs/fidelity.md, "Hooks")."""
    found = []
    for path, entry in module.get("tree", {}).items():
        found += [f"{path or '<root>'}: {hook['kind'].replace('_', '-')} hook {hook['hook']}"
                  for hook in entry.get("hooks", []) if not hook["rebuilt"]]
        if entry.get("forward_replaced"):  # a forward set on the instance: the class's forward runs instead
            found.append(f"{path or '<root>'}: forward replaced on the instance by {entry['forward_replaced']}")
    return found
