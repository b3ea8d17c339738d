# Sourced by scripts/demo and scripts/test: make .venv with torch and modulelens installed.
# torch is installed first, pinned (TORCH_SPEC overrides it, e.g. TORCH_SPEC="torch==2.13.0
# --index-url https://download.pytorch.org/whl/cu128" on a CUDA machine), so that pip never resolves
# a bare `torch` requirement to a multi-GB CUDA build on a CPU machine. The same script works
# unchanged on CUDA and CPU machines: nothing here pins triton.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
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
  python -m pip install -q --disable-pip-version-check --upgrade pip >&2
  # shellcheck disable=SC2086
  python -m pip install -q --disable-pip-version-check $TORCH_SPEC >&2
  python -m pip install -q --disable-pip-version-check -e ".[test]" >&2
  # Triton: the one torch brings (CUDA wheels pin theirs; never pin another, see pyproject.toml);
  # only where torch brings none (CPU wheels) add one, for the CPU interpreter the kernel tests use.
  if ! python -c "import triton" 2>/dev/null; then
    python -m pip install -q --disable-pip-version-check "triton>=3.0" >&2
  fi
  # timm for the third-party tests, without its torchvision requirement: every torchvision wheel on
  # PyPI pins a newer (CUDA) torch than the pinned CPU build, which it would replace
  # (tests/support/shims stands in for the few torchvision names timm imports).
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
  echo "$want" > "$stamp"
fi
