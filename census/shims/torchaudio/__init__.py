"""torchaudio's pure-Python models and transforms without its native library (issue 34).

torchaudio's last release (2.11.1) is built for torch 2.11: its ``_torchaudio.so`` does not load
with torch 2.13 (``OSError: Could not load this library``), and ``import torchaudio`` loads it
first, so nothing of torchaudio imports. Its models (wav2vec 2.0, HuBERT, WavLM, Conformer,
Emformer, RNN-T, ConvTasNet, HDemucs, Tacotron2, WaveRNN, ...) and most transforms are Python
on torch. This stand-in for the ``torchaudio`` package is put first on the path of the census's
torchaudio processes (capture and replay): its ``__path__`` is the installed package's folder
(``scripts/_setup_env.sh`` installs it, without dependencies, into ``.venv/census-site``, a folder
only these processes see, since transformers imports torchaudio whenever it finds it), and
``torchaudio._extension`` says the native library is not there, as torchaudio's own code does
on a build without it; what needs it (``lfilter``, ``forced_align``, the RNN-T loss) raises
when called.
"""

import os
import sys
import types

__path__ = []  # filled below: the installed torchaudio's folder
for _entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path:
    _candidate = os.path.join(_entry, "torchaudio")
    if os.path.isfile(os.path.join(_candidate, "models", "wav2vec2", "model.py")) and _candidate != os.path.dirname(__file__):
        __path__.append(_candidate)
        break


def _not_built(function):  # type: ignore[no-untyped-def]
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"{function.__name__} needs torchaudio's native library, which does not load with this torch")
    return refuse


_extension = types.ModuleType("torchaudio._extension")
_extension._IS_TORCHAUDIO_EXT_AVAILABLE = False  # type: ignore[attr-defined]
_extension._IS_ALIGN_AVAILABLE = False  # type: ignore[attr-defined]
_extension.fail_if_no_align = _not_built  # type: ignore[attr-defined]
sys.modules["torchaudio._extension"] = _extension
