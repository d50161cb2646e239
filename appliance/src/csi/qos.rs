//! Mutable parameters (ControllerModifyVolume, CreateVolume's mutable_parameters): per-volume
//! quality of service, stored durably with the volume for the NVMe/TCP target to enforce.
//!
//! | key | value |
//! |---|---|
//! | `maxIops` | I/O commands per second, a positive integer |
//! | `maxBandwidthBytes` | bytes per second, a positive integer |
//!
//! Any other key is refused.

use std::collections::HashMap;

use tonic::Status;

/// The keys ControllerModifyVolume accepts.
pub const KEYS: [&str; 2] = ["maxIops", "maxBandwidthBytes"];

/// Checks `map` and returns it as core stores it (sorted pairs).
pub fn parse(map: &HashMap<String, String>) -> Result<Vec<(String, String)>, Status> {
    let mut pairs = Vec::with_capacity(map.len());
    for (key, value) in map {
        if !KEYS.contains(&key.as_str()) {
            return Err(Status::invalid_argument(format!(
                "unknown mutable parameter {key:?} (known: {})",
                KEYS.join(", ")
            )));
        }
        match value.parse::<u64>() {
            Ok(n) if n > 0 => pairs.push((key.clone(), n.to_string())),
            _ => {
                return Err(Status::invalid_argument(format!(
                    "mutable parameter {key}={value:?}: expected a positive integer"
                )))
            }
        }
    }
    pairs.sort();
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_keys_with_positive_integers_only() {
        let m = HashMap::from([
            ("maxIops".to_owned(), "5000".to_owned()),
            ("maxBandwidthBytes".to_owned(), "1048576".to_owned()),
        ]);
        assert_eq!(
            parse(&m).unwrap(),
            vec![
                ("maxBandwidthBytes".to_owned(), "1048576".to_owned()),
                ("maxIops".to_owned(), "5000".to_owned())
            ]
        );
        for (k, v) in [
            ("maxIops", "0"),
            ("maxIops", "-5"),
            ("maxIops", "fast"),
            ("iops", "5"),
        ] {
            let e = parse(&HashMap::from([(k.to_owned(), v.to_owned())])).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k}={v}");
        }
    }
}
