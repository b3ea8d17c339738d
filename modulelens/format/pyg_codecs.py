"""torch_geometric's graphs (``Data``, ``HeteroData``) and their mini-batches (``Batch``) as call data.

A GNN model takes its graph as one object; without a codec the whole input was an ``unrecorded``
marker (issue 22). Installed lazily (``format/values.py``) once the job imports ``torch_geometric``.
Both are state codecs (docs/codecs.md): the tracer copies a graph attribute by attribute when the
call starts, records it again after the call (a model may set ``data.x``), and replay compares both.

* A graph is stored as ``to_dict()``: every attribute of a ``Data`` (``x``, ``edge_index``, ``y``,
  any other the job set, ``batch`` and ``ptr`` of a batch), or per node and edge type of a
  ``HeteroData`` (``_global_store`` for its graph-level attributes). It is rebuilt empty (its
  class's own ``__init__`` is not called with arguments, so a ``Data`` subclass with required
  arguments rebuilds too) and filled attribute by attribute.
* A ``Batch`` made by ``Batch.from_data_list`` is of a class torch_geometric generates at run time
  (``DataBatch``, module ``abc``), which no other process can import: it is recorded as
  ``torch_geometric.data.batch:Batch`` with the graph class it batches (``base``), and rebuilt with
  ``Batch(_base_cls=base)`` (the same generated class). ``_slice_dict``, ``_inc_dict`` and
  ``_num_graphs``, which ``to_data_list()``, ``get_example()`` and ``num_graphs`` read, are kept.
"""

from __future__ import annotations

from typing import Any

from modulelens.errors import UntrustedCodeError
from modulelens.format.values import register_state_codec

_BATCH_FIELDS = ("_slice_dict", "_inc_dict", "_num_graphs")


def _graph_parts(data: Any) -> dict[str, object]:
    return {"store": data.to_dict()}


def _batch_parts(batch: Any) -> dict[str, object]:
    parts = {"store": batch.to_dict(), "base": _base_class(type(batch))}
    parts.update({name.lstrip("_"): getattr(batch, name, None) for name in _BATCH_FIELDS})
    return parts


def _base_class(batch_class: type) -> type:
    """The graph class a generated ``<Base>Batch`` class batches (its bases are ``(Batch, Base)``)."""
    from torch_geometric.data import Batch

    bases = [b for b in batch_class.__bases__ if b is not Batch]
    return bases[0] if bases else batch_class


def _new_graph(cls: type, parts: dict[str, Any]) -> object:
    from torch_geometric.data import Data, HeteroData

    graph = cls.__new__(cls)  # type: ignore[call-overload]  # mypy takes a class's __new__ for type.__new__
    (HeteroData if issubclass(cls, HeteroData) else Data).__init__(graph)
    _fill(graph, parts["store"])
    return graph


def _new_batch(cls: type, parts: dict[str, Any]) -> object:
    from torch_geometric.data import Batch
    from torch_geometric.data.data import BaseData

    base = parts["base"]
    if not (isinstance(base, type) and issubclass(base, BaseData)):
        raise UntrustedCodeError(f"a torch_geometric Batch names {base!r}, which is not a graph class; refused")
    batch = Batch(_base_cls=base)  # torch_geometric's own generated <Base>Batch class
    _fill(batch, parts["store"])
    for name in _BATCH_FIELDS:
        value = parts.get(name.lstrip("_"))
        if value is not None:
            setattr(batch, name, value)
    return batch


def _fill(graph: object, store: dict[Any, Any]) -> None:
    from torch_geometric.data import HeteroData

    if not isinstance(graph, HeteroData):
        for name, value in store.items():
            setattr(graph, name, value)
        return
    for key, values in store.items():
        target = graph._global_store if key == "_global_store" else graph[key]
        for name, value in values.items():
            setattr(target, name, value)


def install() -> None:
    from torch_geometric.data import Batch
    from torch_geometric.data.data import BaseData

    register_state_codec(BaseData, name="torch_geometric.Data", attributes=_graph_parts, rebuild=_new_graph)
    # registered after the graph codec, so it wins for DataBatch (a subclass of both Batch and Data)
    register_state_codec(Batch, name="torch_geometric.Batch", attributes=_batch_parts, rebuild=_new_batch,
                         stored_class=lambda _batch: Batch)
