"""A load changes nothing in the process outside the module it returns (issue 34, defect 1).

The rebuild used to run class resolution, stored-source execution and the constructor inside
``with torch.device("meta")``: a library imported for the first time there kept its module-level
tensors on meta (torchdiffeq's ``dopri5`` tableau: every later solve in the process failed), and a
constructor that filled an ``lru_cache`` cached meta tensors (e3nn's Clebsch-Gordan tables: the
load and every later e3nn model failed). Captured in one process, then loaded and replayed in the
user's fresh process, which goes on to use the same libraries itself and is compared with a process
that never loaded anything. Scenarios: tests/support/clean_load_models.py, clean_load_script.py.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from child_process import PYTHON, SUPPORT_DIR, subprocess_env

pytest.importorskip("torchdiffeq")
pytest.importorskip("e3nn")


def _worker(*args: str) -> Any:
    result = subprocess.run([PYTHON, str(SUPPORT_DIR / "clean_load_worker.py"), *args], capture_output=True,
                            text=True, env=subprocess_env(), timeout=600, cwd=SUPPORT_DIR)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    repo = str(tmp_path_factory.mktemp("clean") / "repo")
    refs = _worker("capture", repo)
    return {"after_loads": _worker("check", repo, json.dumps(refs)), "never_loaded": _worker("reference")}


@pytest.mark.parametrize("label", ["ode", "e3nn", "stateful"])
def test_the_load_replays_bit_exact_and_leaves_no_meta_tensor_or_moved_generator(checked: dict[str, Any],
                                                                                 label: str) -> None:
    found = checked["after_loads"]
    assert found["imported_before_load"] == []  # the loads imported torchdiffeq, e3nn and the models
    load = found["loads"][label]
    assert (load["status"], load["mode"]) == ("PASS", "bit-exact"), load
    assert load["meta_tensors_outside"] == 0  # none anywhere in the process but the module's own
    assert load["rng_unchanged"]  # torch's, numpy's and Python's generators as they were


def test_libraries_the_load_imported_keep_real_tables_and_caches(checked: dict[str, Any]) -> None:
    found = checked["after_loads"]
    assert found["devices"] == {"dopri5 tableau": ["cpu"], "e3nn cache": ["cpu"], "module table": ["cpu"],
                                "module cache": ["cpu"]}
    assert found["defaults_unchanged"]


def test_the_users_own_code_computes_after_the_loads_what_it_computes_without_them(checked: dict[str, Any]) -> None:
    after, never = checked["after_loads"], checked["never_loaded"]
    assert after["later_use"] == never["later_use"]  # a dopri5 solve, a new e3nn model
    assert after["basis"] == never["basis"]  # the table the models' own lru_cache kept


def test_a_class_rebuilt_from_stored_source_is_not_reported_as_a_changed_structure(checked: dict[str, Any]) -> None:
    notes = checked["after_loads"]["loads"]["ode"]["notes"]
    assert any("rebuilt from the source stored with your own capture" in note for note in notes)
    assert not any("structure changed" in note for note in notes), notes


def test_a_module_kept_outside_the_tree_is_built_for_real(checked: dict[str, Any]) -> None:
    # e3nn keeps its generated code (with the Clebsch-Gordan constants as buffers) in a plain attribute
    notes = checked["after_loads"]["loads"]["e3nn"]["notes"]
    assert notes == ["constructed with real weights on the CPU, then given the recorded ones (it keeps a tp_forward "
                     "outside its submodules): the load is slower than with empty weights, the module the same"]


def test_only_the_building_thread_gets_meta_weights_and_nothing_else_does() -> None:
    import threading

    import torch
    from torch import nn

    from modulelens.restore.construction import empty_weights

    built: dict[str, nn.Module] = {}
    ready, done = threading.Event(), threading.Event()

    def other_thread() -> None:
        ready.wait()
        built["other"] = nn.Linear(3, 3)  # while the main thread is inside empty_weights()
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with empty_weights():
        layer = nn.Linear(3, 3)
        table = torch.arange(4.0)  # not a parameter or buffer: a real tensor
        ready.set()
        done.wait(timeout=60)
    worker.join()
    assert layer.weight.is_meta and layer.bias.is_meta and not table.is_meta
    assert not built["other"].weight.is_meta
    assert not nn.Linear(3, 3).weight.is_meta  # and nothing is left behind
