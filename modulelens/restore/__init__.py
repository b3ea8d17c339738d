"""Restore: captures back as modules, recorded calls, and replay."""

from modulelens.restore.compare import LeafResult, compare
from modulelens.restore.loader import Call, Capture, load
from modulelens.restore.replay import CallReplay, ReplayReport

__all__ = ["Call", "CallReplay", "Capture", "LeafResult", "ReplayReport", "compare", "load"]
