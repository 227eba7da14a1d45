//! How much disk a private home and its cache layers take.

use std::path::Path;

/// The disk a directory takes, in bytes (allocated blocks; links not followed, each inode
/// once).
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let Ok(m) = e.metadata() else { continue };
            if seen.insert((m.dev(), m.ino())) {
                total += m.blocks() * 512;
            }
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// `1.2 GiB`, `340 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
