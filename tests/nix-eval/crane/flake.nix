# STAND-IN for crane, used only by `cargo xtask nix-check` (see ../nixpkgs/flake.nix). Its
# builders take exactly the arguments crane's do (lib/<builder>.nix at the pinned revision
# 7930f6c2, plus the stdenv.mkDerivation attributes crane passes on, plus environment
# variables in capitals), so a misspelt argument fails instead of silently becoming an
# environment variable. They produce derivations that refuse to build but carry the
# arguments crane would pass to mkDerivation, so the structure check can see where each
# variable is set and which dependency artifacts each derivation reuses.
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

        check = builder: args:
          let
            known = shared ++ allowed.${builder};
            unknown = lib.filter (n: !(builtins.elem n known) && builtins.match "[A-Z][A-Z0-9_]*" n == null) (builtins.attrNames args);
          in
          if unknown == [ ] then args
          else throw "crane.${builder}: unknown argument(s) ${lib.concatStringsSep ", " unknown} (crane takes: ${lib.concatStringsSep ", " known})";

        derivationFor = builder: suffix: args:
          let
            args' = check builder args;
            pname = args'.pname or (throw "stand-in crane: ${builder} needs pname (no Cargo.toml is read here)");
            name = "${pname}${suffix}-${args'.version or "0"}";
          in
          assert args' ? src || throw "crane.${builder}: needs src";
          pkgs.standInDerivation name (removeAttrs args' [ "pname" "version" ] // { meta = args'.meta or { }; });

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
      in
      self;
  };
}
