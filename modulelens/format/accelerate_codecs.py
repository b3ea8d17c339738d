"""accelerate's model hooks, the objects ``add_hook_to_module`` attaches to a module (issue 34, defect 3).

Installed lazily (``format/values.py``) once the job imports ``accelerate``. A hook (a subclass of
``accelerate.hooks.ModelHook``: accelerate's own ``SequentialHook`` or ``LayerwiseCastingHook``, or
the user's) is stored as its class and attributes, each through the codecs, and rebuilt without
``__init__`` (``cls.__new__`` and the attributes set back): what it does lives in its class, which
the import rules resolve like any module class. A hook with an attribute no codec stores is not
stored, and the capture says that its module runs without it.
"""

from __future__ import annotations

from collections.abc import Mapping

from modulelens.format.values import register_codec


def _attributes(hook: object) -> dict[str, object]:
    return dict(vars(hook))


def _rebuild(cls: type, attributes: Mapping[str, object]) -> object:
    hook = cls.__new__(cls)  # type: ignore[call-overload]  # mypy takes a class's __new__ for type.__new__
    hook.__dict__.update(attributes)
    return hook


def install() -> None:
    from accelerate.hooks import ModelHook

    register_codec(ModelHook, _attributes, _rebuild, name="accelerate.ModelHook", subclasses=True)
