"""The first capture of a process imports neither torch.compile's machinery nor DTensor's when the
job uses neither (issue 11: ~8 s of ``torch._dynamo`` plus ~4 s of ``torch.distributed.tensor``)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from child_process import PYTHON, subprocess_env

CHILD = textwrap.dedent('''
    import json, sys, tempfile, time
    import torch, modulelens
    from torch import nn
    modulelens.track_init()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as repo:
        with modulelens.capture(model, targets=["0"], repo=repo, name="x") as cap:
            model(torch.randn(2, 8))
        saved = [v.ref for v in cap.saved]
    print(json.dumps({"saved": saved, "seconds": time.perf_counter() - start,
                      "imported": [m for m in ("torch._dynamo", "torch.distributed.tensor") if m in sys.modules]}))
''')


def test_first_capture_imports_no_compiler_or_dtensor(tmp_path: Path) -> None:
    result = subprocess.run([PYTHON, "-c", CHILD], capture_output=True, text=True, env=subprocess_env(),
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["saved"] == ["x/0:v1"]
    assert out["imported"] == []
