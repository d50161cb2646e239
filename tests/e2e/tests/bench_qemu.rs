//! Data path in QEMU (scripts/bench-qemu.sh, the full mode of scripts/bench.sh): fio in the node
//! VM against a volume of the edgevol target and against the kernel's nvmet-tcp, both served by
//! the same appliance VM from identical raw virtio-blk backing files. The volume is created and
//! published from the host through CSI over mTLS; the node VM connects both subsystems itself
//! through /dev/nvme-fabrics with the same options (its host NQN, default queues), fills the
//! measured region, then runs every workload `EDGEVOL_BENCH_RUNS` times per target, alternating
//! targets, and writes a markdown table of medians and ratios to `EDGEVOL_BENCH_OUT`, with how
//! busy the node VM's one vCPU was during each target's runs (`/proc/stat` around each fio).
//! Ignored unless run by the script (needs its VMs and EDGEVOL_E2E_* / EDGEVOL_BENCH_* variables).

use std::path::PathBuf;

use edgevol_e2e::{appliance_channel, env_addr, node_channel, within, Agent};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;

const MIB: i64 = 1 << 20;
const CALL_SECS: u64 = 120;
/// The region fio touches on both targets (filled first, so reads hit written blocks).
const REGION_MIB: i64 = 256;

fn env_or(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{var}={v:?}")))
        .unwrap_or(default)
}

/// One fio workload: name, unit, rw, block size, queue depth.
struct Workload {
    name: &'static str,
    iops: bool,
    rw: &'static str,
    bs: &'static str,
    qd: u32,
}

const WORKLOADS: [Workload; 6] = [
    Workload {
        name: "4k randread QD1",
        iops: true,
        rw: "randread",
        bs: "4k",
        qd: 1,
    },
    Workload {
        name: "4k randread QD16",
        iops: true,
        rw: "randread",
        bs: "4k",
        qd: 16,
    },
    Workload {
        name: "4k randwrite QD1",
        iops: true,
        rw: "randwrite",
        bs: "4k",
        qd: 1,
    },
    Workload {
        name: "4k randwrite QD16",
        iops: true,
        rw: "randwrite",
        bs: "4k",
        qd: 16,
    },
    Workload {
        name: "128k seqread QD8",
        iops: false,
        rw: "read",
        bs: "128k",
        qd: 8,
    },
    Workload {
        name: "128k seqwrite QD8",
        iops: false,
        rw: "write",
        bs: "128k",
        qd: 8,
    },
];

/// Connects an NVMe/TCP subsystem through /dev/nvme-fabrics and prints its block device.
fn connect_script(addr: &str, port: &str, nqn: &str) -> String {
    format!(
        r#"set -e
h=$(cat /etc/nvme/hostnqn)
exec 3<>/dev/nvme-fabrics
echo "transport=tcp,traddr={addr},trsvcid={port},nqn={nqn},hostnqn=$h" >&3
read -r reply <&3 || true
exec 3>&-
for i in $(seq 1 100); do
  for b in /sys/block/nvme*; do
    n=$(basename "$b")
    case "$n" in *c*) continue ;; esac
    s=$(cat "$b/device/subsysnqn" 2>/dev/null || cat "$b/device/../subsysnqn" 2>/dev/null || true)
    if [ "$s" = "{nqn}" ] && [ -b "/dev/$n" ]; then echo "/dev/$n"; exit 0; fi
  done
  sleep 0.1
done
ls -l /sys/block
exit 1"#
    )
}

/// IOPS or MiB/s of `w`'s terse fio line in `output`.
fn parse_fio(output: &str, w: &Workload) -> f64 {
    edgevol_e2e::fio::terse_figure(output, w.rw.contains("write"), w.iops)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn fmt(x: f64, iops: bool) -> String {
    if iops {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

#[tokio::test]
#[ignore = "needs the VMs of scripts/bench-qemu.sh"]
async fn bench_qemu() {
    let pki = PathBuf::from(std::env::var("EDGEVOL_E2E_PKI").expect("EDGEVOL_E2E_PKI"));
    let nvmet = std::env::var("EDGEVOL_BENCH_NVMET").expect("EDGEVOL_BENCH_NVMET=ADDR:PORT:NQN");
    let mut nv = nvmet.splitn(3, ':');
    let (nv_addr, nv_port, nv_nqn) = (
        nv.next().expect("addr"),
        nv.next().expect("port"),
        nv.next().expect("nqn"),
    );
    let out = PathBuf::from(std::env::var("EDGEVOL_BENCH_OUT").expect("EDGEVOL_BENCH_OUT"));
    let secs = env_or("EDGEVOL_BENCH_SECS", 10);
    let runs = usize::try_from(env_or("EDGEVOL_BENCH_RUNS", 3).max(1)).expect("runs");
    // `EDGEVOL_BENCH_ONLY=4k randread QD1,128k seqread QD8`: only the workloads so named.
    let only = std::env::var("EDGEVOL_BENCH_ONLY").unwrap_or_default();
    let picked = |w: &Workload| only.is_empty() || only.split(',').any(|o| w.name == o.trim());

    let mut ctl = ControllerClient::new(
        appliance_channel(env_addr("EDGEVOL_E2E_CSI"), &pki, "controller").await,
    );
    let mut node = NodeClient::new(node_channel(env_addr("EDGEVOL_E2E_NODE_CSI")).await);
    let agent = Agent {
        addr: env_addr("EDGEVOL_E2E_NODE_EXEC"),
    };
    let node_id = within(
        CALL_SECS,
        "NodeGetInfo",
        node.node_get_info(NodeGetInfoRequest {}),
    )
    .await
    .expect("NodeGetInfo")
    .into_inner()
    .node_id;

    let capability = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    let volume = within(
        CALL_SECS,
        "CreateVolume",
        ctl.create_volume(CreateVolumeRequest {
            name: "bench-qemu".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 2 * REGION_MIB * MIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability.clone()],
            ..Default::default()
        }),
    )
    .await
    .expect("CreateVolume")
    .into_inner()
    .volume
    .expect("a volume");
    let context = within(
        CALL_SECS,
        "ControllerPublishVolume",
        ctl.controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node_id.clone(),
            volume_capability: Some(capability),
            readonly: false,
            ..Default::default()
        }),
    )
    .await
    .expect("ControllerPublishVolume")
    .into_inner()
    .publish_context;
    let get = |k: &str| {
        context
            .get(k)
            .unwrap_or_else(|| panic!("publish_context lacks {k}: {context:?}"))
            .clone()
    };
    let ev_script = connect_script(
        &get("targetAddress"),
        &get("targetPort"),
        &get("subsystemNqn"),
    );
    // The agent merges stderr into the output: the device is the last line.
    let last = |out: String| out.lines().last().unwrap_or_default().trim().to_owned();
    let ev_dev = last(agent.ok(60, &ev_script).await);
    let nv_dev = last(
        agent
            .ok(60, &connect_script(nv_addr, nv_port, nv_nqn))
            .await,
    );
    eprintln!(
        "bench-qemu: edgevol volume {} on {ev_dev}, nvmet-tcp on {nv_dev}",
        volume.volume_id
    );
    let targets = [("edgevol", ev_dev), ("nvmet-tcp", nv_dev)];

    for (name, dev) in &targets {
        let t = std::time::Instant::now();
        agent
            .ok(
                600,
                &format!(
                    "fio --name=fill --filename={dev} --direct=1 --ioengine=libaio --rw=write \
                     --bs=1m --iodepth=4 --size={REGION_MIB}m --output-format=terse"
                ),
            )
            .await;
        eprintln!(
            "bench-qemu: filled {REGION_MIB} MiB of {name} in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }

    let mut table = String::new();
    table.push_str(
        "| workload | unit | edgevol (median) | nvmet-tcp (median) | edgevol / nvmet-tcp | edgevol runs | nvmet-tcp runs | node VM CPU busy, edgevol | same, nvmet-tcp |\n\
         |---|---|---:|---:|---:|---|---|---:|---:|\n",
    );
    for w in WORKLOADS.iter().filter(|w| picked(w)) {
        let mut results: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut busy: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for run in 0..runs {
            for (i, (name, dev)) in targets.iter().enumerate() {
                let cmd = format!(
                    "head -1 /proc/stat && fio --name=b --filename={dev} --direct=1 --ioengine=libaio --rw={} --bs={} \
                     --iodepth={} --size={REGION_MIB}m --time_based --runtime={secs} \
                     --ramp_time=1 --norandommap --randrepeat=0 --output-format=terse \
                     --terse-version=3 && head -1 /proc/stat",
                    w.rw, w.bs, w.qd
                );
                let output = agent.ok(secs + 120, &cmd).await;
                let v = parse_fio(&output, w);
                let b = edgevol_e2e::fio::node_busy(&output);
                eprintln!(
                    "bench-qemu: {} run {} {name}: {} (node VM CPU busy {b:.2})",
                    w.name,
                    run + 1,
                    fmt(v, w.iops)
                );
                results[i].push(v);
                busy[i].push(b);
            }
        }
        let (e, n) = (median(&results[0]), median(&results[1]));
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| fmt(*x, w.iops))
                .collect::<Vec<_>>()
                .join(", ")
        };
        table.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {} | {} | {:.2} | {:.2} |\n",
            w.name,
            if w.iops { "IOPS" } else { "MiB/s" },
            fmt(e, w.iops),
            fmt(n, w.iops),
            if n > 0.0 { e / n } else { f64::NAN },
            list(&results[0]),
            list(&results[1]),
            median(&busy[0]),
            median(&busy[1]),
        ));
        // Row by row: a matrix cut short by its budget still leaves the rows it finished.
        std::fs::write(&out, &table).expect("write EDGEVOL_BENCH_OUT");
    }
    eprintln!("{table}");
}
