#!/usr/bin/env bash
# Run HERE (the dev machine, with internet) before a GPU session: fills .device/ (git-ignored),
# which the device run carries (run(..., carry=[".device"])), since the GPU machine reaches no
# network and ../shared does not travel:
#   .device/wheels/  the gguf wheel (its dependencies numpy, pyyaml, tqdm are on the GPU image)
#   .device/tools/   make_gguf.py from ../shared/tools
#   .device/debs/    Debian packages of the build dependencies (unpacked there into
#                    .device/sysroot only when the image lacks them); --no-debs skips them.
# Keep it under the 64 MiB the working tree may carry (du -sh .device).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/wheels .device/tools .device/debs
python3 -m pip download -q --no-deps -d .device/wheels gguf
cp ../shared/tools/make_gguf.py .device/tools/
if [ "${1:-}" != "--no-debs" ]; then
  # Headers and CMake files only, plus the few shared libraries they link (fmt, pcre2).
  (cd .device/debs && apt-get download libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev libgtest-dev \
     libpcre2-dev libpcre2-8-0 libboost1.81-dev 2>&1 | tail -n 2)
fi
du -sh .device
