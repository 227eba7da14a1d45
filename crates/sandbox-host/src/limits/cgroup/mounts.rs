//! Where the cgroup hierarchies are: `/proc/self/mountinfo`'s cgroup mounts and this
//! process's groups in `/proc/self/cgroup`, parsed as the kernel writes them.

use std::path::PathBuf;

/// One mount of a cgroup hierarchy: where, the path inside the hierarchy it shows, and its
/// kind (`cgroup2`, or the v1 controllers it carries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    pub root: String,
    pub v2: bool,
    pub controllers: Vec<String>,
    pub read_only: bool,
}

/// The cgroup mounts of `/proc/self/mountinfo`'s text.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split_whitespace().collect();
            let mut right = right.split_whitespace();
            let fstype = right.next()?;
            let _source = right.next()?;
            let super_opts = right.next().unwrap_or("");
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let opts = fields.get(5).copied().unwrap_or("");
            Some(CgroupMount {
                root: fields.get(3)?.to_string(),
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                v2,
                controllers: if v2 {
                    Vec::new()
                } else {
                    super_opts.split(',').map(str::to_string).collect()
                },
                read_only: opts.split(',').any(|o| o == "ro"),
            })
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
pub(super) fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Some(n) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
            {
                out.push(n);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/proc/self/cgroup`'s lines: `(hierarchy controllers, path)`; v2's has no controllers.
pub fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            Some((
                controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path.to_string(),
            ))
        })
        .collect()
}
