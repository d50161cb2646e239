//! DH-HMAC-CHAP against known answers computed independently with Python's standard library
//! (tests/fixtures/auth_vectors.py, output checked in as auth_vectors.txt; no Python at test
//! time): secret representation and transform for each hash, the RFC 7919 primes, DH public
//! values and session keys for ffdhe2048 and ffdhe8192, augmented challenges, host and
//! controller responses with and without a DH group.

use std::collections::BTreeMap;

use edgevol_nvmeof::auth::dh::{DhGroup, PrivateKey};
use edgevol_nvmeof::auth::hash::{
    augmented_challenge, controller_response, host_response, HashId, ResponseInput,
};
use edgevol_nvmeof::auth::secret::Secret;

struct Vectors(BTreeMap<String, String>);

impl Vectors {
    fn load() -> Self {
        let text = include_str!("fixtures/auth_vectors.txt");
        let map = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once(" = ").expect("name = value");
                (k.to_owned(), v.to_owned())
            })
            .collect();
        Vectors(map)
    }

    fn text(&self, name: &str) -> &str {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("vector {name} missing"))
    }

    fn bytes(&self, name: &str) -> Vec<u8> {
        let h = self.text(name);
        assert!(h.len().is_multiple_of(2), "{name}: odd hex");
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn number(&self, name: &str) -> u32 {
        self.text(name).parse().expect("decimal")
    }
}

fn hash_of(hh: u8) -> Option<HashId> {
    HashId::from_id(hh)
}

#[test]
fn secrets_parse_encode_and_transform() {
    let v = Vectors::load();
    let (hostnqn, subnqn) = (v.text("hostnqn"), v.text("subnqn"));
    for hh in 0..=3u8 {
        let key = v.bytes(&format!("secret.{hh}.key"));
        let text = v.text(&format!("secret.{hh}.dhhc"));
        let parsed = Secret::parse(text).unwrap();
        assert!(parsed.ct_eq(&Secret::from_key(hash_of(hh), &key).unwrap()));
        assert_eq!(parsed.encode().as_str(), text, "hh {hh}");
        assert_eq!(
            parsed.transform(hostnqn).as_bytes(),
            v.bytes(&format!("secret.{hh}.transform.host")),
            "hh {hh}"
        );
        assert_eq!(
            parsed.transform(subnqn).as_bytes(),
            v.bytes(&format!("secret.{hh}.transform.subsys")),
            "hh {hh}"
        );
    }
}

#[test]
fn rfc_7919_primes_match_the_formula() {
    let v = Vectors::load();
    for g in &DhGroup::ALL[1..] {
        assert_eq!(
            g.prime().unwrap(),
            v.bytes(&format!("prime.{}", g.id())),
            "{g}"
        );
    }
}

#[test]
fn dh_public_values_and_session_keys() {
    let v = Vectors::load();
    for g in [DhGroup::Ffdhe2048, DhGroup::Ffdhe8192] {
        let id = g.id();
        let x = PrivateKey::from_be_bytes(g, &v.bytes(&format!("dh.{id}.x"))).unwrap();
        let y = PrivateKey::from_be_bytes(g, &v.bytes(&format!("dh.{id}.y"))).unwrap();
        let (gx, gy) = (
            v.bytes(&format!("dh.{id}.gx")),
            v.bytes(&format!("dh.{id}.gy")),
        );
        assert_eq!(x.public_value(), gx, "{g} g^x");
        assert_eq!(y.public_value(), gy, "{g} g^y");
        let ks = v.bytes(&format!("dh.{id}.ks"));
        assert_eq!(x.shared_secret(&gy).unwrap().as_bytes(), ks, "{g} Ks");
        assert_eq!(y.shared_secret(&gx).unwrap().as_bytes(), ks, "{g} Ks");
    }
}

#[test]
fn responses_and_augmented_challenges() {
    let v = Vectors::load();
    let (hostnqn, subnqn) = (v.text("hostnqn"), v.text("subnqn"));
    let (s1, s2) = (v.number("s1"), v.number("s2"));
    let t_id = u16::try_from(v.number("t_id")).unwrap();
    for hash in HashId::ALL {
        let h = hash.id();
        let host_secret = Secret::parse(v.text(&format!("secret.{h}.dhhc"))).unwrap();
        let ctrl_hh = v.number(&format!("resp.{h}.ctrl_secret"));
        let ctrl_secret = Secret::parse(v.text(&format!("secret.{ctrl_hh}.dhhc"))).unwrap();
        let kh = host_secret.transform(hostnqn);
        let kc = ctrl_secret.transform(subnqn);
        let (c1, c2) = (
            v.bytes(&format!("resp.{h}.c1")),
            v.bytes(&format!("resp.{h}.c2")),
        );
        for group in [DhGroup::Null, DhGroup::Ffdhe2048, DhGroup::Ffdhe8192] {
            let gid = group.id();
            let ks = (group != DhGroup::Null).then(|| v.bytes(&format!("dh.{gid}.ks")));
            if let Some(ks) = &ks {
                assert_eq!(
                    augmented_challenge(hash, ks, &c1).as_bytes(),
                    v.bytes(&format!("resp.{h}.{gid}.aug1")),
                    "{hash} {group} augmented C1"
                );
            }
            let r1 = host_response(
                &ResponseInput {
                    hash,
                    session_key: ks.as_deref(),
                    challenge: &c1,
                    seqnum: s1,
                    t_id,
                },
                kh.as_bytes(),
                hostnqn,
                subnqn,
            );
            assert_eq!(
                r1.as_bytes(),
                v.bytes(&format!("resp.{h}.{gid}.r1")),
                "{hash} {group} R1"
            );
            let r2 = controller_response(
                &ResponseInput {
                    hash,
                    session_key: ks.as_deref(),
                    challenge: &c2,
                    seqnum: s2,
                    t_id,
                },
                kc.as_bytes(),
                subnqn,
                hostnqn,
            );
            assert_eq!(
                r2.as_bytes(),
                v.bytes(&format!("resp.{h}.{gid}.r2")),
                "{hash} {group} R2"
            );
        }
    }
}
