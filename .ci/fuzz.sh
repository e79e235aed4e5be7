#!/usr/bin/env bash
# Coverage-guided fuzzing of adf's parsers with libFuzzer, on the stable
# toolchain: the sancov instrumentation cargo-fuzz would ask for, passed as
# RUSTFLAGS (no -Z flag needed without a sanitizer). Each target runs for
# SECONDS (default 30) from its corpus in tests/fuzz/corpus/<target>; new
# inputs go to a scratch folder (copy the good ones into the corpus by
# hand). A crash stops the run with the input saved and a non-zero exit.
#   bash .ci/fuzz.sh            # CI: 30 s a target
#   bash .ci/fuzz.sh 3600       # an hour a target, by hand
#   bash .ci/fuzz.sh build      # only build (CI does it in the background)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-30}"
# `shell` is left out of CI: brush-parser's tokenizer still has loops that
# allocate without bound, and a run here finds a new one within a minute or
# two. Each find so far is guarded and kept in tests/fuzz/corpus/shell (a
# unit test replays them).
# Run it by hand: put `shell` in TARGETS and `bash .ci/fuzz.sh 300`.
TARGETS=(config_json canonical_alf sql_guard keymap)
# Instrumented builds differ from the normal ones: keep them apart (and
# outside the clone, so a machine builds the dependencies once).
CACHE="${ADF_PEER_CACHE:-/var/cache/adf-peers}"
mkdir -p "$CACHE" 2>/dev/null || CACHE="${TMPDIR:-/tmp}/adf-peers"
export CARGO_TARGET_DIR="$CACHE/fuzz-target"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros
# (they must not be instrumented), as cargo-fuzz does.
HOST="$(rustc -vV | sed -n 's/^host: //p')"
# ADF_FUZZ_BUILT=1: the binaries were just built (CI's background `build`)
# and are not built again. A second build would not be a no-op: waproto's
# build script writes a file it watches during its first run, so the run
# after a cold build finds it newer and recompiles waproto, the WhatsApp
# crates and adf (minutes, instrumented).
[ "${ADF_FUZZ_BUILT:-0}" = 1 ] || cargo build --release --manifest-path tests/fuzz/Cargo.toml --bins --target "$HOST"
[ "$SECONDS_EACH" = build ] && exit 0
BIN="$CARGO_TARGET_DIR/$HOST/release"
WORK="$(mktemp -d)"
ARTIFACTS="${ADF_FUZZ_ARTIFACTS:-$WORK/artifacts}"
mkdir -p "$ARTIFACTS"
summary=()
for t in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$t"
  log="$WORK/$t.log"
  if ! "$BIN/$t" "$WORK/$t" "tests/fuzz/corpus/$t" \
      -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
      -artifact_prefix="$ARTIFACTS/$t-" > "$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz target $t failed; the input is in $ARTIFACTS" >&2
    exit 1
  fi
  runs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
  summary+=("$t: $runs inputs, coverage $cov edges, no crash")
done
printf '%s\n' "${summary[@]}"
rm -rf "$WORK"
