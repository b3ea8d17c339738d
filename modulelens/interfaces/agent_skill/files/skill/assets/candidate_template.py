"""A candidate implementation for a captured module (template from the modulelens agent skill).

Copy this file next to your code, set CAPTURE, and override ``forward``. The class subclasses the
captured class, so the recorded constructor arguments and weights still apply. Check it with::

    modulelens verify CAPTURE --candidate path/to/this_file.py:Candidate --json
    python .claude/skills/modulelens/scripts/check_candidate.py CAPTURE --candidate path/to/this_file.py:Candidate
"""

from __future__ import annotations

import os
from typing import Any

import torch

import modulelens

# The capture this candidate reproduces (a ref from `modulelens ls --json`, e.g. "ranker/mlp:v3").
CAPTURE = os.environ.get("MODULELENS_CAPTURE", "NAME")
# The repo holding it (None: $MODULELENS_REPO, else ~/.cache/modulelens/repo).
REPO = os.environ.get("MODULELENS_REPO")

# The captured class, resolved the way `modulelens.load` resolves it: imported when it can be, else
# rebuilt from the source stored with the capture (a class defined in a training script, or in a
# module this project no longer has), so this works for every capture `modulelens replay` can run.
Captured = modulelens.load(CAPTURE, repo=REPO).module_type


class Candidate(Captured):  # type: ignore[misc, valid-type]  # the base is only known at run time
    """Same constructor and parameters as the captured class; a new forward."""

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        # Write the new implementation here; start from the original and change one thing at a time.
        return super().forward(*args, **kwargs)
