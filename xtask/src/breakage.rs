//! `cargo xtask nix-breakage`: proof that `nix-check` can fail. Each case breaks a scratch
//! copy of the repository in one way, runs the evaluation steps of `nix-check` on it (builder
//! scripts included), and requires a failure whose details contain the expected text. The
//! unbroken repository must pass the same steps, or the failures would prove nothing.
//!
//! Most cases are mistakes a real `nix flake check` (or `nix build`) fails on, because the
//! stand-ins do what upstream does at the pinned revisions. Those marked `lint: true` are
//! caught only because nix-check is stricter than upstream (crane and most nixpkgs builders
//! pass an unknown argument on to mkDerivation): a real check would let them through.

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
    /// Caught by a lint of nix-check that is stricter than upstream, not by what upstream does.
    lint: bool,
    /// Caught by running a builder script: only these cases run the (slow: the BoxLite wheel
    /// is unpacked each time) builder scripts step; the control runs it too.
    scripts: bool,
}

const CASES: &[Breakage] = &[
    Breakage {
        what: "a misspelt NixOS option in a guest image module",
        file: "vm-images/lima-guest.nix",
        from: "security.sudo.wheelNeedsPassword = false;",
        to: "security.sudo.wheelNeedPassword = false;",
        expect: "security.sudo.wheelNeedPassword' does not exist",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a misspelt NixOS option in a VM test node",
        file: "tests/vm/escape.nix",
        from: "users.users.alice.isNormalUser = true;",
        to: "users.users.alice.isNormaUser = true;",
        expect: "isNormaUser' does not exist",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a misspelt option of the sandbox module",
        file: "tests/vm/home-manager.nix",
        from: "read_folders = [ \"~/reference\" ];",
        to: "read_folder = [ \"~/reference\" ];",
        expect: "settings.read_folder' does not exist",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a nonexistent package",
        file: "vm-images/box-image.nix",
        from: "[ pkgs.skopeo pkgs.jq ]",
        to: "[ pkgs.skopeo-cli pkgs.jq ]",
        expect: "attribute 'skopeo-cli' missing",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a misspelt crane argument (real crane passes it to mkDerivation)",
        file: "nix/packages.nix",
        from: "cargoClippyExtraArgs = ",
        to: "cargoClipyExtraArgs = ",
        expect: "lint (stricter than upstream): crane.cargoClippy: cargoClipyExtraArgs is not an argument crane takes",
        needs: None,
        lint: true,
        scripts: false,
    },
    Breakage {
        what: "a misspelt runNixOSTest argument",
        file: "tests/vm/tool-paths.nix",
        from: "globalTimeout = ",
        to: "globalTimout = ",
        expect: "globalTimout' does not exist",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a wrong getExe' binary name (upstream only the VM test that runs it fails)",
        file: "nix/packages.nix",
        from: "lib.getExe' nono \"nono\"",
        to: "lib.getExe' nono \"nono-cli\"",
        expect: "has no bin/nono-cli",
        needs: None,
        lint: true,
        scripts: false,
    },
    Breakage {
        what: "a Python syntax error in a VM test script",
        file: "tests/vm/escape.nix",
        from: "    def protected_state():",
        to: "    def protected_state()",
        expect: "SyntaxError",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a file a test reads left out of the crane source",
        file: "flake.nix",
        from: "          ./crates\n",
        to: "          ./crates/sandbox-cli/src\n          ./crates/sandbox-cli/Cargo.toml\n          ./crates/sandbox-exec\n          ./crates/sandbox-git\n          ./crates/sandbox-host\n          ./crates/sandbox-policy\n          ./crates/sandbox-protocol\n          ./crates/sandbox-service\n",
        expect: "crates/sandbox-cli/schema",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "the BoxLite variant's wrapper without its runtime files",
        file: "nix/packages.nix",
        from: "SANDBOX_BOXLITE_RUNTIME = \"${boxlite-runtime}\";",
        to: "",
        expect: "sets SANDBOX_BOXLITE_RUNTIME to nothing",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "the BoxLite VM test no longer scheduled on a KVM builder",
        file: "tests/vm/boxlite-escape.nix",
        from: "pkgs.lib.unique (old.requiredSystemFeatures ++ [ \"nixos-test\" \"kvm\" ])",
        to: "[ \"nixos-test\" ]",
        expect: "vm-boxlite-escape does not require the kvm system feature",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a misspelt dockerTools argument in the box image",
        file: "vm-images/box-image.nix",
        from: "fakeRootCommands = ",
        to: "fakeRootCommand = ",
        expect: "unknown argument(s) fakeRootCommand",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "the flake cutting a BoxLite runtime file at another offset than the pins",
        file: "nix/boxlite-runtime.nix",
        from: "offset = 78719004;",
        to: "offset = 78719005;",
        expect: "only the flake has mke2fs at 78719005",
        needs: Some("crates/sandbox-boxlite/src/runtime_files.rs"),
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "the module's settings schema out of step with the CLI's cases",
        file: "crates/sandbox-cli/schema/config-schema.json",
        from: "\"pattern\": \"/.*|~|~/.*\"",
        to: "\"pattern\": \"/.*\"",
        expect: "tilde path (CLI: valid)",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a pipe that SIGPIPEs under stdenv's pipefail (tail | head in the BoxLite runtime's builder)",
        file: "nix/boxlite-runtime.nix",
        from: "dd if=module.so of=\"$out/${f.name}\" bs=1M iflag=skip_bytes,count_bytes \\\n      skip=${toString f.offset} count=${toString f.size} status=none",
        to: "tail -c +${toString (f.offset + 1)} module.so | head -c ${toString f.size} > \"$out/${f.name}\"",
        expect: "exited with 141 (141: a command died of SIGPIPE",
        needs: Some("crates/sandbox-boxlite/src/runtime_files.rs"),
        lint: false,
        scripts: true,
    },
    Breakage {
        what: "a home-manager module check that assumes home-manager installs nothing of its own",
        file: "tests/modules/default.nix",
        from: "ours (packagesOf noPackage) == [ ]",
        to: "packagesOf noPackage == [ ]",
        expect: "home-manager: package = null still installs the sandbox package",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "a module writing another configuration file than its settings (caught by running the check's builder)",
        file: "nixos-modules/common.nix",
        from: "configFile = settings: yaml.generate \"sandbox-config.yaml\" (settingsType.prune settings);",
        to: "configFile = settings: yaml.generate \"sandbox-config.yaml\" (settingsType.prune settings // { extra = true; });",
        expect: "the module wrote",
        needs: None,
        lint: false,
        scripts: true,
    },
    Breakage {
        what: "a `pkgs ? lima` branch in the default wrapper (nixpkgs has lima on every system)",
        file: "nix/packages.nix",
        from: "    SANDBOX_PACKAGE_NONO = lib.getExe' nono \"nono\";\n  };\n",
        to: "    SANDBOX_PACKAGE_NONO = lib.getExe' nono \"nono\";\n  } // lib.optionalAttrs (pkgs ? lima) {\n    SANDBOX_PACKAGE_LIMACTL = lib.getExe' pkgs.lima \"limactl\";\n  };\n",
        expect: "wraps SANDBOX_PACKAGE_LIMACTL SANDBOX_PACKAGE_NONO, not exactly SANDBOX_PACKAGE_NONO",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "nono built with nixpkgs' rustc instead of the pinned toolchain",
        file: "nix/packages.nix",
        from: "nono = pkgs.callPackage ./nono.nix { inherit toolchain; };",
        to: "nono = pkgs.callPackage ./nono.nix { toolchain = pkgs.rustc; };",
        expect: "nono is not built with the pinned toolchain",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "the checks built with the package's dist profile",
        file: "nix/packages.nix",
        from: "checkArgs = commonArgs // { CARGO_PROFILE = \"dev\"; };",
        to: "checkArgs = packageArgs;",
        expect: "checks.x86_64-linux.clippy builds with CARGO_PROFILE dist, not dev",
        needs: None,
        lint: false,
        scripts: false,
    },
    Breakage {
        what: "the nested-KVM BoxLite test back in `checks`",
        file: "flake.nix",
        from: "checks = built.crateChecks // moduleChecks // vmTests // { inherit sandbox; };",
        to: "checks = built.crateChecks // moduleChecks // vmTests // nestedKvmTests // { inherit sandbox; };",
        expect: "vm-boxlite-escape is in checks, but it needs nested KVM",
        needs: None,
        lint: false,
        scripts: false,
    },
];

pub fn run() -> Result<bool> {
    let root = nix_check::workspace_root()?;
    let sh = Shell::new()?;
    let options = Options {
        ci: true,
        quiet: true,
        evaluation_only: true,
        builder_scripts: true,
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
            Ok(()) => println!(
                "ok: caught{}: {} ({})",
                if case.lint {
                    " by a lint stricter than upstream"
                } else {
                    ""
                },
                case.what,
                case.file
            ),
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
    let options = Options {
        builder_scripts: case.scripts,
        ..options.clone()
    };
    let summary = nix_check::run(copy.path(), &options)?;
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
