#!/usr/bin/env bash
# Builds tandem and runs every test: unit tests (GoogleTest) and the reference checks
# (tests/reference/), through CTest. Tests that need the model or ../shared skip without them.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
# Serially: the engine already uses every core (OpenMP), and two multi-threaded tests side by
# side on 2 cores would oversubscribe them and crawl.
ctest --test-dir build --output-on-failure "$@"
