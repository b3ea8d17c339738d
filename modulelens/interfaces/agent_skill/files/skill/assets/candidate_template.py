"""A candidate implementation for a captured module (template from the modulelens agent skill).

Subclass the captured class so the recorded constructor arguments and weights still apply, then
override ``forward``. Check it with::

    modulelens verify NAME --candidate path/to/this_file.py:Candidate --json
"""

from __future__ import annotations

from typing import Any

import torch

# Replace with the captured class: `module_class` in `modulelens show NAME --json`
# ("package.module:Class" means `from package.module import Class`).
from torch.nn import Linear as Captured


class Candidate(Captured):
    """Same constructor and parameters as the captured class; a new forward."""

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        # Write the new implementation here; start from the original and change one thing at a time.
        return super().forward(*args, **kwargs)
