# Runs inside the QoS guest (appliance/tests/qos_qemu.rs copies it to /etc/qos-guest.sh; busybox
# sh, Debian's nvme-cli and fio copied from the host with their libraries). Connects the Linux
# NVMe/TCP initiator to three volumes of edgevol's target in the host test process (10.0.2.2):
# LIMITED (maxIops=300), FREE (no limit), BW (maxBandwidthBytes=5 MiB/s) and PACED (no limit),
# measures with fio
# and prints one "<figure> <value>" line per measurement between step markers:
#   EVQ-BEGIN <step> / <output> / EVQ-END <step> rc=<exit code>, then EVQ-DONE.
# It judges nothing: the host test checks the figures.
#
# usage: sh qos-guest.sh PORT CTL_PORT HOSTNQN LIMITED_NQN FREE_NQN BW_NQN PACED_NQN
#   PACED_NQN has no limit: fio paces itself to 300 IOPS there, the same work as LIMITED's
#   without QoS (the control for the neighbour's figures).
#   CTL_PORT: the host test's control port; the line "raise" sent there makes the host raise
#   LIMITED to 600 IOPS with ControllerModifyVolume, answered once the call returned.
# shellcheck shell=sh

# One fio job for SECS seconds on DEV: random reads of BS at depth QD; prints "iops N" and
# "kib_s N" (terse format v3: field 7 read KiB/s, field 8 read IOPS). Extra fio arguments follow.
if [ "$1" = --fio ]; then
    dev=$2 bs=$3 qd=$4 secs=$5
    shift 5
    out=$(fio --name=qos --filename="$dev" --rw=randread --bs="$bs" --ioengine=libaio \
        --iodepth="$qd" --direct=1 --time_based --runtime="$secs" --size=32m \
        --output-format=terse --terse-version=3 "$@") || { echo "$out"; exit 1; }
    echo "$out" | awk -F';' '{ printf "iops %d\nkib_s %d\n", $8, $7 }'
    exit 0
fi

# The limited volume at QD16 for 12 s, raised to 600 IOPS by the host after 5 s: fio logs the
# IOPS of every second; prints the mean of the whole seconds before the request and of the
# first five whole seconds after the answer. fio's clock starts when its job does, a little
# after t0: its times lag the guest's uptime, so a window is taken as "after" only when it
# surely is, and "before" keeps a margin of 1.5 s.
if [ "$1" = --raise ]; then
    dev=$2 ctl=$3
    t0=$(cut -d' ' -f1 /proc/uptime)
    sh "$0" --fio "$dev" 4k 16 12 --write_iops_log=/tmp/raise --log_avg_msec=1000 >/tmp/fio-raise &
    fio=$!
    sleep 5
    t_ask=$(cut -d' ' -f1 /proc/uptime)
    echo "host $(echo raise | timeout 30 nc 10.0.2.2 "$ctl")"
    t_done=$(cut -d' ' -f1 /proc/uptime)
    wait "$fio" || { cat /tmp/fio-raise; exit 1; }
    # Each log line: end of its 1 s window (ms since fio started), mean IOPS in it, ...
    awk -F', *' -v ask="$(awk "BEGIN { print ($t_ask - $t0) * 1000 }")" \
        -v done="$(awk "BEGIN { print ($t_done - $t0) * 1000 }")" '
        $1 <= ask - 1500 { b += $2; nb++ }
        $1 - 1000 >= done && na < 5 { a += $2; na++ }
        END { printf "before %d (%d s)\nafter %d (%d s)\n", nb ? b / nb : 0, nb, na ? a / na : 0, na }
    ' /tmp/raise_iops.1.log
    echo "modify-call-s $(awk "BEGIN { printf \"%.2f\", $t_done - $t_ask }")"
    echo "asked-ms $(awk "BEGIN { print ($t_ask - $t0) * 1000 }") answered-ms $(awk "BEGIN { print ($t_done - $t0) * 1000 }")"
    echo "log:"
    cat /tmp/raise_iops.1.log
    exit 0
fi

self=$0 port=$1 ctl=$2 host=$3 limited=$4 free=$5 bw=$6 paced=$7
fabric="-t tcp -a 10.0.2.2 -s $port"
# shellcheck source=qemu/guest-lib.sh
. /lib/edgevol/guest-lib.sh
STEP_TAG=EVQ

step net 10 sh -c 'ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0'
# shellcheck disable=SC2086 # $fabric is several words on purpose
{
    step connect-limited 30 nvme connect $fabric -n "$limited" --hostnqn "$host"
    step connect-free 30 nvme connect $fabric -n "$free" --hostnqn "$host"
    step connect-bw 30 nvme connect $fabric -n "$bw" --hostnqn "$host"
    step connect-paced 30 nvme connect $fabric -n "$paced" --hostnqn "$host"
}
lim_dev=$(ns_of "$limited") free_dev=$(ns_of "$free") bw_dev=$(ns_of "$bw") paced_dev=$(ns_of "$paced")
echo "devices: limited $lim_dev free $free_dev bw $bw_dev paced $paced_dev"

# The unlimited neighbour alone, then next to the limited volume (that one at QD16), for 5 s
# each; first at QD1 (latency: what a noisy neighbour harms), then at QD16 (throughput). In a
# TCG guest on two host cores the rig is CPU-bound: any 300 IOPS of work take their share, so
# the QD1 neighbour is also measured next to PACED doing the same 300 IOPS without QoS. The
# guest has 2 vCPUs, one per fio. The first second (fio starting, the bucket's burst) is not
# measured.
pair() { # NAME QD OTHER-FIO-ARGS...
    name=$1 qd=$2
    shift 2
    step "$name" 30 sh -c "sh '$self' --fio $* --ramp_time=1 >/tmp/other &
        sh '$self' --fio '$free_dev' 4k $qd 5 --ramp_time=1 | sed 's/^/free-/'
        wait \$! && sed 's/^/other-/' /tmp/other"
}
for qd in 1 16; do
    step "free-alone-qd$qd" 30 sh "$self" --fio "$free_dev" 4k "$qd" 5 --ramp_time=1
    pair "together-qd$qd" "$qd" "$lim_dev" 4k 16 5
done
pair paced-qd1 1 "$paced_dev" 4k 16 5 --rate_iops=300
step raise 60 sh "$self" --raise "$lim_dev" "$ctl"
# What the guest reaches at 128k unlimited, right before the limited bandwidth: the host judges
# the limit's lower bound only where the guest could go past it.
step free-alone-128k 30 sh "$self" --fio "$free_dev" 128k 4 5 --ramp_time=1
step bandwidth 30 sh "$self" --fio "$bw_dev" 128k 4 5 --ramp_time=1
step disconnect 30 sh -c "nvme disconnect -n '$limited' && nvme disconnect -n '$free' &&
    nvme disconnect -n '$bw' && nvme disconnect -n '$paced'"
echo "EVQ-DONE"
