//! Which appliances `edgevol proxy` serves: `--appliance` flags and the `--config` file.
//!
//! One appliance may be given as a plain `HOST:PORT` (the proxy then forwards blindly, as it
//! always did); several must each be named `ID=HOST:PORT` with the appliance id their CSI ids
//! carry, so the proxy can route a call by the id it names. The config file (TOML) holds the
//! same list, with a certificate name per appliance when it differs from the host:
//!
//! ```toml
//! [[appliance]]
//! id = "box-1"
//! address = "10.0.0.11:9500"
//! server_name = "box-1.edgevol.lan"   # optional; default: --server-name, else the host
//! ```

use std::path::Path;

use edgevol_driver::fleet::check_appliance_id;
use serde::Deserialize;

/// One appliance the proxy serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplianceSpec {
    /// Its appliance id (`edgevol.io/appliance`), when given.
    pub id: Option<String>,
    /// `HOST:PORT` of its CSI endpoint.
    pub address: String,
    /// Certificate name to verify, when it differs from the proxy-wide `--server-name`.
    pub server_name: Option<String>,
}

/// The config file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    appliance: Vec<FileAppliance>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAppliance {
    id: String,
    address: String,
    server_name: Option<String>,
}

/// One `--appliance` value: `ID=HOST:PORT` or `HOST:PORT`.
pub fn parse_flag(value: &str) -> Result<ApplianceSpec, String> {
    let (id, address) = match value.split_once('=') {
        Some((id, address)) => {
            check_appliance_id(id).map_err(|e| e.to_string())?;
            (Some(id.to_owned()), address)
        }
        None => (None, value),
    };
    if address.is_empty() {
        return Err(format!("--appliance {value:?}: expected [ID=]HOST:PORT"));
    }
    Ok(ApplianceSpec {
        id,
        address: address.to_owned(),
        server_name: None,
    })
}

/// The appliances of a config file's text.
pub fn parse_file(text: &str) -> Result<Vec<ApplianceSpec>, String> {
    let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
    file.appliance
        .into_iter()
        .map(|a| {
            check_appliance_id(&a.id).map_err(|e| e.to_string())?;
            Ok(ApplianceSpec {
                id: Some(a.id),
                address: a.address,
                server_name: a.server_name,
            })
        })
        .collect()
}

/// The appliances of the `--appliance` flags and the `--config` file together, checked: at
/// least one; with several, every one named, no id or address twice.
pub fn gather(flags: &[String], config: Option<&Path>) -> Result<Vec<ApplianceSpec>, String> {
    let mut all: Vec<ApplianceSpec> = flags
        .iter()
        .map(|f| parse_flag(f))
        .collect::<Result<_, _>>()?;
    if let Some(path) = config {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        all.extend(parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    if all.is_empty() {
        return Err("no appliance: pass --appliance [ID=]HOST:PORT or --config FILE".into());
    }
    if all.len() > 1 {
        if let Some(a) = all.iter().find(|a| a.id.is_none()) {
            return Err(format!(
                "appliance {}: with several appliances, name each one: --appliance ID=HOST:PORT",
                a.address
            ));
        }
    }
    for (i, a) in all.iter().enumerate() {
        for b in &all[..i] {
            if a.address == b.address {
                return Err(format!("appliance address {} given twice", a.address));
            }
            if a.id.is_some() && a.id == b.id {
                return Err(format!(
                    "appliance id {} given twice",
                    a.id.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_an_appliance_or_leave_its_id_to_learn() {
        assert_eq!(
            parse_flag("box-1=10.0.0.1:9500").unwrap(),
            ApplianceSpec {
                id: Some("box-1".into()),
                address: "10.0.0.1:9500".into(),
                server_name: None
            }
        );
        assert_eq!(parse_flag("[::1]:9500").unwrap().id, None);
        assert!(parse_flag("Box=h:1").unwrap_err().contains("[a-z0-9-]"));
        assert!(parse_flag("box=").is_err());
    }

    #[test]
    fn a_fleet_needs_every_appliance_named_once() {
        let one = gather(&["h:1".into()], None).unwrap();
        assert_eq!(one.len(), 1);
        let err = gather(&["a=h:1".into(), "h:2".into()], None).unwrap_err();
        assert!(err.contains("name each one"), "{err}");
        let err = gather(&["a=h:1".into(), "a=h:2".into()], None).unwrap_err();
        assert!(err.contains("id a given twice"), "{err}");
        let err = gather(&["a=h:1".into(), "b=h:1".into()], None).unwrap_err();
        assert!(err.contains("h:1 given twice"), "{err}");
        assert!(gather(&[], None).is_err());
    }

    #[test]
    fn the_config_file_lists_appliances_with_optional_server_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.toml");
        std::fs::write(
            &path,
            "[[appliance]]\nid = \"box-1\"\naddress = \"h1:9500\"\n\n\
             [[appliance]]\nid = \"box-2\"\naddress = \"h2:9500\"\nserver_name = \"two\"\n",
        )
        .unwrap();
        let all = gather(&["box-3=h3:9500".into()], Some(&path)).unwrap();
        let ids: Vec<_> = all.iter().map(|a| a.id.clone().unwrap()).collect();
        assert_eq!(ids, ["box-3", "box-1", "box-2"]);
        assert_eq!(all[2].server_name.as_deref(), Some("two"));
        std::fs::write(&path, "[[appliance]]\nid = \"x\"\naddres = \"h\"\n").unwrap();
        assert!(gather(&[], Some(&path)).is_err(), "unknown field refused");
    }
}
