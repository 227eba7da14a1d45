# STAND-IN for crane, used only by `cargo xtask nix-check` (see ../nixpkgs/flake.nix). Its
# builders produce derivations that refuse to build but carry the arguments crane would pass
# to mkDerivation, so the structure check can see where each variable is set and which
# dependency artifacts each derivation reuses. Never use it for anything else.
{
  description = "offline stand-in for crane (tests/nix-eval, structure evaluation only)";

  outputs = _: {
    mkLib = pkgs:
      let
        derivationFor = suffix: args:
          assert args ? src || throw "stand-in crane: ${suffix} needs src";
          let
            pname = args.pname or "crate";
            name = "${pname}${suffix}-${args.version or "0"}";
          in
          pkgs.runCommand name (removeAttrs args [ "pname" "version" ]) "exit 1";
      in
      {
        buildDepsOnly = derivationFor "-deps";
        buildPackage = derivationFor "";
        cargoClippy = derivationFor "-clippy";
        cargoFmt = derivationFor "-fmt";
        cargoNextest = derivationFor "-nextest";
        devShell = args: pkgs.mkShell (removeAttrs args [ "checks" ] // {
          inputsFrom = builtins.attrValues (args.checks or { });
        });
      };
  };
}
