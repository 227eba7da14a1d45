# LINTS, stricter than upstream: arguments that the stand-in builders pass on as upstream
# does (crane and runCommand, symlinkJoin, fetchurl, buildRustPackage hand unknown arguments
# to mkDerivation, where they become environment variables) but that none of the builder's
# own arguments or the mkDerivation attributes we use name: almost always a misspelling.
# A real `nix flake check` does not fail on them. Applied by `cargo xtask nix-check` to the
# flake's `packages`, `checks` and `legacyPackages` (it reads `standInUnknownArgs`, which
# only the stand-ins in this directory set).
let
  inherit (builtins) attrValues concatMap isAttrs;

  # A derivation, the CLI it wraps and the dependency build it reuses.
  related = d:
    [ d ]
    ++ (if d ? sandbox-unwrapped then related d.sandbox-unwrapped else [ ])
    ++ (if isAttrs (d.drvAttrs.cargoArtifacts or null) then related d.drvAttrs.cargoArtifacts else [ ]);

  unknownArgs = output: concatMap
    (perSystem: concatMap (d: concatMap (r: r.standInUnknownArgs or [ ]) (related d))
      (builtins.filter (d: isAttrs d && (d.type or null) == "derivation") (attrValues perSystem)))
    (attrValues output);
in
output:
let found = unknownArgs output; in
{
  checked = [ "builder arguments" ];
  # Each message once (the same derivation is reached from several outputs).
  failures = map (m: "lint (stricter than upstream): ${m}") (builtins.attrNames (builtins.listToAttrs (map (m: { name = m; value = null; }) found)));
}
