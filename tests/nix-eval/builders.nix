# The runCommand bodies (`buildCommand`) of one system's top-level derivations in a flake
# output, with what running one needs: its environment (drvAttrs, as the builder would see
# it), its nativeBuildInputs and the fixed-output fetches among its attributes.
# `cargo xtask nix-check` runs each whose inputs it can provide, under stdenv's shell options.
output: system:
let
  inherit (builtins) attrNames filter isAttrs listToAttrs map;

  isDrv = d: isAttrs d && (d.type or null) == "derivation";
  top = output.${system} or { };
  describe = d: { inherit (d) name; path = d.outPath; binaries = d.standInBinaries or [ ]; };
  withScript = filter (n: isDrv top.${n} && top.${n}.drvAttrs ? buildCommand) (attrNames top);
in
listToAttrs (map
  (n:
  let
    d = top.${n};
    passthru = d.passthru or { };
  in
  {
    name = n;
    value = {
      drvName = d.name;
      env = d.drvAttrs;
      nativeBuildInputs = map describe (d.drvAttrs.nativeBuildInputs or [ ]);
      fetches = map (f: { inherit (f) name; path = f.outPath; url = f.drvAttrs.url; })
        (filter (v: isDrv v && v.drvAttrs ? url) (map (k: passthru.${k}) (attrNames passthru)));
      patched = passthru.patched or [ ];
    };
  })
  withScript)
