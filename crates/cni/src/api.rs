//! The switch's HTTP API on its Unix socket (docs/switch.md "Live changes"): the same
//! requests an operator sends with `curl --unix-socket`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::error::{code, CniError, Result};

/// The API applies a change within 5 s or answers 504; a little more for the answer.
const TIMEOUT: Duration = Duration::from_secs(8);

pub struct Api {
    socket: PathBuf,
}

/// An answer: its status and body.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_str(&self.body).map_err(|e| {
            CniError::new(code::IO, format!("the switch's API answered non-JSON: {e}"))
        })
    }

    /// The switch's refusal as a CNI error: a 4xx names the field at fault (invalid config),
    /// a 503/504 is a switch starting, stopping or busy (try again).
    pub fn refusal(&self, what: &str) -> CniError {
        let message = serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| self.body.trim().to_string());
        let c = match self.status {
            503 | 504 => code::TRY_AGAIN,
            400..=499 => code::INVALID_CONFIG,
            _ => code::IO,
        };
        CniError::new(c, format!("the switch refused {what}"))
            .with_details(format!("HTTP {}: {message}", self.status))
    }
}

impl Api {
    pub fn new(socket: &Path) -> Api {
        Api {
            socket: socket.to_path_buf(),
        }
    }

    pub fn get(&self, path: &str) -> Result<Answer> {
        self.request("GET", path, "")
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Answer> {
        self.request("POST", path, &body.to_string())
    }

    pub fn delete(&self, path: &str) -> Result<Answer> {
        self.request("DELETE", path, "")
    }

    /// GET `path`, which must answer 200 with JSON.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        let answer = self.get(path)?;
        if !answer.ok() {
            return Err(answer.refusal(&format!("GET {path}")));
        }
        answer.json()
    }

    /// One request on a fresh connection (`Connection: close`: the body ends at EOF).
    fn request(&self, method: &str, path: &str, body: &str) -> Result<Answer> {
        let unreachable = |e: std::io::Error| {
            let socket = self.socket.display();
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                // Not a switch starting: retrying will not help.
                return CniError::new(
                    code::IO,
                    format!("the picnic switch's API at {socket}: {e}"),
                )
                .with_details(
                    "the socket is owner-only (switch.api_socket_mode): run the plugin as root",
                );
            }
            CniError::new(
                code::TRY_AGAIN,
                format!("the picnic switch's API at {socket} does not answer: {e}"),
            )
            .with_details(
                "is the switch running with switch.api set to this path (netconf 'socket')?",
            )
        };
        let mut stream = UnixStream::connect(&self.socket).map_err(unreachable)?;
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(unreachable)?;
        stream
            .set_write_timeout(Some(TIMEOUT))
            .map_err(unreachable)?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: picnic\r\nConnection: close\r\n\
             User-Agent: picnic-cni/{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            env!("CARGO_PKG_VERSION"),
            body.len()
        );
        stream.write_all(request.as_bytes()).map_err(unreachable)?;
        let mut raw = String::new();
        stream.read_to_string(&mut raw).map_err(unreachable)?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                CniError::new(
                    code::IO,
                    format!(
                        "{method} {path}: not an HTTP answer from {}",
                        self.socket.display()
                    ),
                )
            })?;
        Ok(Answer {
            status,
            body: body.to_string(),
        })
    }
}
