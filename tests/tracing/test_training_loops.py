"""The tracer fails open in real training loops (issue 22, defect 1): Lightning (``self.log`` walks
its ``ResultMetric`` modules' ``__dict__``, where constructor records once lived and killed the job),
accelerate and peft, each an unmodified script under ``modulelens run``; every capture is then
reloaded and replayed in a fresh process."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from child_process import PYTHON, SUPPORT_DIR, subprocess_env

LOOPS = SUPPORT_DIR / "training_loops"
JOBS = {  # script -> targets
    "lightning_train.py": ["body", "body.0"],
    "accelerate_train.py": ["", "0"],
    "peft_train.py": ["*.layers.0", "*.layers.1.self_attn", "*.layers.0.self_attn.q_proj"],
}
REPLAY = '''
import json, sys
import modulelens
out = {}
for ref in sys.argv[2:]:
    cap = modulelens.load(ref, repo=sys.argv[1], trust_source=True)
    out[ref] = str(cap.replay())
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("loops")
    results = {}
    for script, targets in JOBS.items():
        name = script.removesuffix(".py")
        options = [option for target in targets for option in ("-t", target)]
        cmd = [PYTHON, "-m", "modulelens", "run", "--repo", str(root / "repo"), "--json", "--name", name,
               "--max-calls", "2", *options, "--", PYTHON, script]
        results[name] = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=600, cwd=LOOPS)
    refs = [s["ref"] for r in results.values() if r.returncode == 0 for s in json.loads(r.stdout)["result"]["saved"]]
    replayed = subprocess.run([PYTHON, "-c", REPLAY, str(root / "repo"), *refs], capture_output=True, text=True,
                              env=subprocess_env(), timeout=600, cwd=root)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    return {"runs": results, "replayed": json.loads(replayed.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("name", [script.removesuffix(".py") for script in JOBS])
def test_the_training_job_runs_to_its_end_and_every_target_is_saved(jobs: dict[str, Any], name: str) -> None:
    run = jobs["runs"][name]
    assert run.returncode == 0, run.stderr[-3000:]
    assert "TRAINED" in run.stderr  # with --json the job's own output goes to stderr
    result = json.loads(run.stdout)["result"]
    assert result["ok"] and result["missing_targets"] == [], result
    assert len(result["saved"]) == len(JOBS[f"{name}.py"])


def test_every_capture_of_the_training_loops_replays_in_a_fresh_process(jobs: dict[str, Any]) -> None:
    assert len(jobs["replayed"]) == sum(len(targets) for targets in JOBS.values())
    for ref, report in jobs["replayed"].items():
        assert ": PASS" in report.splitlines()[0], f"{ref}: {report}"
