//! How much disk a private home and its cache layers take.

use std::path::Path;

/// The disk a directory takes, in bytes (allocated blocks; links not followed, each inode
/// once): [`crate::beneath::Dir::disk_usage`] of it, 0 if it cannot be opened.
pub fn disk_usage(dir: &Path) -> u64 {
    crate::beneath::Dir::open(dir).map_or(0, |d| d.disk_usage())
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
