"""A small ranking model and its training loop: the project the README's commands run on."""

from ranker.model import GatedMLP, Ranker, build_model
from ranker.training import train

__all__ = ["GatedMLP", "Ranker", "build_model", "train"]
