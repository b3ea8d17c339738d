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
  # torchrec for the census's jagged-tensor family, also --no-deps: it requires fbgemm-gpu (a CUDA build) and pins
  # torchmetrics==1.0.3. No fbgemm-gpu(-cpu) build loads its operators with torch 2.13 (undefined symbol in
  # fbgemm_gpu_py.so), so the census imports only torchrec.sparse.jagged_tensor through census/shims/torchrec, which
  # loads the one fbgemm library file that does load (the cumsum behind jagged offsets). Nothing else is needed:
  # jagged_tensor imports only torch and torchrec's own modules.
  python -m pip install -q --disable-pip-version-check --no-deps "torchrec==1.9.2" "fbgemm-gpu-cpu==1.9.0" >&2
  echo "$want" > "$stamp"
fi
