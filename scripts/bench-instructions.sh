#!/usr/bin/env bash
# Instructions per NVMe/TCP command on the target's engine thread, counted by valgrind's
# callgrind: exact, so a change of a few percent shows, where timed figures on this machine move
# by more than that between runs. Under TCG (scripts/bench-qemu.sh) user-space time is
# instructions, and the engine thread's are most of edgevold's user time in the appliance VM.
#
# It runs appliance/benches/data_path.rs under callgrind (`--target-only`, busy polling off, so
# that no instruction is a poll, and `--pause-ms`, so that the target is idle between cells) and
# has callgrind dump every thread's costs each time the bench prints its table's header or a
# row: dump k+1 then holds cell k. For each cell the engine thread's instructions (the thread
# that dispatched the cell's commands, `edgevol-io-N`) are divided by the commands it
# dispatched. Under valgrind the bench runs 20-50x slower: a 3 s cell holds about a thousand QD1
# commands.
#
# usage: scripts/bench-instructions.sh [--pool-dir DIR] [WORKLOAD...]
#   --pool-dir  where the pool file goes (default /var/tmp: a drive's file system, where writes
#               and queued reads go on the queue's io_uring, as on the appliance's drives)
#   WORKLOAD    words of workload names, as the data-path bench takes them
#               (default: '4k randread QD1' '4k randwrite QD1' '4k randread QD32'
#               '4k randwrite QD32'; a name contains its words, so the QD1 polling-host rows
#               and the 2-queue row come too, the latter counted on its busier engine)
# Prints a markdown table on stdout; callgrind's files stay in target/bench/instructions/.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
pool_dir=/var/tmp
if [[ "${1:-}" == --pool-dir ]]; then
    pool_dir="${2:?--pool-dir DIR}"
    shift 2
fi
filters=("$@")
((${#filters[@]})) || filters=('4k randread QD1' '4k randwrite QD1' '4k randread QD32' '4k randwrite QD32')

apt_need valgrind
out="${CARGO_TARGET_DIR:-$ROOT/target}/bench/instructions"
rm -rf "$out"
mkdir -p "$out"
bin=$(cargo bench --locked -p edgevol-appliance --bench data_path --no-run \
    --message-format=json-render-diagnostics | grep '"kind":\["bench"\].*"name":"data_path"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[[ -x "$bin" ]] || die "data_path bench not built"

log "callgrind over the data-path bench (${filters[*]}); this takes a few minutes"
valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
    "$bin" --target-only --busy-poll-us 0 --pause-ms 2000 --pool-dir "$pool_dir" "${filters[@]}" \
    >"$out/bench.md" 2>"$out/valgrind.log" &
vg=$!
# A dump at the header (setup and the fill) and at each row (its cell), while the bench idles.
dumped=0
while kill -0 "$vg" 2>/dev/null; do
    lines=$(grep -c '^|---\|^| [0-9].* | \(IOPS\|MiB/s\) |' "$out/bench.md" || true)
    while ((dumped < lines)); do
        callgrind_control -d "$vg" >/dev/null || true
        dumped=$((dumped + 1))
    done
    sleep 0.2
done
wait "$vg" || die "the bench failed under valgrind: $out/valgrind.log"

# Workload names in the order the bench ran their cells.
mapfile -t cells < <(sed -n 's/^| \([0-9][^|]*[^ ]\) *| \(IOPS\|MiB\/s\) .*/\1/p' "$out/bench.md")
echo "Engine instructions per command (callgrind, pool on $pool_dir's file system, commit $(git describe --always --dirty))"
echo
echo "| workload | commands | engine instructions | per command | largest inclusive costs per command |"
echo "|---|---:|---:|---:|---|"
for k in "${!cells[@]}"; do
    dump=$((k + 2))
    best='' best_n=0
    for f in "$out"/cg.*."$dump"-*; do
        [[ -e "$f" ]] || continue
        n=$(callgrind_annotate --tree=calling --inclusive=yes "$f" 2>/dev/null |
            grep -m1 -o 'Conn>::dispatch::{{closure}} ([0-9,]*x)' | tr -dc '0-9' || true)
        if [[ -n "$n" ]] && ((n > best_n)); then best="$f" best_n=$n; fi
    done
    [[ -n "$best" ]] || die "no engine thread in dump $dump"
    total=$(sed -n 's/^summary: //p' "$best")
    # The engine's own functions (edgevol_*), inclusive, below the loop that runs them all.
    top=$(callgrind_annotate --inclusive=yes "$best" 2>/dev/null |
        sed -n 's/^ *\([0-9,]*\) ([^)]*)  ???:\(edgevol_.*\) \[.*/\1 \2/p' |
        grep -v 'drive::{{closure}}\|Engines::spawn\|dispatch::{{closure}}' | head -5 |
        awk -v n="$best_n" '{ c = $1; gsub(",", "", c); name = $0; sub(/^[0-9,]+ /, "", name);
            sub(/::\{\{closure\}\}$/, "", name); k = split(name, seg, "::");
            printf "%s%s %d", sep, seg[k], c / n; sep = ", " }')
    printf '| %s | %d | %d | %d | %s |\n' "${cells[$k]}" "$best_n" "$total" $((total / best_n)) "$top"
done
