//! Writes the seed corpora of every fuzz target: `seed_corpus [DIR]` (default `fuzz/corpus`),
//! one directory per target. Run by `scripts/fuzz.sh --seed`; the output is deterministic, so a
//! re-run after a format change shows in `git diff` exactly which seeds changed.
//!
//! Every seed is made by the code that makes such bytes in the product (the pool, the initiator,
//! the DH-HMAC-CHAP host, the bundle builder, the host-key table and file encoder, an HPACK
//! encoder), plus a few edge cases derived from them (cut, extended, erased). Files named
//! `seed-*` are replaced; any other file (a crash kept as a regression input) is left alone.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgevol_appliance::hostkeys::secret::RandomFailed;
use edgevol_appliance::hostkeys::table::Table;
use edgevol_appliance::hostkeys::{file as hostkeys_file, Secret};
use edgevol_core::{FormatOptions, Pool, RamDevice, VolumeSpec};
use edgevol_firmware::{bundle, key::SigningKey};
use edgevol_fuzz::{
    base_pool, pdu_queue_config, seal_host_keys, BLOCK, BUNDLE_ARCH, BUNDLE_KEY_SEED, H2_PREFACE,
    METADATA,
};
use edgevol_nvmeof::auth::host::{Host, HostConfig, TestRng};
use edgevol_nvmeof::auth::{
    AuthCommand, Authenticator, DhGroup, HashId, KeyPair, Outcome, TargetConfig,
};
use edgevol_nvmeof::fabrics_cmd::{
    fctype, ConnectCmd, ConnectData, PropertyGet, PropertySet, PropertySize, CNTLID_DYNAMIC,
};
use edgevol_nvmeof::initiator::{Data, Initiator, InitiatorConfig};
use edgevol_nvmeof::pdu::Digests;
use edgevol_nvmeof::queue::{Completion, Event, Queue};
use edgevol_nvmeof::sqe::{Sqe, FABRICS_OPCODE};
use edgevol_nvmeof::status::Status;

/// One target's seeds: (file name without the `seed-` prefix, bytes).
struct Seeds(Vec<(String, Vec<u8>)>);

impl Seeds {
    fn add(&mut self, name: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.0.push((name.into(), bytes.into()));
    }
}

fn main() -> io::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/corpus".into()),
    );
    for (target, seeds) in [
        ("metadata_decode", metadata()),
        ("pdu_decode", pdu()),
        ("auth_decode", auth()),
        ("bundle_decode", bundles()),
        ("hostkeys_decode", host_keys()),
        ("authority_rewrite", authority()),
    ] {
        let n = seeds.0.len();
        let bytes: usize = seeds.0.iter().map(|(_, b)| b.len()).sum();
        write(&dir.join(target), seeds)?;
        println!("{target}: {n} seeds, {bytes} bytes");
    }
    Ok(())
}

fn write(dir: &Path, seeds: Seeds) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("seed-"))
        {
            fs::remove_file(path)?;
        }
    }
    for (name, bytes) in seeds.0 {
        fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    Ok(())
}

// ---- metadata_decode: [offset hi, lo] + XOR patch, and the whole input as postcard ----

fn metadata() -> Seeds {
    let mut s = Seeds(Vec::new());
    let dev = base_pool().as_bytes();
    let block = BLOCK as usize;
    let patch = |at: usize, xor: &[u8]| {
        let at = u16::try_from(at).expect("metadata offsets fit in u16");
        let mut seed = at.to_be_bytes().to_vec();
        seed.extend_from_slice(xor);
        seed
    };
    // Both superblocks: a flipped magic byte, a flipped byte in the middle of the header, erased.
    for (i, at) in [0, block].into_iter().enumerate() {
        s.add(format!("superblock{i}-magic"), patch(at, &[0x01]));
        s.add(
            format!("superblock{i}-field"),
            patch(at + 8, &[0, 0, 0, 0x01]),
        );
        s.add(
            format!("superblock{i}-erased"),
            patch(at, &dev[at..at + block]),
        );
    }
    for at in (2 * block..METADATA).step_by(block) {
        let head = &dev[at..at + block];
        if head.starts_with(b"EVC1") {
            // Checkpoint header; payload length at 20..28, payload from the slot's next block.
            let len = u64::from_le_bytes(head[20..28].try_into().expect("8 bytes"));
            let len = usize::try_from(len).expect("small pool");
            s.add(
                format!("checkpoint-{at}-tables"),
                &dev[at + block..at + block + len],
            );
            s.add(
                format!("checkpoint-{at}-generation"),
                patch(at + 4, &[0x01]),
            );
            s.add(format!("checkpoint-{at}-length"), patch(at + 20, &[0x10]));
            s.add(format!("checkpoint-{at}-erased"), patch(at, head));
        } else if head.starts_with(b"EVJ3") {
            // Journal frame header (56 bytes); payload length at 20..24, payload after it.
            let len = u32::from_le_bytes(head[20..24].try_into().expect("4 bytes"));
            let len = usize::try_from(len).expect("small pool");
            s.add(
                format!("journal-{at}-records"),
                &dev[at + 56..at + 56 + len],
            );
            s.add(format!("journal-{at}-sequence"), patch(at + 4, &[0x01]));
            s.add(format!("journal-{at}-kind"), patch(at + 32, &[0x01]));
        }
    }
    // The base pool's checkpoint is the empty one of `format`: checkpoint tables of a pool with
    // history come from a busier twin whose journal wrapped (volumes, snapshots, deletions).
    let busy = busy_pool();
    let mut tables = 0;
    for at in (2 * block..METADATA).step_by(block) {
        let head = &busy.as_bytes()[at..at + block];
        let len = u64::from_le_bytes(head[20..28].try_into().expect("8 bytes"));
        let len = usize::try_from(len).expect("small pool");
        if head.starts_with(b"EVC1") && len > 16 {
            s.add(
                format!("busy-checkpoint-{at}-tables"),
                &busy.as_bytes()[at + block..at + block + len],
            );
            tables += 1;
        }
    }
    assert!(tables > 0, "the busy pool wrote a checkpoint of its tables");
    s.add("empty", Vec::new());
    s
}

fn busy_pool() -> RamDevice {
    let options = FormatOptions {
        uuid: [2; 16],
        cluster_size: 4096,
        checkpoint_bytes: 8192,
        journal_bytes: 8192,
    };
    let mut pool = Pool::format(RamDevice::new(BLOCK, 512), options).expect("format");
    for i in 0..12 {
        let v = pool
            .create_volume(VolumeSpec::new(format!("busy-volume-{i}"), 16384))
            .expect("volume");
        let snapshot = pool
            .create_snapshot(v, &format!("busy-snapshot-{i}"), 0)
            .expect("snapshot");
        if i % 3 == 0 {
            pool.delete_snapshot(snapshot).expect("delete snapshot");
            let gone = pool
                .create_volume(VolumeSpec::new(format!("busy-gone-{i}"), 8192))
                .expect("volume");
            pool.delete_volume(gone).expect("delete volume");
        }
    }
    pool.into_device()
}

// ---- pdu_decode: [mode, chunk seed] + what a host sends ----

/// Answers every command the queue hands out with success (and data for reads), installing
/// the queue on a Connect: what the fuzz target does.
fn serve(q: &mut Queue) {
    while let Some(event) = q.poll_event() {
        if let Event::Command(cmd) = event {
            let sqe = cmd.sqe;
            if sqe.opcode() == FABRICS_OPCODE && sqe.fctype() == fctype::CONNECT {
                if let Ok(c) = ConnectCmd::parse(&sqe) {
                    q.install(c.qid, c.sqsize).expect("install");
                }
            }
            let data = vec![0xa5; usize::try_from(cmd.read_len).expect("small")];
            let completion = Completion {
                status: Status::SUCCESS,
                result: 0,
                data: &data,
            };
            q.complete(cmd.tag, completion).expect("complete");
        }
    }
}

/// Moves bytes both ways until both sides are quiet; appends what the host sent to `sent`.
fn pump(host: &mut Initiator, q: &mut Queue, sent: &mut Vec<u8>) {
    for _ in 0..1000 {
        let mut to_target = Vec::new();
        host.poll_transmit(&mut to_target);
        sent.extend_from_slice(&to_target);
        let mut at = 0;
        loop {
            at += q.handle_input(&to_target[at..]);
            serve(q);
            if at == to_target.len() || q.is_closed() {
                break;
            }
        }
        let mut to_host = Vec::new();
        q.poll_transmit(&mut to_host);
        host.handle_input(&to_host);
        while host.poll_event().is_some() {}
        if to_target.is_empty() && to_host.is_empty() {
            return;
        }
    }
    panic!("the initiator and the queue never went quiet");
}

fn connect(host: &mut Initiator, qid: u16, cntlid: u16) {
    let cmd = ConnectCmd {
        qid,
        sqsize: 15,
        cattr: 0,
        kato_ms: if qid == 0 { 5000 } else { 0 },
    };
    let data = ConnectData {
        hostid: [7; 16],
        cntlid,
        subsysnqn: "nqn.2024-11.io.edgevol:fuzz:v1".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:fuzz-host".into(),
    };
    host.connect(cmd, &data).expect("connect");
}

fn io_sqe(opcode: u8, slba: u64, blocks: u16) -> Sqe {
    let mut sqe = Sqe::default();
    sqe.set_opcode(opcode)
        .set_nsid(1)
        .set_cdw(10, slba as u32)
        .set_cdw(11, (slba >> 32) as u32)
        .set_cdw(12, u32::from(blocks - 1));
    sqe
}

/// One connection of the test initiator; returns what it sent (ICReq first).
fn session(digests: Digests, admin: bool) -> Vec<u8> {
    let mut host = Initiator::new(InitiatorConfig {
        digests,
        ..InitiatorConfig::default()
    });
    let mut q = Queue::new(pdu_queue_config(), Duration::ZERO).expect("valid config");
    let mut sent = Vec::new();
    pump(&mut host, &mut q, &mut sent);
    assert!(host.is_live(), "ICReq/ICResp exchanged");
    if admin {
        connect(&mut host, 0, CNTLID_DYNAMIC);
        pump(&mut host, &mut q, &mut sent);
        let cap = PropertyGet {
            size: PropertySize::Eight,
            offset: 0,
        };
        host.submit(cap.to_sqe(0), Data::None).expect("get");
        let cc = PropertySet {
            size: PropertySize::Four,
            offset: 0x14,
            value: 0x0046_0001,
        };
        host.submit(cc.to_sqe(0), Data::None).expect("set");
        // Identify controller (admin opcode 0x06, CNS 1): 4 KiB read.
        let mut identify = Sqe::default();
        identify.set_opcode(0x06).set_cdw(10, 1);
        host.submit(identify, Data::Read(4096)).expect("identify");
    } else {
        connect(&mut host, 1, 1);
        pump(&mut host, &mut q, &mut sent);
        // NVM write (0x01) in the capsule, then one past the capsule limit (R2T, H2CData),
        // a read split into C2HData PDUs (0x02), a flush (0x00).
        host.submit(io_sqe(0x01, 0, 8), Data::Write(vec![0x3c; 4096]))
            .expect("write");
        host.submit(io_sqe(0x01, 8, 32), Data::Write(vec![0x5a; 16384]))
            .expect("write");
        host.submit(io_sqe(0x02, 0, 16), Data::Read(8192))
            .expect("read");
        host.submit(io_sqe(0x00, 0, 1), Data::None).expect("flush");
    }
    pump(&mut host, &mut q, &mut sent);
    assert!(!q.is_closed(), "the session ran without a protocol error");
    sent
}

fn pdu() -> Seeds {
    /// An ICReq PDU: a 128-byte header, no digest.
    const ICREQ_LEN: usize = 128;
    let mut s = Seeds(Vec::new());
    for (digests, name) in [(Digests::NONE, "plain"), (Digests::BOTH, "digests")] {
        for (admin, queue) in [(true, "admin"), (false, "io")] {
            let stream = session(digests, admin);
            // Mode: the standalone decoder's digests; the stream carries its own ICReq.
            let mut seed = vec![digests.bits(), 0];
            seed.extend_from_slice(&stream);
            s.add(format!("{queue}-{name}"), seed);
            // Bit 7: the target prepends the ICReq itself (HPDA 0, these digests).
            let mut seed = vec![0x80 | digests.bits(), 61];
            seed.extend_from_slice(&stream[ICREQ_LEN..]);
            s.add(format!("{queue}-{name}-icreq-prepended"), seed);
        }
    }
    let stream = session(Digests::NONE, false);
    let mut cut = vec![0, 200];
    cut.extend_from_slice(&stream[..stream.len() / 2]);
    s.add("io-plain-cut", cut);
    s
}

// ---- auth_decode: [mode] + the message sent at the step the mode picks ----

fn auth_secret(hash: HashId, byte: u8) -> Secret {
    Secret::from_key(Some(hash), &vec![byte; hash.digest_len()]).expect("valid key")
}

/// The messages the test host sends at each step of the target's script for `mode` (as
/// `auth_decode` sets it up): Negotiate, Reply, Success2.
fn host_messages(mode: u8) -> Vec<Vec<u8>> {
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz-host";
    const SUBNQN: &str = "nqn.2024-11.io.edgevol:fuzz:v1";
    let group = if mode & 0x81 == 0x81 {
        DhGroup::Ffdhe2048
    } else {
        DhGroup::Null
    };
    let pair = KeyPair {
        host: auth_secret(HashId::Sha256, 1),
        controller: Some(auth_secret(HashId::Sha384, 2)),
    };
    let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair.clone()]);
    config.dh_groups = vec![group];
    let mut target = Authenticator::new(config).expect("valid config");
    let mut rng = TestRng::new(u64::from(mode));
    let now = Duration::from_secs(1);
    let mut host = Host::new(HostConfig::linux(
        HOSTNQN,
        SUBNQN,
        pair.host.clone(),
        pair.controller.clone(),
    ));
    let send = |target: &mut Authenticator, data: &[u8]| {
        let tl = u32::try_from(data.len()).expect("small");
        let outcome = target
            .on_auth_send(&AuthCommand::Send { tl }, data, now)
            .expect("accepted");
        assert_eq!(outcome, Outcome::Continue, "the host's message is accepted");
    };
    let receive = |target: &mut Authenticator, rng: &mut TestRng| {
        let mut buf = Vec::new();
        let outcome = target
            .on_auth_receive(&AuthCommand::Receive { al: 4096 }, now, rng, &mut buf)
            .expect("answered");
        assert_eq!(outcome, Outcome::Continue, "the target answers");
        buf
    };
    let negotiate = host.negotiate(7);
    send(&mut target, &negotiate);
    let challenge = receive(&mut target, &mut rng);
    let reply = host.handle_challenge(&challenge, &mut rng).expect("reply");
    send(&mut target, &reply);
    let success1 = receive(&mut target, &mut rng);
    let success2 = host
        .handle_success1(&success1)
        .expect("success1")
        .expect("bidirectional: a Success2");
    vec![negotiate, reply, success2]
}

fn auth() -> Seeds {
    let mut s = Seeds(Vec::new());
    for (group, name) in [(0x00u8, "null"), (0x81, "ffdhe2048")] {
        // Step (bits 1-2) 0: the first message; 1: after Negotiate; 2: after the Challenge;
        // 3: after Reply and Success1. What a well-behaved host sends there: Negotiate, a
        // second Negotiate (refused), the Reply, the Success2.
        for step in 0..4u8 {
            let mode = group | step << 1;
            let messages = host_messages(mode);
            let body = match step {
                0 | 1 => &messages[0],
                2 => &messages[1],
                _ => &messages[2],
            };
            let mut seed = vec![mode];
            seed.extend_from_slice(body);
            s.add(format!("{name}-step{step}"), seed);
        }
    }
    // The decoder alone sees the whole input: the messages themselves.
    for (message, name) in host_messages(0)
        .into_iter()
        .zip(["negotiate", "reply", "success2"])
    {
        s.add(format!("message-{name}"), message);
    }
    s
}

// ---- bundle_decode: bundles signed with the fuzz key ----

/// The fuzz key as `edgevol firmware` keeps a signing key: PKCS#8 v2 (RFC 8410) in PEM.
fn bundle_signing_key() -> SigningKey {
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&BUNDLE_KEY_SEED)
        .expect("any 32 bytes are an Ed25519 seed");
    let public = ring::signature::KeyPair::public_key(&pair)
        .as_ref()
        .to_vec();
    let mut der = vec![
        0x30, 0x53, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(&BUNDLE_KEY_SEED);
    der.extend_from_slice(&[0xa1, 0x23, 0x03, 0x21, 0x00]);
    der.extend_from_slice(&public);
    let text = pem::encode(&pem::Pem::new("PRIVATE KEY", der));
    SigningKey::from_pem(&text).expect("a valid Ed25519 PKCS#8 key")
}

fn bundles() -> Seeds {
    let mut s = Seeds(Vec::new());
    let key = bundle_signing_key();
    let kernel: Vec<u8> = (0..200u8).collect();
    let initramfs: Vec<u8> = (0..96u8).rev().collect();
    let build = |arch: &str, version: &str, kernel: &[u8], initramfs: &[u8]| {
        bundle::build(&key, arch, version, kernel, initramfs).expect("bundle builds")
    };
    let typical = build(BUNDLE_ARCH, "1.2.3", &kernel, &initramfs);
    s.add("typical", typical.clone());
    s.add("empty-parts", build(BUNDLE_ARCH, "1", b"", b""));
    s.add(
        "longest-names",
        build(&"a".repeat(32), &"v".repeat(64), b"k", b"i"),
    );
    s.add("other-arch", build("aarch64", "2.0.0-rc1", &kernel, b""));
    // Edge cases of the typical bundle: header only, cut in the signature, one byte extra, a
    // flipped part byte (digest mismatch).
    let manifest_len = u32::from_le_bytes(typical[8..12].try_into().expect("4 bytes"));
    let header_end = 12 + usize::try_from(manifest_len).expect("small");
    s.add("cut-after-manifest", &typical[..header_end]);
    s.add("cut-in-signature", &typical[..header_end + 32]);
    let mut extended = typical.clone();
    extended.push(0);
    s.add("trailing-byte", extended);
    let mut flipped = typical;
    let last = flipped.len() - 1;
    flipped[last] ^= 0x80;
    s.add("initramfs-flipped", flipped);
    s
}

// ---- hostkeys_decode: [mode] + a host-key file (mode 0) or its payload (mode 1) ----

fn host_keys() -> Seeds {
    const A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
    const B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002";
    let mut n = 0u8;
    let mut secret = move || -> Result<Secret, RandomFailed> {
        n += 1;
        let hash = [HashId::Sha256, HashId::Sha384, HashId::Sha512][usize::from(n % 3)];
        Ok(Secret::from_key(Some(hash), &vec![n; hash.digest_len()]).expect("valid key"))
    };
    let mut tables = vec![("empty", Table::default())];
    let mut t = Table::default();
    t.enrol("node-a", [1; 32], A, 1_700_000_000, &mut secret)
        .expect("enrol");
    tables.push(("enrolled", t.clone()));
    t.rotate("node-a", 1_700_000_100, &mut secret)
        .expect("rotate");
    tables.push(("rotating", t.clone()));
    let pending = t.keys_for(A)[0].generation;
    t.confirm(A, pending, 1_700_000_200);
    t.enrol("node-a", [2; 32], A, 1_700_000_300, &mut secret)
        .expect("second certificate");
    tables.push(("confirmed", t.clone()));
    t.enrol("node-b", [3; 32], B, 1_700_000_400, &mut secret)
        .expect("enrol");
    t.revoke("node-a", 1_700_000_500).expect("revoke");
    tables.push(("revoked", t));

    let mut s = Seeds(Vec::new());
    for (name, table) in tables {
        let file = hostkeys_file::encode(&table);
        assert!(hostkeys_file::decode(&file).is_ok(), "{name} decodes");
        let payload = &file[16..file.len() - 32];
        assert_eq!(
            seal_host_keys(payload),
            *file,
            "the fuzz crate seals as edgevold does"
        );
        let mut whole = vec![0];
        whole.extend_from_slice(&file);
        s.add(format!("{name}-file"), whole);
        let mut sealed = vec![1];
        sealed.extend_from_slice(payload);
        s.add(format!("{name}-payload"), sealed);
        if name == "confirmed" {
            let mut torn = vec![0];
            torn.extend_from_slice(&file[..file.len() - 1]);
            s.add(format!("{name}-torn"), torn);
        }
    }
    s
}

// ---- authority_rewrite: [mode] + a client's HTTP/2 bytes ----

const SETTINGS: u8 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("small");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn grpc_request(authority: &str, user_agent: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/csi.v1.Identity/GetPluginInfo"),
        (":authority", authority),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
        ("user-agent", user_agent),
        ("grpc-accept-encoding", "identity,deflate,gzip"),
    ]
    .into_iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

/// A client connection after the preface: SETTINGS, WINDOW_UPDATE, then two unary calls (the
/// second encoded against the first's dynamic table), each HEADERS then a DATA message.
fn client(authority: &str, user_agent: &str, style: u8) -> Vec<u8> {
    let mut encoder = loona_hpack::Encoder::new();
    let mut out = Vec::new();
    // SETTINGS: ENABLE_PUSH 0, INITIAL_WINDOW_SIZE 4 MiB.
    frame(
        &mut out,
        SETTINGS,
        0,
        0,
        &[0, 2, 0, 0, 0, 0, 0, 4, 0, 0x40, 0, 0],
    );
    frame(&mut out, WINDOW_UPDATE, 0, 0, &0x000f_0000u32.to_be_bytes());
    let headers = grpc_request(authority, user_agent);
    for stream in [1u32, 3] {
        let block = encoder.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
        match style {
            // Plain HEADERS.
            0 => frame(&mut out, HEADERS, END_HEADERS, stream, &block),
            // Padded, with priority fields.
            1 => {
                let mut payload = vec![4];
                payload.extend_from_slice(&[0, 0, 0, 0, 15]);
                payload.extend_from_slice(&block);
                payload.extend_from_slice(&[0; 4]);
                frame(
                    &mut out,
                    HEADERS,
                    END_HEADERS | PADDED | PRIORITY,
                    stream,
                    &payload,
                );
            }
            // Split over a CONTINUATION.
            _ => {
                let (a, b) = block.split_at(block.len() / 2);
                frame(&mut out, HEADERS, 0, stream, a);
                frame(&mut out, CONTINUATION, END_HEADERS, stream, b);
            }
        }
        // An empty GetPluginInfoRequest: uncompressed, length 0.
        frame(&mut out, DATA, END_STREAM, stream, &[0, 0, 0, 0, 0]);
    }
    out
}

fn authority() -> Seeds {
    let mut s = Seeds(Vec::new());
    let clients = [
        (
            "c-core",
            "%2Frun%2Fedgevol%2Fcsi.sock",
            "grpc-python/1.66.0 grpc-c/43.0.0 (linux; chttp2)",
        ),
        (
            "java",
            "%2Fvar%2Flib%2Fkubelet%2Fplugins%2Fedgevol%2Fcsi.sock",
            "grpc-java-netty/1.68.0",
        ),
        ("go", "localhost", "grpc-go/1.67.1"),
        ("host-port", "127.0.0.1:50051", "grpc-go/1.67.1"),
        ("ipv6", "[::1]:50051", "grpc-go/1.67.1"),
    ];
    for (i, (name, authority, agent)) in clients.into_iter().enumerate() {
        let style = u8::try_from(i % 3).expect("small");
        // Bit 7: the target prepends the preface.
        let mut seed = vec![0x80 | u8::try_from(i).expect("small")];
        seed.extend_from_slice(&client(authority, agent, style));
        s.add(name, seed);
    }
    // The preface in the input itself, then a call whose block outgrows one frame once
    // rewritten without Huffman or indexing (a large metadata value).
    let mut seed = vec![0x05];
    seed.extend_from_slice(H2_PREFACE);
    let mut headers = grpc_request("%2Ftmp%2Fcsi.sock", "grpc-c/43.0.0");
    headers.push((b"x-large".to_vec(), vec![b'a'; 16_500]));
    let block = loona_hpack::Encoder::new().encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
    let (a, b) = block.split_at(16_000);
    frame(&mut seed, HEADERS, END_STREAM, 1, a);
    frame(&mut seed, CONTINUATION, END_HEADERS, 1, b);
    s.add("preface-and-large-block", seed);
    // Indexes expanding past the block limit once rewritten (refused since the rewriter bounds
    // what it writes): a 3900-byte entry in the dynamic table, then a frame of 1-byte indexes.
    let mut encoder = loona_hpack::Encoder::new();
    let big: (&[u8], &[u8]) = (b"x-big", &[b'a'; 3900]);
    let mut seed = vec![0x80];
    frame(&mut seed, HEADERS, END_HEADERS, 1, &encoder.encode([big]));
    frame(
        &mut seed,
        HEADERS,
        END_HEADERS,
        3,
        &encoder.encode(vec![big; 16_000]),
    );
    s.add("index-amplification", seed);
    // Edge cases: the preface only; a frame header cut short.
    let mut seed = vec![0x00];
    seed.extend_from_slice(H2_PREFACE);
    s.add("preface-only", seed);
    let mut seed = vec![0x80];
    seed.extend_from_slice(&client("localhost", "grpc-go/1.67.1", 0)[..30]);
    s.add("cut-frame", seed);
    s
}
