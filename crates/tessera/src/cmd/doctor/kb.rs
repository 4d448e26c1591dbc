//! The troubleshooting knowledge base behind `tessera doctor`: GPU error codes
//! of the CUDA driver and runtime, cuBLAS, cuDNN, NCCL and NVML, and the XIDs
//! the node agent acts on, each with its root cause, the fix, and what Tessera
//! itself can check.
//!
//! Numeric values are those of NVIDIA's headers (`cuda.h`/`driver_types.h` of
//! CUDA ≥ 10.1, where runtime and driver codes share numbers; `cublas_api.h`;
//! `cudnn_ops`/`cudnn_graph.h` of cuDNN 8 and 9, which renumbered; `nccl.h`;
//! `nvml.h`). XIDs are not copied here: they come from the node agent's own
//! table ([`tessera_node::health::XID_TABLE`]) so that `doctor` and the agent
//! never disagree.
//!
//! Three ways in: a name (any case, with or without its prefix:
//! `CUBLAS_STATUS_ALLOC_FAILED`, `alloc_failed`, `cudaErrorMemoryAllocation`),
//! a number with its namespace (`cuda:2`, `nvml 15`, `xid 79`), or a pasted log
//! line, which is scanned for names, `Xid … : N` and the libraries' own
//! error strings.

use serde::Serialize;
use tessera_node::health::{XID_TABLE, XidPolicy, xid_info};
use tessera_node::snapshot::xids_in;

use super::kb_data::codes;

/// Which library (or the kernel driver, for XIDs) a code belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// CUDA driver (`CUresult`) and runtime (`cudaError_t`) API.
    Cuda,
    Cublas,
    Cudnn,
    Nccl,
    Nvml,
    /// Kernel driver XID events (`NVRM: Xid`).
    Xid,
}

impl Domain {
    pub const ALL: [Domain; 6] = [
        Domain::Cuda,
        Domain::Cublas,
        Domain::Cudnn,
        Domain::Nccl,
        Domain::Nvml,
        Domain::Xid,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Domain::Cuda => "cuda",
            Domain::Cublas => "cublas",
            Domain::Cudnn => "cudnn",
            Domain::Nccl => "nccl",
            Domain::Nvml => "nvml",
            Domain::Xid => "xid",
        }
    }

    pub fn parse(s: &str) -> Option<Domain> {
        Domain::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Prefixes stripped from names before comparing, longest first.
    fn prefixes(self) -> &'static [&'static str] {
        match self {
            Domain::Cuda => &["CUDA_ERROR_", "CUDAERROR"],
            Domain::Cublas => &["CUBLAS_STATUS_"],
            Domain::Cudnn => &["CUDNN_STATUS_"],
            Domain::Nccl => &["NCCL"],
            Domain::Nvml => &["NVML_ERROR_"],
            Domain::Xid => &["XID"],
        }
    }

    /// Words one of which a log line must contain before the domain's error
    /// strings are looked for in it (they are short: "internal error").
    fn keywords(self) -> &'static [&'static str] {
        match self {
            Domain::Cuda => &["cuda"],
            Domain::Cublas => &["cublas"],
            Domain::Cudnn => &["cudnn"],
            Domain::Nccl => &["nccl"],
            Domain::Nvml => &[
                "nvml",
                "nvidia-smi",
                "libnvidia-ml",
                "unable to determine the device handle",
            ],
            Domain::Xid => &["xid"],
        }
    }
}

/// Who has to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Owner {
    /// The workload's code, build or request.
    Application,
    /// The node's software: driver, libraries, container runtime, daemons.
    Node,
    /// The GPU or its links.
    Hardware,
}

impl Owner {
    pub fn name(self) -> &'static str {
        match self {
            Owner::Application => "application",
            Owner::Node => "node software (driver, runtime, daemons)",
            Owner::Hardware => "GPU hardware",
        }
    }
}

/// One error code.
#[derive(Debug, Clone, Copy)]
pub struct Code {
    pub domain: Domain,
    /// Canonical name as in the header.
    pub name: &'static str,
    /// Other names for the same condition (the runtime API's, an older alias).
    pub aliases: &'static [&'static str],
    /// Numeric values, labelled when the number changed between versions.
    pub values: &'static [(&'static str, i64)],
    /// Lower-case fragments of the library's own error string, as seen in logs.
    pub messages: &'static [&'static str],
    pub owner: Owner,
    pub cause: &'static str,
    pub fix: &'static str,
    /// What Tessera can check about it.
    pub check: &'static str,
}

/// An answer, the same shape for library codes and XIDs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    pub domain: Domain,
    pub name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// `"2"`, or `"cuDNN 8: 2, cuDNN 9: 4003"`.
    pub code: String,
    pub owner: Owner,
    pub cause: String,
    pub fix: String,
    pub tessera_checks: String,
    /// For XIDs: whether the node agent withdraws the GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub withdraws_gpu: Option<bool>,
}

impl Code {
    fn answer(&self) -> Answer {
        let code = match self.values {
            [("", v)] => v.to_string(),
            vs => vs
                .iter()
                .map(|(l, v)| format!("{l}: {v}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        Answer {
            domain: self.domain,
            name: self.name.to_string(),
            aliases: self.aliases.iter().map(|a| a.to_string()).collect(),
            code,
            owner: self.owner,
            cause: self.cause.to_string(),
            fix: self.fix.to_string(),
            tessera_checks: self.check.to_string(),
            withdraws_gpu: None,
        }
    }

    fn matches_name(&self, key: &str) -> bool {
        std::iter::once(self.name)
            .chain(self.aliases.iter().copied())
            .any(|n| normalise(n, self.domain) == key)
    }
}

const XID_CHECK: &str = "The node agent sees XIDs through NVML, withdraws the GPU unless the XID is an application one, and writes the reason into the GpuNode status: `kubectl tessera top` marks the GPU, `tessera doctor pod` lists it for the pod's GPUs, `tessera doctor snapshot` collects the kernel's NVRM/Xid lines.";

/// The answer for XID `code` (known or not), from the node agent's table and policy.
pub fn xid_answer(code: u64) -> Answer {
    let withdraws = XidPolicy::default().is_fatal(code);
    match xid_info(code) {
        Some(i) => Answer {
            domain: Domain::Xid,
            name: format!("XID {code}: {}", i.name),
            aliases: Vec::new(),
            code: code.to_string(),
            owner: if i.cause.is_hardware() {
                Owner::Hardware
            } else {
                Owner::Application
            },
            cause: i.cause.name().to_string(),
            fix: i.action.to_string(),
            tessera_checks: XID_CHECK.to_string(),
            withdraws_gpu: Some(withdraws),
        },
        None => Answer {
            domain: Domain::Xid,
            name: format!("XID {code} (not in Tessera's table)"),
            aliases: Vec::new(),
            code: code.to_string(),
            owner: Owner::Hardware,
            cause: "unknown".to_string(),
            fix: "Look it up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors). The agent treats every XID outside the application list as fatal.".to_string(),
            tessera_checks: XID_CHECK.to_string(),
            withdraws_gpu: Some(withdraws),
        },
    }
}

/// Every entry of one domain (or all), XIDs included.
pub fn list(domain: Option<Domain>) -> Vec<Answer> {
    let mut out: Vec<Answer> = codes()
        .filter(|c| domain.is_none_or(|d| d == c.domain))
        .map(Code::answer)
        .collect();
    if domain.is_none_or(|d| d == Domain::Xid) {
        out.extend(XID_TABLE.iter().map(|i| xid_answer(i.code)));
    }
    out
}

/// Why a query could not be understood (not "nothing found": that is an empty answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("nothing to look up: give an error name, NAMESPACE:NUMBER or a log line")]
    Empty,
    #[error(
        "{0:?} is not a namespace; use one of cuda, cublas, cudnn, nccl, nvml, xid (e.g. cuda:2)"
    )]
    Namespace(String),
    #[error("{0:?} is not a number (e.g. nvml:15)")]
    Number(String),
}

/// Upper-case, without the domain's prefix and without separators, so that
/// `cudaErrorMemoryAllocation`, `MEMORY_ALLOCATION` and `memoryallocation` meet.
fn normalise(name: &str, domain: Domain) -> String {
    let up = name.trim().to_ascii_uppercase();
    let rest = domain
        .prefixes()
        .iter()
        .find_map(|p| up.strip_prefix(p))
        .unwrap_or(&up);
    rest.chars().filter(|c| c.is_ascii_alphanumeric()).collect()
}

/// Looks up `query`: `NAMESPACE:NUMBER` (or `NAMESPACE NUMBER`), a bare number
/// (an XID, as `tessera doctor 79` always meant), a name, or else a log line.
pub fn lookup(query: &str) -> Result<Vec<Answer>, QueryError> {
    let q = query.trim();
    if q.is_empty() {
        return Err(QueryError::Empty);
    }
    if let Some(answers) = by_number(q)? {
        return Ok(answers);
    }
    let by_name = by_name(q);
    if !by_name.is_empty() {
        return Ok(by_name);
    }
    Ok(scan(q))
}

/// `cuda:2`, `nvml 15`, `xid-79`, `XID79`, `79`; `None` when `q` is not of that form.
fn by_number(q: &str) -> Result<Option<Vec<Answer>>, QueryError> {
    if let Ok(n) = q.parse::<u64>() {
        return Ok(Some(vec![xid_answer(n)]));
    }
    let split = q
        .find(|c: char| !c.is_ascii_alphabetic())
        .filter(|&i| i > 0);
    let Some(i) = split else {
        return Ok(None);
    };
    let (ns, rest) = q.split_at(i);
    let num = rest.trim_start_matches([' ', ':', '-', '_', '=', '#']);
    // Only "word SEP digits" is a numbered lookup; anything else may be a name or a log line.
    let numeric = !num.is_empty() && num.chars().all(|c| c.is_ascii_digit());
    let domain = Domain::parse(ns);
    let Some(domain) = domain.filter(|_| numeric) else {
        return match (domain, numeric) {
            (None, true) if rest.starts_with(':') => Err(QueryError::Namespace(ns.to_string())),
            (Some(_), false) if rest.starts_with(':') && !num.contains(char::is_whitespace) => {
                Err(QueryError::Number(num.to_string()))
            }
            _ => Ok(None),
        };
    };
    let value: i64 = num
        .parse()
        .map_err(|_| QueryError::Number(num.to_string()))?;
    if domain == Domain::Xid {
        return match u64::try_from(value) {
            Ok(v) => Ok(Some(vec![xid_answer(v)])),
            Err(_) => Err(QueryError::Number(num.to_string())),
        };
    }
    Ok(Some(
        codes()
            .filter(|c| c.domain == domain && c.values.iter().any(|(_, v)| *v == value))
            .map(Code::answer)
            .collect(),
    ))
}

/// Every code whose name or alias is `q` (any case, with or without prefix).
fn by_name(q: &str) -> Vec<Answer> {
    if q.contains(char::is_whitespace) {
        return Vec::new();
    }
    codes()
        .filter(|c| c.matches_name(&normalise(q, c.domain)))
        .map(Code::answer)
        .collect()
}

/// Codes named in a log line, then those whose error string it contains, then its XIDs.
fn scan(line: &str) -> Vec<Answer> {
    let lower = line.to_ascii_lowercase();
    let mut hits: Vec<&Code> = Vec::new();
    let words = line
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.len() > 3);
    for w in words {
        for c in codes() {
            // Only full names here: a bare "MEMORY" in a sentence is not a code.
            let full = std::iter::once(c.name)
                .chain(c.aliases.iter().copied())
                .any(|n| n.eq_ignore_ascii_case(w));
            if full && !hits.iter().any(|h| std::ptr::eq(*h, c)) {
                hits.push(c);
            }
        }
    }
    if hits.is_empty() {
        for c in codes() {
            let in_context = c.domain.keywords().iter().any(|k| lower.contains(k));
            if in_context && c.messages.iter().any(|m| lower.contains(m)) {
                hits.push(c);
            }
        }
    }
    // Two messages where one contains the other ("out of memory" inside a longer
    // one) keep only the codes whose message is the longest match.
    let best = hits
        .iter()
        .filter_map(|c| {
            c.messages
                .iter()
                .filter(|m| lower.contains(*m))
                .map(|m| m.len())
                .max()
        })
        .max();
    let mut out: Vec<Answer> = hits
        .into_iter()
        .filter(|c| {
            let longest = c
                .messages
                .iter()
                .filter(|m| lower.contains(*m))
                .map(|m| m.len())
                .max();
            longest.is_none() || longest == best
        })
        .map(Code::answer)
        .collect();
    for x in xids_in(line) {
        let a = xid_answer(x);
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(a: &[Answer]) -> Vec<&str> {
        a.iter().map(|a| a.name.as_str()).collect()
    }

    #[test]
    fn names_match_in_any_case_with_or_without_prefix() {
        for q in [
            "CUDA_ERROR_OUT_OF_MEMORY",
            "cuda_error_out_of_memory",
            "out_of_memory",
            "cudaErrorMemoryAllocation",
            "MemoryAllocation",
        ] {
            assert_eq!(
                names(&lookup(q).unwrap()),
                ["CUDA_ERROR_OUT_OF_MEMORY"],
                "{q}"
            );
        }
        // The same suffix in two libraries: both answer.
        assert_eq!(
            names(&lookup("alloc_failed").unwrap()),
            ["CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"]
        );
        assert_eq!(
            names(&lookup("ncclRemoteError").unwrap()),
            ["ncclRemoteError"]
        );
        assert_eq!(
            names(&lookup("gpu_is_lost").unwrap()),
            ["NVML_ERROR_GPU_IS_LOST"]
        );
    }

    #[test]
    fn numbers_need_their_namespace() {
        assert_eq!(
            names(&lookup("cuda:2").unwrap()),
            ["CUDA_ERROR_OUT_OF_MEMORY"]
        );
        assert_eq!(
            names(&lookup("nvml 15").unwrap()),
            ["NVML_ERROR_GPU_IS_LOST"]
        );
        assert_eq!(
            names(&lookup("CUBLAS:13").unwrap()),
            ["CUBLAS_STATUS_EXECUTION_FAILED"]
        );
        // cuDNN 9 renumbered: both numbers find the code.
        assert_eq!(
            names(&lookup("cudnn:2").unwrap()),
            names(&lookup("cudnn:4003").unwrap())
        );
        assert_eq!(lookup("xid 79").unwrap()[0].withdraws_gpu, Some(true));
        assert_eq!(lookup("13").unwrap()[0].withdraws_gpu, Some(false));
        // Codes added for completeness answer by number too.
        assert_eq!(
            names(&lookup("nvml:23").unwrap()),
            ["NVML_ERROR_INSUFFICIENT_RESOURCES"]
        );
        assert_eq!(
            names(&lookup("cudnn:3002").unwrap()),
            ["CUDNN_STATUS_NOT_SUPPORTED_SHAPE"]
        );
        assert_eq!(
            names(&lookup("cudnn:14").unwrap()),
            names(&lookup("cudnn:1002").unwrap())
        );
        assert_eq!(
            names(&lookup("cuda:900").unwrap()),
            ["CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"]
        );
        assert!(lookup("nccl:42").unwrap().is_empty());
        assert_eq!(
            lookup("gpu:3"),
            Err(QueryError::Namespace("gpu".to_string()))
        );
        assert_eq!(lookup("cuda:lots"), Err(QueryError::Number("lots".into())));
        assert_eq!(lookup("   "), Err(QueryError::Empty));
    }

    #[test]
    fn log_lines_find_their_code() {
        let cases = [
            (
                "RuntimeError: CUDA error: out of memory",
                "CUDA_ERROR_OUT_OF_MEMORY",
            ),
            (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                "CUDA_ERROR_OUT_OF_MEMORY",
            ),
            (
                "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
                "CUBLAS_STATUS_NOT_INITIALIZED",
            ),
            (
                "RuntimeError: CUDA error: an illegal memory access was encountered",
                "CUDA_ERROR_ILLEGAL_ADDRESS",
            ),
            (
                "RuntimeError: The NVIDIA driver on your system is too old. CUDA driver version is insufficient for CUDA runtime version",
                "cudaErrorInsufficientDriver",
            ),
            (
                "Failed to initialize NVML: Driver/library version mismatch",
                "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
            ),
            (
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
                "ncclUnhandledCudaError",
            ),
            (
                "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
                "CUDNN_STATUS_EXECUTION_FAILED",
            ),
            (
                "RuntimeError: CUDA error: device-side assert triggered",
                "CUDA_ERROR_ASSERT",
            ),
            (
                "RuntimeError: CUDA error: peer access is not supported between these two devices",
                "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            ),
            (
                "Failed to initialize NVML: Unknown Error",
                "NVML_ERROR_UNKNOWN",
            ),
            // Lines operators paste from the driver stack, not only from libraries.
            (
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
                "NVML_ERROR_DRIVER_NOT_LOADED",
            ),
            (
                "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown",
                "NVML_ERROR_DRIVER_NOT_LOADED",
            ),
            (
                "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: cannot open shared object file: no such file or directory: unknown",
                "NVML_ERROR_LIBRARY_NOT_FOUND",
            ),
            (
                "bash: nvidia-smi: command not found",
                "NVML_ERROR_LIBRARY_NOT_FOUND",
            ),
            (
                "RuntimeError: CUDA error: no kernel image is available for execution on the device",
                "CUDA_ERROR_NO_BINARY_FOR_GPU",
            ),
            (
                "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 804: forward compatibility was attempted on non supported HW",
                "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
            ),
            (
                "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
                "CUDA_ERROR_DEVICE_UNAVAILABLE",
            ),
            // The longer of two matching strings wins ("operation not permitted" is 800).
            (
                "RuntimeError: CUDA error: operation not permitted when stream is capturing",
                "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            ),
            (
                "RuntimeError: CUDA error: peer mapping resources exhausted",
                "CUDA_ERROR_TOO_MANY_PEERS",
            ),
            (
                "RuntimeError: CUDA error: API call is not supported in the installed CUDA driver",
                "cudaErrorCallRequiresNewerDriver",
            ),
            // The node agent's own refusal of a MIG change, as the pod's event shows it.
            (
                "MIG on GPU GPU-1: NVML_ERROR_INSUFFICIENT_RESOURCES: nvmlDeviceCreateGpuInstanceWithPlacement failed: the placement overlaps an existing instance or no compute is left: 3g.40gb at memory slice 4",
                "NVML_ERROR_INSUFFICIENT_RESOURCES",
            ),
        ];
        for (line, want) in cases {
            let got = lookup(line).unwrap();
            assert_eq!(names(&got).first(), Some(&want), "{line}: {got:?}");
        }
        let xid =
            lookup("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', GPU has fallen off the bus.")
                .unwrap();
        assert_eq!(xid.len(), 1);
        assert_eq!(xid[0].code, "79");
        // A line that names nothing finds nothing (not everything).
        assert!(lookup("the job finished in 3 minutes").unwrap().is_empty());
        // An error string without its library's name in the line is not a match.
        assert!(lookup("internal error").unwrap().is_empty());
    }

    /// NVML's answers for the codes the node agent's MIG changes report say what
    /// they mean there.
    #[test]
    fn mig_codes_explain_the_agents_mig_changes() {
        for code in [
            "NVML_ERROR_INSUFFICIENT_RESOURCES",
            "NVML_ERROR_NO_PERMISSION",
            "NVML_ERROR_RESET_REQUIRED",
            "NVML_ERROR_INVALID_ARGUMENT",
            "NVML_ERROR_IN_USE",
        ] {
            let a = &lookup(code).unwrap()[0];
            assert!(a.cause.contains("MIG"), "{code}: {}", a.cause);
            assert!(a.tessera_checks.contains("node agent"), "{code}");
        }
    }

    /// Every entry is complete, and no value is claimed twice within one domain
    /// (a typo in a number would show up as a collision or a wrong lookup above).
    #[test]
    fn entries_are_complete_and_unique() {
        for c in codes() {
            assert!(!c.values.is_empty(), "{}", c.name);
            assert!(
                !c.cause.is_empty() && !c.fix.is_empty() && !c.check.is_empty(),
                "{}",
                c.name
            );
            for m in c.messages {
                assert_eq!(
                    *m,
                    m.to_ascii_lowercase(),
                    "{}: messages are lower case",
                    c.name
                );
            }
        }
        for d in Domain::ALL {
            let mut seen = std::collections::BTreeMap::new();
            for c in codes().filter(|c| c.domain == d) {
                for (label, v) in c.values {
                    if let Some(other) = seen.insert((*label, *v), c.name) {
                        panic!("{} {label} {v} is both {other} and {}", d.name(), c.name);
                    }
                }
            }
        }
    }
}
