# The real nixpkgs lib (../shared/nixpkgs-lib: nixpkgs.lib at de42d442, 2026-06-14, five weeks
# older than the pinned nixpkgs' lib; lib/ changes slowly) with the parts it cannot provide
# offline replaced:
#   - fileset: needs builtins.readFileType (nix >= 2.14); here a file set is a list of path
#     strings, and toSource really copies exactly those files (so a missing file shows);
#   - getExe': checks the binary name against the stand-in package's list of binaries.
#     A LINT, stricter than upstream: the real getExe' only builds the path, the wrapper
#     builds with a wrong name, and only a VM test running the binary fails;
#   - nixosSystem: added to lib by nixpkgs' flake; here the real module system with the
#     NixOS option declarations of nixos.nix.
{ realLib, pkgsFor }:
let
  inherit (builtins) any isList map pathExists toString;

  inherit (realLib) hasPrefix;

  lib = realLib // {
    fileset = {
      unions = paths: map
        (p: if pathExists p then toString p else throw "stand-in lib.fileset.unions: ${toString p} does not exist")
        paths;
      toSource = { root, fileset }:
        let
          members = if isList fileset then fileset else [ (toString fileset) ];
          keep = path: any (m: path == m || hasPrefix (m + "/") path || hasPrefix (path + "/") m) members;
        in
        builtins.path { name = "source"; path = root; filter = path: _type: keep path; };
    };

    getExe' = drv: name:
      if drv ? standInBinaries && !(builtins.elem name drv.standInBinaries) then
        throw "lib.getExe': ${drv.name} has no bin/${name} (its binaries: ${toString drv.standInBinaries})"
      else realLib.getExe' drv name;

    nixosSystem = args: import ./nixos.nix ({ inherit lib pkgsFor; } // args);

    # Not in nixpkgs: forces a module system's config as building it would (every value, and
    # every derivation's drvPath), skipping `_module` (its args hold all of pkgs). Used by the
    # stand-in nixosSystem, runNixOSTest and home-manager.
    standInForce = value:
      if realLib.isDerivation value then builtins.seq value.drvPath true
      else if builtins.isAttrs value then realLib.all lib.standInForce (builtins.attrValues (removeAttrs value [ "_module" ]))
      else if builtins.isList value then realLib.all lib.standInForce value
      else builtins.seq value true;
  };
in
lib
