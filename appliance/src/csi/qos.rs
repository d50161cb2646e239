//! Mutable parameters (CreateVolume's `mutable_parameters`, ControllerModifyVolume): the
//! volume's QoS limits ([`crate::qos::limits`] names the keys), stored durably with the volume
//! and enforced by the NVMe/TCP target. ControllerModifyVolume changes the keys it names and
//! keeps the others; a key given the empty value is removed (its limit lifted). Any other key,
//! and any value that is not a positive integer, is refused.

use std::collections::HashMap;

use tonic::Status;

use crate::qos::limits::{is_key, parse_value};

/// Checks `map` (CreateVolume: every key sets a limit) and returns it as core stores it (sorted
/// pairs).
pub fn parse(map: &HashMap<String, String>) -> Result<Vec<(String, String)>, Status> {
    pairs(map, false)
}

/// Checks ControllerModifyVolume's changes: as [`parse`], and the empty value removes a key.
pub fn parse_changes(map: &HashMap<String, String>) -> Result<Vec<(String, String)>, Status> {
    pairs(map, true)
}

fn pairs(map: &HashMap<String, String>, removal: bool) -> Result<Vec<(String, String)>, Status> {
    let mut pairs = Vec::with_capacity(map.len());
    for (key, value) in map {
        let value = match parse_value(key, value) {
            Ok(n) => n.to_string(),
            Err(_) if removal && value.is_empty() && is_key(key) => String::new(),
            Err(e) => return Err(Status::invalid_argument(e.to_string())),
        };
        pairs.push((key.clone(), value));
    }
    pairs.sort();
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn known_keys_with_positive_integers_only() {
        let m = map(&[
            ("maxIops", "5000"),
            ("maxBandwidthBytes", "1048576"),
            ("maxReadIops", "007"),
        ]);
        assert_eq!(
            parse(&m).unwrap(),
            vec![
                ("maxBandwidthBytes".to_owned(), "1048576".to_owned()),
                ("maxIops".to_owned(), "5000".to_owned()),
                ("maxReadIops".to_owned(), "7".to_owned()),
            ]
        );
        for (k, v) in [
            ("maxIops", "0"),
            ("maxIops", "-5"),
            ("maxIops", "fast"),
            ("maxWriteBandwidthBytes", "1.5"),
            ("iops", "5"),
            ("maxIops", ""),
        ] {
            let e = parse(&map(&[(k, v)])).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k}={v}");
        }
    }

    #[test]
    fn a_change_to_the_empty_value_removes_a_known_key_only() {
        assert_eq!(
            parse_changes(&map(&[("maxIops", ""), ("maxWriteIops", "10")])).unwrap(),
            vec![
                ("maxIops".to_owned(), String::new()),
                ("maxWriteIops".to_owned(), "10".to_owned()),
            ]
        );
        let e = parse_changes(&map(&[("iops", "")])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("unknown"), "{}", e.message());
    }
}
