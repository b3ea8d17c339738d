"""The processes of tests/restore/test_clean_load.py (issue 34, defect 1): ``python clean_load_worker.py
capture REPO`` captures the scenarios of clean_load_models.py and prints ``{label: ref}``; ``check
REPO REFS_JSON`` is the user's fresh process: it loads and replays each capture before importing
any of the libraries (so the load imports them), then uses those libraries itself and prints what
it found as JSON; ``reference`` is a process that never loads anything.
"""

from __future__ import annotations

import functools
import gc
import json
import random
import sys
from typing import Any

import numpy
import torch

import modulelens


def capture(repo: str) -> dict[str, str]:
    import subprocess
    from pathlib import Path

    script = Path(__file__).with_name("clean_load_script.py")
    run = subprocess.run([sys.executable, str(script), repo], capture_output=True, text=True, check=True)
    refs = {"ode": run.stdout.strip().splitlines()[-1]}
    modulelens.track_init()
    from clean_load_models import SCENARIOS

    for label, (build, run) in SCENARIOS.items():
        torch.manual_seed(0)
        model = build()
        with modulelens.capture(model, targets="", repo=repo, name=f"clean/{label}") as cap:
            run(model)
        refs[label] = cap.saved[0].ref
    return refs


def _rng_states() -> list[Any]:
    return [torch.get_rng_state().tolist(), numpy.random.get_state()[1].tolist(), random.getstate()]


def _meta_tensors_outside(module: torch.nn.Module) -> int:
    """Meta tensors anywhere in the process (as the garbage collector sees it) but the module's own;
    garbage (a first attempt at building that was given up) is collected first."""
    gc.collect()
    own = {id(t) for t in (*module.parameters(), *module.buffers())}
    return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and obj.is_meta and id(obj) not in own)


def _cached_tensors(module: Any) -> list[torch.Tensor]:
    """The tensors the ``lru_cache``s of ``module`` hold (the cache dict is a referent of its wrapper)."""
    found = []
    for value in vars(module).values():
        if isinstance(value, functools._lru_cache_wrapper):  # type: ignore[attr-defined]
            for referent in gc.get_referents(value):
                if isinstance(referent, dict):
                    found += [v for v in referent.values() if isinstance(v, torch.Tensor)]
    return found


def _later_use() -> dict[str, Any]:
    """The user's own code after the loads: a dopri5 solve and a new e3nn model."""
    import torchdiffeq
    from clean_load_models import e3nn_inputs, e3nn_model

    solution = torchdiffeq.odeint(lambda t, y: -y, torch.ones(2), torch.tensor([0.0, 1.0]), method="dopri5")
    torch.manual_seed(5)
    return {"dopri5": solution[-1].tolist(), "e3nn": e3nn_model()(*e3nn_inputs()).sum().item()}


def check(repo: str, refs: dict[str, str]) -> dict[str, Any]:
    torch.manual_seed(11)
    numpy.random.seed(11)
    random.seed(11)
    defaults = (torch.get_default_dtype(), str(torch.get_default_device()), torch.is_grad_enabled())
    found: dict[str, Any] = {"loads": {}, "imported_before_load": sorted(
        name for name in ("torchdiffeq", "e3nn", "clean_load_models") if name in sys.modules)}
    for label, ref in refs.items():
        before = _rng_states()
        cap = modulelens.load(ref, repo=repo)
        module = cap.module
        found["loads"][label] = {"rng_unchanged": _rng_states() == before,
                                 "meta_tensors_outside": _meta_tensors_outside(module)}
        report = cap.replay()
        found["loads"][label].update(status=report.status, mode=report.mode, notes=cap.notes)
    found["defaults_unchanged"] = defaults == (torch.get_default_dtype(), str(torch.get_default_device()),
                                              torch.is_grad_enabled())
    from clean_load_models import TABLE, basis
    from e3nn.o3 import _wigner
    from torchdiffeq._impl import dopri5

    tableau = dopri5._DORMAND_PRINCE_SHAMPINE_TABLEAU
    found["devices"] = {
        "dopri5 tableau": sorted({str(t.device) for t in (tableau.alpha, *tableau.beta, tableau.c_sol)}),
        "e3nn cache": sorted({str(t.device) for t in _cached_tensors(_wigner)}),
        "module table": [str(TABLE.device)],
        "module cache": sorted({str(t.device) for t in _cached_tensors(sys.modules["clean_load_models"])}),
    }
    found["basis"] = basis(6).tolist()
    found["later_use"] = _later_use()
    return found


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "capture":
        print(json.dumps(capture(sys.argv[2])))
    elif command == "check":
        print(json.dumps(check(sys.argv[2], json.loads(sys.argv[3]))))
    else:
        from clean_load_models import basis

        print(json.dumps({"later_use": _later_use(), "basis": basis(6).tolist()}))
