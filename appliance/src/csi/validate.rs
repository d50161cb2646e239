//! The request checks every CSI handler shares, with uniform `INVALID_ARGUMENT` messages.
//!
//! CSI limits: names and ids at most 128 bytes, maps at most 4 KiB, and neither may contain
//! control characters. Secrets are only measured: their content never appears in a message.

use std::collections::HashMap;

use tonic::Status;

/// Bytes a CSI string field may hold.
pub const MAX_STRING: usize = 128;
/// Bytes a CSI map may hold (keys plus values).
pub const MAX_MAP: usize = 4096;

/// A required name or id: present, at most 128 bytes, no control characters.
pub fn required(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    string(field, value)
}

/// An optional string: at most 128 bytes, no control characters.
pub fn string(field: &str, value: &str) -> Result<(), Status> {
    if value.len() > MAX_STRING {
        return Err(Status::invalid_argument(format!(
            "{field} is {} bytes; at most {MAX_STRING} are allowed",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "{field} contains a control character"
        )));
    }
    Ok(())
}

/// A string map (parameters, contexts, mutable parameters): at most 4 KiB in all.
pub fn map(field: &str, map: &HashMap<String, String>) -> Result<(), Status> {
    let size: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_MAP {
        return Err(Status::invalid_argument(format!(
            "{field} holds {size} bytes; at most {MAX_MAP} are allowed"
        )));
    }
    if let Some(key) = map
        .keys()
        .find(|k| k.is_empty() || k.chars().any(char::is_control))
    {
        return Err(Status::invalid_argument(format!(
            "{field} has an invalid key {key:?}"
        )));
    }
    Ok(())
}

/// A List call's `max_entries`: not negative; 0 means no limit.
pub fn max_entries(n: i32) -> Result<usize, Status> {
    match usize::try_from(n) {
        Ok(0) => Ok(usize::MAX),
        Ok(n) => Ok(n),
        Err(_) => Err(Status::invalid_argument(format!(
            "max_entries is {n}; it must not be negative"
        ))),
    }
}

/// The secrets map: size only, and the message names no key or value.
pub fn secrets(map: &HashMap<String, String>) -> Result<(), Status> {
    let size: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_MAP {
        return Err(Status::invalid_argument(format!(
            "secrets hold {size} bytes; at most {MAX_MAP} are allowed"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn limits_and_messages() {
        assert!(required("name", "pvc-1").is_ok());
        assert_eq!(
            required("name", "").unwrap_err().message(),
            "name is required"
        );
        let long = "x".repeat(129);
        assert_eq!(
            required("name", &long).unwrap_err().message(),
            "name is 129 bytes; at most 128 are allowed"
        );
        assert!(required("name", &"x".repeat(128)).is_ok());
        assert_eq!(
            required("name", "a\nb").unwrap_err().code(),
            Code::InvalidArgument
        );

        let mut m = HashMap::from([("k".to_owned(), "v".repeat(4095))]);
        assert!(map("parameters", &m).is_ok());
        m.insert("k2".into(), String::new());
        assert!(map("parameters", &m)
            .unwrap_err()
            .message()
            .contains("4098 bytes"));

        assert_eq!(max_entries(0).unwrap(), usize::MAX);
        assert_eq!(max_entries(3).unwrap(), 3);
        assert_eq!(max_entries(-1).unwrap_err().code(), Code::InvalidArgument);

        let s = HashMap::from([("password".to_owned(), "hunter2".repeat(600))]);
        let e = secrets(&s).unwrap_err();
        assert!(!e.message().contains("hunter2") && !e.message().contains("password"));
    }
}
