//! Trace formats, one module each, all reading `impl BufRead` and yielding the
//! shared [`TracePod`] type.

pub mod openb;

use tessera_core::request::Request;

/// One pod of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePod {
    pub name: String,
    pub request: Request,
    /// Seconds from the trace start; `None` when the format has no times.
    pub creation_s: Option<u64>,
    pub deletion_s: Option<u64>,
    pub scheduled_s: Option<u64>,
}

/// A trace file that could not be read. Parse errors carry `file:line`.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}:{line}: {message}")]
    Parse {
        file: String,
        line: u64,
        message: String,
    },
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}
