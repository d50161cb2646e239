# Runs inside the auth-kernel guest (scripts/test-auth-kernel-qemu.sh boots it with
# qemu/run-guest.sh --kernel auth, which copies it to /etc/auth-kernel-guest.sh; busybox sh,
# Debian's nvme-cli copied from the host with its libraries). The reference of NVMe in-band
# authentication (DH-HMAC-CHAP, issue 15) as Linux does it on both ends, over 127.0.0.1:
#   target: the kernel's nvmet + nvmet-tcp, configured through configfs: one subsystem with a
#           64 MiB file-backed namespace and one allowed host with a host key (dhchap_key), a
#           controller key (dhchap_ctrl_key: bidirectional), dhchap_hash and dhchap_dhgroup
#           (edgevol.hash= and edgevol.dhgroup= on the kernel command line; default
#           hmac(sha256) and ffdhe2048)
#   host:   nvme gen-dhchap-key --hmac=1 makes the keys, with --nqn the host NQN for the host key
#           and the subsystem NQN for the controller key (nvme-cli 2.3 prints DHHC-1:01: and
#           base64 of HMAC-SHA-256(random secret, NQN || "NVMe-over-Fabrics") with its CRC-32;
#           the kernels apply the hh=01 transform to that again when they use it); nvme connect
#           --dhchap-secret --dhchap-ctrl-secret; 1 MiB written through the namespace, read
#           back with O_DIRECT and found in the target's backing file; disconnect
#   then:   no key, a wrong host key, a wrong controller key: each connect refused, no
#           controller left
#   with edgevol.matrix=1 also: each hash (hmac(sha256|sha384|sha512)) with each DH group (null,
#           ffdhe2048 ... ffdhe8192) set on the target, one connect + disconnect each, timed
# Every step's output is printed between "EVAUTH-BEGIN <step>" and "EVAUTH-END <step> rc=<rc>",
# the kernel's messages after each connect in a dmesg-* step, each verdict as
# "EVAUTH CHECK ok|FAIL <what>", and at the end "EVAUTH PASS" (exit 0) or
# "EVAUTH FAILED <n> checks" (exit 1).
# (The script calls itself as `sh auth-kernel-guest.sh --<step>` so that those steps, too, run
# under busybox `timeout`.)
# shellcheck shell=sh
# shellcheck source=qemu/guest-lib.sh
. /lib/edgevol/guest-lib.sh
STEP_TAG=EVAUTH
# The host ID goes with the host NQN: without --hostid the 6.12 initiator takes its default host's
# ID, which it already holds with another NQN, and refuses the connect ("found same hostid ...
# but different hostnqn", EINVAL).
HOSTID=6c0c1b1e-15a7-4f55-8a4b-2f5e0c9d0a15
HOST=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
SUBSYS=nqn.2024-11.io.edgevol:auth-reference
CFG=/sys/kernel/config/nvmet
hash=$(arg hash) dhgroup=$(arg dhgroup)
hash=${hash:-hmac(sha256)} dhgroup=${dhgroup:-ffdhe2048}

# The host's authentication settings on the target: HASH DHGROUP.
target_auth() {
    echo "$1" >"$CFG/hosts/$HOST/dhchap_hash" && echo "$2" >"$CFG/hosts/$HOST/dhchap_dhgroup"
}

case "${1:-}" in
--keys)
    # Two pairs: the right keys and a wrong pair for the refusals.
    for k in host other-host; do nvme gen-dhchap-key --hmac=1 --nqn="$HOST" >"/tmp/$k.key" || exit 1; done
    for k in ctrl other-ctrl; do nvme gen-dhchap-key --hmac=1 --nqn="$SUBSYS" >"/tmp/$k.key" || exit 1; done
    for k in host ctrl other-host other-ctrl; do echo "$k: $(cat "/tmp/$k.key")"; done
    exit 0
    ;;
--target)
    set -e
    mount -t configfs none /sys/kernel/config 2>/dev/null || true
    mkdir "$CFG/hosts/$HOST"
    printf '%s' "$(cat /tmp/host.key)" >"$CFG/hosts/$HOST/dhchap_key"
    printf '%s' "$(cat /tmp/ctrl.key)" >"$CFG/hosts/$HOST/dhchap_ctrl_key"
    target_auth "$hash" "$dhgroup"
    sub="$CFG/subsystems/$SUBSYS"
    mkdir "$sub"
    echo 0 >"$sub/attr_allow_any_host"
    ln -s "$CFG/hosts/$HOST" "$sub/allowed_hosts/$HOST"
    dd if=/dev/zero of=/tmp/ns.img bs=1M count=64 2>/dev/null
    mkdir "$sub/namespaces/1"
    printf '%s' /tmp/ns.img >"$sub/namespaces/1/device_path"
    echo 1 >"$sub/namespaces/1/enable"
    mkdir "$CFG/ports/1"
    echo tcp >"$CFG/ports/1/addr_trtype"
    echo ipv4 >"$CFG/ports/1/addr_adrfam"
    echo 127.0.0.1 >"$CFG/ports/1/addr_traddr"
    echo 4420 >"$CFG/ports/1/addr_trsvcid"
    ln -s "$sub" "$CFG/ports/1/subsystems/$SUBSYS"
    for f in dhchap_key dhchap_ctrl_key dhchap_hash dhchap_dhgroup; do
        echo "hosts/$HOST/$f: $(cat "$CFG/hosts/$HOST/$f")"
    done
    exit 0
    ;;
--io)
    dev=$2
    yes EDGEVOL-AUTH-REFERENCE | head -c 1048576 >/tmp/written
    dd if=/tmp/written of="$dev" bs=65536 seek=128 conv=fsync 2>/dev/null || exit 1
    echo 3 >/proc/sys/vm/drop_caches
    dd if="$dev" of=/tmp/read bs=65536 skip=128 count=16 iflag=direct 2>/dev/null || exit 1
    dd if=/tmp/ns.img of=/tmp/backing bs=65536 skip=128 count=16 2>/dev/null
    for f in written read backing; do echo "$f $(md5sum <"/tmp/$f")"; done
    exit 0
    ;;
esac

self=$0 failed=0
check() { # WHAT COMMAND...: one verdict line
    what=$1
    shift
    if "$@"; then
        echo "EVAUTH CHECK ok $what"
    else
        echo "EVAUTH CHECK FAIL $what"
        failed=$((failed + 1))
    fi
}
controllers() {
    n=0
    for c in /sys/class/nvme/nvme*; do [ -e "$c" ] && n=$((n + 1)); done
    echo "$n"
}
one_controller() { [ "$(controllers)" -eq 1 ]; }
no_controller() { [ "$(controllers)" -eq 0 ]; }
# The namespace's block device (nvmeXnY), once it shows up (up to 10 s).
ns_dev() {
    for b in /sys/block/nvme*n*; do
        case "${b##*/}" in *c*) ;; *) [ -e "$b" ] && { echo "/dev/${b##*/}"; return 0; } ;; esac
    done
    return 1
}
namespace() { retry 100 ns_dev && ns_dev; }
connect() { # STEP-NAME [nvme connect options...]: a connect, then what the kernel said
    name=$1
    shift
    step "$name" 120 nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$SUBSYS" --hostnqn "$HOST" \
        --hostid "$HOSTID" "$@"
    step "dmesg-$name" 10 sh -c 'dmesg -c | grep -iE "nvme|auth|dhchap"'
}
uptime_s() { cut -d' ' -f1 /proc/uptime; }

echo "kernel $(uname -r); modules loaded in order: $(tr '\n' ' ' </lib/modules/load.list)"
# nvme gen-dhchap-key fails (exit 1, no message) until the kernel's random pool is initialised:
# wait for it (a read of /dev/random blocks until then; the virtio-rng device makes it quick).
step entropy 120 sh -c 'head -c 1 /dev/random >/dev/null && dmesg | grep -m 1 "crng init done"'
step keys 30 sh "$self" --keys
check "keys from nvme gen-dhchap-key (DHHC-1:01:<base64 key+crc>:)" \
    grep -qE '^DHHC-1:01:[A-Za-z0-9+/=]+:$' /tmp/host.key
hostkey=$(cat /tmp/host.key) ctrlkey=$(cat /tmp/ctrl.key)
step target 30 sh "$self" --target
check "nvmet target configured through configfs" [ -L "$CFG/ports/1/subsystems/$SUBSYS" ]
dmesg -c >/dev/null

# --- authenticated: connect, I/O, disconnect -------------------------------------------------------
t0=$(uptime_s)
connect connect --dhchap-secret="$hostkey" --dhchap-ctrl-secret="$ctrlkey"
t1=$(uptime_s)
check "connect with the host and controller keys ($(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s)" one_controller
# shellcheck disable=SC2016 # expanded by the step's shell
step controller 10 sh -c 'for c in /sys/class/nvme/nvme*; do [ -e "$c" ] || continue; echo "${c##*/}"
    for a in state transport address subsysnqn hostnqn dhchap_secret dhchap_ctrl_secret queue_count; do
        echo "$a: $(cat "$c/$a" 2>&1)"; done; done'
if dev=$(namespace); then
    step io 60 sh "$self" --io "$dev"
else
    echo "no namespace block device"
fi
check "1 MiB written through the namespace reads back" cmp -s /tmp/written /tmp/read
check "and is in the target's backing file" cmp -s /tmp/written /tmp/backing
step disconnect 30 nvme disconnect -n "$SUBSYS"
check "disconnected" no_controller

# --- refused: no key, a wrong host key, a wrong controller key ------------------------------------
connect no-key
check "connect without a key refused" no_controller
connect wrong-host-key --dhchap-secret="$(cat /tmp/other-host.key)" --dhchap-ctrl-secret="$ctrlkey"
check "connect with a wrong host key refused" no_controller
connect wrong-ctrl-key --dhchap-secret="$hostkey" --dhchap-ctrl-secret="$(cat /tmp/other-ctrl.key)"
check "connect with a wrong controller key refused" no_controller
step leftovers 5 sh -c 'ls /sys/class/nvme /sys/block | grep "^nvme" || echo none'

# --- every hash with every DH group ---------------------------------------------------------------
if [ "$(arg matrix)" = 1 ]; then
    for h in "hmac(sha256)" "hmac(sha384)" "hmac(sha512)"; do
        for g in null ffdhe2048 ffdhe3072 ffdhe4096 ffdhe6144 ffdhe8192; do
            t0=$(uptime_s)
            target_auth "$h" "$g" || { check "the target takes $h $g" false; continue; }
            t1=$(uptime_s)
            connect "matrix-$h-$g" --dhchap-secret="$hostkey" --dhchap-ctrl-secret="$ctrlkey"
            t2=$(uptime_s)
            check "$h $g: set on the target in $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s, connected in $(awk "BEGIN { printf \"%.1f\", $t2 - $t1 }") s" one_controller
            t0=$(uptime_s)
            nvme disconnect -n "$SUBSYS" >/dev/null 2>&1
            retry 50 no_controller
            echo "disconnected in $(awk "BEGIN { printf \"%.1f\", $(uptime_s) - $t0 }") s"
        done
    done
    target_auth "$hash" "$dhgroup"
fi

if [ "$failed" -eq 0 ]; then
    echo "EVAUTH PASS"
else
    echo "EVAUTH FAILED $failed checks"
    exit 1
fi
