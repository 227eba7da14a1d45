//! `cargo xtask nix-breakage`: proof that `nix-check` can fail. Each case breaks a scratch
//! copy of the repository in one way a real `nix flake check` would catch (and that the old
//! stand-ins let through), runs the evaluation steps of `nix-check` on it, and requires a
//! failure whose details contain the expected text. The unbroken repository must pass the
//! same steps, or the failures would prove nothing.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xshell::Shell;

use crate::nix_check::{self, Options};

/// One way to break the flake: in `file`, replace `from` (which must occur) by `to`; the
/// check must then fail mentioning `expect`.
struct Breakage {
    what: &'static str,
    file: &'static str,
    from: &'static str,
    to: &'static str,
    expect: &'static str,
    /// A file the check needs; without it the case is skipped (the BoxLite pins arrive with
    /// the backend crate).
    needs: Option<&'static str>,
}

const CASES: &[Breakage] = &[
    Breakage {
        what: "a misspelt NixOS option in a guest image module",
        file: "vm-images/lima-guest.nix",
        from: "security.sudo.wheelNeedsPassword = false;",
        to: "security.sudo.wheelNeedPassword = false;",
        expect: "security.sudo.wheelNeedPassword' does not exist",
        needs: None,
    },
    Breakage {
        what: "a misspelt NixOS option in a VM test node",
        file: "tests/vm/escape.nix",
        from: "users.users.alice.isNormalUser = true;",
        to: "users.users.alice.isNormaUser = true;",
        expect: "isNormaUser' does not exist",
        needs: None,
    },
    Breakage {
        what: "a misspelt option of the sandbox module",
        file: "tests/vm/home-manager.nix",
        from: "read_folders = [ \"~/reference\" ];",
        to: "read_folder = [ \"~/reference\" ];",
        expect: "settings.read_folder' does not exist",
        needs: None,
    },
    Breakage {
        what: "a nonexistent package",
        file: "vm-images/box-image.nix",
        from: "[ pkgs.skopeo pkgs.jq ]",
        to: "[ pkgs.skopeo-cli pkgs.jq ]",
        expect: "attribute 'skopeo-cli' missing",
        needs: None,
    },
    Breakage {
        what: "a misspelt crane argument",
        file: "nix/packages.nix",
        from: "cargoClippyExtraArgs = ",
        to: "cargoClipyExtraArgs = ",
        expect: "unknown argument(s) cargoClipyExtraArgs",
        needs: None,
    },
    Breakage {
        what: "a misspelt runNixOSTest argument",
        file: "tests/vm/tool-paths.nix",
        from: "globalTimeout = ",
        to: "globalTimout = ",
        expect: "globalTimout' does not exist",
        needs: None,
    },
    Breakage {
        what: "a wrong getExe' binary name",
        file: "nix/packages.nix",
        from: "lib.getExe' nono \"nono\"",
        to: "lib.getExe' nono \"nono-cli\"",
        expect: "has no bin/nono-cli",
        needs: None,
    },
    Breakage {
        what: "a Python syntax error in a VM test script",
        file: "tests/vm/escape.nix",
        from: "    def protected_state():",
        to: "    def protected_state()",
        expect: "SyntaxError",
        needs: None,
    },
    Breakage {
        what: "a file a test reads left out of the crane source",
        file: "flake.nix",
        from: "          ./crates\n",
        to: "          ./crates/sandbox-cli/src\n          ./crates/sandbox-cli/Cargo.toml\n          ./crates/sandbox-exec\n          ./crates/sandbox-git\n          ./crates/sandbox-host\n          ./crates/sandbox-policy\n          ./crates/sandbox-protocol\n          ./crates/sandbox-service\n",
        expect: "crates/sandbox-cli/schema",
        needs: None,
    },
    Breakage {
        what: "the BoxLite variant's wrapper without its runtime files",
        file: "nix/packages.nix",
        from: "SANDBOX_BOXLITE_RUNTIME = \"${boxlite-runtime}\";",
        to: "",
        expect: "sets SANDBOX_BOXLITE_RUNTIME to nothing",
        needs: None,
    },
    Breakage {
        what: "the BoxLite VM test no longer scheduled on a KVM builder",
        file: "tests/vm/boxlite-escape.nix",
        from: "pkgs.lib.unique (old.requiredSystemFeatures ++ [ \"nixos-test\" \"kvm\" ])",
        to: "[ \"nixos-test\" ]",
        expect: "vm-boxlite-escape does not require the kvm system feature",
        needs: None,
    },
    Breakage {
        what: "a misspelt dockerTools argument in the box image",
        file: "vm-images/box-image.nix",
        from: "fakeRootCommands = ",
        to: "fakeRootCommand = ",
        expect: "unknown argument(s) fakeRootCommand",
        needs: None,
    },
    Breakage {
        what: "the flake cutting a BoxLite runtime file at another offset than the pins",
        file: "nix/boxlite-runtime.nix",
        from: "offset = 78719004;",
        to: "offset = 78719005;",
        expect: "only the flake has mke2fs at 78719005",
        needs: Some("crates/sandbox-boxlite/src/runtime_files.rs"),
    },
    Breakage {
        what: "the module's settings schema out of step with the CLI's cases",
        file: "crates/sandbox-cli/schema/config-schema.json",
        from: "\"pattern\": \"/.*|~|~/.*\"",
        to: "\"pattern\": \"/.*\"",
        expect: "tilde path (CLI: valid)",
        needs: None,
    },
];

pub fn run() -> Result<bool> {
    let root = nix_check::workspace_root()?;
    let sh = Shell::new()?;
    let options = Options {
        ci: true,
        quiet: true,
        evaluation_only: true,
        lib_base: root.clone(),
    };

    // The control: the unbroken repository passes the same steps.
    let control = nix_check::run(&root, &options)?;
    if control.failed > 0 || control.passed == 0 {
        println!(
            "FAILED: the unbroken repository does not pass the evaluation steps, so a failure \
             below would prove nothing:\n{}",
            control.failures.join("\n")
        );
        return Ok(false);
    }
    println!(
        "ok: control: the unbroken repository passes ({} steps)",
        control.passed
    );

    let mut all_caught = true;
    let mut skipped = 0;
    for case in CASES {
        if let Some(needed) = case.needs.filter(|f| !root.join(f).is_file()) {
            println!(
                "skipped: {} ({}): {needed} is not in this tree",
                case.what, case.file
            );
            skipped += 1;
            continue;
        }
        match check(&sh, &root, case, &options) {
            Ok(()) => println!("ok: caught: {} ({})", case.what, case.file),
            Err(err) => {
                all_caught = false;
                println!("FAILED: not caught: {} ({}): {err:#}", case.what, case.file);
            }
        }
    }
    println!(
        "nix-breakage: {} cases, {}{}",
        CASES.len(),
        if all_caught {
            "all run caught"
        } else {
            "some NOT caught"
        },
        if skipped > 0 {
            format!(", {skipped} skipped")
        } else {
            String::new()
        }
    );
    Ok(all_caught)
}

fn check(sh: &Shell, root: &Path, case: &Breakage, options: &Options) -> Result<()> {
    let copy = nix_check::flake_copy(sh, root)?;
    let file = copy.path().join(case.file);
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", case.file))?;
    if !text.contains(case.from) {
        bail!(
            "{} no longer contains {:?}; update the case",
            case.file,
            case.from
        );
    }
    std::fs::write(&file, text.replacen(case.from, case.to, 1))?;
    let summary = nix_check::run(copy.path(), options)?;
    if summary.failed == 0 {
        bail!("nix-check passed the broken copy");
    }
    let details = summary.failures.join("\n");
    if !details.contains(case.expect) {
        bail!(
            "nix-check failed, but not with {:?}:\n{details}",
            case.expect
        );
    }
    Ok(())
}
