"""Global settings of libraries that decide what a call computes: gpytorch's and linear_operator's.

botorch's ``model.posterior(X)`` runs the model under ``gpytorch.settings.fast_pred_var()`` (and
other settings of ``gpt_posterior_settings()``); the settings are class attributes that those
context managers set while they are entered. A replay that ran the recorded call without them
computed the covariance another way and FAILed by 1e-16, a module that was right. So each recorded
call keeps the settings in force on entry (``calls[i].settings``, docs/format.md), read only from
the settings modules the job has imported, and a replay runs under them (restored after).

A setting is named ``"<module>:<Class>.<attribute>"``, the module one of :data:`SETTINGS_MODULES`,
the attribute one of those the settings classes keep their state in, the value a JSON scalar: a
capture sets nothing else, on no other class.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import sys
from collections.abc import Iterator, Mapping

from modulelens.errors import CorruptCaptureError

SETTINGS_MODULES = ("gpytorch.settings", "linear_operator.settings")
# where gpytorch's settings classes keep their state (_feature_flag, _value_context, _dtype_value_context)
_ATTRIBUTES = ("_state", "_global_value", "_global_float_value", "_global_double_value", "_global_half_value")
_MISSING = object()

Setting = bool | int | float | str | None


def library_settings() -> dict[str, Setting]:
    """The settings in force now, of the settings modules already imported (``{}`` without them).
    Runs at every recorded call where gpytorch is imported: the settings are found once per set of
    imported modules, and only their values read each time."""
    imported = tuple(sys.modules.get(name) for name in SETTINGS_MODULES)
    if not any(imported):
        return {}
    found: dict[str, Setting] = {}
    for key, cls, attribute in _settings_of(imported):
        value = getattr(cls, attribute, _MISSING)
        if _is_setting(value):
            found[key] = value  # type: ignore[assignment]  # (_is_setting checked it)
    return found


@functools.lru_cache(maxsize=4)
def _settings_of(imported: tuple[object, ...]) -> list[tuple[str, type, str]]:
    """``(key, class, attribute)`` of every setting the imported settings modules define."""
    settings = []
    seen: set[int] = set()  # gpytorch re-exports linear_operator's classes: each once
    for module_name, module in zip(SETTINGS_MODULES, imported, strict=True):
        for class_name, cls in (vars(module).items() if module is not None else ()):
            if not isinstance(cls, type) or class_name.startswith("_") or id(cls) in seen:
                continue
            seen.add(id(cls))
            settings += [(f"{module_name}:{class_name}.{attribute}", cls, attribute) for attribute in _ATTRIBUTES
                         if hasattr(cls, attribute)]
    return settings


def _is_setting(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value))


def parse_setting(key: str, value: object) -> tuple[str, str, str]:
    """``(module, class, attribute)`` of a recorded setting, checked without importing anything.

    Raises:
        CorruptCaptureError: ``key`` names another module, class or attribute (the format allows no
            other: a capture sets nothing else), or ``value`` is no JSON scalar.
    """
    module_name, _, rest = key.partition(":")
    class_name, _, attribute = rest.rpartition(".")
    if module_name not in SETTINGS_MODULES or attribute not in _ATTRIBUTES or not class_name.isidentifier() \
            or class_name.startswith("_"):
        raise CorruptCaptureError(f"setting {key!r} is not a setting of {', '.join(SETTINGS_MODULES)}; refused")
    if not _is_setting(value):
        raise CorruptCaptureError(f"setting {key!r}: {value!r} is not a JSON scalar")
    return module_name, class_name, attribute


def setting_class(key: str, value: object) -> tuple[type, str]:
    """The class and attribute a recorded setting names (its module imported: one of
    :data:`SETTINGS_MODULES`, whose import the capture's own module needed anyway).

    Raises:
        CorruptCaptureError: see :func:`parse_setting`; or the module has no such settings class.
    """
    module_name, class_name, attribute = parse_setting(key, value)
    try:
        cls = vars(importlib.import_module(module_name)).get(class_name)
    except ImportError as error:
        raise CorruptCaptureError(f"setting {key!r}: {module_name} cannot be imported here ({error})") from None
    if not isinstance(cls, type) or not hasattr(cls, attribute):
        raise CorruptCaptureError(f"setting {key!r}: {module_name} has no such setting")
    return cls, attribute


@contextlib.contextmanager
def settings_applied(settings: Mapping[str, object]) -> Iterator[None]:
    """The block runs under ``settings`` (as recorded); each class gets back what it held after."""
    previous: list[tuple[type, str, object]] = []
    try:
        for key, value in settings.items():
            cls, attribute = setting_class(key, value)
            previous.append((cls, attribute, vars(cls).get(attribute, _MISSING)))
            setattr(cls, attribute, value)
        yield
    finally:
        for cls, attribute, old in reversed(previous):
            if old is _MISSING:
                delattr(cls, attribute)  # it was inherited: the class falls back to its base's again
            else:
                setattr(cls, attribute, old)
