//! Inputs of the placement search (layers, network, setup), their validation, and the α–β
//! network formulas. Everything is SI: seconds, bytes, bytes per second.

/// Activation-recomputation policy of a pipeline stage.
///
/// The discriminant is the index into [`Layer::recompute_s`] and [`Layer::saved_bytes`],
/// and the order of the tie-break "lower policy index first".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Recompute {
    /// Stash every activation autograd saves; no extra forward work.
    None = 0,
    /// Recompute the cheap, memory-hungry parts (e.g. attention scores) in backward.
    Selective = 1,
    /// Stash only the layer inputs and rerun the whole forward in backward.
    Full = 2,
}

impl Recompute {
    /// All policies, in index order.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The policy with the given index (0, 1, 2), if any.
    pub fn from_index(i: usize) -> Option<Recompute> {
        Self::ALL.get(i).copied()
    }

    /// Index into the per-policy arrays of a [`Layer`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The policy of a lower-case name (`"none"`, `"selective"`, `"full"`), if any.
    pub fn from_name(name: &str) -> Option<Recompute> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// A recompute setting as users give it: `"auto"` lets the search choose per stage
    /// (`None`), a policy's name fixes that policy for every stage (see
    /// [`Problem::recompute`]). Anything else is an input error naming the words.
    pub fn setting(name: &str) -> Result<Option<Recompute>, InputError> {
        if name == "auto" {
            return Ok(None);
        }
        Self::from_name(name).map(Some).ok_or_else(|| InputError {
            message: format!("recompute must be one of auto, none, selective, full, got {name:?}"),
        })
    }

    /// Lower-case name used across the Python boundary: `"none"`, `"selective"`, `"full"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// One layer (prologue, a transformer block, the head), priced for ONE micro-batch at the
/// problem's micro-batch size and TP width, on one device of its TP group. Its TP collectives
/// are ops of the layer: their time is in `fwd_s` and `bwd_s`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layer {
    /// Forward compute time (s).
    pub fwd_s: f64,
    /// Backward compute time (s), input and weight gradients.
    pub bwd_s: f64,
    /// Extra time per micro-batch under each recompute policy (none, selective, full) (s).
    pub recompute_s: [f64; 3],
    /// Activation bytes stashed per micro-batch under each policy (none, selective, full).
    /// Usually non-increasing, which the search does not assume.
    pub saved_bytes: [u64; 3],
    /// Weight bytes held per device, after TP sharding.
    pub param_bytes: u64,
    /// Gradient bytes held per device; also what the DP all-reduce moves.
    pub grad_bytes: u64,
    /// Optimizer-state bytes held per device (e.g. fp32 master copy + Adam moments).
    pub optimizer_bytes: u64,
    /// Peak transient bytes while the layer runs (only the largest in a stage counts).
    pub workspace_bytes: u64,
    /// Activation bytes sent to the next layer per micro-batch; the same size comes back as
    /// the gradient in backward. Paid only when a stage boundary falls after this layer.
    pub boundary_bytes: u64,
}

/// One level of the cluster network (a node's fabric, the scale-out network, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct NetLevel {
    /// Devices that share this level (e.g. 8 per node); the last level is the whole cluster.
    pub group_size: u64,
    /// Per-link bandwidth (bytes/s); `bandwidth_Bps` in the Python dicts.
    pub bandwidth_bps: f64,
    /// Per-message latency (s).
    pub latency_s: f64,
}

/// A placement problem: the priced layers, the cluster and the training setup.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// Layers in topological order (prologue, blocks, head).
    pub layers: Vec<Layer>,
    /// Devices in the cluster (N).
    pub devices: u64,
    /// HBM capacity of one device (bytes).
    pub hbm_bytes: u64,
    /// Network levels, innermost first; a flat network is one level.
    pub levels: Vec<NetLevel>,
    /// Global batch B (samples per optimizer step).
    pub global_batch: u64,
    /// Micro-batch size b (samples).
    pub micro_batch: u64,
    /// TP width t: devices per pipeline stage.
    pub tp: u64,
    /// Whether the DP gradient all-reduce overlaps the stage's last backward.
    pub dp_overlap: bool,
    /// Upper bound on the number of pipeline stages, if any.
    pub max_stages: Option<usize>,
    /// The recompute policy of every stage, as a user fixes it (`--recompute full`), or `None`
    /// to let the search choose the best policy per stage (`"auto"`). A fixed policy is the
    /// only one the search, the memory check and the infeasibility report consider.
    pub recompute: Option<Recompute>,
}

/// A problem that cannot even be posed (NaN times, zero devices, no layers, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputError {
    /// What is wrong, naming the field (e.g. `layers[3].fwd_s must be finite and >= 0, got NaN`).
    pub message: String,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InputError {}

fn err(message: String) -> Result<(), InputError> {
    Err(InputError { message })
}

fn check_time(name: &str, v: f64) -> Result<(), InputError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        err(format!("{name} must be finite and >= 0, got {v}"))
    }
}

impl Problem {
    /// Checks that the problem is well posed. Infeasibility (nothing fits) is *not* an input
    /// error: it is an answer of the search. This only rejects data the formulas cannot use.
    pub fn validate(&self) -> Result<(), InputError> {
        if self.layers.is_empty() {
            return err("layers must not be empty".into());
        }
        for (i, l) in self.layers.iter().enumerate() {
            check_time(&format!("layers[{i}].fwd_s"), l.fwd_s)?;
            check_time(&format!("layers[{i}].bwd_s"), l.bwd_s)?;
            for (r, v) in l.recompute_s.iter().enumerate() {
                check_time(&format!("layers[{i}].recompute_s[{r}]"), *v)?;
            }
        }
        if self.levels.is_empty() {
            return err("levels must not be empty (a flat network is one level)".into());
        }
        for (i, lv) in self.levels.iter().enumerate() {
            if lv.group_size == 0 {
                return err(format!("levels[{i}].group_size must be >= 1"));
            }
            if !(lv.bandwidth_bps.is_finite() && lv.bandwidth_bps > 0.0) {
                return err(format!(
                    "levels[{i}].bandwidth_Bps must be finite and > 0, got {}",
                    lv.bandwidth_bps
                ));
            }
            check_time(&format!("levels[{i}].latency_s"), lv.latency_s)?;
        }
        for (name, v) in [
            ("devices", self.devices),
            ("global_batch", self.global_batch),
            ("micro_batch", self.micro_batch),
            ("tp", self.tp),
        ] {
            if v == 0 {
                return err(format!("{name} must be >= 1"));
            }
        }
        if self.max_stages == Some(0) {
            return err("max_stages must be >= 1 when given".into());
        }
        Ok(())
    }

    /// The indices of the policies a stage may use: all three, or the fixed one.
    pub fn policies(&self) -> &'static [usize] {
        match self.recompute {
            None => &[0, 1, 2],
            Some(Recompute::None) => &[0],
            Some(Recompute::Selective) => &[1],
            Some(Recompute::Full) => &[2],
        }
    }

    /// Index of the network level that a group of `g` contiguously placed devices uses: the
    /// innermost level whose `group_size >= g`, else the last (outermost) level.
    pub fn level_for(&self, g: u64) -> usize {
        self.levels
            .iter()
            .position(|lv| lv.group_size >= g)
            .unwrap_or(self.levels.len() - 1)
    }

    /// Ring all-reduce of `bytes` over `g` devices on `level`:
    /// `2(g−1)/g · bytes / bw + 2(g−1) · lat`, and 0 when `g <= 1`.
    pub fn ring_allreduce_s(&self, bytes: f64, g: u64, level: usize) -> f64 {
        if g <= 1 {
            return 0.0;
        }
        let lv = &self.levels[level];
        let gf = g as f64;
        2.0 * (gf - 1.0) / gf * bytes / lv.bandwidth_bps + 2.0 * (gf - 1.0) * lv.latency_s
    }

    /// Point-to-point transfer of `bytes` on `level`: `lat + bytes / bw`.
    pub fn p2p_s(&self, bytes: f64, level: usize) -> f64 {
        let lv = &self.levels[level];
        lv.latency_s + bytes / lv.bandwidth_bps
    }
}
