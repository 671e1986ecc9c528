#!/usr/bin/env bash
# libFuzzer runs of picnic's fuzz targets (fuzz/, bodies in crates/fuzz; docs/fuzzing.md).
#
#   scripts/fuzz.sh list                  the targets
#   scripts/fuzz.sh run TARGET [RUNS]     RUNS inputs (default 10 million) into TARGET, from
#                                         its seeds (fuzz/seeds/TARGET) and working corpus
#                                         (fuzz/corpus/TARGET, not committed); a crash stops
#                                         the run and leaves its input in fuzz/artifacts/
#   scripts/fuzz.sh smoke [SECONDS]       every target for SECONDS (default 5) each
#
# With CARGO_TARGET_DIR set, builds go to $CARGO_TARGET_DIR/fuzz (else fuzz/target).
# Extra libFuzzer flags go in FUZZ_ARGS (e.g. FUZZ_ARGS=-max_total_time=600). Needs the
# nightly toolchain and cargo-fuzz (scripts/setup.sh installs cargo-fuzz when nightly is
# there); without them it says so and exits 0, since `cargo test` already replays every
# target's seeds and mutations of them on stable (crates/fuzz/tests/smoke.rs).
#
# No sanitizer (-s none): the code under test is safe Rust (the unsafe code is in the
# port backends and the run loop, which no target reaches), so a bug shows as a panic,
# which libFuzzer catches; cargo-fuzz builds with debug assertions and overflow checks on.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
targets=(wire feedback switch_config scenario api_body)

have_tools() {
  if ! rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
    echo "fuzz: skipped: no nightly toolchain (rustup toolchain install nightly); cargo test runs the stable corpus smoke"
    return 1
  fi
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: skipped: cargo-fuzz missing (cargo install cargo-fuzz); cargo test runs the stable corpus smoke"
    return 1
  fi
}

run() {
  local target=$1 runs=$2
  mkdir -p "corpus/$target"
  # shellcheck disable=SC2086
  cargo +nightly fuzz run -s none ${CARGO_TARGET_DIR:+--target-dir "$CARGO_TARGET_DIR/fuzz"} "$target" "corpus/$target" "seeds/$target" -- \
    -runs="$runs" -print_final_stats=1 ${FUZZ_ARGS:-}
}

case "${1:-list}" in
  list) printf '%s\n' "${targets[@]}" ;;
  run)
    [ $# -ge 2 ] || { echo "usage: scripts/fuzz.sh run TARGET [RUNS]" >&2; exit 2; }
    have_tools || exit 0
    run "$2" "${3:-10000000}"
    ;;
  smoke)
    have_tools || exit 0
    for t in "${targets[@]}"; do
      FUZZ_ARGS="-max_total_time=${2:-5} ${FUZZ_ARGS:-}" run "$t" 100000000
    done
    ;;
  *) echo "usage: scripts/fuzz.sh list | run TARGET [RUNS] | smoke [SECONDS]" >&2; exit 2 ;;
esac
