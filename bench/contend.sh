#!/usr/bin/env bash
# Decode on a shared machine: tandem (and llama.cpp's llama-bench, when bench/compare.py has
# built it) at -t 2 quiet, -t 2 beside one busy single-threaded process, and -t 1 beside it,
# alternating in one run. A busy process here is `yes > /dev/null`: one core's worth of work,
# as an editor's indexer or a second model's thread would be.
#   bench/contend.sh [MODEL] [ROUNDS]
# Prints each figure per round and the medians; "kept" is busy -t 2 / quiet -t 2.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${2:-3}
TANDEM=${TANDEM:-build/tandem}
PEER=bench/.peer/build/bin/llama-bench
tg_tandem() { timeout 300 "$TANDEM" bench -m "$M" -t "$1" -p 0 -n 64 -r 2 --json 2>/dev/null |
  python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["tg64"]["tok_s"])'; }
tg_peer() { LD_LIBRARY_PATH=$(dirname "$PEER") timeout 300 "$PEER" -m "$M" -t "$1" -p 0 -n 64 -r 2 -o json 2>/dev/null |
  python3 -c 'import json,sys; print("%.1f" % [r for r in json.load(sys.stdin) if r["n_gen"] > 0][0]["avg_ts"])'; }
tools=(tandem)
[ -x "$PEER" ] && tools+=(peer)
declare -A fig
for r in $(seq "$ROUNDS"); do
  for tool in "${tools[@]}"; do
    q2=$(tg_$tool 2)
    yes > /dev/null & busy=$!
    sleep 0.5
    b2=$(tg_$tool 2); b1=$(tg_$tool 1)
    kill $busy; wait $busy 2>/dev/null || true
    echo "round $r $tool: quiet -t 2 $q2 tok/s, busy -t 2 $b2, busy -t 1 $b1"
    fig[$tool.q2]+="$q2 "; fig[$tool.b2]+="$b2 "; fig[$tool.b1]+="$b1 "
  done
done
med() { printf "%s\n" $1 | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
for tool in "${tools[@]}"; do
  q2=$(med "${fig[$tool.q2]}"); b2=$(med "${fig[$tool.b2]}"); b1=$(med "${fig[$tool.b1]}")
  echo "$tool medians: quiet -t 2 $q2, busy -t 2 $b2 (kept $(awk "BEGIN{printf \"%.0f\", 100*$b2/$q2}")%), busy -t 1 $b1"
done
