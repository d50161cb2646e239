//! Checks of the names the configuration puts on the wire: the appliance id (in NVMe qualified
//! names and topology) and topology segments (CSI's rules, as Kubernetes labels).

use edgevol_driver::fleet;

use super::ConfigError;

/// Checks an appliance id: it becomes part of NVMe qualified names and a topology value.
pub fn check_appliance_id(id: &str) -> Result<(), ConfigError> {
    fleet::check_appliance_id(id).map_err(|e| ConfigError(e.to_string()))
}

/// CSI topology rules (as Kubernetes labels): key = optional DNS prefix + '/' + name of at most
/// 63 characters; value at most 63 characters; names and values start and end alphanumeric
/// and hold only `[-_.A-Za-z0-9]`.
pub(super) fn check_segment(key: &str, value: &str) -> Result<(), ConfigError> {
    fn label(s: &str, may_be_empty: bool) -> bool {
        if s.is_empty() {
            return may_be_empty;
        }
        let b = s.as_bytes();
        s.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
    }
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    let prefix_ok = prefix.is_empty()
        || (prefix.len() <= 253 && prefix.split('.').all(|part| label(part, false)));
    if !(prefix_ok && label(name, false)) {
        return Err(ConfigError(format!(
            "topology key {key:?} is not a valid key"
        )));
    }
    if !label(value, true) {
        return Err(ConfigError(format!(
            "topology value {value:?} of {key:?} is not a valid value"
        )));
    }
    Ok(())
}
