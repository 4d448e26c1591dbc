//! The openb trace (Alibaba GPU cluster trace v2023, as the FGD paper uses it).
//!
//! Two kinds of CSV file, both with a header line and no quoting:
//! - node lists `sn,cpu_milli,memory_mib,gpu,model` become a [`Cluster`] with the
//!   nodes in file order (ties between equal scores go to the earlier node, as in
//!   the artifact, whose nodes are ordered by name, which is file order here);
//! - pod lists `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
//!   creation_time,deletion_time,scheduled_time` (11 columns) or only the first
//!   five (the `multigpu` variants) become [`TracePod`]s.
//!
//! A pod asking for one GPU at less than 1000 milli is a GPU share
//! ([`Request::share_milli`]); `num_gpu` whole GPUs otherwise; no GPU is a
//! CPU-only pod. `gpu_spec` (models joined with `|`) becomes the request's model
//! allow-list. `qos` and `pod_phase` are checked for presence only (the fill
//! experiment ignores them, as the artifact does).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use tessera_core::model::{Catalog, Cluster, Node};
use tessera_core::request::{GpuAsk, GpuMemory, Isolation, Request};

use super::{TraceError, TracePod};

const NODE_HEADER: [&str; 5] = ["sn", "cpu_milli", "memory_mib", "gpu", "model"];
const POD_HEADER: [&str; 11] = [
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
];

/// Reads a node list into a cluster with the default [`Catalog`]. `file` names the
/// source in error messages. Nodes without GPUs (`gpu` = 0) are kept as CPU-only nodes.
pub fn read_nodes(reader: impl BufRead, file: &str) -> Result<Cluster, TraceError> {
    let catalog = Catalog::default();
    let mut nodes = Vec::new();
    let mut lines = Lines::new(reader, file);
    lines.header(&NODE_HEADER, &NODE_HEADER)?;
    while let Some((line, text)) = lines.next_line()? {
        let f = fields(&text);
        if f.len() != NODE_HEADER.len() {
            return Err(lines.err(
                line,
                format!(
                    "expected {} columns ({}), found {}",
                    NODE_HEADER.len(),
                    NODE_HEADER.join(","),
                    f.len()
                ),
            ));
        }
        let name = f[0];
        if name.is_empty() {
            return Err(lines.err(line, "sn: empty node name".to_string()));
        }
        let cpu_milli = number(&lines, line, "cpu_milli", f[1])?;
        let memory_mib = number(&lines, line, "memory_mib", f[2])?;
        let gpus = number(&lines, line, "gpu", f[3])?;
        if gpus > 64 {
            return Err(lines.err(line, format!("gpu: {gpus} GPUs is more than 64")));
        }
        let node = if gpus == 0 {
            Node::uniform(
                name,
                cpu_milli,
                memory_mib,
                tessera_core::model::ModelId(0),
                0,
            )
        } else {
            let model = catalog.find(f[4]).ok_or_else(|| {
                lines.err(
                    line,
                    format!(
                        "model: unknown GPU model {:?} (known: {})",
                        f[4],
                        catalog.names().join(", ")
                    ),
                )
            })?;
            Node::uniform(name, cpu_milli, memory_mib, model, gpus as u32)
        };
        nodes.push(node);
    }
    if nodes.is_empty() {
        return Err(lines.err(lines.line, "no nodes after the header".to_string()));
    }
    Cluster::new(catalog, nodes).map_err(|e| TraceError::Parse {
        file: file.to_string(),
        line: 0,
        message: e.to_string(),
    })
}

/// Reads a pod list (11 or 5 columns), validating GPU models against `catalog`.
/// Pods keep file order; times are `None` in the 5-column variant.
pub fn read_pods(
    reader: impl BufRead,
    file: &str,
    catalog: &Catalog,
) -> Result<Vec<TracePod>, TraceError> {
    let mut lines = Lines::new(reader, file);
    let columns = lines.header(&POD_HEADER, &POD_HEADER[..5])?;
    let mut pods = Vec::new();
    while let Some((line, text)) = lines.next_line()? {
        let f = fields(&text);
        if f.len() != columns {
            return Err(lines.err(
                line,
                format!(
                    "expected {columns} columns as in the header, found {}",
                    f.len()
                ),
            ));
        }
        let name = f[0];
        if name.is_empty() {
            return Err(lines.err(line, "name: empty pod name".to_string()));
        }
        let cpu_milli = number(&lines, line, "cpu_milli", f[1])?;
        let memory_mib = number(&lines, line, "memory_mib", f[2])?;
        let num_gpu = number(&lines, line, "num_gpu", f[3])?;
        let gpu_milli = number(&lines, line, "gpu_milli", f[4])?;
        if num_gpu > 64 {
            return Err(lines.err(line, format!("num_gpu: {num_gpu} is more than 64")));
        }
        if gpu_milli > 1000 {
            return Err(lines.err(
                line,
                format!("gpu_milli: {gpu_milli} is more than one GPU (1000)"),
            ));
        }
        let num_gpu = num_gpu as u32;
        let gpu_milli = gpu_milli as u32;
        let mut request = match (num_gpu, gpu_milli) {
            (0, 0) => Request::cpu_only(cpu_milli, memory_mib),
            (0, m) => {
                return Err(lines.err(
                    line,
                    format!("gpu_milli: {m} but num_gpu is 0 (a CPU-only pod has gpu_milli 0)"),
                ));
            }
            (_, 0) => {
                return Err(lines.err(
                    line,
                    format!("gpu_milli: 0 but num_gpu is {num_gpu} (expected 1..=1000)"),
                ));
            }
            (n, 1000) => Request::whole(n, cpu_milli, memory_mib),
            (1, m) => Request::share_milli(m, cpu_milli, memory_mib),
            (n, m) => Request {
                cpu_milli,
                memory_mib,
                gpu: GpuAsk::Shared {
                    count: n,
                    memory: GpuMemory::PerMille(m),
                    cores_milli: m,
                },
                isolation: Isolation::Mps,
                ..Request::default()
            },
        };
        let (mut creation_s, mut deletion_s, mut scheduled_s) = (None, None, None);
        if columns == POD_HEADER.len() {
            let spec = f[5].trim();
            if !spec.is_empty() {
                let models: Vec<&str> = spec.split('|').collect();
                request = request
                    .with_models(&models, catalog)
                    .map_err(|e| lines.err(line, format!("gpu_spec: {e}")))?;
            }
            creation_s = optional(&lines, line, "creation_time", f[8])?;
            deletion_s = optional(&lines, line, "deletion_time", f[9])?;
            scheduled_s = optional(&lines, line, "scheduled_time", f[10])?;
        }
        pods.push(TracePod {
            name: name.to_string(),
            request,
            creation_s,
            deletion_s,
            scheduled_s,
        });
    }
    if pods.is_empty() {
        return Err(lines.err(lines.line, "no pods after the header".to_string()));
    }
    Ok(pods)
}

/// The 17 pod lists of the openb trace (`openb_pod_list_<name>.csv`), in the order
/// of the FGD authors' tables.
pub const WORKLOADS: [&str; 17] = [
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "default",
    "gpushare100",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
];

/// [`read_nodes`] from a file.
pub fn load_nodes(path: &Path) -> Result<Cluster, TraceError> {
    read_nodes(open(path)?, &path.display().to_string())
}

/// [`read_pods`] from a file.
pub fn load_pods(path: &Path, catalog: &Catalog) -> Result<Vec<TracePod>, TraceError> {
    read_pods(open(path)?, &path.display().to_string(), catalog)
}

fn open(path: &Path) -> Result<BufReader<File>, TraceError> {
    File::open(path)
        .map(BufReader::new)
        .map_err(|source| TraceError::Io {
            file: path.display().to_string(),
            source,
        })
}

fn fields(text: &str) -> Vec<&str> {
    text.split(',').map(str::trim).collect()
}

/// Line-numbered reading with the file name for errors.
struct Lines<R> {
    reader: R,
    file: String,
    line: u64,
    buf: String,
}

impl<R: BufRead> Lines<R> {
    fn new(reader: R, file: &str) -> Lines<R> {
        Lines {
            reader,
            file: file.to_string(),
            line: 0,
            buf: String::new(),
        }
    }

    fn err(&self, line: u64, message: String) -> TraceError {
        TraceError::Parse {
            file: self.file.clone(),
            line,
            message,
        }
    }

    /// The next non-blank line and its 1-based number.
    fn next_line(&mut self) -> Result<Option<(u64, String)>, TraceError> {
        loop {
            self.buf.clear();
            let n = self
                .reader
                .read_line(&mut self.buf)
                .map_err(|source| TraceError::Io {
                    file: self.file.clone(),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            let text = self.buf.trim_end_matches(['\n', '\r']);
            let text = if self.line == 1 {
                text.trim_start_matches('\u{feff}')
            } else {
                text
            };
            if !text.trim().is_empty() {
                return Ok(Some((self.line, text.to_string())));
            }
        }
    }

    /// Checks the header: the `full` columns or the `short` prefix. Returns the column count.
    fn header(&mut self, full: &[&str], short: &[&str]) -> Result<usize, TraceError> {
        let Some((line, text)) = self.next_line()? else {
            return Err(self.err(0, "empty file (expected a header line)".to_string()));
        };
        let got = fields(&text);
        if got == full {
            Ok(full.len())
        } else if got == short {
            Ok(short.len())
        } else {
            Err(self.err(
                line,
                format!(
                    "missing or wrong header: expected {:?}, found {:?}",
                    full.join(","),
                    text
                ),
            ))
        }
    }
}

fn number<R: BufRead>(
    lines: &Lines<R>,
    line: u64,
    column: &str,
    value: &str,
) -> Result<u64, TraceError> {
    if value.starts_with('-') {
        return Err(lines.err(line, format!("{column}: {value:?} must not be negative")));
    }
    value.parse::<u64>().map_err(|_| {
        lines.err(
            line,
            format!("{column}: {value:?} is not a non-negative whole number"),
        )
    })
}

fn optional<R: BufRead>(
    lines: &Lines<R>,
    line: u64,
    column: &str,
    value: &str,
) -> Result<Option<u64>, TraceError> {
    if value.is_empty() {
        Ok(None)
    } else {
        number(lines, line, column, value).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(text: &str) -> Result<Cluster, TraceError> {
        read_nodes(text.as_bytes(), "nodes.csv")
    }
    fn pods(text: &str) -> Result<Vec<TracePod>, TraceError> {
        read_pods(text.as_bytes(), "pods.csv", &Catalog::default())
    }
    fn message(r: Result<impl std::fmt::Debug, TraceError>) -> String {
        r.unwrap_err().to_string()
    }

    const NH: &str = "sn,cpu_milli,memory_mib,gpu,model\n";
    const PH: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    #[test]
    fn nodes_in_file_order_with_models() {
        let c = nodes(&format!(
            "{NH}n1,64000,262144,2,P100\nn0,96000,393216,8,V100M16\ncpu,32000,1024,0,\n"
        ))
        .unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c.nodes()[0].name, "n1");
        assert_eq!(c.nodes()[1].gpus.len(), 8);
        assert_eq!(
            c.nodes()[1].gpus[0].model,
            c.catalog.find("V100-16GB").unwrap()
        );
        assert_eq!(c.nodes()[2].gpus.len(), 0);
        assert_eq!(c.gpu_count(), 10);
    }

    #[test]
    fn node_errors_name_file_line_and_problem() {
        assert_eq!(
            message(nodes("")),
            "nodes.csv:0: empty file (expected a header line)"
        );
        assert!(
            message(nodes("n1,1,1,1,T4\n")).starts_with("nodes.csv:1: missing or wrong header")
        );
        assert_eq!(
            message(nodes(&format!("{NH}n1,64000,1,2\n"))),
            "nodes.csv:2: expected 5 columns (sn,cpu_milli,memory_mib,gpu,model), found 4"
        );
        assert_eq!(
            message(nodes(&format!("{NH}n1,-5,1,2,T4\n"))),
            "nodes.csv:2: cpu_milli: \"-5\" must not be negative"
        );
        assert_eq!(
            message(nodes(&format!("{NH}n1,5,x1,2,T4\n"))),
            "nodes.csv:2: memory_mib: \"x1\" is not a non-negative whole number"
        );
        assert!(
            message(nodes(&format!("{NH}n1,5,1,2,H9000\n")))
                .starts_with("nodes.csv:2: model: unknown GPU model \"H9000\"")
        );
        assert_eq!(message(nodes(NH)), "nodes.csv:1: no nodes after the header");
        assert!(message(nodes(&format!("{NH}n1,5,1,2,T4\nn1,5,1,2,T4\n"))).contains("duplicate"));
    }

    #[test]
    fn pod_kinds() {
        let p = pods(&format!(
            "{PH}a,12000,16384,1,1000,,LS,Running,0,125,0\n\
             b,6000,12288,1,460,,LS,Running,42,99,\n\
             c,4000,100,0,0,,BE,Failed,1,2,3\n\
             d,8000,100,8,1000,V100M16|V100M32,LS,Running,1,2,3\n"
        ))
        .unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[0].request, Request::whole(1, 12000, 16384));
        assert_eq!(p[0].deletion_s, Some(125));
        assert_eq!(p[1].request, Request::share_milli(460, 6000, 12288));
        assert_eq!(p[1].scheduled_s, None);
        assert_eq!(p[2].request, Request::cpu_only(4000, 100));
        assert_eq!(p[3].request.gpu, GpuAsk::Whole { count: 8 });
        assert_eq!(p[3].request.constraints.models, ["V100-16GB", "V100-32GB"]);
        let cat = Catalog::default();
        assert!(
            p[3].request
                .constraints
                .model_set
                .contains(cat.find("V100M32").unwrap())
        );
        assert!(
            !p[3]
                .request
                .constraints
                .model_set
                .contains(cat.find("T4").unwrap())
        );
    }

    #[test]
    fn five_column_variant() {
        let p = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1000,10,2,1000\n").unwrap();
        assert_eq!(p[0].request, Request::whole(2, 1000, 10));
        assert_eq!(p[0].creation_s, None);
    }

    #[test]
    fn pod_errors() {
        assert_eq!(
            message(pods("")),
            "pods.csv:0: empty file (expected a header line)"
        );
        assert!(message(pods("a,1,1,1,1000\n")).starts_with("pods.csv:1: missing or wrong header"));
        assert_eq!(
            message(pods(&format!("{PH}a,1,1,1,1000\n"))),
            "pods.csv:2: expected 11 columns as in the header, found 5"
        );
        assert_eq!(
            message(pods(&format!("{PH}a,1,1,1,1001,,LS,Running,0,1,0\n"))),
            "pods.csv:2: gpu_milli: 1001 is more than one GPU (1000)"
        );
        assert_eq!(
            message(pods(&format!("{PH}a,1,-1,1,100,,LS,Running,0,1,0\n"))),
            "pods.csv:2: memory_mib: \"-1\" must not be negative"
        );
        assert_eq!(
            message(pods(&format!("{PH}a,1,1,1,100,,LS,Running,zero,1,0\n"))),
            "pods.csv:2: creation_time: \"zero\" is not a non-negative whole number"
        );
        assert!(
            message(pods(&format!("{PH}a,1,1,1,100,X99,LS,Running,0,1,0\n")))
                .starts_with("pods.csv:2: gpu_spec: ")
        );
        assert!(
            message(pods(&format!("{PH}a,1,1,0,100,,LS,Running,0,1,0\n"))).contains("num_gpu is 0")
        );
        assert_eq!(message(pods(PH)), "pods.csv:1: no pods after the header");
    }

    /// Reads the real files when they are there (they must be under CI).
    #[test]
    fn real_openb_files() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb");
        let nodes_path = dir.join("openb_node_list_gpu_node.csv");
        if !nodes_path.exists() {
            assert!(
                std::env::var("CI").is_err(),
                "{} missing under CI",
                nodes_path.display()
            );
            return;
        }
        let c = load_nodes(&nodes_path).unwrap();
        assert_eq!((c.len(), c.gpu_count()), (1213, 6212));
        let cpu: u64 = c.nodes().iter().map(|n| n.cpu_milli).sum();
        assert_eq!(cpu, 107_018_000);
        let p = load_pods(&dir.join("openb_pod_list_default.csv"), &c.catalog).unwrap();
        assert_eq!(p.len(), 8152);
        let demand: u64 = p.iter().map(|p| p.request.gpu.total_milli()).sum();
        assert_eq!(demand, 6_086_800);
        let p = load_pods(&dir.join("openb_pod_list_multigpu50.csv"), &c.catalog).unwrap();
        assert_eq!(p.len(), 9061);
        let p = load_pods(&dir.join("openb_pod_list_gpuspec33.csv"), &c.catalog).unwrap();
        assert_eq!(
            p.iter()
                .filter(|p| !p.request.constraints.models.is_empty())
                .count(),
            2388
        );
    }
}
