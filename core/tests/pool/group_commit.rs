//! Group commit of control operations (`Pool::set_group_commit`): staged operations share one
//! journal write and one flush, and a crash or a failed commit never keeps an operation without
//! the ones staged before it, nor loses one whose ticket was committed.

use crate::common;

use common::{faulty_ram, options, FaultyRam, CLUSTER};
use edgevol_core::{BlockDevice, CommitTicket, DeviceErrorKind, Error, Pool, VolumeSpec};
use edgevol_hal::TearUnit;

const CS: u64 = CLUSTER as u64;
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:group-commit";

fn pool(seed: u64) -> Pool<FaultyRam> {
    let blocks = 2 + 2 * 128 + 64 + 8 + 256 * CS / u64::from(common::BLOCK);
    let mut pool = Pool::format(faulty_ram(blocks, seed), options(3)).unwrap();
    pool.set_group_commit(true);
    pool
}

/// What control operations leave: every volume with its id, name, size and hosts.
type Summary = Vec<(u64, String, u64, Vec<String>)>;

fn summary<D: edgevol_core::BlockDevice>(pool: &Pool<D>) -> Summary {
    pool.volumes(None)
        .map(|v| {
            let hosts = v.publications().iter().map(|p| p.host.clone()).collect();
            (v.id().0, v.name().to_owned(), v.size(), hosts)
        })
        .collect()
}

#[test]
fn staged_operations_share_one_journal_write_and_one_flush() {
    let mut pool = pool(1);
    let before = pool.device_mut().stats();
    let mut tickets = Vec::new();
    for i in 0..8 {
        let v = pool.create_volume(VolumeSpec::new(format!("v{i}"), CS)).unwrap();
        pool.publish(v, HOST, false).unwrap();
        tickets.push(pool.commit_ticket());
    }
    let staged = pool.device_mut().stats();
    assert_eq!(
        (staged.writes, staged.flushes),
        (before.writes, before.flushes),
        "staging did I/O"
    );
    assert!(tickets.iter().all(|&t| !pool.is_committed(t)));
    assert_eq!(pool.volume_count(), 8, "staged operations are visible at once");

    pool.commit_staged(*tickets.last().unwrap()).unwrap();
    let after = pool.device_mut().stats();
    assert_eq!(after.writes - before.writes, 1, "16 operations, one journal write");
    assert_eq!(after.flushes - before.flushes, 1, "16 operations, one flush");
    assert!(tickets.iter().all(|&t| pool.is_committed(t)));
    // A covered ticket needs no further I/O.
    pool.commit_staged(tickets[0]).unwrap();
    assert_eq!(pool.device_mut().stats().flushes, after.flushes);

    let expected = summary(&pool);
    let reopened = Pool::open(pool.into_device().into_inner()).unwrap();
    assert_eq!(summary(&reopened), expected);
}

#[test]
fn an_unstaged_pool_still_commits_each_operation() {
    let mut pool = pool(2);
    pool.set_group_commit(false);
    let before = pool.device_mut().stats().flushes;
    pool.create_volume(VolumeSpec::new("a", CS)).unwrap();
    pool.create_volume(VolumeSpec::new("b", CS)).unwrap();
    assert_eq!(pool.device_mut().stats().flushes - before, 2);
    assert!(pool.is_committed(pool.commit_ticket()));
}

/// A batch of control operations on a seeded mix: create, publish, unpublish, delete.
fn stage_batch(pool: &mut Pool<FaultyRam>, rng: &mut u64, names: &mut u32, states: &mut Vec<Summary>) {
    let ops = 1 + next(rng) % 6;
    for _ in 0..ops {
        let ids: Vec<_> = pool.volumes(None).map(|v| v.id()).collect();
        let pick = |r: u64| ids[usize::try_from(r % ids.len() as u64).unwrap()];
        match next(rng) % 4 {
            _ if ids.is_empty() => {
                pool.create_volume(VolumeSpec::new(format!("v{names}"), CS)).unwrap();
                *names += 1;
            }
            0 | 1 => {
                pool.create_volume(VolumeSpec::new(format!("v{names}"), CS * (1 + next(rng) % 3)))
                    .unwrap();
                *names += 1;
            }
            2 => {
                let v = pick(next(rng));
                match pool.volume(v).unwrap().publications().is_empty() {
                    true => pool.publish(v, HOST, false).unwrap(),
                    false => pool.unpublish(v, HOST).unwrap(),
                }
            }
            _ => {
                let v = pick(next(rng));
                pool.unpublish(v, HOST).unwrap();
                pool.delete_volume(v).unwrap();
            }
        }
        states.push(summary(pool));
    }
}

fn next(state: &mut u64) -> u64 {
    // xorshift64*
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

#[test]
fn a_crash_at_any_write_of_group_commits_keeps_every_committed_operation() {
    for seed in [7u64, 0x5eed] {
        println!("seed {seed}");
        let mut pool = pool(seed);
        pool.device_mut().start_recording();
        let mut rng = seed | 1;
        let mut names = 0;
        // Per batch: the states it may recover to, from the last committed one (index 0) to the
        // state after its last operation.
        let mut batches = Vec::new();
        for b in 0..120u64 {
            pool.device_mut().set_tag(b);
            let mut states = vec![summary(&pool)];
            stage_batch(&mut pool, &mut rng, &mut names, &mut states);
            pool.commit_staged(pool.commit_ticket()).unwrap();
            batches.push(states);
        }
        let recording = pool.device_mut().take_recording().unwrap();
        let writes = common::recorded_writes(&recording);
        assert!(writes >= 100, "{writes} writes: too few to mean anything");
        let mut cuts = recording.cuts(seed, TearUnit::Byte);
        while let Some(cut) = cuts.next_cut().unwrap() {
            let allowed = &batches[usize::try_from(cut.tag).unwrap()];
            for (what, image) in [
                ("process crash", cuts.process_crash()),
                ("power cut", cuts.power_cut().unwrap()),
            ] {
                let got = summary(&Pool::open(image).unwrap());
                assert!(
                    allowed.contains(&got),
                    "{what} at event {} (batch {}): neither the committed state nor a prefix of the batch\n{got:?}",
                    cut.event,
                    cut.tag
                );
            }
        }
    }
}

/// Stages a batch on top of one committed batch, then fails its commit with `fault`; returns the
/// error, the committed state and the states the batch staged.
fn failed_commit(fault: impl FnOnce(&mut FaultyRam)) -> (Error, Pool<FaultyRam>, Vec<Summary>) {
    let mut pool = pool(11);
    let a = pool.create_volume(VolumeSpec::new("acked", CS)).unwrap();
    pool.publish(a, HOST, false).unwrap();
    pool.commit_staged(pool.commit_ticket()).unwrap();
    let mut states = vec![summary(&pool)];
    let mut tickets: Vec<CommitTicket> = Vec::new();
    for i in 0..6 {
        pool.create_volume(VolumeSpec::new(format!("lost{i}"), CS)).unwrap();
        tickets.push(pool.commit_ticket());
        states.push(summary(&pool));
    }
    fault(pool.device_mut());
    let err = pool.commit_staged(*tickets.last().unwrap()).unwrap_err();
    assert!(
        tickets.iter().all(|&t| !pool.is_committed(t)),
        "a ticket of the failed commit counts as committed"
    );
    // The pool stops: no later operation or commit may claim success.
    assert_eq!(pool.create_volume(VolumeSpec::new("after", CS)), Err(err));
    assert_eq!(pool.commit_staged(tickets[0]), Err(err));
    (err, pool, states)
}

#[test]
fn a_group_commit_torn_by_a_power_cut_fails_and_recovers_a_prefix() {
    let (err, pool, states) = failed_commit(|dev| {
        dev.config_mut().lose_unflushed = true;
        dev.config_mut().cut_after_writes = Some(dev.stats().writes + 1);
    });
    assert_eq!(err, Error::Device(DeviceErrorKind::PowerLoss));
    let mut dev = pool.into_device();
    dev.power_on();
    let got = summary(&Pool::open(dev.into_inner()).unwrap());
    assert!(
        states.contains(&got),
        "recovered neither the committed state nor a prefix: {got:?}"
    );
    assert_eq!(got[0].1, "acked");
}

#[test]
fn a_group_commit_whose_journal_write_fails_fails_and_keeps_the_committed_state() {
    let (err, pool, states) = failed_commit(|dev| {
        let blocks = dev.inner_mut().block_count();
        dev.config_mut().write_errors = (0..blocks).collect();
    });
    assert_eq!(err, Error::Device(DeviceErrorKind::Io));
    let got = summary(&Pool::open(pool.into_device().into_inner()).unwrap());
    assert_eq!(got, states[0], "nothing of the failed commit was written");
}
