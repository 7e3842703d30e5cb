#!/usr/bin/env bash
# Builds tandem with AddressSanitizer + UndefinedBehaviorSanitizer in build-asan and runs the
# CTest suite there (unit tests, CLI checks, the reference and server tests, which run the
# sanitized tandem binary). Any sanitizer report fails: UBSan aborts (no recovery), and every
# process writes its reports under build-asan/sanitizer-logs, so a report from a child process
# (tandem serve under the Python server tests) fails this script even if its test passed.
#   scripts/sanitize.sh [ctest arguments, e.g. -R Scheduler]
#   SANITIZE_EXCLUDE=regex  tests to leave out (ctest -E); by default the three slowest numeric
#     checks on the real model (over 15 minutes under ASan on 2 cores) and the peer replay (half
#     a billion parameters per model). Their code paths still run sanitized:
#     RealModel.PrefillDecodeAndNoCacheAgreeOn64Tokens, the tiny-model tests of every family,
#     reference_logits_families and server_openai drive the same forward passes.
#     SANITIZE_EXCLUDE= (empty) runs everything. (The grammar's per-mask CPU-time bound is 5x
#     its release value in a sanitized build, engine/grammar/budget.h, so the real-vocabulary
#     constrained tests run here too.)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan
# CUDA off: the release build compiles and tests the CUDA backend; this one checks the host code the CPU runs.
# MPI off too: the release build runs the tensor-parallel tests under mpirun (Open MPI's own
# allocations would drown LeakSanitizer's reports).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DTANDEM_MPI=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target tandem tandem_tests tandem_backend_tests tandem_handoff_tests

logs="$PWD/$build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:log_path=$logs/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"
export LSAN_OPTIONS="log_path=$logs/lsan"

slowest='^(reference_logits|peer_greedy_replay|RealModel\.GreedyCachedEqualsNaiveFor64Tokens|RealModel\.GreedyAgreesWithPeerAtEveryStep)$'
exclude=()
[ -n "${SANITIZE_EXCLUDE-$slowest}" ] && exclude=(-E "${SANITIZE_EXCLUDE-$slowest}")
status=0
ctest --test-dir "$build" --output-on-failure "${exclude[@]}" "$@" || status=1

reports=$(find "$logs" -type f | sort)
if [ -n "$reports" ]; then
  echo "sanitize: sanitizer reports:" >&2
  for r in $reports; do
    echo "==== $r" >&2
    head -c 20000 "$r" >&2
  done
  status=1
fi
[ "$status" -eq 0 ] && echo "sanitize: every test passed under ASan + UBSan, no reports"
exit "$status"
