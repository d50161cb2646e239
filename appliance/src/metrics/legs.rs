//! Which volumes are legs of a replicated volume: `edgevol_volume_leg`, from the leg marking
//! CreateVolume stored with them (checked when it was given, see [`crate::csi::params`]).
//!
//! `legs_before` names the earlier legs by id, and so their appliances; a leg whose `leg` is
//! `n-1/n` (the last) names every other, so joining the exporters of a site shows each
//! replicated volume's legs and the boxes holding them.

use edgevol_core::{BlockDevice, Pool, VolumeId};
use edgevol_driver::fleet::{join_legs, LegMark, LEGS_BEFORE_PARAM, LEG_PARAM};

use super::text::{Exposition, Kind};
use crate::csi::ids::Ids;
use crate::state::State;

/// The legs among the pool's volumes, with their marking.
pub fn marked<D: BlockDevice>(pool: &Pool<D>) -> Vec<(VolumeId, LegMark)> {
    pool.volumes(None)
        .filter_map(|v| {
            let get = |key: &str| {
                v.parameters()
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, value)| value.as_str())
            };
            let mark = LegMark::parse(get(LEG_PARAM), get(LEGS_BEFORE_PARAM)).ok()??;
            Some((v.id(), mark))
        })
        .collect()
}

/// `edgevol_volume_leg{volume_id, leg, legs_before} 1` for each leg.
pub fn render(e: &mut Exposition, state: &State, legs: &[(VolumeId, LegMark)]) {
    let ids = Ids::new(&state.appliance_id);
    e.family(
        "edgevol_volume_leg",
        Kind::Gauge,
        "Always 1: the volume is leg `leg` (i/n, from 0) of a replicated volume, after the legs \
         `legs_before` (their ids, joined by +, name their appliances).",
    );
    for (v, mark) in legs {
        let position = format!("{}/{}", mark.index, mark.count);
        let before = join_legs(mark.before.iter().map(String::as_str));
        e.sample(
            "edgevol_volume_leg",
            &[
                ("volume_id", &ids.volume(*v)),
                ("leg", &position),
                ("legs_before", &before),
            ],
            1,
        );
    }
}
