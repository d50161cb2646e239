//! Who the plugin is: name, version and plugin capabilities, shared by every instance.

use edgevol_proto::csi::v1::plugin_capability::service::Type as Service;
use edgevol_proto::csi::v1::{plugin_capability, GetPluginCapabilitiesResponse, PluginCapability};

/// The plugin's name, in domain notation as CSI asks.
pub const PLUGIN_NAME: &str = "csi.edgevol.io";

/// The vendor version: the workspace version every edgevol binary is built with.
pub const VENDOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The plugin capabilities of the whole driver: the Controller, GroupController and
/// SnapshotMetadata services (on the appliance) and topology (a volume is reachable only
/// through its appliance, named by the `edgevol.io/appliance` segment).
pub const SERVICES: [Service; 4] = [
    Service::ControllerService,
    Service::VolumeAccessibilityConstraints,
    Service::GroupControllerService,
    Service::SnapshotMetadataService,
];

/// The GetPluginCapabilities answer of every instance.
pub fn plugin_capabilities() -> GetPluginCapabilitiesResponse {
    let capabilities = SERVICES
        .into_iter()
        .map(|service| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: service as i32,
                },
            )),
        })
        .collect();
    GetPluginCapabilitiesResponse { capabilities }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_the_four_services_in_order() {
        let got: Vec<i32> = plugin_capabilities()
            .capabilities
            .into_iter()
            .map(|c| match c.r#type {
                Some(plugin_capability::Type::Service(s)) => s.r#type,
                other => panic!("not a service capability: {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                Service::ControllerService as i32,
                Service::VolumeAccessibilityConstraints as i32,
                Service::GroupControllerService as i32,
                Service::SnapshotMetadataService as i32
            ]
        );
    }

    #[test]
    fn name_is_in_domain_notation_within_63_characters() {
        assert!(PLUGIN_NAME.len() <= 63 && PLUGIN_NAME.contains('.'));
        assert!(PLUGIN_NAME
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '.' || c == '-' || c.is_ascii_digit()));
    }
}
