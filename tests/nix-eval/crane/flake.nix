# STAND-IN for crane, used only by `cargo xtask nix-check` (see ../nixpkgs/flake.nix). Follows
# crane at the pinned revision 7930f6c291de6f83c257839d434592aa085f290a (flake.lock):
# lib/<builder>.nix take their own arguments with `...` and lib/mkCargoDerivation.nix hands
# everything else to stdenv.mkDerivation, so an argument crane does not know (a misspelt
# one included) silently becomes an environment variable, here too. The builders produce
# derivations that refuse to build but carry the arguments crane would pass to
# mkDerivation, so the structure check can see where each variable is set and which
# dependency artifacts each derivation reuses.
#
# LINT, stricter than crane: a lower-case argument that is neither crane's (lib/<builder>.nix,
# mkCargoDerivation.nix, vendorCargoDeps.nix, crateNameFromCargoToml.nix) nor a mkDerivation
# attribute we pass is recorded in `standInUnknownArgs`; `cargo xtask nix-check` reports it
# as a lint failure (tests/nix-eval/lints.nix). A real `nix flake check` passes it.
{
  description = "offline stand-in for crane (tests/nix-eval)";

  outputs = _: {
    mkLib = pkgs:
      let
        inherit (pkgs) lib;

        # crane/lib/mkCargoDerivation.nix, vendorCargoDeps.nix, crateNameFromCargoToml.nix.
        shared = [
          "cargoArtifacts"
          "cargoVendorDir"
          "cargoLock"
          "cargoLockContents"
          "cargoLockParsed"
          "cargoToml"
          "cargoTomlContents"
          "outputHashes"
          "doInstallCargoArtifacts"
          "installPhaseCommand"
          "buildPhaseCargoCommand"
          "checkPhaseCargoCommand"
          "cargoExtraArgs"
          "doIncludeCrossToolchainEnv"
          "pnameSuffix"
          "stdenv"
          # stdenv.mkDerivation attributes we pass through crane.
          "pname"
          "version"
          "src"
          "strictDeps"
          "nativeBuildInputs"
          "buildInputs"
          "doCheck"
          "postInstall"
          "passthru"
          "meta"
          "env"
        ];
        allowed = {
          buildDepsOnly = [ "cargoBuildCommand" "cargoBuildExtraArgs" "cargoCheckCommand" "cargoCheckExtraArgs" "cargoTestCommand" "cargoTestExtraArgs" "dummySrc" ];
          buildPackage = [ "cargoBuildCommand" "cargoBuildExtraArgs" "cargoTestCommand" "cargoTestExtraArgs" ];
          cargoClippy = [ "cargoClippyExtraArgs" ];
          cargoFmt = [ "rustFmtExtraArgs" ];
          cargoNextest = [ "cargoNextestExtraArgs" "cargoNextestPartitionsExtraArgs" "cargoNextestArchiveExtraArgs" "partitions" "partitionType" "withLlvmCov" "cargoLlvmCovExtraArgs" ];
        };

        unknownArgs = builder: args:
          let
            known = shared ++ allowed.${builder};
            unknown = lib.filter (n: !(builtins.elem n known) && builtins.match "[A-Z][A-Z0-9_]*" n == null) (builtins.attrNames args);
          in
          map (n: "crane.${builder}: ${n} is not an argument crane takes (crane passes it to mkDerivation as an environment variable)") unknown;

        derivationFor = builder: suffix: args:
          let
            pname = args.pname or (throw "stand-in crane: ${builder} needs pname (no Cargo.toml is read here)");
            name = "${pname}${suffix}-${args.version or "0"}";
          in
          assert args ? src || throw "crane.${builder}: needs src";
          pkgs.standInDerivation name (removeAttrs args [ "pname" "version" ] // {
            meta = args.meta or { };
            standInUnknownArgs = unknownArgs builder args;
          });

        self = {
          overrideToolchain = toolchain:
            assert lib.isFunction toolchain || lib.isDerivation toolchain || throw "crane.overrideToolchain: expects a toolchain or a function pkgs -> toolchain";
            builtins.seq (if lib.isFunction toolchain then (toolchain pkgs).drvPath else toolchain.drvPath) self;
          buildDepsOnly = derivationFor "buildDepsOnly" "-deps";
          buildPackage = derivationFor "buildPackage" "";
          cargoClippy = derivationFor "cargoClippy" "-clippy";
          cargoFmt = derivationFor "cargoFmt" "-fmt";
          cargoNextest = derivationFor "cargoNextest" "-nextest";
          # crane/lib/devShell.nix: `checks`, `inputsFrom`, `packages`, and mkShell's arguments.
          devShell = args: pkgs.mkShell (removeAttrs args [ "checks" ] // {
            inputsFrom = builtins.attrValues (args.checks or { }) ++ (args.inputsFrom or [ ]);
          });
        };

        # lib/default.nix: crane supports nixpkgs 26.05 and later and warns on every
        # evaluation below that (the modules build with the user's nixpkgs: docs/nix.md).
        current = lib.concatStringsSep "." (lib.lists.sublist 0 2 (lib.splitVersion lib.version));
      in
      lib.warnIf (lib.versionOlder current "26.05") "crane requires at least nixpkgs-26.05, supplied nixpkgs-${current}" self;
  };
}
