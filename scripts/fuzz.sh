#!/usr/bin/env bash
# Run one cargo-fuzz target for a while: scripts/fuzz.sh TARGET SECONDS
# Uses the nightly toolchain when rustup has one; otherwise the stable compiler with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz needs nightly-only sanitizer flags). Installs cargo-fuzz if missing.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
target=${1:?target}
seconds=${2:-30}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked -q
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi
mkdir -p "fuzz/corpus/$target"
"${fuzz[@]}" run "$target" -- -max_total_time="$seconds" -rss_limit_mb=2048 2>&1 | tail -n 5
