"""`modulelens demo`: capture from a real training run, then reload and replay in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from modulelens.repo import Repo
from modulelens.tracing.runner import RunConfig, run_command

TARGETS = ["embeddings", "attention", "interaction", "top_mlp"]


def run_demo(repo: str | None = None, steps: int = 30, quiet: bool = False) -> dict[str, Any]:
    console = Console(stderr=quiet)
    store = Repo(repo)
    console.rule("[bold]modulelens demo[/bold]")
    console.print(f"1. training a recommendation model for {steps} steps under capture "
                  f"(targets {', '.join(TARGETS)}; warm-up 3 calls, then 2 recorded calls each)")
    console.print(f"   $ modulelens run {' '.join('-t ' + t for t in TARGETS)} --warmup 3 --max-calls 2 --name demo "
                  f"-- python -m modulelens.demo.train --steps {steps}\n")
    config = RunConfig(targets=TARGETS, warmup=3, max_calls=2, repo=str(store.root), name="demo")
    outcome = run_command([sys.executable, "-m", "modulelens.demo.train", "--steps", str(steps)], config, quiet=quiet)
    if outcome["exit_code"] != 0:
        raise SystemExit(f"demo training failed with exit code {outcome['exit_code']}")
    table = Table(title=f"2. captured into {store.root}")
    for col in ("ref", "module class", "calls"):
        table.add_column(col)
    for saved in outcome["saved"]:
        table.add_row(saved["ref"], saved["module_class"].rsplit(":", 1)[-1], str(saved["calls"]))
    console.print(table)
    ref = next(s["ref"] for s in outcome["saved"] if s["name"] == "demo/top_mlp")
    console.print(f"\n3. reloading {ref} in a fresh process and replaying its recorded calls")
    console.print(f"   $ modulelens replay {ref}\n")
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        completed = subprocess.run(
            [sys.executable, "-m", "modulelens.demo.reload", ref, "--repo", str(store.root), "--result", str(result_path)],
            check=False, stdout=sys.stderr if quiet else None,
        )
        reload = json.loads(result_path.read_text()) if result_path.exists() else {"replay": {"passed": False}}
    passed = completed.returncode == 0 and reload["replay"]["passed"]
    console.print(f"\n[bold]{'done' if passed else 'replay FAILED'}[/bold]. Try: modulelens ls --repo {store.root}; "
                  f"modulelens show {ref} --repo {store.root}")
    return {"repo": str(store.root), "saved": outcome["saved"], "reloaded": ref, "replay": reload["replay"],
            "load_seconds": reload.get("load_seconds")}
