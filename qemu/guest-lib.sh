# Shared helpers of the shell that runs inside the QEMU guests and the firmware image (busybox
# sh). qemu/run-guest.sh puts this file into every guest, image/build.sh into the image, both as
# /lib/edgevol/guest-lib.sh; an init or a guest script sources it: . /lib/edgevol/guest-lib.sh
#   guest_init            PID 1's start: busybox applets, /proc /sys /dev, tmpfs on /tmp /run and
#                         /dev/shm, lo up, then the modules of /lib/modules/load.list in order
#                         (written by modules_install of scripts/lib.sh)
#   arg NAME              the value of edgevol.NAME= on the kernel command line (empty if absent)
#   iface_of MAC          the network interface with that MAC address
#   disk_of SERIAL        the virtio-blk disk (/dev/vdX) with that serial
#   time_scale            edgevol.time_scale= of the kernel command line (run-guest.sh passes
#                         EDGEVOL_TEST_TIME_SCALE), 1 if absent: retry, ns_of and step widen by it
#   retry TENTHS CMD...   runs CMD (output discarded) every 0.1 s until it succeeds, TENTHS times
#                         (times time_scale) at most; fails if it never did
#   net_up MAC ADDR/LEN   brings the interface with that MAC up with that address
#   fail WHY              prints "$GUEST_MARKER FAILED WHY" (the script sets GUEST_MARKER), exits 1
#   ns_of SUBNQN          the namespace block device (/dev/nvmeXnY: the multipath head, not a
#                         nvmeXcYnZ path) of that subsystem, once it shows up (up to 15 s, scaled)
#   step NAME SECS CMD... runs CMD under busybox timeout SECS (times time_scale), its output
#                         between the lines "$STEP_TAG-BEGIN NAME" and "$STEP_TAG-END NAME rc=N"
#                         (the script sets STEP_TAG), for a host test to judge each step
# shellcheck shell=sh

guest_init() {
    /bin/busybox --install -s /bin
    export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev
    mkdir -p /dev/pts /dev/shm /root /tmp /run
    mount -t tmpfs tmpfs /tmp
    mount -t tmpfs tmpfs /run
    mount -t tmpfs tmpfs /dev/shm
    ip link set lo up 2>/dev/null
    while read -r m; do
        [ -n "$m" ] || continue
        insmod "/lib/modules/$m" || echo "edgevol-guest: insmod $m failed"
    done </lib/modules/load.list
}

arg() { sed -n "s/.*edgevol\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }

time_scale() {
    _ts=$(arg time_scale)
    echo "${_ts:-1}"
}

iface_of() {
    for n in /sys/class/net/*; do
        [ "$(cat "$n/address" 2>/dev/null)" = "$1" ] && { basename "$n"; return 0; }
    done
    return 1
}

disk_of() {
    for b in /sys/block/vd*; do
        [ "$(cat "$b/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/$(basename "$b")"; return 0; }
    done
    return 1
}

retry() {
    _n=$(($1 * $(time_scale)))
    shift
    while ! "$@" >/dev/null 2>&1; do
        _n=$((_n - 1))
        [ "$_n" -gt 0 ] || return 1
        sleep 0.1
    done
}

net_up() {
    _if="$(iface_of "$1")" || { echo "edgevol-guest: no interface with MAC $1"; return 1; }
    ip link set "$_if" up && ip addr add "$2" dev "$_if"
}

ns_of() {
    _i=0 _tenths=$((150 * $(time_scale)))
    while [ $_i -lt $_tenths ]; do
        for _b in /sys/block/nvme*; do
            _n=${_b##*/}
            case "$_n" in *c*) continue ;; esac
            _s=$(cat "$_b/device/subsysnqn" 2>/dev/null || cat "$_b/device/../subsysnqn" 2>/dev/null)
            if [ "$_s" = "$1" ] && [ -b "/dev/$_n" ]; then
                echo "/dev/$_n"
                return 0
            fi
        done
        sleep 0.1
        _i=$((_i + 1))
    done
    echo "edgevol-guest: no namespace of $1 in: $(ls /sys/block)"
    return 1
}

fail() {
    echo "$GUEST_MARKER FAILED $*"
    exit 1
}

step() {
    _name=$1 _budget=$2
    shift 2
    echo "$STEP_TAG-BEGIN $_name"
    timeout "$((_budget * $(time_scale)))" "$@" 2>&1
    echo "$STEP_TAG-END $_name rc=$?"
}
