# Runs inside the node VM of the power-cut check (tests/e2e/tests/powercut.rs sends it through
# the test agent to /tmp/pc.sh; busybox sh). The writers log every write that an fsync made
# durable, on the node's tmpfs, which the power cut of the appliance VM does not touch:
#   sh /tmp/pc.sh fs DIR     files of 256 KiB (random) on the ext4 volume mounted at DIR, each
#                            written with dd conv=fsync then sync -f; logged "md5 name" after.
#   sh /tmp/pc.sh raw DEV    batches of 32 O_DIRECT 4 KiB writes to the block volume DEV
#                            followed by one fsync (as fio --fsync=32; the node VM has no fio),
#                            batch N at 128 KiB * N; logged "N md5" after the fsync returned.
# Both stop when /tmp/pc-stop exists; a failed write or fsync is logged to /tmp/pc-*.err and the
# writer goes on. While /tmp/pc-pause exists they wait before their next write, and say so in
# /tmp/pc-fs.paused and /tmp/pc-raw.paused.
#   sh /tmp/pc.sh hold DEV       on a block volume of its own, which nothing else flushes: once
#                                /tmp/pc-hold-go exists, 4 KiB O_DIRECT writes, each the first
#                                of a new 1 MiB cluster (block N at N MiB, at most 240), their
#                                count in /tmp/pc-hold.state, until /tmp/pc-hold-stop exists
#                                (then /tmp/pc-hold.stopped says so); once /tmp/pc-release exists
#                                (the host creates it after the cut) one fsync, and "N md5" of
#                                every write in /tmp/pc-hold.log. With the other writers paused
#                                the cut finds them acknowledged and never flushed by the host.
# Then:
#   sh /tmp/pc.sh counts         "fs N raw M fs-errors E raw-errors F"
#   sh /tmp/pc.sh verify-fs DIR  every logged file read back after dropping the page cache
#   sh /tmp/pc.sh verify-raw DEV every logged batch read back with O_DIRECT
#   sh /tmp/pc.sh verify-hold DEV every held write read back with O_DIRECT
# (each prints "verified N bad M" and the first bad entries with their all-zero 4 KiB blocks).
# shellcheck shell=sh
mode=$1 target=$2
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
pause() { # NAME: wait while /tmp/pc-pause exists
    while [ -e /tmp/pc-pause ]; do
        [ -e "/tmp/pc-$1.paused" ] || echo paused >"/tmp/pc-$1.paused"
        sleep 0.1
    done
    rm -f "/tmp/pc-$1.paused"
}
ZERO4K=$(head -c 4096 /dev/zero | md5sum | cut -d' ' -f1)
# All-zero 4 KiB blocks of a file (what a lost mapping reads as).
zeros() {
    z=0 n=0 size=$(wc -c <"$1")
    while [ $((n * 4096)) -lt "$size" ]; do
        [ "$(dd if="$1" bs=4096 skip=$n count=1 2>/dev/null | md5sum | cut -d' ' -f1)" = "$ZERO4K" ] &&
            z=$((z + 1))
        n=$((n + 1))
    done
    echo "$z of $n 4 KiB blocks all zero"
}
# verify_blocks LOG BLOCKS STRIDE WHAT: each "N md5" of LOG read back with O_DIRECT, BLOCKS 4 KiB
# blocks at N * STRIDE blocks into the device.
verify_blocks() {
    ok=0 bad=0
    while read -r n sum; do
        dd if="$target" of=/tmp/pc-vbuf bs=4096 count="$2" skip=$((n * $3)) iflag=direct 2>/dev/null
        got=$(md5sum </tmp/pc-vbuf | cut -d' ' -f1)
        if [ "$got" = "$sum" ]; then
            ok=$((ok + 1))
        else
            bad=$((bad + 1))
            [ $bad -le 5 ] && echo "bad: $4 $n want $sum got $got: $(zeros /tmp/pc-vbuf)"
        fi
    done <"$1"
    echo "verified $ok bad $bad"
}

case "$mode" in
fs)
    i=0
    while [ ! -e /tmp/pc-stop ]; do
        pause fs
        i=$((i + 1))
        dd if=/dev/urandom of=/tmp/pc-fbuf bs=65536 count=4 2>/dev/null
        sum=$(md5sum </tmp/pc-fbuf | cut -d' ' -f1)
        if dd if=/tmp/pc-fbuf of="$target/f$i" bs=65536 conv=fsync 2>>/tmp/pc-fs.err &&
            sync -f "$target"; then
            echo "$sum f$i" >>/tmp/pc-fs.log
        else
            echo "write or fsync of f$i failed" >>/tmp/pc-fs.err
        fi
    done
    ;;
raw)
    i=0
    # 1024 batches of 128 KiB: the first 128 MiB of the volume.
    while [ ! -e /tmp/pc-stop ] && [ $i -lt 1024 ]; do
        pause raw
        dd if=/dev/urandom of=/tmp/pc-rbuf bs=4096 count=32 2>/dev/null
        sum=$(md5sum </tmp/pc-rbuf | cut -d' ' -f1)
        if dd if=/tmp/pc-rbuf of="$target" bs=4096 count=32 seek=$((i * 32)) oflag=direct \
            conv=notrunc,fsync 2>>/tmp/pc-raw.err; then
            echo "$i $sum" >>/tmp/pc-raw.log
        else
            echo "write or fsync of batch $i failed" >>/tmp/pc-raw.err
        fi
        i=$((i + 1))
    done
    ;;
hold)
    # The data first (240 random blocks), so that nothing but the writes runs in the loop.
    dd if=/dev/urandom of=/tmp/pc-hdata bs=4096 count=240 2>/dev/null
    while [ ! -e /tmp/pc-hold-go ]; do sleep 0.1; done
    i=0
    while [ ! -e /tmp/pc-release ] && [ ! -e /tmp/pc-hold-stop ] && [ $i -lt 240 ]; do
        dd if=/tmp/pc-hdata of="$target" bs=4096 count=1 skip=$i seek=$((i * 256)) \
            oflag=direct conv=notrunc 2>>/tmp/pc-raw.err ||
            { echo "held write $i failed" >>/tmp/pc-raw.err; exit 1; }
        i=$((i + 1))
        echo $i >/tmp/pc-hold.state
    done
    echo stopped >/tmp/pc-hold.stopped
    while [ ! -e /tmp/pc-release ]; do sleep 0.2; done
    if sync "$target" 2>>/tmp/pc-raw.err; then
        j=0
        while [ $j -lt $i ]; do
            sum=$(dd if=/tmp/pc-hdata bs=4096 count=1 skip=$j 2>/dev/null | md5sum | cut -d' ' -f1)
            echo "$j $sum" >>/tmp/pc-hold.log
            j=$((j + 1))
        done
    else
        echo "fsync of the held writes failed" >>/tmp/pc-raw.err
    fi
    ;;
counts)
    fe=0 re=0
    [ -f /tmp/pc-fs.err ] && fe=$(grep -c failed /tmp/pc-fs.err)
    [ -f /tmp/pc-raw.err ] && re=$(grep -c failed /tmp/pc-raw.err)
    echo "fs $(lines /tmp/pc-fs.log) raw $(lines /tmp/pc-raw.log) fs-errors $fe raw-errors $re"
    ;;
verify-fs)
    sync
    echo 3 >/proc/sys/vm/drop_caches
    ok=0 bad=0
    while read -r sum name; do
        got=$(md5sum <"$target/$name" | cut -d' ' -f1)
        if [ "$got" = "$sum" ]; then
            ok=$((ok + 1))
        else
            bad=$((bad + 1))
            [ $bad -le 5 ] && echo "bad: $name want $sum got $got: $(zeros "$target/$name")"
        fi
    done </tmp/pc-fs.log
    echo "verified $ok bad $bad"
    ;;
verify-raw)
    verify_blocks /tmp/pc-raw.log 32 32 batch
    ;;
verify-hold)
    verify_blocks /tmp/pc-hold.log 1 256 "held write"
    ;;
*)
    echo "usage: pc.sh fs DIR | raw DEV | hold DEV | counts | verify-fs DIR | verify-raw DEV | verify-hold DEV" >&2
    exit 2
    ;;
esac
