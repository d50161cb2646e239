# Runs inside the fault-check guest (appliance/tests/faults_qemu.rs copies it to
# /etc/faults-guest.sh; busybox sh, Debian's nvme-cli and fio copied from the host with their
# libraries). edgevold runs as a real process on the host, reached through slirp at 10.0.2.2;
# the host test kills and restarts it, or unpublishes the volume, when this script asks on the
# control port. Every step's output is printed between markers for the host test to judge:
#   EVF-BEGIN <step>
#   <stdout and stderr of the step>
#   EVF-END <step> rc=<exit code>          (124 or 143: the step's time budget was spent)
# then EVF-DONE. The script asserts nothing itself: a step that fails does not stop the others.
#
# usage: sh faults-guest.sh PORT CTL_PORT HOSTNQN OVERWRITE_NQN ALLOCATE_NQN UNPUBLISH_NQN \
#          FAST_IO_FAIL_TMO
#   OVERWRITE_NQN, ALLOCATE_NQN, UNPUBLISH_NQN: three volumes published to HOSTNQN.
#   CTL_PORT: the host test's control port. A line "kill NAME" makes the host SIGKILL and restart
#   edgevold three times while this guest writes; a line "unpublish" makes it call
#   ControllerUnpublishVolume on UNPUBLISH_NQN's volume. The host answers when it is done.
#   (The script calls itself as `sh faults-guest.sh --<step> ...` so that those steps, too, run
#   under busybox `timeout`.)
#
# Workloads (fio 4k random writes at QD16, no fsync, no FUA: O_DIRECT only; crc32c verify
# headers in every block, read back and checked after the write phase):
#   overwrite: 16 MiB written sequentially and flushed first (fio --end_fsync), then 12 MiB of
#              random 4k overwrites inside it (3072 blocks, each once).
#   allocate:  a fresh 1 GiB thin volume; 3072 random 4k blocks spread over its 1024 clusters
#              (1 MiB each), so most writes are the first write of their cluster; no Flush ever.
# Both are rate-limited to RATE IOPS so the write phase (~30 s) outlasts the host's three kill
# and restart cycles; fio catches up after each stall.
# shellcheck shell=sh
RATE=100

# The namespace block device of subsystem $2, once it shows up (guest-lib.sh's ns_of).
if [ "$1" = --wait-ns ]; then
    # shellcheck source=qemu/guest-lib.sh
    . /lib/edgevol/guest-lib.sh
    ns_of "$2"
    exit
fi

# 16 MiB written and flushed: the overwrite workload's region exists before the kills.
if [ "$1" = --prefill ]; then
    exec fio --name=prefill --filename="$2" --size=16m --rw=write --bs=1m --ioengine=libaio \
        --iodepth=4 --direct=1 --end_fsync=1
fi

# A connect through /dev/nvme-fabrics with the options the node plugin uses: Debian 12's
# nvme-cli 2.3 has no --fast_io_fail_tmo (the kernel option is fast_io_fail_tmo).
if [ "$1" = --connect-fabrics ]; then
    port=$2 nqn=$3 host=$4 fast=$5
    exec 3<>/dev/nvme-fabrics || exit 1
    echo "transport=tcp,traddr=10.0.2.2,trsvcid=$port,nqn=$nqn,hostnqn=$host,ctrl_loss_tmo=60,reconnect_delay=1,fast_io_fail_tmo=$fast" >&3 ||
        exit 1
    read -r reply <&3
    exec 3>&-
    echo "fabrics: $reply"
    exit 0
fi

# fio writes while the host kills edgevold three times (it answers once its third restart has
# seen writes again), then fio verifies every block it wrote.
if [ "$1" = --faults ]; then
    dev=$2 ctl=$3 name=$4
    case "$name" in
    overwrite) region=16m ;;
    allocate) region=1g ;;
    *) echo "unknown workload $name"; exit 2 ;;
    esac
    dmesg -c >/dev/null
    fio --name="$name" --filename="$dev" --size="$region" --io_size=12m --rw=randwrite --bs=4k \
        --ioengine=libaio --iodepth=16 --direct=1 --rate_iops=$RATE --verify=crc32c \
        --do_verify=1 --continue_on_error=verify >"/tmp/fio-$name" 2>&1 &
    fio=$!
    sleep 2
    echo "host $(echo "kill $name" | timeout 170 nc 10.0.2.2 "$ctl")"
    wait "$fio"
    rc=$?
    echo "fio rc=$rc"
    # fio's summary (err=, issued), then every verify failure counted, the first few shown.
    grep -E 'err=|issued rwts|IOPS=' "/tmp/fio-$name"
    pat='bad magic header|verify failed|bad header|verify type mismatch'
    echo "verify-errors $(grep -cE "$pat" "/tmp/fio-$name")"
    grep -m 5 -E "$pat" "/tmp/fio-$name"
    echo "dmesg:"
    dmesg | grep -E 'nvme|I/O|error|blk_'
    exit "$rc"
fi

# fio writes, the host unpublishes the volume; fio must get an I/O error within the bound
# (fast_io_fail_tmo after the controller lost its connection), and the target must refuse the
# controller's reconnects. Times from /proc/uptime.
if [ "$1" = --unpublish ]; then
    dev=$2 ctl=$3
    dmesg -c >/dev/null
    fio --name=unpublish --filename="$dev" --size=16m --rw=randwrite --bs=4k --ioengine=libaio \
        --iodepth=16 --direct=1 --time_based --runtime=300 --norandommap --randrepeat=0 \
        >/tmp/fio-unpublish 2>&1 &
    fio=$!
    sleep 3
    t_ask=$(cut -d' ' -f1 /proc/uptime)
    echo "host $(echo unpublish | timeout 60 nc 10.0.2.2 "$ctl")"
    t_done=$(cut -d' ' -f1 /proc/uptime)
    i=0
    while kill -0 "$fio" 2>/dev/null && [ $i -lt 900 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    t_fail=$(cut -d' ' -f1 /proc/uptime)
    if kill -0 "$fio" 2>/dev/null; then
        echo "fio still writing 90 s after the unpublish"
        kill "$fio"
    fi
    wait "$fio"
    echo "fio rc=$?"
    echo "unpublish-call-s $(awk "BEGIN { printf \"%.1f\", $t_done - $t_ask }")"
    echo "io-failed-after-s $(awk "BEGIN { printf \"%.1f\", $t_fail - $t_done }")"
    grep -E 'err=|error' /tmp/fio-unpublish | head -n 5
    # Let the kernel try (and be refused) a few more reconnects before the log is read.
    sleep 3
    echo "dmesg:"
    dmesg | grep -E 'nvme|I/O|error|blk_'
    exit 0
fi

self=$0 port=$1 ctl=$2 host=$3 ow=$4 alloc=$5 unpub=$6 fast=$7
fabric="-t tcp -a 10.0.2.2 -s $port"

# step NAME BUDGET_SECS COMMAND... (qemu/guest-lib.sh) prints the EVF-BEGIN/EVF-END lines.
# shellcheck source=qemu/guest-lib.sh
. /lib/edgevol/guest-lib.sh
STEP_TAG=EVF
ns() { sh "$self" --wait-ns "$1" | tail -n 1; }

step net 10 sh -c 'ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0'
# shellcheck disable=SC2086 # $fabric is several words on purpose
{
    # 1a. overwrites of a flushed region, edgevold killed three times.
    step ow-connect 30 nvme connect $fabric -n "$ow" --hostnqn "$host" --ctrl-loss-tmo=120 \
        --reconnect-delay=1
    step ow-namespace 20 sh "$self" --wait-ns "$ow"
    step ow-prefill 90 sh "$self" --prefill "$(ns "$ow")"
    step ow-faults 240 sh "$self" --faults "$(ns "$ow")" "$ctl" overwrite
    step ow-disconnect 30 nvme disconnect -n "$ow"
    # 1b. allocating writes on a fresh volume, never flushed, edgevold killed three times.
    step alloc-connect 30 nvme connect $fabric -n "$alloc" --hostnqn "$host" --ctrl-loss-tmo=120 \
        --reconnect-delay=1
    step alloc-namespace 20 sh "$self" --wait-ns "$alloc"
    step alloc-faults 240 sh "$self" --faults "$(ns "$alloc")" "$ctl" allocate
    step alloc-disconnect 30 nvme disconnect -n "$alloc"
    # 2. unpublish while the guest writes.
    step up-connect 30 sh "$self" --connect-fabrics "$port" "$unpub" "$host" "$fast"
    step up-namespace 20 sh "$self" --wait-ns "$unpub"
    step up-io 150 sh "$self" --unpublish "$(ns "$unpub")" "$ctl"
    step up-disconnect 30 nvme disconnect -n "$unpub"
    step leftovers 10 sh -c 'ls /sys/class/nvme /sys/block | grep "^nvme" || echo none'
}
echo "EVF-DONE"
