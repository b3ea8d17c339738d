"""Shared helpers for the interface tests (IPython, notebook, shell, agent skill, MCP).

Imported as the top-level module ``agents_support`` (the tests put this folder on ``sys.path``,
and subprocesses get it through ``PYTHONPATH``), so the classes below are importable by the
loader under the same path in every process.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from pathlib import Path

import torch

TESTS_DIR = Path(__file__).resolve().parent  # tests/support: the support modules
WORKTREE = TESTS_DIR.parent.parent


class Gate(torch.nn.Module):
    """A small module with a keyword input and a tuple output."""

    def __init__(self, dim: int, hidden: int, *, scale: float = 1.0) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)
        self.scale = scale
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        gate = torch.sigmoid(self.up(x))
        if mask is not None:
            gate = gate * mask.unsqueeze(-1)
        return self.down(gate) * self.scale, gate


class Noisy(torch.nn.Linear):
    """A Linear whose forward prints to stdout and warns (the MCP server must keep stdout clean)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("noisy forward on stdout")
        warnings.warn("noisy forward warning", UserWarning, stacklevel=1)
        return super().forward(x)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate(8, 16, scale=0.5)
        self.head = torch.nn.Linear(8, 4)
        self.noisy = Noisy(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.gate(x, mask=torch.ones(x.shape[:-1]))
        return self.noisy(self.head(y))


def make_repo(root: Path) -> Path:
    """A repo with ``toy/gate`` (2 calls), ``toy/head`` and ``toy/noisy``."""
    import modulelens

    torch.manual_seed(0)
    with modulelens.track_init():
        model = Net()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with modulelens.capture(model, targets=["gate", "head", "noisy"], repo=root, name="toy", record=modulelens.Recording(max_calls=2)):
            model(torch.randn(3, 8))
            model(torch.randn(5, 8))
    return root


def subprocess_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment for child processes: this worktree and the tests folder importable, caches in tmp."""
    env = dict(os.environ)
    paths = [str(WORKTREE), str(TESTS_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        OMP_NUM_THREADS="1",
        IPYTHONDIR=str(tmp / "ipython"),
        JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
        JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),
        JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"),
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="default",
    )
    env.pop("MODULELENS_REPO", None)
    env.update(extra)
    return env


def python() -> str:
    return sys.executable
