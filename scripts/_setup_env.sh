# Sourced by scripts/demo and scripts/test: make .venv with torch and modulelens installed.
#
# Two levels (MODULELENS_SETUP): "core" (scripts/demo) is torch and modulelens's own dependencies,
# about 1 GB with a CPU torch; "test" (scripts/test, the default) adds the test stack: the test
# extra (transformers, diffusers, lightning, wandb, the UI's browser tests...), Triton, timm,
# torchtune and torchrec. A .venv set up for the tests serves the demo as it is.
#
# torch is installed first, pinned (TORCH_SPEC overrides it, e.g. TORCH_SPEC="torch==2.13.0
# --index-url https://download.pytorch.org/whl/cu128" on a CUDA machine), so that pip never resolves
# a bare `torch` requirement to a multi-GB CUDA build on a CPU machine: without TORCH_SPEC, a Linux
# machine with no NVIDIA driver gets the CPU build from PyTorch's CPU index when that index answers.
# The same script works unchanged on CUDA and CPU machines: nothing here pins triton.
set -euo pipefail
# the checkout this script is in, links resolved: a folder that links to scripts/ (a copy of the
# examples for a docs test) still sets up and uses this checkout's .venv, never one pointing elsewhere
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
PYTHON_BIN=${PYTHON:-python3}
level=${MODULELENS_SETUP:-test}
if [ "$level" != core ] && [ "$level" != test ]; then
  echo "MODULELENS_SETUP must be core or test, not '$level'" >&2
  exit 2
fi
if [ -z "${TORCH_SPEC:-}" ]; then
  TORCH_SPEC="torch==2.13.0"
  # PyPI's Linux torch is the CUDA build (3+ GB with its libraries); PyTorch's own CPU index has the
  # CPU build (under 0.5 GB). Asked only where no NVIDIA driver is and the index answers within 3 s.
  if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 \
     && "$PYTHON_BIN" -c "import urllib.request; urllib.request.urlopen('https://download.pytorch.org/whl/cpu/', timeout=3)" 2>/dev/null; then
    TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "setting up .venv (first run only)..." >&2
  "$PYTHON_BIN" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=".venv/.modulelens-setup"
sources="$(cat pyproject.toml scripts/_setup_env.sh | sha256sum | cut -c1-16) $TORCH_SPEC"
have="$(cat "$stamp" 2>/dev/null || true)"
# what is installed: "<sources> core" or "<sources> test"; a test setup is also a core one
if [ "$have" != "$sources test" ] && { [ "$level" = test ] || [ "$have" != "$sources core" ]; }; then
  # setuptools prints an "Editable installation" box (a warning about folders named like the package
  # shadowing it, which is not the case here) through pip's -q: that one message is filtered
  pip_install() { PYTHONWARNINGS="ignore:Editable installation" python -m pip install -q --disable-pip-version-check "$@" >&2; }
  # each step says what it does (pip -q is silent for minutes otherwise)
  echo "setup: pip" >&2
  pip_install --upgrade pip
  echo "setup: $TORCH_SPEC (first, pinned)" >&2
  # shellcheck disable=SC2086
  pip_install $TORCH_SPEC
  echo "setup: modulelens and its dependencies (pip install -e .)" >&2
  pip_install -e .
  if [ "$level" = test ]; then
    echo "setup: the test stack (pip install -e '.[test]')" >&2
    pip_install -e ".[test]"
    # Triton: the one torch brings (CUDA wheels pin theirs; never pin another, see pyproject.toml);
    # only where torch brings none (CPU wheels) add one, for the CPU interpreter the kernel tests use.
    if ! python -c "import triton" 2>/dev/null; then
      echo "setup: triton (torch brought none)" >&2
      pip_install "triton>=3.0"
    fi
    # timm imports torchvision, and only a torchvision built for this very torch loads (PyPI's are
    # CUDA builds: with a CPU torch their operators fail to register and `import torchvision` raises).
    # Ask for the one matching torch from where torch came from (TORCH_SPEC's index; torch itself is
    # pinned so it stays as it is), and keep it only if it imports; the tests use a stand-in otherwise
    # (tests/support/shims).
    if ! python -c "import torchvision" 2>/dev/null; then
      torch_version=$(python -c "import torch; print(torch.__version__.split('+')[0])")
      echo "setup: a torchvision built for torch $torch_version, if there is one (for timm)" >&2
      # shellcheck disable=SC2086
      pip_install $TORCH_SPEC "torch==$torch_version" torchvision 2>/dev/null || true
      if ! python -c "import torchvision" 2>/dev/null; then
        python -m pip uninstall -q -y torchvision >&2 2>/dev/null || true
      fi
    fi
    # timm for the third-party tests; without a working torchvision it is installed without it
    # (tests/support/shims stands in for the few torchvision names timm imports in the tests).
    echo "setup: timm" >&2
    pip_install --no-deps "timm>=1.0.15"
    # torchtune for the fidelity tests, in a folder of its own that only the torchtune test's processes
    # put on their path (tests/restore/test_structure_rebuild.py): it imports torchao, and transformers
    # imports torchao whenever it is installed (seconds and noise on every transformers test). torchao
    # 0.17.0: torchtune 0.6.1 imports torchao.dtypes.nf4tensor (gone in 0.18), 0.12 does not import
    # with torch 2.13, and peft refuses torchao below 0.16. Its `datasets` import is shimmed
    # (tests/support/torchtune_shims/datasets): pyarrow and pandas for a dataset loader no test calls.
    rm -rf .venv/torchtune-site
    pip_install --no-deps --target .venv/torchtune-site \
      "torchtune==0.6.1" "torchao==0.17.0" omegaconf antlr4-python3-runtime sentencepiece tiktoken
    # torchrec for the census's jagged-tensor family, also --no-deps: it requires fbgemm-gpu (a CUDA build) and pins
    # torchmetrics==1.0.3. No fbgemm-gpu(-cpu) build loads its operators with torch 2.13 (undefined symbol in
    # fbgemm_gpu_py.so), so the census imports only torchrec.sparse.jagged_tensor through census/shims/torchrec, which
    # loads the one fbgemm library file that does load (the cumsum behind jagged offsets). Nothing else is needed:
    # jagged_tensor imports only torch and torchrec's own modules.
    pip_install --no-deps "torchrec==1.9.2" "fbgemm-gpu-cpu==1.9.0"
    # openai-whisper for the tests of its sparse alignment_heads buffer, --no-deps: it requires triton
    # unpinned on Linux (and torch); its imports (numba, tiktoken, more-itertools) are in pyproject's test extra.
    pip_install --no-deps "openai-whisper==20250625"
    # torchaudio for the census's audio family, in a folder of its own that only that family's processes put on their
    # path (census/families/torchaudio.py), --no-deps: its last release (2.11.1) requires torch 2.11 and its native
    # library does not load with torch 2.13, so `import torchaudio` fails; census/shims/torchaudio loads its Python
    # models and transforms without it. Installed next to the rest, it would break every library that imports
    # torchaudio when it finds it (transformers' audio feature extractors).
    rm -rf .venv/census-site
    pip_install --no-deps --target .venv/census-site "torchaudio==2.11.1"
  fi
  echo "$sources $level" > "$stamp"
fi
