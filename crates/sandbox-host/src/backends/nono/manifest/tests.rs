#[test]
fn nono_is_refused_below_landlock_abi_6_with_the_reason() {
    for abi in 0..6 {
        let why = kernel_refusal(abi).expect("refused");
        assert!(
            why.contains("ABI 6") && why.contains(&format!("ABI {abi}")),
            "{why}"
        );
    }
    for abi in 6..=9 {
        assert_eq!(kernel_refusal(abi), None);
    }
}

use super::*;

#[test]
fn versions_parse_and_compare() {
    assert_eq!(parse_version("nono 0.81.0"), Some((0, 81, 0)));
    assert_eq!(parse_version("nono 1.2.3-rc1"), Some((1, 2, 3)));
    assert_eq!(parse_version("0.9"), Some((0, 9, 0)));
    assert_eq!(parse_version("nono"), None);
    assert!(parse_version("nono 0.80.9").unwrap() < MIN_VERSION);
    assert!(parse_version("nono 0.81.0").unwrap() >= MIN_VERSION);
    assert!(parse_version("nono 1.0.0").unwrap() >= MIN_VERSION);
}

#[test]
fn file_marker_reports_only_once_created_and_names_are_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let m = StartMarker::file(dir.path());
    let StartMarker::File { path } = &m else {
        unreachable!()
    };
    assert!(path.starts_with(dir.path()));
    assert!(!m.fired());
    std::fs::write(path, "").unwrap();
    assert!(m.fired());
    let StartMarker::File { path: other } = StartMarker::file(dir.path()) else {
        unreachable!()
    };
    assert_ne!(&other, path);
}

#[test]
fn pipe_marker_reports_only_after_a_write() {
    let m = StartMarker::pipe().unwrap();
    assert!(!m.fired());
    let StartMarker::Pipe { write, .. } = &m else {
        unreachable!()
    };
    nix::unistd::write(write, b"1").unwrap();
    assert!(m.fired());
}

#[test]
fn nono_variables_are_recognised() {
    assert!(is_nono_variable(OsStr::new("NONO_ALLOW")));
    assert!(!is_nono_variable(OsStr::new("NONOX")));
    assert!(!is_nono_variable(OsStr::new("PATH")));
}
