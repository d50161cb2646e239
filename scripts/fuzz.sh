#!/usr/bin/env bash
# Run the cargo-fuzz targets (fuzz/fuzz_targets/), each starting from its committed seed corpus.
#
#   scripts/fuzz.sh TARGET [SECONDS]   one target for SECONDS (default 30)
#   scripts/fuzz.sh --smoke [SECONDS]  every target for SECONDS each, one per core at once (default 15;
#                                      what CI runs)
#   scripts/fuzz.sh --build-smoke      build every target as --smoke runs them, run none
#   scripts/fuzz.sh --long [TARGET...] every target (or those named) for FUZZ_RUNS executions
#                                      each (default 10000000): the long run before a release
#   scripts/fuzz.sh --seed             rewrite the seed corpora (fuzz/examples/seed_corpus.rs)
#   scripts/fuzz.sh --list             the targets
#
# The seed corpus fuzz/corpus/TARGET/ is read, never written: inputs a run finds go to a scratch
# corpus (a temporary one for a timed run; fuzz/target/corpus-long/TARGET/, kept, for --long).
# A crash leaves its input in fuzz/artifacts/TARGET/. Prints a table of target, executions,
# exec/s and result; exits 1 if any target failed. Built with debug assertions (overflow checks).
# --smoke is a check that every target builds and runs clean from its corpus, not a search: it
# builds unoptimised (the dev profile, line tables only) and without a sanitizer (every crate it
# feeds is #![forbid(unsafe_code)], so AddressSanitizer would watch only std and the
# dependencies). CI runs it. Single-target and --long runs build optimised, with AddressSanitizer.
# Uses the nightly toolchain when rustup has one; otherwise the stable compiler with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz needs nightly-only sanitizer flags). Installs cargo-fuzz if missing.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

targets() { for f in fuzz/fuzz_targets/*.rs; do basename "$f" .rs; done; }

fuzz_setup() {
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked -q
    if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        fuzz=(cargo +nightly fuzz)
    else
        export RUSTC_BOOTSTRAP=1
        fuzz=(cargo fuzz)
    fi
}

build=(-s address)
smoke_build=(--dev -s none)
# Only the smoke builds use the dev profile.
export CARGO_PROFILE_DEV_DEBUG=line-tables-only
rows=()
failed=0
# run_target TARGET SCRATCH_DIR LIBFUZZER_FLAG...: one run from the seed corpus; adds a table row.
run_target() {
    fuzz_run "$@"
    fuzz_report "$1"
}
# fuzz_run TARGET SCRATCH_DIR LIBFUZZER_FLAG...: the run alone, its log and exit code in files.
fuzz_run() {
    local target=$1 scratch=$2
    shift 2
    [[ -f fuzz/fuzz_targets/$target.rs ]] || die "no fuzz target '$target' (see --list)"
    local out=fuzz/target/fuzz-logs/$target.log
    mkdir -p "$scratch" "fuzz/corpus/$target" "fuzz/artifacts/$target" "$(dirname "$out")"
    log "fuzz $target $*"
    local rc=0
    "${fuzz[@]}" run "${build[@]}" --debug-assertions "$target" "$scratch" "fuzz/corpus/$target" -- \
        -rss_limit_mb=2048 -timeout=60 -print_final_stats=1 "$@" >"$out" 2>&1 || rc=$?
    echo "$rc" >"$out.rc"
}
# fuzz_report TARGET: the table row of its last run.
fuzz_report() {
    local target=$1 out=fuzz/target/fuzz-logs/$1.log
    local rc execs rate result=clean
    rc=$(cat "$out.rc")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out" | tail -n 1)
    if ((rc != 0)); then
        result="FAILED (exit $rc): $out"
        failed=1
        tail -n 40 "$out" >&2
    else
        tail -n 3 "$out" >&2
    fi
    rows+=("$(printf '%-18s %12s %8s  %s' "$target" "${execs:--}" "${rate:--}" "$result")")
}

table() {
    printf '%-18s %12s %8s  %s\n' target executions exec/s result
    printf '%s\n' "${rows[@]}"
}

# A timed run of each named target from a fresh scratch corpus, as many at once as there are
# cores (libFuzzer runs on one).
timed() {
    local seconds=$1
    shift
    local scratch running=() target
    scratch=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now: the path is fixed
    trap "rm -rf '$scratch'" EXIT
    fuzz_setup
    for target in "$@"; do
        if ((${#running[@]} >= $(nproc))); then
            wait "${running[0]}"
            running=("${running[@]:1}")
        fi
        fuzz_run "$target" "$scratch/$target" -max_total_time="$seconds" &
        running+=("$!")
    done
    wait
    for target in "$@"; do fuzz_report "$target"; done
}

case "${1:-}" in
--list) targets ;;
--seed)
    cargo run -q --manifest-path fuzz/Cargo.toml --example seed_corpus -- fuzz/corpus
    ;;
--build-smoke)
    fuzz_setup
    "${fuzz[@]}" build "${smoke_build[@]}" --debug-assertions
    ;;
--smoke)
    build=("${smoke_build[@]}")
    seconds=${2:-15}
    mapfile -t all < <(targets)
    timed "$seconds" "${all[@]}"
    table
    ;;
--long)
    shift
    runs=${FUZZ_RUNS:-10000000}
    if (($#)); then selected=("$@"); else mapfile -t selected < <(targets); fi
    fuzz_setup
    for target in "${selected[@]}"; do
        run_target "$target" "fuzz/target/corpus-long/$target" -runs="$runs"
    done
    table
    ;;
-h | --help) usage ;;
-* | '') die "usage: scripts/fuzz.sh TARGET [SECONDS] | --smoke [SECONDS] | --build-smoke | --long [TARGET...] | --seed | --list" ;;
*)
    timed "${2:-30}" "$1"
    table
    ;;
esac
exit "$failed"
