#!/usr/bin/env bash
# Keep it (issue 17): the benchmarks in their short form on a release
# build, each figure held to twice its target (`adf bench --check`), so the
# noise of a shared machine passes and a regression fails.
#
# The figures the project does not meet yet are named with --known-miss:
# measured and printed beside their target, not held. A run where one is
# within twice its target says so; once it stays there, drop it from its
# list here and it is held from then on. Nothing may be added to them.
#   bash .ci/bench.sh [path/to/release/adf]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/adf}"
[ -x "$BIN" ] || cargo build --release
BIN="$(realpath "$BIN")"
# Each suite's scratch files go to a fresh folder, removed at the end.
export TMPDIR="$(mktemp -d)"
trap 'rm -rf "$TMPDIR"' EXIT

echo "-- store: create, open + close, writes"
"$BIN" bench store --iterations 100 --check
echo "-- overhead scenario: 10 agents, instant model, paced"
"$BIN" bench --scenario overhead --check --known-miss turn_p50_ms,turn_p95_ms,turn_p99_ms
echo "-- loaded scenario: 400 idle agents' memory, a woken agent's first turn"
"$BIN" bench --scenario loaded --agents 400 --check --known-miss woken_turn_max_ms
echo "-- daemon: start, list, load, event stream, writes"
"$BIN" bench daemon --short --check --known-miss load_p50_ms
