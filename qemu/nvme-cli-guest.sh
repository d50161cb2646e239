# Runs inside the nvme-cli interop guest (appliance/tests/nvme_cli.rs copies it to
# /etc/nvme-cli-guest.sh; busybox sh, Debian's nvme-cli copied from the host with its libraries).
# Drives nvme-cli against edgevol's target in the host test process, reached through slirp at
# 10.0.2.2, and prints every step's output between markers for the host test to judge:
#   EVCLI-BEGIN <step>
#   <stdout and stderr of the step>
#   EVCLI-END <step> rc=<exit code>          (124 or 143: the step's time budget was spent)
# then EVCLI-DONE. The script asserts nothing itself: a step that fails does not stop the others.
#
# usage: sh nvme-cli-guest.sh PORT SUBNQN OTHER_SUBNQN HOSTNQN STRANGER_HOSTNQN
#   SUBNQN is published to HOSTNQN, OTHER_SUBNQN to another host; STRANGER_HOSTNQN to nothing.
#   (The script calls itself as `sh nvme-cli-guest.sh --wait-ns|--roundtrip DEV` so that those
#   steps, too, run under busybox `timeout`.)

# The namespace nvme-cli created (the guest has no other NVMe device), once it shows up.
if [ "$1" = --wait-ns ]; then
    i=0
    while ! ls /sys/block/ | grep -qE '^nvme[0-9]+n[0-9]+$' && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    ls /sys/block/ | grep -E '^nvme[0-9]+n[0-9]+$'
    exit
fi
# 4 MiB of a known pattern at 1 MiB, read back after dropping the page cache; both checksums.
if [ "$1" = --roundtrip ]; then
    yes EDGEVOL-NVME-CLI | head -c 4194304 >/tmp/written &&
        dd if=/tmp/written of="$2" bs=65536 seek=16 conv=fsync &&
        echo 3 >/proc/sys/vm/drop_caches &&
        dd if="$2" of=/tmp/read bs=65536 skip=16 count=64 &&
        echo "written $(md5sum </tmp/written)" && echo "read $(md5sum </tmp/read)"
    exit
fi

self=$0 port=$1 nqn=$2 other=$3 host=$4 stranger=$5
fabric="-t tcp -a 10.0.2.2 -s $port"

step() { # NAME BUDGET_SECS COMMAND...
    name=$1 budget=$2
    shift 2
    echo "EVCLI-BEGIN $name"
    timeout "$budget" "$@" 2>&1
    echo "EVCLI-END $name rc=$?"
}
ctrl() { for c in /sys/class/nvme/nvme*; do [ -e "$c" ] && echo "/dev/${c##*/}"; done; }
ns() { ls /sys/block/ | grep -E '^nvme[0-9]+n[0-9]+$' | sed 's|^|/dev/|'; }

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
    step disconnect 20 nvme disconnect -n "$nqn"
    step connect-stranger 30 nvme connect $fabric -n "$nqn" --hostnqn "$stranger"
    step connect-other 30 nvme connect $fabric -n "$other" --hostnqn "$host"
    step leftovers 10 sh -c 'ls /sys/class/nvme /sys/block | grep "^nvme" || echo none'
}
echo "EVCLI-DONE"
