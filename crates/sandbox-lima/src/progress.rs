//! Lima's own event stream, turned into the named steps of the seed's spawn dialog. `limactl
//! --log-format json start` writes one logrus JSON object per line on stderr, and relays the
//! host agent's log (`ha.stderr.log`) with the prefix `[hostagent] `; the messages matched
//! here are Lima's (pkg/instance/start.go, pkg/hostagent/requirements.go,
//! pkg/fileutils/download.go).

use serde::Deserialize;

/// The named steps of bringing a VM up. Lima 2.2's `limactl create` fetches the image
/// (`cmd/limactl/start.go` runs `instance.Prepare`), so a new VM's steps come as create,
/// download, start, SSH, provisioning (seen with the real `limactl`, docs/lima.md); `start`
/// logs `Starting the instance` before a `Prepare` of its own, which downloads only when the
/// instance has no disk yet — hence download after start in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VmStep {
    Check,
    Create,
    Start,
    Download,
    Ssh,
    Provision,
    Launch,
}

impl VmStep {
    pub fn name(self) -> &'static str {
        match self {
            VmStep::Check => "checking the VM",
            VmStep::Create => "creating the VM",
            VmStep::Download => "downloading the image",
            VmStep::Start => "starting the VM",
            VmStep::Ssh => "connecting over SSH",
            VmStep::Provision => "provisioning",
            VmStep::Launch => "launching",
        }
    }
}

/// One line of Lima's JSON log.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LogLine {
    pub level: String,
    pub msg: String,
    #[serde(default)]
    pub time: Option<String>,
}

/// Parses one line; Lima's text format (`time=… level=info msg="…"`) is read as well, for
/// output that did not come with `--log-format json`.
pub fn parse_line(line: &str) -> Option<LogLine> {
    let line = line.trim();
    if line.starts_with('{') {
        return serde_json::from_str(line).ok();
    }
    let level = field(line, "level")?;
    let msg = field(line, "msg").unwrap_or_default();
    Some(LogLine {
        level,
        msg,
        time: field(line, "time"),
    })
}

/// A `key=value` or `key="quoted \" value"` field of logrus's text format.
fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.extend(chars.next()),
                '"' => return Some(out),
                c => out.push(c),
            }
        }
        Some(out)
    } else {
        Some(rest.split_whitespace().next().unwrap_or("").to_string())
    }
}

/// What a line means for the progress display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// A step began.
    Step(VmStep),
    /// The VM is up (`READY.`).
    Ready,
    /// Lima's `DEGRADED.` warning.
    Degraded(String),
    /// An error or fatal line.
    Error(String),
    /// Anything else (shown in verbose logs only).
    Other,
}

/// Classifies one log line.
pub fn classify(line: &LogLine) -> Signal {
    let msg = line.msg.strip_prefix("[hostagent] ").unwrap_or(&line.msg);
    if matches!(line.level.as_str(), "error" | "fatal" | "panic") {
        return Signal::Error(msg.to_string());
    }
    if msg.starts_with("DEGRADED.") {
        return Signal::Degraded(msg.to_string());
    }
    if msg.starts_with("READY.") {
        return Signal::Ready;
    }
    if msg.starts_with("Attempting to download the image") || msg.starts_with("Using cache") {
        return Signal::Step(VmStep::Download);
    }
    if msg.starts_with("Starting the instance") {
        return Signal::Step(VmStep::Start);
    }
    if msg.starts_with("Waiting for the essential requirement") && msg.contains("ssh") {
        return Signal::Step(VmStep::Ssh);
    }
    if msg.starts_with("Waiting for the final requirement")
        || msg.starts_with("Cloud-init provisioning started")
    {
        return Signal::Step(VmStep::Provision);
    }
    Signal::Other
}

/// What went wrong, judged from a failed step's log lines (errors first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    NoVirtualization(String),
    ImageDownload(String),
    Provisioning(String),
    Degraded(String),
    Other(String),
}

/// Maps the error lines of a failed `limactl start`/`create` to a failure.
pub fn judge_failure(lines: &[LogLine]) -> Failure {
    let errors: Vec<&str> = lines
        .iter()
        .filter(|l| {
            matches!(l.level.as_str(), "error" | "fatal" | "panic") || l.msg.contains("DEGRADED.")
        })
        .map(|l| l.msg.as_str())
        .collect();
    let all = errors.join("; ");
    let last = errors.last().copied().unwrap_or("").to_string();
    let has = |needle: &str| errors.iter().any(|e| e.contains(needle));
    if has("DEGRADED.") || has("degraded, status=") {
        Failure::Degraded(last)
    } else if lines
        .iter()
        .any(|l| l.msg.contains("/dev/kvm is not available"))
        || has("Virtualization")
        || has("HVF")
    {
        Failure::NoVirtualization(last)
    } else if has("failed to download")
        || has("download the image")
        || has("no images are configured")
    {
        Failure::ImageDownload(last)
    } else if has("boot scripts must have finished") || has("provision") {
        Failure::Provisioning(all)
    } else {
        Failure::Other(if last.is_empty() {
            "no error message".into()
        } else {
            last
        })
    }
}
