//! What a backend enforces on this machine, as data for `doctor` and `policy show`.

pub mod layers;

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Enforcement {
    /// "landlock+seccomp", "seatbelt", "nono", "launcher", "none".
    pub mechanism: String,
    pub landlock_abi: Option<i32>,
    /// Landlock filesystem rights this kernel enforces.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fs_rights_enforced: Vec<String>,
    /// Rights newer kernels add that this one lacks (informational).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fs_rights_missing: Vec<String>,
    /// Properties that hold for a run.
    pub enforced: Vec<String>,
    /// Parts of the policy this machine cannot enforce. A run fails closed while any exist,
    /// unless the user passed `--allow-degraded`.
    pub gaps: Vec<String>,
    /// Caveats worth knowing.
    pub notes: Vec<String>,
    /// Layers this machine cannot give (the private view without user namespaces): the run
    /// still starts, and says so at its start, every time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub downgrades: Vec<String>,
}
