//! Fixtures of the fleet tests: several dev appliances sharing one CA (and so one controller
//! certificate), and `edgevol proxy` serving all of them as one driver.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use edgevol_appliance::{start, Running};
use edgevol_cli::proxy;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;

use super::common::{dev_config, dev_tls, pool_ready, unix_channel};

/// One dev appliance of a fleet.
pub struct Box_ {
    /// Its appliance id.
    pub id: String,
    /// Its data directory.
    pub data: PathBuf,
    /// Where its CSI endpoint listens (kept across a restart).
    pub addr: SocketAddr,
    /// The daemon, while it runs.
    pub running: Option<Running>,
}

impl Box_ {
    /// Stops the daemon: its calls become unreachable.
    pub async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await.unwrap();
        }
    }

    /// Starts it again on the same address.
    pub async fn restart(&mut self) {
        let running = start(dev_config(&self.data, self.addr, &self.id))
            .await
            .unwrap();
        pool_ready(&running).await;
        self.running = Some(running);
    }
}

/// A fleet of dev appliances named `ids` under `dir`, one CA for all (`dir/pki`).
pub async fn start_fleet(dir: &Path, ids: &[&str]) -> Vec<Box_> {
    let pki = dir.join("pki");
    edgevol_pki::files::ensure_dev(&pki).unwrap();
    let mut boxes = Vec::new();
    for id in ids {
        let data = dir.join(id);
        std::fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::symlink(&pki, data.join("pki")).unwrap();
        let running = start(dev_config(&data, "127.0.0.1:0".parse().unwrap(), id))
            .await
            .unwrap();
        pool_ready(&running).await;
        boxes.push(Box_ {
            id: (*id).to_owned(),
            data,
            addr: running.local_addr,
            running: Some(running),
        });
    }
    boxes
}

/// Stops every appliance of the fleet (at the end of a test).
pub async fn stop_all(boxes: &mut [Box_]) {
    for b in boxes {
        b.stop().await;
    }
}

/// `edgevol proxy` on `dir/csi.sock` serving `boxes` (by id) with the controller certificate;
/// a Controller client on it.
pub async fn fleet_proxy(dir: &Path, boxes: &[Box_]) -> ControllerClient<Channel> {
    let tls = dev_tls(&dir.join("pki"), "controller");
    let upstreams = boxes
        .iter()
        .map(|b| {
            let up =
                proxy::Upstream::new(&b.addr.to_string(), Some("localhost"), tls.clone()).unwrap();
            (b.id.clone(), up)
        })
        .collect();
    let socket = dir.join("csi.sock");
    let listener = proxy::bind(&socket).await.unwrap();
    tokio::spawn(proxy::serve_fleet(
        listener,
        upstreams,
        None,
        std::future::pending(),
    ));
    ControllerClient::new(unix_channel(socket).await)
}

/// A single-node-writer mount capability.
pub fn mount() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// CreateVolume of `name` with `bytes`, a mount capability and nothing else.
pub fn create(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount()],
        ..Default::default()
    }
}

/// A topology of `pairs`.
pub fn topology(pairs: &[(&str, &str)]) -> Topology {
    Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// The appliance a volume id names (`box-a-v3` -> `box-a`).
pub fn home(id: &str) -> &str {
    &id[..id.rfind('-').unwrap()]
}

/// Every item of a paged List call: `page(starting_token)` makes one call (that must succeed)
/// and gives its items and its next_token, which is empty on the last page.
pub async fn all_pages<T>(mut page: impl AsyncFnMut(String) -> (Vec<T>, String)) -> Vec<T> {
    let mut items = Vec::new();
    let mut token = String::new();
    loop {
        let (page_items, next_token) = page(token).await;
        items.extend(page_items);
        if next_token.is_empty() {
            return items;
        }
        token = next_token;
    }
}

/// The pages of ListVolumes entries the proxy gives, `page` entries at a time, in listing order.
pub async fn volume_pages(
    c: &mut ControllerClient<Channel>,
    page: i32,
) -> Vec<Vec<list_volumes_response::Entry>> {
    all_pages(async |starting_token| {
        let resp = c
            .list_volumes(ListVolumesRequest {
                max_entries: page,
                starting_token,
            })
            .await
            .unwrap()
            .into_inner();
        (vec![resp.entries], resp.next_token)
    })
    .await
}

/// Every volume id the proxy lists, `page` at a time, in listing order.
pub async fn list_all(c: &mut ControllerClient<Channel>, page: i32) -> Vec<String> {
    let pages = volume_pages(c, page).await;
    for entries in &pages {
        assert!(page == 0 || entries.len() <= page as usize);
    }
    pages
        .into_iter()
        .flatten()
        .map(|e| e.volume.unwrap().volume_id)
        .collect()
}
