//! Files host tools run (`.vscode`, `.mcp.json`, `.claude/…`): read-only by default, opened by
//! `--allow-write`, and every one the run created or changed reported with the grant that
//! would have allowed it — on stderr and in `--report-json`, as root and as `nobody`. The
//! attacks themselves are the escape suite's `hostfiles` family.

use std::path::Path;
use std::process::Output;

use crate::common;
use sandbox_testkit::nobody::UserDirs;

const WRITES: &str = "echo '{\"tasks\":[]}' > .vscode/tasks.json; echo vscode=$?; \
                      echo '{}' > .mcp.json; echo mcp=$?";

fn project(work: &Path) {
    std::fs::create_dir_all(work.join(".vscode")).unwrap();
    std::fs::write(work.join(".vscode/settings.json"), "{}\n").unwrap();
    std::fs::write(work.join("main.c"), "int main(void){return 0;}\n").unwrap();
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Without a grant: the write to the existing `.vscode` is refused inside (the view binds it
/// read-only), the new `.mcp.json` is set aside after the run, and the report names
/// `--allow-write .mcp.json`. With `--allow-write .vscode --allow-write .mcp.json` (one
/// existing, one not yet): both are written and kept, nothing reported.
fn grants_open_them(run: &dyn Fn(&[&str]) -> Output, work: &Path, report: &Path) {
    let out = run(&[
        "--report-json",
        report.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        WRITES,
    ]);
    let text = common::text(&out);
    assert!(out.status.success(), "{text}");
    assert!(!work.join(".vscode/tasks.json").exists(), "{text}");
    assert!(
        !stdout(&out).contains("vscode=0"),
        "the write was refused: {text}"
    );
    assert!(!work.join(".mcp.json").exists(), "set aside: {text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("host files: the run created")
            && stderr.contains("--allow-write .mcp.json"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    let change = &json["hostFiles"]["changes"][0];
    assert_eq!(change["grant"], "--allow-write .mcp.json", "{json:#}");
    assert_eq!(change["change"], "created", "{json:#}");
    let aside = Path::new(change["movedTo"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(aside).unwrap(),
        "{}\n",
        "kept aside"
    );

    let out = run(&[
        "--allow-write",
        ".vscode",
        "--allow-write",
        ".mcp.json",
        "--report-json",
        report.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        WRITES,
    ]);
    let text = common::text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        stdout(&out).contains("vscode=0") && stdout(&out).contains("mcp=0"),
        "{text}"
    );
    assert!(work.join(".vscode/tasks.json").exists(), "{text}");
    assert!(work.join(".mcp.json").exists(), "{text}");
    assert!(!text.contains("host files:"), "{text}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    assert_eq!(
        json["hostFiles"]["changes"],
        serde_json::json!([]),
        "{json:#}"
    );
}

#[test]
fn a_grant_opens_a_protected_path_and_the_report_names_it() {
    let env = common::Env::new();
    let work = env.work();
    project(&work);
    let report = env.path().join("report.json");
    let run = |args: &[&str]| {
        env.cmd()
            .current_dir(&work)
            .args(["run", "--backend", "native"])
            .args(args)
            .output()
            .unwrap()
    };
    grants_open_them(&run, &work, &report);
}

/// The same as an unprivileged user, whose view is built in a user namespace it owns and
/// whose after-run check works with its own rights.
#[test]
fn a_grant_opens_a_protected_path_for_an_unprivileged_user() {
    if nix::unistd::geteuid().is_root() && !Path::new(sandbox_testkit::nobody::SETPRIV).exists() {
        common::skip("setpriv", "setpriv is missing");
        return;
    }
    let env = common::Env::new();
    let user = UserDirs::new(env.path(), "u", common::BIN, true);
    let as_user = |args: &[&str]| user.command(args).output().unwrap();
    let made = as_user(&[
        "sh",
        "-c",
        "mkdir .vscode && echo '{}' > .vscode/settings.json && echo ok",
    ]);
    assert!(stdout(&made).contains("ok"), "{}", common::text(&made));
    let policy = as_user(&[user.bin_str(), "policy", "show"]);
    if !stdout(&policy).contains("private view") {
        common::skip(
            "unprivileged-private-view",
            "no private view for an unprivileged user here",
        );
        return;
    }
    let report = user.run.join("report.json");
    let run = |args: &[&str]| {
        let mut argv = vec![user.bin_str(), "run", "--backend", "native"];
        argv.extend_from_slice(args);
        as_user(&argv)
    };
    grants_open_them(&run, &user.work, &report);
}
