//! One appliance of a fleet, as the router sees it: whether it is the appliance configured at
//! its address, whether it was reachable lately, and a call forwarded to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use edgevol_proto::csi::v1::{GetPluginInfoRequest, GetPluginInfoResponse};
use http::{Request, Response};
use hyper::body::Incoming;
use prost::Message;
use tonic::{Code, Status};

use crate::grpc_unary::{answer, request, ProxyBody};
use crate::proxy::{Forwarder, CONNECT_TIMEOUT};

/// The manifest key of GetPluginInfo that carries the appliance's id.
const MANIFEST_ID: &str = "appliance-id";

/// How long calls that ask every appliance (listings, GetCapacity) leave out an appliance they
/// could not reach, without trying it again: an appliance that is off (no answer at all) would
/// otherwise hold each of them for the whole connect timeout. Calls that need one appliance of
/// several (Identity, ids of no appliance) try it after the others; CreateVolume keeps the
/// name's order (the volume may be there already) and calls on its own volumes always try it.
pub const SKIP_UNREACHABLE: Duration = Duration::from_secs(30);

/// One appliance of the fleet.
#[derive(Debug)]
pub struct Member {
    pub(crate) id: String,
    pub(crate) forwarder: Forwarder,
    verified: AtomicBool,
    /// When a call last failed to reach it, and why; cleared by the next call that does.
    unreachable: Mutex<Option<(Instant, String)>>,
}

impl Member {
    /// Appliance `id`, reached through `forwarder`.
    pub fn new(id: String, forwarder: Forwarder) -> Member {
        Member {
            id,
            forwarder,
            verified: AtomicBool::new(false),
            unreachable: Mutex::new(None),
        }
    }

    fn unreachable(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.unreachable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// UNAVAILABLE when a call failed to reach the appliance less than [`SKIP_UNREACHABLE`] ago.
    pub(crate) fn recently_unreachable(&self) -> Result<(), Status> {
        match &*self.unreachable() {
            Some((at, why)) if at.elapsed() < SKIP_UNREACHABLE => Err(Status::unavailable(
                format!("{why} (left out for {}s)", SKIP_UNREACHABLE.as_secs()),
            )),
            _ => Ok(()),
        }
    }

    /// Notes whether `result` reached the appliance.
    fn note<T>(&self, result: Result<T, Status>) -> Result<T, Status> {
        match &result {
            Err(s) if s.code() == Code::Unavailable => {
                *self.unreachable() = Some((Instant::now(), s.message().to_owned()));
            }
            _ => *self.unreachable() = None,
        }
        result
    }

    /// Its appliance id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Checks once that the appliance at this address is the one configured.
    async fn verify(&self) -> Result<(), Status> {
        if self.verified.load(Ordering::Relaxed) {
            return Ok(());
        }
        let ask = async {
            let resp = self
                .forwarder
                .forward(request(
                    "/csi.v1.Identity/GetPluginInfo",
                    &GetPluginInfoRequest {},
                ))
                .await?;
            answer::<GetPluginInfoResponse>(resp).await
        };
        // The appliance's own answer is quick; one that never comes is a box that hangs.
        let info = tokio::time::timeout(CONNECT_TIMEOUT, ask)
            .await
            .unwrap_or_else(|_| {
                Err(Status::unavailable(format!(
                    "edgevol proxy: appliance {} did not say who it is within {}s",
                    self.forwarder.address(),
                    CONNECT_TIMEOUT.as_secs()
                )))
            })?;
        match info.manifest.get(MANIFEST_ID) {
            Some(id) if *id == self.id => {
                self.verified.store(true, Ordering::Relaxed);
                Ok(())
            }
            other => Err(Status::unavailable(format!(
                "edgevol proxy: the appliance at {} is {}, not {} as configured",
                self.forwarder.address(),
                other.map_or("of unknown id", String::as_str),
                self.id
            ))),
        }
    }

    /// `req` sent to this appliance; its answer as sent.
    pub(crate) async fn forward(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, Status> {
        let verified = self.verify().await;
        self.note(verified)?;
        let forwarded = self.forwarder.forward(req).await;
        self.note(forwarded)
    }

    /// [`Member::call`] for a call that asks every appliance (listings, capacity): fails at
    /// once while the appliance is [recently unreachable](Member::recently_unreachable).
    pub(crate) async fn call_fanned<M: Message + Default>(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<M, Status> {
        self.recently_unreachable()?;
        self.call(req).await
    }

    /// A unary call's answer message, or the status the appliance sent.
    pub(crate) async fn call<M: Message + Default>(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<M, Status> {
        answer(self.forward(req).await?).await
    }

    /// Whether the appliance can be reached and is the one configured.
    pub(crate) async fn ready(&self) -> Result<(), Status> {
        let ready = self.forwarder.ready().await;
        self.note(ready)?;
        let verified = self.verify().await;
        self.note(verified)
    }
}
