#!/usr/bin/env bash
# Installs (scripts/setup.sh) and runs the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
