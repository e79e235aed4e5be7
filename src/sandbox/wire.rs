//! The sandbox worker's wire: JSON lines between the runtime and a worker
//! process (`adf __sandbox`) over its stdin and stdout. The runtime asks a
//! worker to run code; while it runs, the worker asks the runtime to serve
//! `adf.*` calls, one at a time, and finally reports the outcome.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Runtime → worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToWorker {
    Run(RunReq),
    /// The answer to a `Call`.
    Reply {
        call: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ok: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        err: Option<CallError>,
    },
}

/// One piece of work.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReq {
    pub id: u64,
    /// Start from a new realm (cold); otherwise globals and loaded
    /// modules of earlier runs are kept (warm).
    pub fresh: bool,
    /// Inline code (`sys_code`): statements, or a body with `await`/`return`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A lambda: a module to load (once per content hash when warm) and a
    /// function of it to call with `args`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<ModuleReq>,
    #[serde(default)]
    pub args: Value,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ModuleReq {
    /// The file's path, for messages.
    pub path: String,
    /// Content hash of `source` (a warm worker reuses the loaded module).
    pub hash: String,
    /// JavaScript after type stripping and import/export rewriting: the
    /// body of an async function that returns the exported names.
    pub source: String,
    pub function: String,
}

/// An `adf.*` call refused or failed, thrown into JS as an `Error` with
/// this `code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallError {
    pub code: String,
    pub message: String,
}

impl CallError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        CallError { code: code.into(), message: message.into() }
    }
}

/// Worker → runtime.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FromWorker {
    Ready,
    Call {
        call: u64,
        method: String,
        args: Value,
    },
    Done {
        id: u64,
        /// The value returned (absent for `undefined`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<CallError>,
        /// `console.*` output, one entry per call (`[warn] …`, `[error] …`).
        #[serde(default)]
        logs: Vec<String>,
    },
}
