//! The text of `edgevol status`, `volumes` and `snapshots`.

use std::fmt::Write;

use super::exporter::Metrics;
use super::listing::{SnapshotRow, VolumeRow};
use super::units::{gauge_bytes, human_bytes, utc};
use super::StatusReport;

/// What to do for what only the exporter knows.
const NO_METRICS: &str = "pass --metrics HOST:PORT";

/// A plain text table: a header row, left-aligned columns two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let _ = write!(text, "{cell:<w$}");
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// A volume's CONNECTED cell: its hosts' NQNs, `-` for none, `unknown` when the exporter does
/// not say (an appliance older than the gauge).
fn connected_cell(metrics: &Metrics, volume: &str) -> String {
    match metrics.connected_hosts(volume) {
        Some(hosts) if hosts.is_empty() => "-".into(),
        Some(hosts) => hosts.into_iter().collect::<Vec<_>>().join(","),
        None => "unknown".into(),
    }
}

fn or_dash(value: Option<&String>) -> String {
    value.cloned().unwrap_or_else(|| "-".into())
}

/// The `edgevol volumes` table. CONNECTED (the hosts with a live NVMe/TCP controller on the
/// volume) comes from the exporter: without `metrics` the column is left out and a line says
/// how to get it. LEG (which leg of which replicated volume) appears when a listed volume is a
/// leg, ENCRYPTED (`luks2`, `luks2+discard`) when one is encrypted on its node.
pub fn render_volumes(rows: &[VolumeRow], metrics: Option<&Metrics>) -> String {
    let mut header = vec!["VOLUME", "SIZE", "SOURCE", "PUBLISHED TO"];
    if metrics.is_some() {
        header.push("CONNECTED");
    }
    header.extend(["CLAIM", "PV"]);
    let legs = rows.iter().any(|v| v.leg.is_some());
    if legs {
        header.push("LEG");
    }
    let encrypted = rows.iter().any(|v| v.encrypted.is_some());
    if encrypted {
        header.push("ENCRYPTED");
    }
    header.push("CONDITION");
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|v| {
            let mut row = vec![
                v.id.clone(),
                human_bytes(v.size),
                or_dash(v.source.as_ref()),
                if v.published.is_empty() {
                    "-".into()
                } else {
                    v.published.join(",")
                },
            ];
            if let Some(m) = metrics {
                row.push(connected_cell(m, &v.id));
            }
            row.extend([or_dash(v.claim.as_ref()), or_dash(v.pv.as_ref())]);
            if legs {
                row.push(or_dash(v.leg.as_ref()));
            }
            if encrypted {
                row.push(or_dash(v.encrypted.as_ref()));
            }
            row.push(v.condition.clone());
            row
        })
        .collect();
    let mut out = table(&header, &cells);
    let _ = writeln!(out, "{} volume(s)", rows.len());
    if metrics.is_none() {
        let _ = writeln!(
            out,
            "connected hosts: {NO_METRICS} (the appliance's exporter) to list them"
        );
    }
    out
}

/// The `edgevol snapshots` table.
pub fn render_snapshots(rows: &[SnapshotRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.source.clone(),
                human_bytes(s.size),
                utc(s.created),
                if s.ready { "yes" } else { "no" }.into(),
                or_dash(s.group.as_ref()),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "SNAPSHOT",
            "SOURCE VOLUME",
            "SIZE",
            "CREATED (UTC)",
            "READY",
            "GROUP SNAPSHOT",
        ],
        &cells,
    );
    let _ = writeln!(out, "{} snapshot(s)", rows.len());
    out
}

/// The `edgevol status` text.
pub fn render_status(s: &StatusReport) -> String {
    let mut out = String::new();
    let (metrics, metrics_note) = match &s.metrics {
        Some(Ok(m)) => (Some(m), None),
        Some(Err(e)) => (None, Some(format!("unknown ({e})"))),
        None => (None, Some(format!("unknown ({NO_METRICS})"))),
    };
    let unknown = || metrics_note.clone().unwrap_or_else(|| "unknown".into());
    let _ = writeln!(out, "appliance   {} {}", s.plugin.0, s.plugin.1);
    if let Some(id) = metrics.and_then(|m| {
        m.samples("edgevol_build_info")
            .find_map(|(l, _)| l.get("appliance").map(str::to_owned))
    }) {
        let _ = writeln!(out, "id          {id}");
    }
    let _ = writeln!(
        out,
        "ready       {}",
        if s.ready { "yes" } else { "no (pool opening)" }
    );
    let gauge = |name: &str| metrics.and_then(|m| m.get(name, &[])).map(gauge_bytes);
    let _ = writeln!(out, "\npool");
    let rows = vec![
        vec![
            "available".into(),
            human_bytes(s.available),
            "GetCapacity: free for new volumes".into(),
        ],
        vec![
            "total".into(),
            gauge("edgevol_pool_total_bytes").unwrap_or_else(unknown),
            String::new(),
        ],
        vec![
            "used".into(),
            gauge("edgevol_pool_used_bytes").unwrap_or_else(unknown),
            String::new(),
        ],
        vec![
            "reserved".into(),
            gauge("edgevol_pool_reserved_bytes").unwrap_or_else(unknown),
            "thick volumes' unwritten clusters".into(),
        ],
    ];
    out.push_str(&indent(&table(&["", "", ""], &rows)));
    let _ = writeln!(out, "\nhealth");
    match metrics {
        None => {
            let _ = writeln!(out, "  {}", unknown());
        }
        Some(m) => health(&mut out, m),
    }
    let published = s.volumes.iter().filter(|v| !v.published.is_empty()).count();
    let abnormal = s.volumes.iter().filter(|v| v.condition != "ok").count();
    let _ = writeln!(
        out,
        "\nvolumes     {} ({published} published, {abnormal} abnormal)\nsnapshots   {}",
        s.volumes.len(),
        s.snapshots
    );
    let _ = writeln!(out, "\nconnected hosts");
    match metrics {
        None => {
            let _ = writeln!(out, "  {}", unknown());
        }
        Some(m) => {
            let rows: Vec<Vec<String>> = s
                .volumes
                .iter()
                .map(|v| vec![v.id.clone(), connected_cell(m, &v.id)])
                .filter(|row| row[1] != "-")
                .collect();
            if rows.is_empty() {
                let _ = writeln!(out, "  none");
            } else {
                out.push_str(&indent(&table(&["VOLUME", "HOSTS"], &rows)));
            }
        }
    }
    out
}

/// The pool's health and one line per device.
fn health(out: &mut String, m: &Metrics) {
    let pool = match m.get("edgevol_pool_healthy", &[]) {
        Some(1.0) => "healthy",
        Some(_) => "FAILED (device error; restart the appliance)",
        None => "unknown",
    };
    let _ = writeln!(out, "  pool      {pool}");
    for (labels, _) in m.samples("edgevol_pool_device_info") {
        let device = labels.get("device").unwrap_or("?");
        let kind = labels.get("kind").unwrap_or("?");
        let l = [("device", device)];
        let line = if m.get("edgevol_nvme_smart_available", &l) == Some(1.0) {
            let v = |n: &str| {
                m.get(n, &l)
                    .map_or_else(|| "?".to_owned(), |v| format!("{v}"))
            };
            format!(
                "NVMe: {} C, {}% used, {} media errors, spare {}%, critical warning {}",
                v("edgevol_nvme_temperature_celsius"),
                v("edgevol_nvme_percentage_used"),
                v("edgevol_nvme_media_errors_total"),
                v("edgevol_nvme_available_spare_percent"),
                v("edgevol_nvme_critical_warning"),
            )
        } else if kind == "nvme" {
            "NVMe SMART log unreadable".to_owned()
        } else {
            format!("{kind} device: no SMART log")
        };
        let _ = writeln!(out, "  device    {device}: {line}");
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("  {l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of each line of a table.
    fn words(table: &str) -> Vec<Vec<&str>> {
        table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect()
    }

    fn row(id: &str, published: &[&str]) -> VolumeRow {
        VolumeRow {
            id: id.into(),
            size: 1 << 30,
            source: None,
            published: published.iter().map(|s| (*s).to_owned()).collect(),
            condition: "ok".into(),
            claim: None,
            pv: None,
            leg: None,
            encrypted: None,
        }
    }

    #[test]
    fn encrypted_volumes_get_an_encrypted_column() {
        let mut enc = row("box-v1", &[]);
        enc.encrypted = Some("luks2".into());
        let out = render_volumes(&[enc, row("box-v2", &[])], None);
        let lines = words(&out);
        assert_eq!(lines[0][lines[0].len() - 2..], ["ENCRYPTED", "CONDITION"]);
        assert_eq!(lines[1][lines[1].len() - 2..], ["luks2", "ok"]);
        assert_eq!(lines[2][lines[2].len() - 2..], ["-", "ok"]);
        let out = render_volumes(&[row("box-v2", &[])], None);
        let plain = words(&out);
        assert!(!plain[0].contains(&"ENCRYPTED"));
    }

    #[test]
    fn legs_get_a_leg_column_and_other_volumes_a_dash() {
        let mut leg = row("box-b-v5", &[]);
        leg.leg = Some("1/2 of box-a-v3+box-b-v5".into());
        let out = render_volumes(&[leg, row("box-b-v6", &[])], None);
        let lines = words(&out);
        assert_eq!(
            lines[0],
            [
                "VOLUME",
                "SIZE",
                "SOURCE",
                "PUBLISHED",
                "TO",
                "CLAIM",
                "PV",
                "LEG",
                "CONDITION"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "box-b-v5",
                "1.0",
                "GiB",
                "-",
                "-",
                "-",
                "-",
                "1/2",
                "of",
                "box-a-v3+box-b-v5",
                "ok"
            ]
        );
        assert_eq!(
            lines[2],
            ["box-b-v6", "1.0", "GiB", "-", "-", "-", "-", "-", "ok"]
        );
        assert!(!render_volumes(&[row("box-b-v6", &[])], None).contains("LEG"));
    }

    #[test]
    fn tables_align_columns_two_spaces_apart() {
        assert_eq!(
            table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]),
            "A    LONG\nxyz  1\n"
        );
    }

    #[test]
    fn connected_lists_the_hosts_or_the_column_goes() {
        let rows = [row("box:v1", &["nqn.h1"]), row("box:v2", &[])];
        let m = Metrics::parse(
            "# HELP edgevol_volume_host_controllers c\n\
             # TYPE edgevol_volume_host_controllers gauge\n\
             edgevol_volume_host_controllers{volume_id=\"box:v1\",host_nqn=\"nqn.h1\"} 2\n\
             edgevol_volume_host_controllers{volume_id=\"box:v1\",host_nqn=\"nqn.h3\"} 1\n",
        )
        .unwrap();
        let out = render_volumes(&rows, Some(&m));
        let lines = words(&out);
        assert_eq!(
            lines[0],
            [
                "VOLUME",
                "SIZE",
                "SOURCE",
                "PUBLISHED",
                "TO",
                "CONNECTED",
                "CLAIM",
                "PV",
                "CONDITION"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "box:v1",
                "1.0",
                "GiB",
                "-",
                "nqn.h1",
                "nqn.h1,nqn.h3",
                "-",
                "-",
                "ok"
            ]
        );
        assert_eq!(
            lines[2],
            ["box:v2", "1.0", "GiB", "-", "-", "-", "-", "-", "ok"]
        );
        assert!(!out.contains('?'), "{out}");

        // Without the exporter: no CONNECTED column, no made-up value, and how to get it.
        let out = render_volumes(&rows, None);
        assert!(!out.contains("CONNECTED") && !out.contains('?'), "{out}");
        assert!(
            out.contains("connected hosts: pass --metrics HOST:PORT"),
            "{out}"
        );
        let lines = words(&out);
        assert_eq!(
            lines[1],
            ["box:v1", "1.0", "GiB", "-", "nqn.h1", "-", "-", "ok"]
        );

        // An appliance that does not export the gauge: unknown, said as such.
        let old = Metrics::parse("edgevol_pool_total_bytes 1\n").unwrap();
        let out = render_volumes(&rows, Some(&old));
        assert!(out.lines().nth(1).unwrap().contains(" unknown "), "{out}");
    }
}
