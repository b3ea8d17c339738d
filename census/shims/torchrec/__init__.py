"""torchrec's pure-Python pieces without its native dependency (issue 22, defect 7).

torchrec 1.9.2 needs fbgemm-gpu, and no fbgemm-gpu(-cpu) wheel imports with torch 2.13
(``fbgemm_gpu_py.so``: undefined symbol ``torch::autograd::_wrap_outputs``; 1.9.0 and the
2026.10.16 nightly alike). This stand-in for the ``torchrec`` package is put first on the path of
the census's torchrec processes (capture and replay): its ``__path__`` is the real package's
folder, so ``torchrec.sparse.jagged_tensor`` (``KeyedJaggedTensor``, ``JaggedTensor``,
``KeyedTensor``) is torchrec's own code, but torchrec's ``__init__`` (which imports the
distributed and fbgemm-backed modules) does not run. The one fbgemm operator the jagged tensors
need for offsets, ``fbgemm::asynchronous_complete_cumsum``, is loaded from fbgemm's
``fbgemm_gpu_sparse_async_cumsum.so``, which does load with torch 2.13.
"""

import importlib.util
import os

import torch

__path__ = []  # filled below: the installed torchrec's folder
for _entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) + __import__("sys").path:
    _candidate = os.path.join(_entry, "torchrec")
    if os.path.isfile(os.path.join(_candidate, "sparse", "jagged_tensor.py")) and _candidate != os.path.dirname(__file__):
        __path__.append(_candidate)
        break
_fbgemm = importlib.util.find_spec("fbgemm_gpu")
if _fbgemm is not None and _fbgemm.submodule_search_locations:
    _folder = next(iter(_fbgemm.submodule_search_locations))
    torch.ops.load_library(os.path.join(_folder, "fbgemm_gpu_sparse_async_cumsum.so"))
