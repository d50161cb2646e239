//! `edgevol keys rotate|revoke|list`: the nodes' NVMe data-path keys (DH-HMAC-CHAP), managed
//! over mTLS with an admin certificate. The appliance never sends a secret to these commands:
//! only a node's own enrolment receives its keys.

use std::fmt::Write;

use edgevol_proto::edgevol::v1::host_keys_client::HostKeysClient;
use edgevol_proto::edgevol::v1::{
    ListRequest, ListResponse, RevokeRequest, RevokeResponse, RotateRequest,
};
use tonic::transport::Channel;

use crate::status::{call_err, table, utc};

/// Gives `node` a new key pair; returns its generation.
pub async fn rotate(channel: &Channel, node: &str) -> Result<u64, String> {
    let answer = HostKeysClient::new(channel.clone())
        .rotate(RotateRequest {
            node: node.to_owned(),
        })
        .await
        .map_err(call_err("Rotate"))?;
    Ok(answer.into_inner().generation)
}

/// Revokes `node`'s keys, binding and certificates.
pub async fn revoke(channel: &Channel, node: &str) -> Result<RevokeResponse, String> {
    let answer = HostKeysClient::new(channel.clone())
        .revoke(RevokeRequest {
            node: node.to_owned(),
        })
        .await
        .map_err(call_err("Revoke"))?;
    Ok(answer.into_inner())
}

/// Every enrolled node and revoked certificate.
pub async fn list(channel: &Channel) -> Result<ListResponse, String> {
    let answer = HostKeysClient::new(channel.clone())
        .list(ListRequest {})
        .await
        .map_err(call_err("List"))?;
    Ok(answer.into_inner())
}

/// What `keys rotate` prints.
pub fn render_rotated(node: &str, generation: u64) -> String {
    format!(
        "node {node}: new keys, generation {generation}; its current keys keep working until its \
         host has authenticated with the new ones (edgevol-node picks them up when it enrols)\n"
    )
}

/// What `keys revoke` prints.
pub fn render_revoked(node: &str, r: &RevokeResponse) -> String {
    format!(
        "node {node}: keys revoked; host NQN {} no longer authenticates and its connections are \
         closed; {} certificate(s) of the node may no longer enrol (issue it a new one to \
         enrol it again)\n",
        r.host_nqn, r.revoked_certificates
    )
}

fn time(t: Option<&prost_types::Timestamp>) -> String {
    t.map_or_else(|| "never".into(), |t| utc(t.seconds))
}

/// What `keys list` prints: a table of nodes, then one of revoked certificates if any.
pub fn render_list(list: &ListResponse) -> String {
    let rows: Vec<Vec<String>> = list
        .nodes
        .iter()
        .map(|n| {
            vec![
                n.node.clone(),
                n.host_nqn.clone(),
                n.generation.to_string(),
                if n.rotation_pending { "pending" } else { "-" }.into(),
                time(n.enrolled.as_ref()),
                time(n.keys_created.as_ref()),
                time(n.last_authenticated.as_ref()),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "NODE",
            "HOST NQN",
            "GENERATION",
            "ROTATION",
            "ENROLLED (UTC)",
            "KEYS CREATED (UTC)",
            "LAST AUTHENTICATED (UTC)",
        ],
        &rows,
    );
    let _ = writeln!(out, "{} node(s)", list.nodes.len());
    if !list.revoked.is_empty() {
        let rows: Vec<Vec<String>> = list
            .revoked
            .iter()
            .map(|r| vec![r.node.clone(), time(r.revoked.as_ref()), r.sha256.clone()])
            .collect();
        out.push('\n');
        out.push_str(&table(
            &["REVOKED NODE", "REVOKED (UTC)", "CERTIFICATE SHA-256"],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_proto::edgevol::v1::{NodeKeys, RevokedCertificate};

    fn at(seconds: i64) -> Option<prost_types::Timestamp> {
        Some(prost_types::Timestamp { seconds, nanos: 0 })
    }

    #[test]
    fn the_list_shows_nodes_then_revoked_certificates() {
        let list = ListResponse {
            nodes: vec![
                NodeKeys {
                    node: "worker-1".into(),
                    host_nqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
                    generation: 3,
                    rotation_pending: true,
                    enrolled: at(0),
                    keys_created: at(86_400),
                    last_authenticated: None,
                },
                NodeKeys {
                    node: "worker-2".into(),
                    host_nqn: "nqn.2014-08.org.nvmexpress:uuid:2".into(),
                    generation: 2,
                    rotation_pending: false,
                    enrolled: at(60),
                    keys_created: at(60),
                    last_authenticated: at(3_600),
                },
            ],
            revoked: vec![RevokedCertificate {
                node: "old".into(),
                sha256: "ab".repeat(32),
                revoked: at(7_200),
            }],
        };
        let out = render_list(&list);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("NODE") && lines[0].contains("LAST AUTHENTICATED"));
        let cells: Vec<&str> = lines[1].split("  ").filter(|c| !c.is_empty()).collect();
        assert_eq!(
            cells.iter().map(|c| c.trim()).collect::<Vec<_>>(),
            [
                "worker-1",
                "nqn.2014-08.org.nvmexpress:uuid:1",
                "3",
                "pending",
                "1970-01-01 00:00:00",
                "1970-01-02 00:00:00",
                "never"
            ]
        );
        assert!(lines[2].contains("worker-2") && lines[2].ends_with("1970-01-01 01:00:00"));
        assert_eq!(lines[3], "2 node(s)");
        assert_eq!(lines[4], "");
        assert!(lines[5].starts_with("REVOKED NODE"));
        assert!(lines[6].starts_with("old") && lines[6].ends_with(&"ab".repeat(32)));
        let empty = render_list(&ListResponse::default());
        assert!(empty.ends_with("0 node(s)\n") && !empty.contains("REVOKED"));
    }
}
