//! The input forms serde's derive does not give: byte counts that may be fractional, the
//! settings whose `"auto"` is `None`, and a network level and its protocols as the hardware
//! description has them (`phaze_ir.hardware.NetworkLevel` and `NetworkProtocol`, which the
//! binding reads by attribute, or their dicts): the topology's keys flat beside the level's
//! own, and the fields the DP does not price with read and ignored by name. Used by the
//! `Deserialize` derives in [`crate::model`].

use crate::model::{
    Algorithm, InputError, NetLevel, Protocol, RankOrder, Recompute, Topology, Zero,
};
use serde::de::{self, Deserializer, IgnoredAny, Unexpected, Visitor};
use serde::Deserialize;
use std::fmt;

/// Bytes: a non-negative integer, or a finite non-negative float rounded up to a whole byte
/// (cost models may compute sizes in floating point; rounding up keeps a fit a fit).
struct Bytes(u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative number of bytes")
            }
            fn visit_u64<E: de::Error>(self, x: u64) -> Result<Bytes, E> {
                Ok(Bytes(x))
            }
            fn visit_i64<E: de::Error>(self, x: i64) -> Result<Bytes, E> {
                u64::try_from(x)
                    .map(Bytes)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(x), &self))
            }
            fn visit_f64<E: de::Error>(self, x: f64) -> Result<Bytes, E> {
                // 2^64 as f64 is exact; anything at or above it does not fit a u64.
                if x.is_finite() && x >= 0.0 && x.ceil() < 18_446_744_073_709_551_616.0 {
                    Ok(Bytes(x.ceil() as u64))
                } else {
                    Err(E::invalid_value(Unexpected::Float(x), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

pub(crate) fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Bytes::deserialize(d).map(|b| b.0)
}

pub(crate) fn per_policy_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<[u64; 3], D::Error> {
    <[Bytes; 3]>::deserialize(d).map(|a| a.map(|b| b.0))
}

/// A setting as users write it, `"auto"` or missing (None) or a word `parse` reads; anything
/// else is refused naming the words.
fn setting<'de, D, T>(
    d: D,
    words: &'static str,
    parse: fn(&str) -> Result<Option<T>, InputError>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    struct V<T>(&'static str, fn(&str) -> Result<Option<T>, InputError>);
    impl<'de, T> Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "one of {}", self.0)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<T>, E> {
            (self.1)(v).map_err(E::custom)
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            d.deserialize_str(self)
        }
    }
    d.deserialize_option(V(words, parse))
}

pub(crate) fn recompute<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Recompute>, D::Error> {
    setting(d, "auto, none, selective, full", Recompute::setting)
}

pub(crate) fn zero<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Zero>, D::Error> {
    setting(d, "auto, 0, 1, 2, 3", Zero::setting)
}

pub(crate) fn rank_order<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RankOrder>, D::Error> {
    setting(d, "auto, tp-dp-pp, tp-pp-dp", RankOrder::setting)
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum TopologyName {
    #[default]
    Switch,
    Torus,
    FatTree,
}

/// A [`NetLevel`] as the hardware description gives it. A topology's keys that are missing
/// become values [`crate::Problem::validate`] rejects, naming them; those of another topology
/// are ignored. Any other key is refused (a misspelt optional key is not silently its default).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Level {
    // The level's label and what its network costs in energy and power (the energy passes'):
    // not the DP's.
    #[serde(default, rename = "name")]
    _name: IgnoredAny,
    #[serde(default, rename = "energy_j_per_byte")]
    _energy_j_per_byte: IgnoredAny,
    #[serde(default, rename = "power_w_per_device")]
    _power_w_per_device: IgnoredAny,
    group_size: u64,
    #[serde(rename = "bandwidth_Bps")]
    bandwidth_bps: f64,
    latency_s: f64,
    #[serde(default, rename = "uplink_Bps")]
    uplink_bps: Option<f64>,
    #[serde(default)]
    topology: TopologyName,
    #[serde(default)]
    torus_dims: Vec<u64>,
    #[serde(default)]
    leaf_size: u64,
    #[serde(default)]
    oversubscription: f64,
    #[serde(default)]
    protocols: Vec<NamedProtocol>,
    #[serde(default)]
    tree: bool,
    #[serde(default)]
    collective_compute_share: Option<f64>,
}

impl From<Level> for NetLevel {
    fn from(l: Level) -> NetLevel {
        NetLevel {
            group_size: l.group_size,
            bandwidth_bps: l.bandwidth_bps,
            latency_s: l.latency_s,
            uplink_bps: l.uplink_bps,
            topology: match l.topology {
                TopologyName::Switch => Topology::Switch,
                TopologyName::Torus => Topology::Torus(l.torus_dims),
                TopologyName::FatTree => Topology::FatTree {
                    leaf_size: l.leaf_size,
                    oversubscription: l.oversubscription,
                },
            },
            protocols: l.protocols.into_iter().map(Protocol::from).collect(),
            tree: l.tree,
            collective_compute_share: l.collective_compute_share.unwrap_or(0.0),
        }
    }
}

/// A [`Protocol`] as the hardware description gives it; any other key is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamedProtocol {
    // Its label ("LL128"): for people, not the DP.
    #[serde(default, rename = "name")]
    _name: IgnoredAny,
    #[serde(rename = "bandwidth_Bps")]
    bandwidth_bps: f64,
    latency_s: f64,
    #[serde(default)]
    base_s: f64,
    #[serde(default, rename = "shard_Bps")]
    shard_bps: Option<f64>,
    #[serde(default)]
    algorithm: Algorithm,
}

impl From<NamedProtocol> for Protocol {
    fn from(p: NamedProtocol) -> Protocol {
        Protocol {
            bandwidth_bps: p.bandwidth_bps,
            latency_s: p.latency_s,
            base_s: p.base_s,
            shard_bps: p.shard_bps,
            algorithm: p.algorithm,
        }
    }
}
