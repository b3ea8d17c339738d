"""Made once, by the code of commit 8bcdb2b (before the Store refactor of issue 24), and never
regenerated: a layout-2 repo as modulelens wrote it, on disk (``repo/``) and in object storage
(``bucket/``: every object of a ``memory://`` repo, by key).

Run: ``python tests/format/golden_v2/make_golden.py tests/format/golden_v2``.

Both hold the same history: ``golden/mlp`` saved four times (a 1 MiB weight in a blob of its own,
small payloads in packs), v2 aliased ``stable`` and given a profile report, v3 removed (its number
stays used: a tombstone), and ``other`` saved once (packs only).
"""

import json
import shutil
import sys
from pathlib import Path

import fsspec
import torch
from torch import nn

import modulelens

out = Path(sys.argv[1])


def history(repo: modulelens.Repo) -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))  # 1 MiB weight: its own blob
    mlp.train()
    for step in range(4):
        with modulelens.capture(mlp, targets=["Sequential"], name="golden/mlp", repo=repo, tags=["nightly"],
                                record=modulelens.Recording(max_calls=2)) as cap:
            mlp(torch.arange(1024, dtype=torch.float32).reshape(2, 512) / (1000 + step))
        cap.wait()
    repo.set_alias("golden/mlp:v2", "stable")
    repo.add_report("golden/mlp:v2", "profile", {"ms": 1.25, "device": "cpu"})
    repo.remove("golden/mlp:v3")
    norm = nn.LayerNorm(8)
    with modulelens.capture(norm, targets=["LayerNorm"], name="other", repo=repo) as cap:
        norm(torch.linspace(-1, 1, 16).reshape(2, 8))
    cap.wait()


modulelens.track_init()
shutil.rmtree(out / "repo", ignore_errors=True)
local = modulelens.Repo(out / "repo")
history(local)
for lock in ("lock", "lock-gate"):  # empty lock files: part of the layout, nothing to pin
    (out / "repo" / lock).unlink(missing_ok=True)

shutil.rmtree(out / "bucket", ignore_errors=True)
url = "memory://golden-v2"
history(modulelens.Repo(url))
fs = fsspec.filesystem("memory")
for key in fs.find("/golden-v2"):
    relative = key[len("/golden-v2/"):]
    if relative.startswith("locks/"):
        continue
    target = out / "bucket" / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(fs.cat_file(key))

expected = {"refs": [i.ref for i in local.list()], "aliases": local.aliases("golden/mlp"),
            "tags": {i.ref: list(i.tags) for i in local.list()},
            "calls": {i.ref: i.calls for i in local.list()}, "nbytes": {i.ref: i.nbytes for i in local.list()}}
(out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
print(json.dumps(expected))
