//! The serde forms of the inputs and answers: what the Python dicts hold
//! (`passes/algorithms/_phaze_rs.pyi`), read here from JSON (the binding reads Python values
//! the same way: a bool is not a number, a float not a count).

use phaze_dp::{
    solve, Algorithm, Evaluation, Layer, NetLevel, Problem, Protocol, RankOrder, Recompute,
    Topology, Zero,
};
use serde_json::{json, Value};

fn layer() -> Value {
    json!({"fwd_s": 1e-3, "bwd_s": 2e-3, "recompute_s": [0.0, 1e-4, 1e-3],
           "saved_bytes": [300, 200.5, 100], "param_bytes": 9.2, "grad_bytes": 10,
           "optimizer_bytes": 0, "workspace_bytes": 0, "boundary_bytes": 64})
}

fn problem() -> Value {
    json!({
        "layers": [layer(), layer()],
        "devices": 8,
        "hbm_bytes": 1e9,
        "levels": [
            {"group_size": 4, "bandwidth_Bps": 1e11, "latency_s": 1e-6,
             "protocols": [{"bandwidth_Bps": 2e11, "latency_s": 1e-6, "base_s": 0.0,
                            "algorithm": "nvls"},
                           {"bandwidth_Bps": 1e11, "latency_s": 1e-6, "shard_Bps": 1e12}]},
            {"group_size": 8, "bandwidth_Bps": 1e10, "latency_s": 1e-5, "uplink_Bps": 4e10,
             "topology": "fat_tree", "leaf_size": 8, "oversubscription": 2.0, "tree": true,
             "collective_compute_share": 0.25},
        ],
        "global_batch": 8,
        "micro_batch": 1,
        "tp": 1,
        "dp_overlap": false,
        "recompute": "full",
        "zero": "auto",
        "rank_order": "tp-pp-dp",
        "blocks": [0, 2],
        "max_stages": null,
    })
}

fn read(v: Value) -> Result<Problem, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

#[test]
fn a_problem_dict_reads_as_the_problem() {
    let l = Layer {
        fwd_s: 1e-3,
        bwd_s: 2e-3,
        recompute_s: [0.0, 1e-4, 1e-3],
        saved_bytes: [300, 201, 100], // a fraction of a byte rounds up
        param_bytes: 10,
        grad_bytes: 10,
        boundary_bytes: 64,
        ..Default::default()
    };
    let want = Problem {
        layers: vec![l.clone(), l],
        devices: 8,
        hbm_bytes: 1_000_000_000,
        levels: vec![
            NetLevel {
                group_size: 4,
                bandwidth_bps: 1e11,
                latency_s: 1e-6,
                protocols: vec![
                    Protocol {
                        bandwidth_bps: 2e11,
                        latency_s: 1e-6,
                        algorithm: Algorithm::Nvls,
                        ..Default::default()
                    },
                    Protocol {
                        bandwidth_bps: 1e11,
                        latency_s: 1e-6,
                        shard_bps: Some(1e12),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
            NetLevel {
                group_size: 8,
                bandwidth_bps: 1e10,
                latency_s: 1e-5,
                uplink_bps: Some(4e10),
                topology: Topology::FatTree {
                    leaf_size: 8,
                    oversubscription: 2.0,
                },
                protocols: vec![],
                tree: true,
                collective_compute_share: 0.25,
            },
        ],
        global_batch: 8,
        micro_batch: 1,
        tp: 1,
        cp: 1,
        dp_overlap: false,
        max_stages: None,
        recompute: Some(Recompute::Full),
        zero: None,
        virtual_stages: None,
        blocks: Some((0, 2)),
        expert_parallel: None,
        expert_tensor_parallel: None,
        rank_order: Some(RankOrder::TpPpDp),
        pipeline_split: false,
        grads_freed: false,
        grad_reduce_scale: 1.0,
        dp_shard: None,
        fsdp_copies: None,
    };
    assert_eq!(read(problem()).unwrap(), want);
    let mut torus = problem();
    torus["levels"][1] = json!({"group_size": 8, "bandwidth_Bps": 1e10, "latency_s": 1e-5,
                                "topology": "torus", "torus_dims": [2, 4]});
    assert_eq!(
        read(torus).unwrap().levels[1].topology,
        Topology::Torus(vec![2, 4])
    );
    // The hardware description's level and protocol (phaze_ir.hardware) read the same: their
    // label, energy and power are not the DP's.
    let mut described = problem();
    described["levels"][0]["name"] = json!("node");
    described["levels"][0]["protocols"][0]["name"] = json!("NVLS");
    described["levels"][1]["energy_j_per_byte"] = json!(1e-10);
    described["levels"][1]["power_w_per_device"] = json!(20.0);
    assert_eq!(read(described).unwrap(), want);
}

/// The problem changed by `change` is refused, the message saying `says`.
fn refused(change: impl Fn(&mut Value), says: &str) {
    let mut p = problem();
    change(&mut p);
    let err = read(p).expect_err(says);
    assert!(err.contains(says), "{says}: {err}");
}

#[test]
fn a_bad_dict_is_refused_naming_the_key() {
    refused(|p| p["devcies"] = json!(8), "devcies");
    refused(|p| p["levels"][0]["uplink_bps"] = json!(1.0), "uplink_bps");
    refused(
        |p| p["levels"][0]["protocols"][1]["shard_bps"] = json!(1.0),
        "shard_bps",
    );
    let fwd = |p: &mut Value| _ = p["layers"][0].as_object_mut().unwrap().remove("fwd_s");
    refused(fwd, "missing field `fwd_s`");
    refused(
        |p| p["layers"][0]["fwd_s"] = json!(true),
        "invalid type: boolean",
    );
    refused(|p| p["tp"] = json!(1.5), "invalid type: floating point");
    refused(
        |p| p["layers"][0]["grad_bytes"] = json!(-1),
        "expected a non-negative number of bytes",
    );
    refused(|p| p["dp_overlap"] = json!(1), "expected a boolean");
    refused(
        |p| p["recompute"] = json!("most"),
        "auto, none, selective, full",
    );
    refused(|p| p["levels"][1]["topology"] = json!("ring"), "fat_tree");
}

#[test]
fn answers_write_the_words_of_the_result_dicts() {
    let mut p = read(problem()).unwrap();
    p.zero = Some(Zero::Optimizer);
    let got = serde_json::to_value(Evaluation::from(solve(&p))).unwrap();
    assert_eq!(got["feasible"], json!(true));
    assert_eq!(got["violations"], json!([]));
    let plan = &got["plan"];
    assert_eq!(plan["zero"], json!(1));
    assert_eq!(plan["rank_order"], json!("tp-pp-dp"));
    assert_eq!(plan["stages"][0]["recompute"], json!("full"));
    assert!(plan["stages"][0]["memory"]["params"].is_u64());
    assert!(plan["stages"][0]["time_parts"]["compute_s"].is_f64());

    p.tp = 16;
    let got = serde_json::to_value(Evaluation::from(solve(&p))).unwrap();
    assert_eq!(got["feasible"], json!(false));
    assert_eq!(got["plan"], Value::Null);
    assert_eq!(got["violations"][0]["kind"], json!("devices"));
    assert_eq!(got["violations"][0]["needed_bytes"], Value::Null);
}
