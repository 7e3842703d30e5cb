#!/usr/bin/env bash
# Side-by-side benchmark against the llama.cpp peer; see bench/compare.py for what it does.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/compare.py "$@"
