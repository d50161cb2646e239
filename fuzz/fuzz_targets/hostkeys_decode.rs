//! Arbitrary bytes into the host-key file decoder (`DATA_DIR/host-keys`, read when edgevold
//! starts): `edgevol_appliance::hostkeys::file::decode`.
//!
//! Byte 0, bit 0 clear: the rest is the whole file. Set: the rest is the payload, framed and
//! checksummed here (`edgevol_fuzz::seal_host_keys`), so mutations reach the postcard table
//! decoder and the table's invariant check behind the SHA-256, which a fuzzer cannot forge.
//! Oracle: nothing panics, and a file that decodes
//! - re-encodes to a file no longer than itself (only over-long integers may shrink) that decodes
//!   to a table encoding to the very same bytes: decode and encode are inverse on what encode
//!   writes;
//! - holds a table whose every node owns its host NQN and whose current pair is offered for it.
//!
//! Seeds (fuzz/corpus/hostkeys_decode/): files of real tables (enrolments, rotations,
//! confirmations, revocations), whole and as sealed payloads.
//!
//! Run from the repository root: `scripts/fuzz.sh hostkeys_decode 60`
#![no_main]

use edgevol_appliance::hostkeys::file::{decode, encode};
use edgevol_fuzz::seal_host_keys;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let sealed;
    let file = if mode & 1 == 0 {
        rest
    } else {
        sealed = seal_host_keys(rest);
        &sealed[..]
    };
    let Ok(table) = decode(file) else {
        return;
    };

    let again = encode(&table);
    assert!(again.len() <= file.len(), "re-encoding grew the file");
    let back = decode(&again).expect("what encode writes decodes");
    assert_eq!(
        encode(&back),
        again,
        "encode(decode(encode(t))) == encode(t)"
    );

    for (name, node) in table.nodes() {
        let (owner, _) = table
            .owner(&node.host_nqn)
            .expect("a node's NQN has an owner");
        assert_eq!(owner, name, "one node per NQN");
        let offered = table.keys_for(&node.host_nqn);
        assert!(
            offered
                .iter()
                .any(|p| p.generation == node.current.generation),
            "the current pair of {name:?} is not offered"
        );
    }
});
