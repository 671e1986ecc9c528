#!/usr/bin/env bash
# The project's test command: every unit, property and integration test.
# Integration tests that need root and network namespaces skip (and say why) without root.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo test --workspace --release 2>&1
