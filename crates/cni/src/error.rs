//! The CNI spec's error object (`{"cniVersion", "code", "msg", "details"}`, SPEC.md "Error"),
//! printed on stdout with a non-zero exit.

use serde::Serialize;

/// Well-known error codes of the CNI spec, and picnic's own (100 and up).
pub mod code {
    /// The netconf's `cniVersion` is not one this plugin speaks.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// The container (its network namespace) does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// A `CNI_*` environment variable is missing or malformed.
    pub const INVALID_ENV: u32 = 4;
    /// Reading stdin, running `ip` or a delegated plugin failed.
    pub const IO: u32 = 5;
    /// stdin is not JSON of the netconf's shape.
    pub const DECODE: u32 = 6;
    /// The netconf is JSON but says something picnic cannot do, or the switch refused it.
    pub const INVALID_CONFIG: u32 = 7;
    /// The switch's API is not answering now (not started, restarting, busy).
    pub const TRY_AGAIN: u32 = 11;
    /// STATUS: the plugin cannot add pods now (the switch is not answering).
    pub const NOT_AVAILABLE: u32 = 50;
    /// CHECK: the pod's attachment is not what ADD made.
    pub const DRIFT: u32 = 100;
}

/// An error as the spec's error object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The error object the runtime reads on stdout.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("an error serializes");
        v["cniVersion"] = cni_version.into();
        v
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

pub type Result<T> = std::result::Result<T, CniError>;
