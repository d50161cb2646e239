# Runs inside the nvme-cli interop guest (appliance/tests/nvme_cli.rs copies it to
# /etc/nvme-cli-guest.sh; busybox sh, Debian's nvme-cli copied from the host with its libraries).
# Drives nvme-cli against edgevol's target in the host test process, reached through slirp at
# 10.0.2.2, and prints every step's output between markers for the host test to judge:
#   EVCLI-BEGIN <step>
#   <stdout and stderr of the step>
#   EVCLI-END <step> rc=<exit code>          (124 or 143: the step's time budget was spent)
# then EVCLI-DONE. The script asserts nothing itself: a step that fails does not stop the others.
#
# usage: sh nvme-cli-guest.sh PORT CTL_PORT SUBNQN OTHER_SUBNQN HOSTNQN STRANGER_HOSTNQN
#   SUBNQN is published to HOSTNQN, OTHER_SUBNQN to another host; STRANGER_HOSTNQN to nothing.
#   CTL_PORT: the host test's control port; a line "snapshot" sent there makes the host snapshot
#   the volume over CSI, and the host answers once the snapshot is cut.
#   (The script calls itself as `sh nvme-cli-guest.sh --<step> DEV ...` so that those steps,
#   too, run under busybox `timeout`.)
#
# Layout of the 256 MiB volume: ext4 on the first 64 MiB; dd round trip at 64 MiB (4 MiB); fio
# verify at 80 MiB (32 MiB); snapshot region at 128 MiB (8 MiB); fio writes during the snapshot
# at 144 MiB (32 MiB). The host reads the regions back through core.
# shellcheck shell=sh

# The NVMe namespaces' block devices (nvmeXnY), one name a line; fails when there is none.
namespaces() { for b in /sys/block/*; do echo "${b##*/}"; done | grep -E '^nvme[0-9]+n[0-9]+$'; }

# The namespace nvme-cli created (the guest has no other NVMe device), once it shows up.
if [ "$1" = --wait-ns ]; then
    i=0
    while ! namespaces >/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    namespaces
    exit
fi
# 4 MiB of a known pattern at 64 MiB, read back after dropping the page cache; both checksums.
if [ "$1" = --roundtrip ]; then
    yes EDGEVOL-NVME-CLI | head -c 4194304 >/tmp/written &&
        dd if=/tmp/written of="$2" bs=65536 seek=1024 conv=fsync &&
        echo 3 >/proc/sys/vm/drop_caches &&
        dd if="$2" of=/tmp/read bs=65536 skip=1024 count=64 &&
        echo "written $(md5sum </tmp/written)" && echo "read $(md5sum </tmp/read)"
    exit
fi

# A Read of the first block past the end of the namespace: LBA Out of Range, and an entry in
# the controller's Error Information log.
if [ "$1" = --past-end ]; then
    n=${2#/dev/}
    lbs=$(cat "/sys/block/$n/queue/logical_block_size")
    blocks=$(($(cat "/sys/block/$n/size") * 512 / lbs))
    echo "blocks $blocks"
    nvme read "$2" --start-block="$blocks" --block-count=0 --data-size="$lbs" --data=/dev/null
    exit
fi
# fio's own check: 32 MiB of 4k random writes at QD16, each block stamped with a crc32c header,
# then read back and verified (fio exits non-zero on the first bad block).
if [ "$1" = --fio-verify ]; then
    exec fio --name=verify --filename="$2" --offset=80m --size=32m --rw=randwrite --bs=4k \
        --ioengine=libaio --iodepth=16 --direct=1 --verify=crc32c --do_verify=1 --verify_fatal=1
fi
# A snapshot while the guest writes: 8 MiB written and flushed first ("before"), fio writing
# elsewhere while the host cuts the snapshot, then the same 8 MiB overwritten ("after"). A clone
# of the snapshot must hold "before", the volume "after".
if [ "$1" = --snapshot ]; then
    dev=$2 ctl=$3
    dd if=/dev/urandom of=/tmp/before bs=1048576 count=8 2>/dev/null &&
        dd if=/tmp/before of="$dev" bs=1048576 seek=128 conv=fsync 2>/dev/null || exit 1
    echo "before $(sha256sum </tmp/before)"
    fio --name=during --filename="$dev" --offset=144m --size=32m --rw=randwrite --bs=4k \
        --ioengine=libaio --iodepth=16 --direct=1 --time_based --runtime=10 --norandommap \
        --randrepeat=0 >/tmp/during 2>&1 &
    fio=$!
    sleep 3
    echo "host $(echo snapshot | nc 10.0.2.2 "$ctl")"
    dd if=/dev/urandom of=/tmp/after bs=1048576 count=8 2>/dev/null &&
        dd if=/tmp/after of="$dev" bs=1048576 seek=128 conv=fsync 2>/dev/null || exit 1
    echo "after $(sha256sum </tmp/after)"
    wait "$fio"
    rc=$?
    grep -E 'err=|IOPS' /tmp/during
    echo "fio rc=$rc"
    exit "$rc"
fi
# ext4 with a few files and their checksums; verified after a disconnect and a fresh connect.
if [ "$1" = --fs-write ]; then
    mkfs.ext4 -q -F -b 4096 "$2" 16384 && mkdir -p /mnt/v && mount -t ext4 "$2" /mnt/v || exit 1
    for n in 1 3 5; do
        dd if=/dev/urandom of=/mnt/v/file$n bs=1048576 count=$n 2>/dev/null || exit 1
    done
    head -c 12345 /dev/urandom >/mnt/v/odd && mkdir /mnt/v/dir && cp /mnt/v/file3 /mnt/v/dir/copy &&
        (cd /mnt/v && md5sum file1 file3 file5 odd dir/copy) >/tmp/sums && cat /tmp/sums &&
        umount /mnt/v
    exit
fi
if [ "$1" = --fs-verify ]; then
    mount -t ext4 -o ro "$2" /mnt/v || exit 1
    (cd /mnt/v && md5sum -c /tmp/sums)
    rc=$?
    umount /mnt/v
    exit "$rc"
fi

self=$0 port=$1 ctl=$2 nqn=$3 other=$4 host=$5 stranger=$6
fabric="-t tcp -a 10.0.2.2 -s $port"

# step NAME BUDGET_SECS COMMAND... (qemu/guest-lib.sh) prints the EVCLI-BEGIN/EVCLI-END lines.
# shellcheck source=qemu/guest-lib.sh
. /lib/edgevol/guest-lib.sh
STEP_TAG=EVCLI
ctrl() { for c in /sys/class/nvme/nvme*; do [ -e "$c" ] && echo "/dev/${c##*/}"; done; }
ns() { namespaces | sed 's|^|/dev/|'; }

step net 10 sh -c 'ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0'
# shellcheck disable=SC2086 # $fabric is several words on purpose
{
    step discover 30 nvme discover $fabric --hostnqn "$host"
    step discover-stranger 30 nvme discover $fabric --hostnqn "$stranger"
    step connect 30 nvme connect $fabric -n "$nqn" --hostnqn "$host"
    step namespace 15 sh "$self" --wait-ns
    step list 20 nvme list
    step id-ctrl 20 nvme id-ctrl "$(ctrl)"
    step id-ns 20 nvme id-ns "$(ns)"
    step ns-descs 20 nvme ns-descs "$(ns)"
    step io 60 sh "$self" --roundtrip "$(ns)"
    step past-end 20 sh "$self" --past-end "$(ns)"
    step error-log 20 nvme error-log "$(ctrl)" --log-entries=2
    step fio-verify 120 sh "$self" --fio-verify "$(ns)"
    step snapshot 90 sh "$self" --snapshot "$(ns)" "$ctl"
    step fs-write 90 sh "$self" --fs-write "$(ns)"
    step disconnect 20 nvme disconnect -n "$nqn"
    step reconnect 30 nvme connect $fabric -n "$nqn" --hostnqn "$host"
    step namespace-again 15 sh "$self" --wait-ns
    step fs-verify 60 sh "$self" --fs-verify "$(ns)"
    step disconnect-again 20 nvme disconnect -n "$nqn"
    step connect-stranger 30 nvme connect $fabric -n "$nqn" --hostnqn "$stranger"
    step connect-other 30 nvme connect $fabric -n "$other" --hostnqn "$host"
    step leftovers 10 sh -c 'ls /sys/class/nvme /sys/block | grep "^nvme" || echo none'
}
echo "EVCLI-DONE"
