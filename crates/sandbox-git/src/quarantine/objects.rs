//! Objects in the quarantine: the host takes each new object from the sandbox's layer by
//! content, never by file. A loose object is inflated as a stream (bounded memory whatever
//! its size) and written with the host's own hash
//! (an object whose file name lies is rejected); a pack is copied, re-indexed by libgit2
//! (which hashes every object itself) and its new objects written the same way. An object
//! the store already has is skipped, so none is ever replaced.

use std::io::Read;
use std::path::Path;

use git2::{ObjectType, Odb, Oid};

use super::error::QuarantineError;
use super::refs::open_untrusted;
use super::report::RejectedObject;
use super::State;

/// Larger objects are rejected: a small loose file that inflates without end would otherwise
/// keep the host inflating and writing (memory stays bounded: objects are streamed).
const MAX_OBJECT_BYTES: u64 = 4 << 30;

pub(crate) fn import(
    upper: &Path,
    odb: &Odb,
    scratch: &Path,
    state: &mut State,
    last: bool,
) -> Result<(), QuarantineError> {
    let objects = upper.join("objects");
    let Ok(fanout) = std::fs::read_dir(&objects) else {
        return Ok(());
    };
    for dir in fanout.flatten() {
        let Some(prefix) = dir.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if prefix == "pack" {
            import_packs(upper, &dir.path(), odb, scratch, state, last)?;
            continue;
        }
        if prefix.len() != 2 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for file in files.flatten() {
            let Some(rest) = file.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let name = format!("{prefix}{rest}");
            if state.seen_objects.contains(&name) {
                continue;
            }
            // git writes `tmp_obj_*` and renames it into place: only final names count.
            let Ok(oid) = Oid::from_str(&name).map(|o| (name.len() == 40).then_some(o)) else {
                continue;
            };
            let Some(oid) = oid else { continue };
            let path = format!("objects/{prefix}/{rest}");
            // A whiteout: the sandbox deleted (pruned, packed) an object of the host's. The
            // host's store keeps it; nothing to take in.
            if odb.exists(oid) || is_whiteout(&file.path()) {
                state.seen_objects.insert(name);
                continue;
            }
            match stream_loose(upper, &file.path(), odb) {
                Ok(written) => {
                    if written == oid {
                        state.report.objects_imported += 1;
                    } else {
                        // `written` is a real object now, under its true name: harmless.
                        state.report.rejected_objects.push(RejectedObject {
                            path,
                            reason: format!("its content hashes to {written}, not to its name"),
                        });
                    }
                    state.seen_objects.insert(name);
                }
                Err(reason) if last => {
                    state
                        .report
                        .rejected_objects
                        .push(RejectedObject { path, reason });
                    state.seen_objects.insert(name);
                }
                // Possibly still being written: the next pass looks again.
                Err(_) => {}
            }
        }
    }
    Ok(())
}

/// Whether `path` of the layer is an overlay whiteout (a deletion).
fn is_whiteout(path: &Path) -> bool {
    path.symlink_metadata()
        .is_ok_and(|m| super::refs::is_whiteout(&m))
}

/// Whether the layer holds an object or pack not handled yet.
pub(crate) fn any_new(upper: &Path, state: &State) -> bool {
    let Ok(fanout) = std::fs::read_dir(upper.join("objects")) else {
        return false;
    };
    fanout.flatten().any(|dir| {
        let prefix = dir.file_name().to_string_lossy().into_owned();
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            return false;
        };
        files.flatten().any(|file| {
            let name = file.file_name().to_string_lossy().into_owned();
            match prefix.as_str() {
                "pack" => name.ends_with(".pack") && !state.seen_packs.contains(&name),
                "info" => false,
                _ => !state.seen_objects.contains(&format!("{prefix}{name}")),
            }
        })
    })
}

/// Inflates a loose object (`<type> <size>\0<body>`) into the store as a stream: the host
/// holds one buffer of it at a time, whatever the object's size, and the store (libgit2's
/// loose backend) hashes and writes it as it goes. Nothing lands in the store unless the
/// whole object matches its header. Returns the object's true id.
fn stream_loose(upper: &Path, path: &Path, odb: &Odb) -> Result<Oid, String> {
    let file = open_untrusted(upper, path).map_err(|e| e.to_string())?;
    let mut inflated = flate2::read::ZlibDecoder::new(std::io::BufReader::new(file));
    let mut header = Vec::with_capacity(32);
    loop {
        let mut byte = [0u8];
        inflated
            .read_exact(&mut byte)
            .map_err(|e| format!("it does not inflate to an object header ({e})"))?;
        match byte[0] {
            0 => break,
            _ if header.len() >= 32 => return Err("it has no object header".into()),
            b => header.push(b),
        }
    }
    let header = std::str::from_utf8(&header).map_err(|_| "a garbled header")?;
    let (kind, size) = header.split_once(' ').ok_or("a garbled header")?;
    let kind = match kind {
        "commit" => ObjectType::Commit,
        "tree" => ObjectType::Tree,
        "blob" => ObjectType::Blob,
        "tag" => ObjectType::Tag,
        other => return Err(format!("an unknown object type {other:?}")),
    };
    let size: u64 = size.parse().map_err(|_| "a garbled size")?;
    if size > MAX_OBJECT_BYTES {
        return Err(format!(
            "its header says {size} bytes, above the limit of {MAX_OBJECT_BYTES}"
        ));
    }
    let mut writer = odb
        .writer(size as usize, kind)
        .map_err(|e| format!("the store refused a stream ({})", e.message()))?;
    let copied = std::io::copy(&mut (&mut inflated).take(size), &mut writer)
        .map_err(|e| format!("it does not inflate ({e})"))?;
    let mut more = [0u8];
    let trailing = inflated.read(&mut more).unwrap_or(0);
    if copied != size || trailing != 0 {
        // Dropping the writer throws its temporary file away.
        return Err(format!(
            "its header says {size} bytes, it holds {}",
            if trailing != 0 {
                "more".to_string()
            } else {
                copied.to_string()
            }
        ));
    }
    writer
        .finalize()
        .map_err(|e| format!("writing it into the store ({})", e.message()))
}

/// New packs (a `git gc` or `repack` inside): each is copied out of the layer, indexed by the
/// host, and its objects the store lacks are written in.
fn import_packs(
    upper: &Path,
    dir: &Path,
    odb: &Odb,
    scratch: &Path,
    state: &mut State,
    last: bool,
) -> Result<(), QuarantineError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".pack") else {
            continue;
        };
        // A whiteout: the sandbox deleted (repacked) a pack of the host's, which the host
        // keeps.
        if is_whiteout(&entry.path()) {
            state.seen_packs.insert(name.clone());
            continue;
        }
        // git renames the index into place after the pack: until then it is being written.
        if state.seen_packs.contains(&name) || (!dir.join(format!("{stem}.idx")).exists() && !last)
        {
            continue;
        }
        state.seen_packs.insert(name.clone());
        if let Err(reason) = import_pack(upper, &entry.path(), odb, scratch, state) {
            state.report.rejected_objects.push(RejectedObject {
                path: format!("objects/pack/{name}"),
                reason,
            });
        }
    }
    Ok(())
}

fn import_pack(
    upper: &Path,
    pack: &Path,
    odb: &Odb,
    scratch: &Path,
    state: &mut State,
) -> Result<(), String> {
    // An object directory of its own (`<scratch>/pack/`), read back as an alternate.
    let _ = std::fs::remove_dir_all(scratch);
    let packs = scratch.join("pack");
    std::fs::create_dir_all(&packs).map_err(|e| e.to_string())?;
    // Streamed into the indexer: the pack is never held in memory whole.
    let file = open_untrusted(upper, pack).map_err(|e| e.to_string())?;
    let mut indexer =
        git2::Indexer::new(Some(odb), &packs, 0o644, true).map_err(|e| e.message().to_string())?;
    std::io::copy(&mut file.take(MAX_OBJECT_BYTES), &mut indexer)
        .map_err(|e| format!("it does not index ({e})"))?;
    indexer
        .commit()
        .map_err(|e| format!("it does not index ({})", e.message()))?;
    let indexed = Odb::new().map_err(|e| e.message().to_string())?;
    indexed
        .add_disk_alternate(scratch.to_str().ok_or("a scratch path that is not UTF-8")?)
        .map_err(|e| e.message().to_string())?;
    let mut ids = Vec::new();
    indexed
        .foreach(|oid| {
            ids.push(*oid);
            true
        })
        .map_err(|e| e.message().to_string())?;
    for oid in ids {
        if odb.exists(oid) {
            continue;
        }
        let object = indexed.read(oid).map_err(|e| e.message().to_string())?;
        let written = odb
            .write(object.kind(), object.data())
            .map_err(|e| e.message().to_string())?;
        if written == oid {
            state.report.objects_imported += 1;
        }
    }
    let _ = std::fs::remove_dir_all(scratch);
    Ok(())
}
