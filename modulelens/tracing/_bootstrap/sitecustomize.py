"""Loaded by every Python process started under `modulelens run` (this folder is put first on
PYTHONPATH). It turns capture on before the user's code is imported, then hands over to any
sitecustomize the environment had before."""

import os
import sys


def _activate() -> None:
    if not os.environ.get("MODULELENS_RUN_CONFIG"):
        return
    try:
        from modulelens.tracing.runner import activate_from_env

        activate_from_env()
    except Exception as error:  # fail open: the user's job must still run
        print(f"modulelens: capture could not start: {error}", file=sys.stderr)


def _chain_original() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        print(f"modulelens: the original sitecustomize failed: {error}", file=sys.stderr)


_activate()
_chain_original()
