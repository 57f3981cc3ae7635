#!/usr/bin/env bash
# Installs (scripts/setup.sh) and runs the main job on the embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/vocgraft demo "$@"
