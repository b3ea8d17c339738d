"""Where a capture was taken: versions, device, host, git commit, time, rank."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time

import torch

from modulelens.format.spec import cpu_capability


def describe_environment() -> dict[str, object]:
    env: dict[str, object] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cuda_available": torch.cuda.is_available(),
        "git_commit": _git_commit(),
    }
    capability = cpu_capability()
    if capability is not None:
        env["cpu_capability"] = capability
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        env["cuda_device"] = index
        env["gpu_name"] = torch.cuda.get_device_name(index)
        env["cuda_version"] = torch.version.cuda
    env.update(distributed_info())
    return env


def distributed_info() -> dict[str, object]:
    info: dict[str, object] = {"rank": 0, "world_size": 1}
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        info["rank"] = dist.get_rank()
        info["world_size"] = dist.get_world_size()
        info["backend"] = str(dist.get_backend())
    else:
        for key, env_name in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
            if os.environ.get(env_name, "").isdigit():
                info[key] = int(os.environ[env_name])
    for key, env_name in (("local_rank", "LOCAL_RANK"), ("local_world_size", "LOCAL_WORLD_SIZE"),
                          ("node_rank", "GROUP_RANK")):
        if os.environ.get(env_name, "").isdigit():
            info[key] = int(os.environ[env_name])
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        info["launcher"] = "torchelastic"  # torchrun / torch.distributed.run
    return info


def _git_commit() -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=2, check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and commit else None
