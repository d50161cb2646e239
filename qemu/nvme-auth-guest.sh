# Runs inside the DH-HMAC-CHAP interop guest (appliance/tests/nvme_auth_qemu.rs boots the 6.12
# kernel with qemu/run-guest.sh --kernel auth and copies this to /etc/nvme-auth-guest.sh; busybox
# sh, Debian's nvme-cli and fio copied from the host with their libraries). Linux's initiator
# against edgevold's target in the host test process, reached through slirp at 10.0.2.2; every
# connect is `nvme connect --hostnqn --hostid [--dhchap-secret --dhchap-ctrl-secret]`.
#   refusals:  no key, a wrong host key, a wrong controller key, another node's pair, each on a
#              volume (REFUSE_NQN) that nothing ever reaches
#   connect:   the right pair (bidirectional), 4 MiB of a pattern written at 1 MiB and read back
#   rotation:  fio writes and verifies while the host test rotates the node's keys (asked for
#              over the control port CTL: "rotate" answers "keys HOST_SECRET CTRL_SECRET") and
#              the new pair goes to the controller's sysfs dhchap_ctrl_secret and dhchap_secret
#              (the kernel re-authenticates its queues); then the old pair is refused on a new
#              connect and the new one connects
#   matrix:    RUNS rounds of one timed connect + disconnect to each appliance of
#              /etc/nvme-auth-matrix (lines "LABEL PORT SUBNQN HOST_SECRET|- CTRL_SECRET|-": one
#              appliance per hash / DH group the host test allows, and one open appliance)
# Settings come from /etc/nvme-auth.env (shell assignments written by the host test). Every
# step's output is printed between "EVNA-BEGIN <step>" and "EVNA-END <step> rc=<rc>" (124 or
# 143: its time budget was spent), then EVNA-DONE. The script asserts nothing itself.
# (The script calls itself as `sh nvme-auth-guest.sh --<step> ...` so that those steps, too,
# run under busybox `timeout`.)
# shellcheck shell=sh source=qemu/guest-lib.sh
. /lib/edgevol/guest-lib.sh
STEP_TAG=EVNA
# shellcheck disable=SC1091 # written by the host test: HOST HOSTID CTL RUNS MAIN_PORT
# MAIN_NQN REFUSE_NQN KEY CTRL_KEY WRONG_KEY WRONG_CTRL_KEY OTHER_KEY OTHER_CTRL_KEY
. /etc/nvme-auth.env
self=$0

uptime_s() { cut -d' ' -f1 /proc/uptime; }
ctrl_dir() { for c in /sys/class/nvme/nvme*; do [ -e "$c" ] && { echo "$c"; return 0; }; done; return 1; }
ns_dev() {
    for b in /sys/block/nvme*n*; do
        case "${b##*/}" in *c*) ;; *) [ -e "$b" ] && { echo "/dev/${b##*/}"; return 0; } ;; esac
    done
    return 1
}
no_controller() { [ "$(controllers)" -eq 0 ]; }
controllers() {
    n=0
    for c in /sys/class/nvme/nvme*; do [ -e "$c" ] && n=$((n + 1)); done
    echo "$n"
}

case "${1:-}" in
--connect)
    # --connect PORT SUBNQN HOST_SECRET|- CTRL_SECRET|-: the connect, its wall time, and the
    # controllers afterwards.
    port=$2 nqn=$3 key=$4 ckey=$5
    set -- nvme connect -t tcp -a 10.0.2.2 -s "$port" -n "$nqn" --hostnqn "$HOST" --hostid "$HOSTID"
    [ "$key" = - ] || set -- "$@" --dhchap-secret="$key"
    [ "$ckey" = - ] || set -- "$@" --dhchap-ctrl-secret="$ckey"
    t0=$(uptime_s)
    "$@"
    rc=$?
    t1=$(uptime_s)
    echo "elapsed $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")"
    echo "controllers $(controllers)"
    exit "$rc"
    ;;
--roundtrip)
    # 4 MiB of a pattern at 1 MiB, read back with O_DIRECT: both checksums.
    yes EDGEVOL-NVME-AUTH | head -c 4194304 >/tmp/written &&
        dd if=/tmp/written of="$2" bs=65536 seek=16 conv=fsync 2>/dev/null &&
        dd if="$2" of=/tmp/read bs=65536 skip=16 count=64 iflag=direct 2>/dev/null &&
        echo "written $(md5sum </tmp/written)" && echo "read $(md5sum </tmp/read)"
    exit
    ;;
--readback)
    # The pattern at 1 MiB, read again with O_DIRECT (on a new connect, once the namespace shows).
    dev=$(retry 100 ns_dev && ns_dev) || exit 1
    dd if="$dev" of=/tmp/again bs=65536 skip=16 count=64 iflag=direct 2>/dev/null &&
        echo "read $(md5sum </tmp/again)"
    exit
    ;;
--rotate)
    # fio writes 4k blocks at QD8 over 16 MiB at 16 MiB for 15 s, verifying them as it goes;
    # 5 s in, the new pair is asked for and written to the controller; fio must end clean.
    dev=$2 c=$(ctrl_dir) || exit 1
    fio --name=rotation --filename="$dev" --offset=16m --size=16m --rw=randwrite --bs=4k \
        --ioengine=libaio --iodepth=8 --direct=1 --time_based --runtime=15 --verify=crc32c \
        --verify_backlog=256 --verify_fatal=1 >/tmp/fio 2>&1 &
    fio=$!
    sleep 5
    reply=$(echo rotate | nc 10.0.2.2 "$CTL")
    # shellcheck disable=SC2086 # three words on purpose
    set -- $reply
    [ "$1" = keys ] || { echo "control port answered: $reply"; kill "$fio"; exit 1; }
    dmesg -c >/dev/null
    t0=$(uptime_s)
    printf '%s' "$3" >"$c/dhchap_ctrl_secret" || echo "dhchap_ctrl_secret write failed"
    printf '%s' "$2" >"$c/dhchap_secret" || echo "dhchap_secret write failed"
    echo "new keys written at uptime $t0 s"
    [ "$(cat "$c/dhchap_secret")" = "$2" ] && echo "sysfs dhchap_secret: the new one"
    [ "$(cat "$c/dhchap_ctrl_secret")" = "$3" ] && echo "sysfs dhchap_ctrl_secret: the new one"
    wait "$fio"
    rc=$?
    echo "fio rc=$rc"
    grep -E 'err=|verify|IOPS|error' /tmp/fio
    echo "state $(cat "$c/state")"
    exit "$rc"
    ;;
esac

step net 10 sh -c 'ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0'
# The DH exponents come from the kernel's RNG: wait until its pool is ready (virtio-rng).
step entropy 120 sh -c 'head -c 1 /dev/random >/dev/null && echo ready'
dmesg -c >/dev/null
kmsg() { step "dmesg-$1" 10 sh -c 'dmesg -c | grep -iE "nvme|auth|dhchap"'; }

# --- refused: nothing may reach REFUSE_NQN -------------------------------------------------------
step refuse-no-key 100 sh "$self" --connect "$MAIN_PORT" "$REFUSE_NQN" - -
kmsg refuse-no-key
step refuse-wrong-host-key 100 sh "$self" --connect "$MAIN_PORT" "$REFUSE_NQN" "$WRONG_KEY" "$CTRL_KEY"
kmsg refuse-wrong-host-key
step refuse-wrong-ctrl-key 100 sh "$self" --connect "$MAIN_PORT" "$REFUSE_NQN" "$KEY" "$WRONG_CTRL_KEY"
kmsg refuse-wrong-ctrl-key
step refuse-other-node 100 sh "$self" --connect "$MAIN_PORT" "$REFUSE_NQN" "$OTHER_KEY" "$OTHER_CTRL_KEY"
kmsg refuse-other-node
step leftovers-refused 5 sh -c 'ls /sys/class/nvme /sys/block | grep "^nvme" || echo none'

# --- the right pair: connect, I/O, rotation ------------------------------------------------------
step connect 100 sh "$self" --connect "$MAIN_PORT" "$MAIN_NQN" "$KEY" "$CTRL_KEY"
kmsg connect
dev=$(retry 100 ns_dev && ns_dev)
# shellcheck disable=SC2016 # expanded by the step's shell
step controller 10 sh -c 'for c in /sys/class/nvme/nvme*; do echo "${c##*/}"
    for a in state transport subsysnqn hostnqn queue_count; do echo "$a: $(cat "$c/$a")"; done
    for a in dhchap_secret dhchap_ctrl_secret; do
        case "$(cat "$c/$a")" in DHHC-1:*) echo "$a: set" ;; *) echo "$a: none" ;; esac; done; done'
step io 60 sh "$self" --roundtrip "$dev"
step rotate 120 sh "$self" --rotate "$dev"
kmsg rotate
step pairs 10 sh -c "echo pairs | nc 10.0.2.2 $CTL"
step readback 30 sh "$self" --readback
step disconnect 30 nvme disconnect -n "$MAIN_NQN"
step refuse-old-key 100 sh "$self" --connect "$MAIN_PORT" "$REFUSE_NQN" "$KEY" "$CTRL_KEY"
kmsg refuse-old-key
# The new pair, as the control port gave it, on a new connect.
# shellcheck disable=SC2046 # two words on purpose
set -- $(echo current | nc 10.0.2.2 "$CTL")
step connect-new-key 100 sh "$self" --connect "$MAIN_PORT" "$MAIN_NQN" "$2" "$3"
kmsg connect-new-key
step readback-new-key 30 sh "$self" --readback
step disconnect-new-key 30 nvme disconnect -n "$MAIN_NQN"
step leftovers 5 sh -c 'ls /sys/class/nvme /sys/block | grep "^nvme" || echo none'

# --- every hash and DH group, and connect time with and without authentication ------------------
run=1
while [ "$run" -le "$RUNS" ]; do
    while read -r label port nqn key ckey; do
        [ -n "$label" ] || continue
        step "m-$label-$run" 100 sh "$self" --connect "$port" "$nqn" "$key" "$ckey"
        [ "$run" = 1 ] && kmsg "m-$label-$run"
        nvme disconnect -n "$nqn" >/dev/null 2>&1
        retry 100 no_controller || echo "m-$label-$run: controller still there"
    done </etc/nvme-auth-matrix
    run=$((run + 1))
done
step leftovers-matrix 5 sh -c 'ls /sys/class/nvme /sys/block | grep "^nvme" || echo none'
echo "EVNA-DONE"
