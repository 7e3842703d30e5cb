#!/usr/bin/env bash
# Builds every libFuzzer target with clang (ASan + UBSan, in build-fuzz) and runs each for a
# bounded time from its seed corpus; a crash, leak, sanitizer report, over-long input (-timeout)
# or memory blow-up (-rss_limit_mb) fails. The targets and their seeds, dictionaries and input
# lengths come from tests/CMakeLists.txt (tandem_fuzz_target), so new targets run unchanged.
#   scripts/fuzz.sh [seconds per target]   (default: $FUZZ_SECONDS, else 60)
# A failing input is kept as build-fuzz/artifacts/<target>-crash-*; rerun it with
#   build-fuzz/tests/<target> build-fuzz/artifacts/<target>-crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${FUZZ_SECONDS:-60}}
build=build-fuzz
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON >/dev/null
list="$build/fuzz_targets.tsv"
mapfile -t targets < <(cut -f1 "$list")
[ "${#targets[@]}" -gt 0 ] || { echo "fuzz: no targets in $list" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
mkdir -p "$build/artifacts" "$build/logs"
failed=()
while IFS=$'\t' read -r name bin max_len dict seeds; do
  corpus="$build/corpus/$name"  # grows across runs on one machine; seeds stay read-only
  mkdir -p "$corpus"
  args=(-max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1
        -artifact_prefix="$build/artifacts/$name-")
  [ "$dict" != "-" ] && args+=(-dict="$dict")
  dirs=("$corpus")
  if [ "$seeds" != "-" ]; then
    IFS=: read -r -a seed_dirs <<< "$seeds"
    for d in "${seed_dirs[@]}"; do [ -d "$d" ] && dirs+=("$d"); done
  fi
  log="$build/logs/$name.log"
  echo "fuzz: $name for ${secs}s (max_len $max_len, corpus ${dirs[*]})"
  if "$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1; then
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ *DONE)" "$log" | tr '\n' ' '; echo
  else
    echo "fuzz: $name FAILED; the end of $log:" >&2
    tail -n 60 "$log" >&2
    failed+=("$name")
  fi
done < "$list"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${secs}s each without a failure"
