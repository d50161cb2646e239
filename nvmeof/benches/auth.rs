//! Target-side cost of one DH-HMAC-CHAP transaction per DH group: the time the appliance spends
//! in `Authenticator::on_auth_send` / `on_auth_receive` from Negotiate to Success2
//! (bidirectional, SHA-256: challenge and ephemeral DH key, session key, R1 check, R2), with the
//! host's work (done by the test host between the calls) left out. The baseline is the null
//! group in the same run; the ratio is of medians (means carry the scheduling noise of a shared
//! machine). Prints a markdown table.
//!
//! `cargo bench -p edgevol-nvmeof --bench auth --features test-initiator` (add `-- --quick` for
//! a smoke run).

use std::time::{Duration, Instant};

use edgevol_nvmeof::auth::host::{Host, HostConfig, TestRng};
use edgevol_nvmeof::auth::{
    AuthCommand, Authenticator, DhGroup, HashId, KeyPair, Outcome, Secret, TargetConfig,
};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const SUBNQN: &str = "nqn.2024-11.io.edgevol:bench:v1";

fn secret(hash: HashId, byte: u8) -> Secret {
    Secret::from_key(Some(hash), &vec![byte; hash.digest_len()]).expect("valid key")
}

/// One transaction on a fresh queue; returns the time spent in the target.
fn transaction(group: DhGroup, rng: &mut TestRng) -> Duration {
    let pair = KeyPair {
        host: secret(HashId::Sha256, 1),
        controller: Some(secret(HashId::Sha256, 2)),
    };
    let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair.clone()]);
    config.hashes = vec![HashId::Sha256];
    config.dh_groups = vec![group];
    let mut target = Authenticator::new(config).expect("valid config");
    let mut host = Host::new(HostConfig::linux(
        HOSTNQN,
        SUBNQN,
        pair.host,
        pair.controller,
    ));
    let now = Duration::from_secs(1);
    let mut buf = Vec::new();
    let receive = AuthCommand::Receive { al: 4096 };
    let send = |data: &[u8]| AuthCommand::Send {
        tl: u32::try_from(data.len()).expect("small message"),
    };
    let mut spent = Duration::ZERO;

    let neg = host.negotiate(1);
    let t = Instant::now();
    let o1 = target.on_auth_send(&send(&neg), &neg, now);
    let o2 = target.on_auth_receive(&receive, now, rng, &mut buf);
    spent += t.elapsed();
    assert_eq!((o1, o2), (Ok(Outcome::Continue), Ok(Outcome::Continue)));

    let reply = host.handle_challenge(&buf, rng).expect("reply");
    let t = Instant::now();
    let o1 = target.on_auth_send(&send(&reply), &reply, now);
    let o2 = target.on_auth_receive(&receive, now, rng, &mut buf);
    spent += t.elapsed();
    assert_eq!((o1, o2), (Ok(Outcome::Continue), Ok(Outcome::Continue)));

    let success2 = host
        .handle_success1(&buf)
        .expect("controller authenticated")
        .expect("bidirectional");
    let t = Instant::now();
    let o = target.on_auth_send(&send(&success2), &success2, now);
    spent += t.elapsed();
    assert!(matches!(o, Ok(Outcome::Authenticated(_))));
    spent
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = if quick {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(3)
    };
    let mut rng = TestRng::new(1);
    println!("| DH group | transactions | median (µs) | mean (µs) | median vs null |");
    println!("|---|---|---|---|---|");
    let mut baseline = None;
    for group in DhGroup::ALL {
        // Warm up (group parameters are built once per process).
        let _ = transaction(group, &mut rng);
        let mut samples = Vec::new();
        let start = Instant::now();
        while samples.len() < 5 || (start.elapsed() < budget && samples.len() < 100_000) {
            samples.push(transaction(group, &mut rng));
        }
        samples.sort();
        let mean = samples.iter().sum::<Duration>() / u32::try_from(samples.len()).unwrap_or(1);
        let median = samples[samples.len() / 2];
        let base = *baseline.get_or_insert(median);
        println!(
            "| {group} | {} | {:.1} | {:.1} | {:.0}x |",
            samples.len(),
            median.as_secs_f64() * 1e6,
            mean.as_secs_f64() * 1e6,
            median.as_secs_f64() / base.as_secs_f64()
        );
    }
}
