# Sourced by scripts/demo and scripts/test: make .venv with torch and modulelens installed.
# torch is installed first, pinned (TORCH_SPEC overrides it, e.g. TORCH_SPEC="torch==2.13.0
# --index-url https://download.pytorch.org/whl/cu128" on a CUDA machine), so that pip never resolves
# a bare `torch` requirement to a multi-GB CUDA build on a CPU machine. The same script works
# unchanged on CUDA and CPU machines: nothing here pins triton.
set -euo pipefail
# the checkout this script is in, links resolved: a folder that links to scripts/ (a copy of the
# examples for a docs test) still sets up and uses this checkout's .venv, never one pointing elsewhere
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
PYTHON_BIN=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  echo "setting up .venv (first run only)..." >&2
  "$PYTHON_BIN" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=".venv/.modulelens-setup"
want="$(cat pyproject.toml scripts/_setup_env.sh | sha256sum | cut -c1-16) $TORCH_SPEC"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # each step says what it does (pip -q is silent for minutes otherwise)
  echo "setup: pip" >&2
  python -m pip install -q --disable-pip-version-check --upgrade pip >&2
  echo "setup: $TORCH_SPEC (first, pinned)" >&2
  # shellcheck disable=SC2086
  python -m pip install -q --disable-pip-version-check $TORCH_SPEC >&2
  echo "setup: modulelens and its test dependencies (pip install -e '.[test]')" >&2
  python -m pip install -q --disable-pip-version-check -e ".[test]" >&2
  # Triton: the one torch brings (CUDA wheels pin theirs; never pin another, see pyproject.toml);
  # only where torch brings none (CPU wheels) add one, for the CPU interpreter the kernel tests use.
  if ! python -c "import triton" 2>/dev/null; then
    echo "setup: triton (torch brought none)" >&2
    python -m pip install -q --disable-pip-version-check "triton>=3.0" >&2
  fi
  # timm imports torchvision, and only a torchvision built for this very torch loads (PyPI's are
  # CUDA builds: with a CPU torch their operators fail to register and `import torchvision` raises).
  # Ask for the one matching torch from where torch came from (TORCH_SPEC's index; torch itself is
  # pinned so it stays as it is), and keep it only if it imports.
  if ! python -c "import torchvision" 2>/dev/null; then
    torch_version=$(python -c "import torch; print(torch.__version__.split('+')[0])")
    echo "setup: a torchvision built for torch $torch_version (for timm)" >&2
    # shellcheck disable=SC2086
    python -m pip install -q --disable-pip-version-check $TORCH_SPEC "torch==$torch_version" torchvision >&2 || true
    if ! python -c "import torchvision" 2>/dev/null; then
      python -m pip uninstall -q -y torchvision >&2 || true
    fi
  fi
  # timm for the third-party tests; without a working torchvision it is installed without it
  # (tests/support/shims stands in for the few torchvision names timm imports in the tests).
  echo "setup: timm" >&2
  python -m pip install -q --disable-pip-version-check --no-deps "timm>=1.0.15" >&2
  # torchtune for the fidelity tests, in a folder of its own that only the torchtune test's processes
  # put on their path (tests/restore/test_structure_rebuild.py): it imports torchao, and transformers
  # imports torchao whenever it is installed (seconds and noise on every transformers test). torchao
  # 0.17.0: torchtune 0.6.1 imports torchao.dtypes.nf4tensor (gone in 0.18), 0.12 does not import
  # with torch 2.13, and peft refuses torchao below 0.16. Its `datasets` import is shimmed
  # (tests/support/torchtune_shims/datasets): pyarrow and pandas for a dataset loader no test calls.
  rm -rf .venv/torchtune-site
  python -m pip install -q --disable-pip-version-check --no-deps --target .venv/torchtune-site \
    "torchtune==0.6.1" "torchao==0.17.0" omegaconf antlr4-python3-runtime sentencepiece tiktoken >&2
  # torchrec for the census's jagged-tensor family, also --no-deps: it requires fbgemm-gpu (a CUDA build) and pins
  # torchmetrics==1.0.3. No fbgemm-gpu(-cpu) build loads its operators with torch 2.13 (undefined symbol in
  # fbgemm_gpu_py.so), so the census imports only torchrec.sparse.jagged_tensor through census/shims/torchrec, which
  # loads the one fbgemm library file that does load (the cumsum behind jagged offsets). Nothing else is needed:
  # jagged_tensor imports only torch and torchrec's own modules.
  python -m pip install -q --disable-pip-version-check --no-deps "torchrec==1.9.2" "fbgemm-gpu-cpu==1.9.0" >&2
  # openai-whisper for the tests of its sparse alignment_heads buffer (issue 34), --no-deps: it requires triton
  # unpinned on Linux (and torch); its imports (numba, tiktoken, more-itertools) are in pyproject's test extra.
  python -m pip install -q --disable-pip-version-check --no-deps "openai-whisper==20250625" >&2
  # torchaudio for the census's audio family, in a folder of its own that only that family's processes put on their
  # path (census/families/torchaudio.py), --no-deps: its last release (2.11.1) requires torch 2.11 and its native
  # library does not load with torch 2.13, so `import torchaudio` fails; census/shims/torchaudio loads its Python
  # models and transforms without it. Installed next to the rest, it would break every library that imports
  # torchaudio when it finds it (transformers' audio feature extractors).
  rm -rf .venv/census-site
  python -m pip install -q --disable-pip-version-check --no-deps --target .venv/census-site "torchaudio==2.11.1" >&2
  echo "$want" > "$stamp"
  if ! python -c "import torchvision" 2>/dev/null; then
    echo "note: no torchvision build for torch $(python -c "import torch; print(torch.__version__)") is available from" \
       "the configured package indexes, so \`import timm\` fails here (the tests use a stand-in); to capture timm" \
       "models, choose a torch build whose index has torchvision: TORCH_SPEC=\"torch --index-url" \
       "https://download.pytorch.org/whl/cpu\" (see the README)" >&2
  fi
fi
