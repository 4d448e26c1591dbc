//! GPU models: memory, SMs, architecture and MIG geometry, with a built-in catalog.
//!
//! The MIG tables follow `protocols.md` §4.5 (NVIDIA's supported-profile tables,
//! `mig-parted` and KEP-4815). They are documentation-grade defaults: the node
//! agent reads the real tables from NVML where a driver is present.

use serde::{Deserialize, Serialize};

/// GPU architecture (generation). Ordered oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
    /// A model whose generation is not public (the openb trace's G2/G3).
    Unknown,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Pascal => "pascal",
            Architecture::Volta => "volta",
            Architecture::Turing => "turing",
            Architecture::Ampere => "ampere",
            Architecture::Ada => "ada",
            Architecture::Hopper => "hopper",
            Architecture::Blackwell => "blackwell",
            Architecture::Unknown => "unknown",
        }
    }
}

/// One MIG GPU-instance profile of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// NVIDIA's name, e.g. `1g.10gb` or `1g.10gb+me`.
    pub name: String,
    /// Compute slices (of [`MigGeometry::compute_slices`]).
    pub compute_slices: u8,
    /// Memory slices the placement occupies (of [`MigGeometry::memory_slices`]).
    pub memory_slices: u8,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Most instances of this profile on one GPU.
    pub max_instances: u8,
    /// Allowed first memory slices of a placement.
    pub starts: Vec<u8>,
}

impl MigProfile {
    /// A table row: compute and memory slices, MiB, most instances, allowed starts.
    fn new(
        name: &str,
        compute_slices: u8,
        memory_slices: u8,
        memory_mib: u64,
        max_instances: u8,
        starts: &[u8],
    ) -> MigProfile {
        MigProfile {
            name: name.to_string(),
            compute_slices,
            memory_slices,
            memory_mib,
            max_instances,
            starts: starts.to_vec(),
        }
    }
}

/// MIG geometry of a model: slice counts and the profile table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGeometry {
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub profiles: Vec<MigProfile>,
}

impl MigGeometry {
    pub fn profile(&self, name: &str) -> Option<(usize, &MigProfile)> {
        self.profiles
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == name)
    }

    /// The memory slices of `profile` placed at `start`, as a bitmask (bit i = slice i),
    /// or `None` when the profile may not start there.
    pub fn placement_mask(&self, profile: &MigProfile, start: u8) -> Option<u8> {
        let end = u16::from(start) + u16::from(profile.memory_slices);
        if !profile.starts.contains(&start) || end > u16::from(self.memory_slices.min(8)) {
            return None;
        }
        let ones = (1u16 << profile.memory_slices) - 1;
        Some(((ones << start) & 0xff) as u8)
    }

    /// The share of the GPU's compute one instance of `profile` has, in per-mille,
    /// rounded down so that the instances of one GPU never add up to more than 1000
    /// (3 of 7 slices: 3000 / 7 = 428).
    pub fn compute_milli(&self, profile: &MigProfile) -> u32 {
        match self.compute_slices {
            0 => 0,
            total => (u32::from(profile.compute_slices) * 1000 / u32::from(total)).min(1000),
        }
    }

    /// Places instances of the named profiles on an empty GPU, in order, each at its
    /// first free allowed start (as `nvidia-smi mig -cgi` does): `(profile index, start)`.
    pub fn layout(&self, profiles: &[&str]) -> Result<Vec<(u8, u8)>, String> {
        let (mut memory, mut compute) = (0u8, 0u8);
        let mut count = vec![0u8; self.profiles.len()];
        let mut out = Vec::with_capacity(profiles.len());
        for name in profiles {
            let (pi, p) = self
                .profile(name)
                .ok_or_else(|| format!("{name:?} is not a MIG profile of this model"))?;
            if count[pi] >= p.max_instances
                || compute.saturating_add(p.compute_slices) > self.compute_slices
            {
                return Err(format!("no room left for another {name}"));
            }
            let start = p
                .starts
                .iter()
                .copied()
                .find(|&s| self.placement_mask(p, s).is_some_and(|m| m & memory == 0))
                .ok_or_else(|| format!("no free placement left for {name}"))?;
            memory |= self.placement_mask(p, start).unwrap_or(0);
            compute += p.compute_slices;
            count[pi] += 1;
            out.push((pi as u8, start));
        }
        Ok(out)
    }
}

/// A GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSpec {
    /// Canonical name, e.g. `A100-80GB` (also the name requests use).
    pub name: String,
    /// Other names that mean this model: trace codes (`V100M16`), NVML product names.
    #[serde(default)]
    pub aliases: Vec<String>,
    pub memory_mib: u64,
    pub sm_count: u32,
    pub architecture: Architecture,
    /// MIG geometry, for MIG-capable models.
    #[serde(default)]
    pub mig: Option<MigGeometry>,
}

impl GpuSpec {
    fn plain(
        name: &str,
        aliases: &[&str],
        memory_mib: u64,
        sm_count: u32,
        arch: Architecture,
    ) -> Self {
        GpuSpec {
            name: name.to_string(),
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            memory_mib,
            sm_count,
            architecture: arch,
            mig: None,
        }
    }

    /// Whether `name` names this model (canonical name or alias), ASCII
    /// case-insensitive and with spaces and `-` alike, so that GPU Feature
    /// Discovery's `nvidia.com/gpu.product` value (the NVML product name with
    /// spaces replaced by `-`: `NVIDIA-A100-SXM4-80GB`, `Tesla-T4`) names the
    /// same model as the NVML name (`NVIDIA A100-SXM4-80GB`, `Tesla T4`).
    pub fn answers_to(&self, name: &str) -> bool {
        std::iter::once(&self.name)
            .chain(&self.aliases)
            .any(|a| same_spelling(a, name))
    }
}

/// Two model names compared ASCII case-insensitively, a space equal to `-`.
fn same_spelling(a: &str, b: &str) -> bool {
    let norm = |c: u8| {
        if c == b' ' {
            b'-'
        } else {
            c.to_ascii_lowercase()
        }
    };
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| norm(x) == norm(y))
}

/// A GFD product value without the suffixes GFD adds to the product name: `-SHARED`
/// (the GPU is shared by time slicing or MPS, NVIDIA device plugin's
/// `renameByDefault: false`) and `-MIG-<profile>` (the "single" MIG strategy,
/// `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`). `None` when it carries neither.
fn without_gfd_suffix(name: &str) -> Option<&str> {
    let upper = name.to_ascii_uppercase();
    let mut end = name.len();
    if upper.ends_with("-SHARED") {
        end -= "-SHARED".len();
    }
    if let Some(at) = upper[..end].rfind("-MIG-") {
        end = at;
    }
    (end < name.len() && end > 0).then(|| &name[..end])
}

/// MiB of a MIG profile's memory from the `NNgb` in its name read as decimal GB,
/// rounded down to 256 MiB. NVIDIA's names round the instance's memory, and an
/// instance holds at least this (e.g. `1g.10gb` of the H100: 9,984 MiB per
/// `nvidia-smi mig -lgip`, this gives 9,472), so a planned instance never
/// promises more than the driver gives; NVML reports the exact size once it exists.
/// Used where no published `-lgip` output was at hand.
const fn gb_name_mib(gb: u64) -> u64 {
    gb * 1_000_000_000 / (1 << 20) / 256 * 256
}

/// The GA100/GH100 7-compute/8-memory-slice geometry with per-profile memory.
/// `mem` gives the MiB of the 1-, 2-, 4- and 8-memory-slice profiles.
fn ga100_like(names: [&str; 7], mem: [u64; 4]) -> MigGeometry {
    let p = MigProfile::new;
    MigGeometry {
        compute_slices: 7,
        memory_slices: 8,
        profiles: vec![
            p(names[0], 1, 1, mem[0], 7, &[0, 1, 2, 3, 4, 5, 6]),
            p(names[1], 1, 1, mem[0], 1, &[0, 1, 2, 3, 4, 5, 6]),
            p(names[2], 1, 2, mem[1], 4, &[0, 2, 4, 6]),
            p(names[3], 2, 2, mem[1], 3, &[0, 2, 4]),
            p(names[4], 3, 4, mem[2], 2, &[0, 4]),
            p(names[5], 4, 4, mem[2], 1, &[0]),
            p(names[6], 7, 8, mem[3], 1, &[0]),
        ],
    }
}

/// The GA100 geometry of the A30: 4 compute and 4 memory slices. Memory per
/// profile is the smaller of what published `nvidia-smi mig -lgip` outputs show
/// for different drivers (5.75–5.81, 11.62–11.69, 23.37–23.50 GiB), so a planned
/// instance never promises more than the driver gives; NVML reports the exact
/// size of an instance once it exists.
fn a30_geometry() -> MigGeometry {
    let p = MigProfile::new;
    MigGeometry {
        compute_slices: 4,
        memory_slices: 4,
        profiles: vec![
            p("1g.6gb", 1, 1, 5_888, 4, &[0, 1, 2, 3]),
            p("1g.6gb+me", 1, 1, 5_888, 1, &[0, 1, 2, 3]),
            p("2g.12gb", 2, 2, 11_904, 2, &[0, 2]),
            p("2g.12gb+me", 2, 2, 11_904, 1, &[0, 2]),
            p("4g.24gb", 4, 4, 23_936, 1, &[0]),
        ],
    }
}

/// The built-in GPU models. Memory is what NVML reports as total framebuffer.
///
/// The openb trace's `G2` and `G3` are Alibaba-internal codes whose hardware is
/// not disclosed; their memory and SM counts here are placeholders (the trace
/// requests GPU shares in per-mille, so only the share matters for them).
pub fn builtin_specs() -> Vec<GpuSpec> {
    use Architecture::*;
    let mut a100_40 = GpuSpec::plain(
        "A100-40GB",
        &["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100"],
        40_960,
        108,
        Ampere,
    );
    a100_40.mig = Some(ga100_like(
        [
            "1g.5gb",
            "1g.5gb+me",
            "1g.10gb",
            "2g.10gb",
            "3g.20gb",
            "4g.20gb",
            "7g.40gb",
        ],
        [4_864, 9_856, 19_968, 40_192],
    ));
    let mut a100_80 = GpuSpec::plain(
        "A100-80GB",
        &[
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100-PCIE-80GB",
            "NVIDIA A100 80GB PCIe",
        ],
        81_920,
        108,
        Ampere,
    );
    a100_80.mig = Some(ga100_like(
        [
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
        ],
        [9_728, 19_968, 40_192, 80_896],
    ));
    let mut h100 = GpuSpec::plain(
        "H100-80GB",
        &[
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe",
            "NVIDIA H100",
            "H100",
        ],
        81_559,
        132,
        Hopper,
    );
    h100.mig = Some(ga100_like(
        [
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
        ],
        [9_984, 20_096, 40_448, 81_152],
    ));
    let mut h200 = GpuSpec::plain(
        "H200-141GB",
        &["NVIDIA H200", "NVIDIA H200 NVL", "H200"],
        143_771,
        132,
        Hopper,
    );
    h200.mig = Some(ga100_like(
        [
            "1g.18gb",
            "1g.18gb+me",
            "1g.35gb",
            "2g.35gb",
            "3g.71gb",
            "4g.71gb",
            "7g.141gb",
        ],
        [16_384, 32_768, 65_536, 139_264],
    ));
    vec![
        a100_40,
        a100_80,
        h100,
        h200,
        GpuSpec::plain("L4", &["NVIDIA L4"], 23_034, 58, Ada),
        GpuSpec::plain("T4", &["Tesla T4"], 15_360, 40, Turing),
        GpuSpec::plain(
            "V100-16GB",
            &["V100M16", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"],
            16_384,
            80,
            Volta,
        ),
        GpuSpec::plain(
            "V100-32GB",
            &["V100M32", "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB"],
            32_768,
            80,
            Volta,
        ),
        GpuSpec::plain(
            "P100",
            &["Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB"],
            16_384,
            56,
            Pascal,
        ),
        GpuSpec::plain("A10", &["NVIDIA A10"], 23_028, 72, Ampere),
        GpuSpec::plain("G2", &[], 32_768, 80, Unknown),
        GpuSpec::plain("G3", &[], 32_768, 80, Unknown),
        // Last, so that adding it moved no other model's id.
        GpuSpec {
            mig: Some(a30_geometry()),
            ..GpuSpec::plain("A30", &["NVIDIA A30", "A30-24GB"], 24_576, 56, Ampere)
        },
        // Newer models, appended so that no older model's id moves.
        //
        // Sources. Total memory: what `nvidia-smi` prints as the GPU's total (NVML's
        // framebuffer total) in published outputs: H100 NVL 95,830 MiB, B200
        // 183,359 MiB, GB200 189,471 MiB, H20 97,871 MiB, L40S 46,068 MiB. MIG
        // profile names, slices, instance counts and placements: NVIDIA's MIG User
        // Guide, "Supported MIG Profiles" (B200 table) and "Supported GPUs" (B200
        // 180GB, GB200 186GB, H100-PCIE 94GB, H20 96GB: all GH100/GB100 with 7
        // instances, the same 7-compute/8-memory-slice table as the H100), with the
        // names the GPU Operator's mig-parted configuration and `nvidia-smi -L`
        // outputs show (H100 NVL `1g.12gb`, `3g.47gb`; H20 `1g.12gb`, `1g.24gb`,
        // `3g.48gb`, `7g.96gb`; GB200 `1g.23gb`, `1g.47gb`, `3g.93gb`, `7g.186gb`).
        // Profile memory: [`gb_name_mib`] (no published `-lgip` output at hand).
        // SM counts: NVIDIA's product briefs (H100 NVL 132, L40S 142); B200 148 and
        // H20 78 from published device-query outputs; GB200 148 is NOT confirmed
        // (assumed equal to the B200: same GB100 die and the same 18 SMs per MIG
        // slice); the node agent reads the real count from NVML.
        GpuSpec {
            mig: Some(ga100_like(
                [
                    "1g.12gb",
                    "1g.12gb+me",
                    "1g.24gb",
                    "2g.24gb",
                    "3g.47gb",
                    "4g.47gb",
                    "7g.94gb",
                ],
                [
                    gb_name_mib(12),
                    gb_name_mib(24),
                    gb_name_mib(47),
                    gb_name_mib(94),
                ],
            )),
            ..GpuSpec::plain(
                "H100-NVL",
                &["NVIDIA H100 NVL", "H100-NVL-94GB", "H100 NVL"],
                95_830,
                132,
                Hopper,
            )
        },
        GpuSpec {
            mig: Some(ga100_like(
                [
                    "1g.23gb",
                    "1g.23gb+me",
                    "1g.45gb",
                    "2g.45gb",
                    "3g.90gb",
                    "4g.90gb",
                    "7g.180gb",
                ],
                [
                    gb_name_mib(23),
                    gb_name_mib(45),
                    gb_name_mib(90),
                    gb_name_mib(180),
                ],
            )),
            ..GpuSpec::plain(
                "B200",
                &["NVIDIA B200", "B200-180GB"],
                183_359,
                148,
                Blackwell,
            )
        },
        GpuSpec {
            mig: Some(ga100_like(
                [
                    "1g.23gb",
                    "1g.23gb+me",
                    "1g.47gb",
                    "2g.47gb",
                    "3g.93gb",
                    "4g.93gb",
                    "7g.186gb",
                ],
                [
                    gb_name_mib(23),
                    gb_name_mib(47),
                    gb_name_mib(93),
                    gb_name_mib(186),
                ],
            )),
            ..GpuSpec::plain(
                "GB200",
                &["NVIDIA GB200", "GB200-186GB"],
                189_471,
                148,
                Blackwell,
            )
        },
        GpuSpec::plain("L40S", &["NVIDIA L40S"], 46_068, 142, Ada),
        GpuSpec {
            mig: Some(ga100_like(
                [
                    "1g.12gb",
                    "1g.12gb+me",
                    "1g.24gb",
                    "2g.24gb",
                    "3g.48gb",
                    "4g.48gb",
                    "7g.96gb",
                ],
                [
                    gb_name_mib(12),
                    gb_name_mib(24),
                    gb_name_mib(48),
                    gb_name_mib(96),
                ],
            )),
            ..GpuSpec::plain("H20", &["NVIDIA H20", "H20-96GB"], 97_871, 78, Hopper)
        },
    ]
}

/// Index of a model in a [`Catalog`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ModelId(pub u8);

/// A set of models as a bitmask over catalog indices (at most 64 models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModelSet(pub u64);

impl ModelSet {
    pub const ALL: ModelSet = ModelSet(u64::MAX);
    pub fn contains(self, id: ModelId) -> bool {
        self.0 & (1u64 << id.0) != 0
    }
    pub fn insert(&mut self, id: ModelId) {
        self.0 |= 1u64 << id.0;
    }
}

/// The models a cluster knows: the built-ins plus any the inventory added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    specs: Vec<GpuSpec>,
}

/// A catalog holds at most this many models (they index a 64-bit [`ModelSet`]).
pub const MAX_MODELS: usize = 64;

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            specs: builtin_specs(),
        }
    }
}

impl Catalog {
    /// Finds a model by canonical name or alias, written with spaces or `-` (so
    /// GFD's `nvidia.com/gpu.product` values resolve: `NVIDIA-H100-80GB-HBM3`,
    /// and with GFD's `-SHARED` or `-MIG-<profile>` suffix too).
    pub fn find(&self, name: &str) -> Option<ModelId> {
        let name = name.trim();
        let by = |name: &str| {
            self.specs
                .iter()
                .position(|s| s.answers_to(name))
                .map(|i| ModelId(i as u8))
        };
        by(name).or_else(|| without_gfd_suffix(name).and_then(by))
    }

    /// Finds a model from an NVML product name such as `NVIDIA A100-SXM4-80GB`, falling
    /// back to matching on the family and memory size when there is no exact alias.
    pub fn find_product(&self, product: &str, memory_mib: u64) -> Option<ModelId> {
        if let Some(id) = self.find(product) {
            return Some(id);
        }
        // The family is a whole word of the product name: `L4` is not in
        // `NVIDIA L40S`, nor `B200` in `NVIDIA GB200`.
        let upper = product.to_ascii_uppercase();
        let words: Vec<&str> = upper.split([' ', '-']).collect();
        let family_of = |spec: &GpuSpec| {
            spec.name
                .split('-')
                .next()
                .is_some_and(|f| words.iter().any(|w| w.eq_ignore_ascii_case(f)))
        };
        // Closest memory size within the family (e.g. A100 40 vs 80 GB).
        self.specs
            .iter()
            .enumerate()
            .filter(|(_, s)| family_of(s))
            .min_by_key(|(_, s)| s.memory_mib.abs_diff(memory_mib))
            .map(|(i, _)| ModelId(i as u8))
    }

    /// Adds a model, or returns the id of the model already known by that name.
    pub fn add(&mut self, spec: GpuSpec) -> Result<ModelId, CatalogFull> {
        if let Some(id) = self.find(&spec.name) {
            return Ok(id);
        }
        if self.specs.len() >= MAX_MODELS {
            return Err(CatalogFull);
        }
        self.specs.push(spec);
        Ok(ModelId((self.specs.len() - 1) as u8))
    }

    /// Adds a model unless one is known by exactly its canonical name. Unlike
    /// [`Catalog::add`] it does not read the name as a GFD product label, where
    /// `<model>-MIG-<profile>` means the parent model.
    pub fn push_exact(&mut self, spec: GpuSpec) -> Result<ModelId, CatalogFull> {
        if let Some(i) = self.specs.iter().position(|s| s.name == spec.name) {
            return Ok(ModelId(i as u8));
        }
        if self.specs.len() >= MAX_MODELS {
            return Err(CatalogFull);
        }
        self.specs.push(spec);
        Ok(ModelId((self.specs.len() - 1) as u8))
    }

    pub fn spec(&self, id: ModelId) -> &GpuSpec {
        &self.specs[id.0 as usize]
    }

    pub fn specs(&self) -> &[GpuSpec] {
        &self.specs
    }

    /// Every known spelling, for error messages.
    pub fn names(&self) -> Vec<&str> {
        self.specs.iter().map(|s| s.name.as_str()).collect()
    }

    /// Models that offer the MIG profile `name`.
    pub fn models_with_profile(&self, name: &str) -> ModelSet {
        let mut set = ModelSet(0);
        for (i, s) in self.specs.iter().enumerate() {
            if s.mig.as_ref().is_some_and(|m| m.profile(name).is_some()) {
                set.insert(ModelId(i as u8));
            }
        }
        set
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the GPU model catalog is full ({MAX_MODELS} models)")]
pub struct CatalogFull;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_resolves_names_aliases_and_products() {
        let c = Catalog::default();
        let a100 = c.find("A100-80GB").unwrap();
        assert_eq!(c.find("a100-80gb"), Some(a100));
        assert_eq!(c.find_product("NVIDIA A100-SXM4-80GB", 81_920), Some(a100));
        // Not an alias, but the family and the memory size say which A100.
        let a100_40 = c.find("A100-40GB").unwrap();
        assert_eq!(
            c.find_product("NVIDIA A100-SXM4-40GB-X", 40_536),
            Some(a100_40)
        );
        assert_eq!(c.find("V100M16"), c.find("V100-16GB"));
        assert!(c.find("RTX-9999").is_none());
        for name in [
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H200-141GB",
            "L4",
            "T4",
            "V100-16GB",
            "V100-32GB",
            "P100",
            "A10",
            "G2",
            "G3",
            "A30",
            "H100-NVL",
            "B200",
            "GB200",
            "L40S",
            "H20",
        ] {
            assert!(
                c.find(name).is_some(),
                "{name} missing from the built-in catalog"
            );
        }
    }

    /// GPU Feature Discovery labels nodes `nvidia.com/gpu.product` with the NVML
    /// name, spaces replaced by `-` (and `-SHARED` / `-MIG-<profile>` appended for
    /// shared GPUs and the single MIG strategy): each names the model NVML's does.
    #[test]
    fn gfd_product_labels_name_the_same_models_as_nvml() {
        let c = Catalog::default();
        let id = |n: &str| c.find(n).map(|m| c.spec(m).name.as_str());
        for (gfd, model) in [
            ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
            ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
            ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
            ("NVIDIA-H100-NVL", "H100-NVL"),
            ("NVIDIA-H200", "H200-141GB"),
            ("NVIDIA-H200-NVL", "H200-141GB"),
            ("NVIDIA-B200", "B200"),
            ("NVIDIA-GB200", "GB200"),
            ("NVIDIA-L40S", "L40S"),
            ("NVIDIA-L4", "L4"),
            ("NVIDIA-H20", "H20"),
            ("Tesla-T4", "T4"),
            ("Tesla-V100-SXM2-16GB", "V100-16GB"),
            ("nvidia-a100-sxm4-80gb", "A100-80GB"),
            ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
            ("Tesla-T4-SHARED", "T4"),
            ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb-SHARED", "H100-80GB"),
        ] {
            assert_eq!(id(gfd), Some(model), "{gfd}");
        }
        // The NVML spellings still resolve, and a suffix alone names nothing.
        assert_eq!(id("NVIDIA A100-SXM4-80GB"), Some("A100-80GB"));
        assert_eq!(id("NVIDIA H100 NVL"), Some("H100-NVL"));
        assert_eq!(id("-MIG-1g.5gb"), None);
        assert_eq!(id("NVIDIA-RTX-9999"), None);
    }

    /// The product fallback matches a family as a whole word: an L40S is not an
    /// L4 and a GB200 is not a B200, whatever their memory.
    #[test]
    fn product_family_is_a_whole_word() {
        let c = Catalog::default();
        let name = |p: &str, mib| c.find_product(p, mib).map(|m| c.spec(m).name.clone());
        // Not aliases: only the family and the memory say which model.
        assert_eq!(name("NVIDIA L40S-X", 46_068).as_deref(), Some("L40S"));
        assert_eq!(name("NVIDIA L4-X", 23_034).as_deref(), Some("L4"));
        assert_eq!(name("NVIDIA GB200 X", 189_471).as_deref(), Some("GB200"));
        assert_eq!(name("NVIDIA B200 X", 183_359).as_deref(), Some("B200"));
        // 94 GB is nearer the H100 NVL's 95,830 MiB than the 80 GB part's.
        assert_eq!(
            name("NVIDIA H100 NVL X", 95_000).as_deref(),
            Some("H100-NVL")
        );
    }

    /// The models added for current hardware: memory, architecture and MIG tables
    /// as documented in [`builtin_specs`].
    #[test]
    fn current_models_are_in_the_catalog() {
        let c = Catalog::default();
        let spec = |n: &str| c.spec(c.find(n).unwrap()).clone();
        let b200 = spec("B200");
        assert_eq!(
            (b200.memory_mib, b200.architecture),
            (183_359, Architecture::Blackwell)
        );
        assert_eq!(spec("L40S").architecture, Architecture::Ada);
        assert!(spec("L40S").mig.is_none());
        assert_eq!(spec("H20").memory_mib, 97_871);
        // 23 GB read as decimal: 23e9 / 2^20 = 21,934.2 MiB, down to 256: 21,760.
        let geo = b200.mig.unwrap();
        assert_eq!(geo.profile("1g.23gb").unwrap().1.memory_mib, 21_760);
        assert_eq!(geo.profile("7g.180gb").unwrap().1.memory_slices, 8);
        // 1g.12gb is the H100 NVL's and the H20's; 7g.186gb only the GB200's.
        assert_eq!(c.models_with_profile("1g.12gb").0.count_ones(), 2);
        let gb200 = c.find("GB200").unwrap();
        assert!(c.models_with_profile("7g.186gb").contains(gb200));
        assert_eq!(c.models_with_profile("7g.186gb").0.count_ones(), 1);
        // No model id before them moved: the A30 is still the 13th.
        assert_eq!(c.find("A30"), Some(ModelId(12)));
    }

    #[test]
    fn mig_tables_follow_the_7_by_8_geometry() {
        let c = Catalog::default();
        for name in [
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H200-141GB",
            "H100-NVL",
            "B200",
            "GB200",
            "H20",
        ] {
            let spec = c.spec(c.find(name).unwrap());
            let mig = spec.mig.as_ref().unwrap();
            assert_eq!((mig.compute_slices, mig.memory_slices), (7, 8));
            for p in &mig.profiles {
                // Every placement stays inside the 8 memory slices.
                assert!(
                    p.starts.iter().all(|s| s + p.memory_slices <= 8),
                    "{name} {}",
                    p.name
                );
                assert!(p.memory_mib <= spec.memory_mib);
            }
        }
        // 1g.5gb exists only on the 40 GB A100; 1g.10gb on both A100s (two slices on the 40 GB part).
        let with_1g5 = c.models_with_profile("1g.5gb");
        assert!(with_1g5.contains(c.find("A100-40GB").unwrap()));
        assert!(!with_1g5.contains(c.find("A100-80GB").unwrap()));
        let with_1g10 = c.models_with_profile("1g.10gb");
        assert!(with_1g10.contains(c.find("A100-40GB").unwrap()));
        assert!(with_1g10.contains(c.find("H100-80GB").unwrap()));
        assert!(!with_1g10.contains(c.find("T4").unwrap()));
    }

    /// The A30's 4-by-4 geometry (NVIDIA's A30 profile table: 1g ×4, 2g ×2, 4g ×1).
    #[test]
    fn a30_has_four_compute_and_four_memory_slices() {
        let c = Catalog::default();
        let a30 = c.find("NVIDIA A30").unwrap();
        let geo = c.spec(a30).mig.clone().unwrap();
        assert_eq!((geo.compute_slices, geo.memory_slices), (4, 4));
        // Per-mille of 4 slices: 1g 250, 2g 500, 4g 1000.
        let milli = |name| geo.compute_milli(geo.profile(name).unwrap().1);
        assert_eq!(
            [milli("1g.6gb"), milli("2g.12gb"), milli("4g.24gb")],
            [250, 500, 1000]
        );
        // Four 1g fill it; a 2g may start at 0 or 2 only; a fifth 1g has no room.
        assert_eq!(
            geo.layout(&["2g.12gb", "1g.6gb", "1g.6gb"]).unwrap(),
            [(2, 0), (0, 2), (0, 3)]
        );
        let (_, p2g) = geo.profile("2g.12gb").unwrap();
        assert_eq!(geo.placement_mask(p2g, 1), None);
        assert_eq!(geo.placement_mask(p2g, 2), Some(0b1100));
        assert!(geo.layout(&["1g.6gb"; 5]).is_err());
        assert!(geo.layout(&["4g.24gb", "1g.6gb"]).is_err());
        // The A30 is the only model with these profiles.
        assert_eq!(c.models_with_profile("1g.6gb").0.count_ones(), 1);
    }

    #[test]
    fn mig_placements_compute_shares_and_layouts() {
        let c = Catalog::default();
        let geo = c.spec(c.find("A100-80GB").unwrap()).mig.clone().unwrap();
        let (_, p3g) = geo.profile("3g.40gb").unwrap();
        // 3g takes 4 memory slices at 0 or 4: 0b1111_0000 at 4; start 2 is not allowed.
        assert_eq!(geo.placement_mask(p3g, 4), Some(0b1111_0000));
        assert_eq!(geo.placement_mask(p3g, 2), None);
        // Per-mille of 7 compute slices, rounded down: 1g 142, 3g 428, 4g 571, 7g 1000.
        let milli = |name| geo.compute_milli(geo.profile(name).unwrap().1);
        assert_eq!(
            [
                milli("1g.10gb"),
                milli("3g.40gb"),
                milli("4g.40gb"),
                milli("7g.80gb")
            ],
            [142, 428, 571, 1000]
        );
        // Seven 1g instances stay within the GPU: 7 × 142 = 994.
        assert!(7 * milli("1g.10gb") <= 1000);
        // 2g, 1g, 1g, 3g: 2g at 0, the 1g at the next free slices 2 and 3, 3g at 4.
        let starts: Vec<u8> = geo
            .layout(&["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"])
            .unwrap()
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        assert_eq!(starts, [0, 2, 3, 4]);
        assert!(geo.layout(&["4g.40gb", "4g.40gb"]).is_err());
        assert!(geo.layout(&["3g.40gb", "3g.40gb", "1g.10gb"]).is_err());
        assert!(geo.layout(&["9g.99gb"]).is_err());
    }
}
