# Every package of the stand-in nixpkgs for one system, by store path: its name and the
# binaries the real one installs. `cargo xtask nix-check` uses it to give a builder script the
# host's copy of each tool it names (or, for a package that is only named, an empty stand-in
# directory). The store paths are those the flake sees: a stand-in derivation's path depends
# on its attributes only.
{ realLib, system }:
let
  lib = import ./nixpkgs/lib.nix { inherit realLib; pkgsFor = s: import ./nixpkgs/pkgs.nix { inherit lib; system = s; }; };
  pkgs = import ./nixpkgs/pkgs.nix { inherit lib system; };
  isDrv = d: builtins.isAttrs d && (d.type or null) == "derivation";
  packagesIn = set: builtins.filter isDrv (builtins.attrValues set);
  all = packagesIn pkgs ++ packagesIn pkgs.dockerTools;
in
builtins.listToAttrs (map (d: { name = builtins.unsafeDiscardStringContext d.outPath; value = { inherit (d) name; binaries = d.standInBinaries or [ ]; }; }) all)
