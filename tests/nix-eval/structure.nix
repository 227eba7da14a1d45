# Assertions about the flake's outputs, used by `cargo xtask nix-check` through
# `nix eval <flake>#<output> --apply '(import …/structure.nix).<output>'`. Each function returns
# { checked = [ what was looked at ]; failures = [ messages ]; }.
#
# Nothing here depends on the stand-in: on a machine with the real inputs the same functions
# can be applied to the real outputs (docs/nix.md shows how).
let
  inherit (builtins) all attrNames concatMap filter hasAttr length map;

  systems = [ "x86_64-linux" "aarch64-darwin" ];
  isLinux = system: builtins.match ".*-linux" system != null;

  require = cond: message: if cond then [ ] else [ message ];
  requireAttrs = what: set: names:
    concatMap (n: require (hasAttr n set) "${what} has no attribute ${n} (it has: ${toString (attrNames set)})") names;

  toolVars = [ "SANDBOX_LIMACTL" "SANDBOX_NONO" "SANDBOX_MKE2FS" ];
  imageVars = [ "SANDBOX_LIMA_IMAGE" "SANDBOX_BOX_IMAGE" ];
  bakedVars = toolVars ++ imageVars;

  report = checked: failures: { inherit checked failures; };
in
{
  packages = packages:
    let
      perSystem = system:
        let
          p = packages.${system} or { };
          expected = [ "sandbox" "default" "sandbox-with-images" "sandbox-without-images" ]
            ++ (if isLinux system then [ "lima-image" "box-image" ] else [ ]);
          missing = requireAttrs "packages.${system}" p expected;
          env = drv: drv.drvAttrs;
          has = drv: var: hasAttr var (env drv);
          sandbox = p.sandbox;
          deps = (env sandbox).cargoArtifacts or null;
          withImages = if isLinux system then [ sandbox p.sandbox-with-images ] else [ p.sandbox-with-images ];
        in
        # Instantiating forces every interpolated string (tool and image paths, scripts).
        if missing != [ ] then missing else
        concatMap (n: require (p.${n}.drvPath != "") "packages.${system}.${n} does not instantiate") expected
        ++ require (p.default.drvPath == sandbox.drvPath) "packages.${system}.default is not packages.${system}.sandbox"
        ++ require ((sandbox.meta.mainProgram or null) == "sandbox") "packages.${system}.sandbox has no meta.mainProgram = \"sandbox\""
        ++ concatMap (v: require (has sandbox v) "packages.${system}.sandbox does not bake ${v}") toolVars
        ++ concatMap (d: concatMap (v: require (has d v) "${d.name} (${system}) does not bake ${v}") imageVars) withImages
        ++ concatMap (v: require (!(has p.sandbox-without-images v)) "packages.${system}.sandbox-without-images bakes ${v}") imageVars
        ++ concatMap (v: require (has sandbox v) "packages.${system}.sandbox lacks the build variable ${v}") [ "PROTOC" "BOXLITE_DEPS_STUB" ]
        ++ require (deps != null) "packages.${system}.sandbox does not reuse dependency artifacts (cargoArtifacts)"
        ++ (if deps == null then [ ] else
        concatMap (v: require (!(has deps v)) "the dependency build (${deps.name}) sets ${v}: a tool bump would rebuild every dependency") bakedVars
        ++ require ((env deps).BOXLITE_DEPS_STUB or null == "1") "the dependency build does not set BOXLITE_DEPS_STUB=1"
        ++ require (has deps "PROTOC") "the dependency build does not set PROTOC");
    in
    report (map (s: "packages.${s}") systems) (concatMap perSystem systems);

  checks = checks:
    let
      perSystem = system:
        let
          c = checks.${system} or { };
          expected = [ "clippy" "fmt" "nextest" "sandbox" "module-home-manager" ]
            ++ (if isLinux system then [ "module-nixos" "vm-escape" "vm-tool-paths" "vm-home-manager" ] else [ ]);
          missing = requireAttrs "checks.${system}" c expected;
          # Module checks evaluate NixOS / home-manager themselves, which the stand-in cannot;
          # everything else is instantiated.
          instantiated = filter (n: builtins.match "module-.*" n == null) (attrNames c);
          artifacts = n: c.${n}.drvAttrs.cargoArtifacts.drvPath or "none";
          shared = c.sandbox.drvAttrs.cargoArtifacts.drvPath or "none";
        in
        if missing != [ ] then missing else
        concatMap (n: require (c.${n}.drvPath != "") "checks.${system}.${n} does not instantiate") instantiated
        ++ concatMap (n: require (artifacts n == shared) "checks.${system}.${n} does not reuse the package's dependency artifacts") [ "clippy" "nextest" ]
        ++ concatMap (n: require ((c.${n}.type or null) == "derivation") "checks.${system}.${n} is not a derivation") (attrNames c);
    in
    report (map (s: "checks.${s}") systems) (concatMap perSystem systems);

  apps = apps:
    let
      perSystem = system:
        let a = apps.${system} or { }; in
        requireAttrs "apps.${system}" a [ "sandbox" "default" ]
        ++ concatMap
          (n: require ((a.${n}.type or null) == "app" && builtins.match "/nix/store/.*/bin/sandbox" (a.${n}.program or "") != null)
            "apps.${system}.${n} is not an app running bin/sandbox")
          (filter (n: hasAttr n a) [ "sandbox" "default" ]);
    in
    report (map (s: "apps.${s}") systems) (concatMap perSystem systems);

  devShells = devShells:
    let
      perSystem = system:
        let d = devShells.${system} or { }; in
        requireAttrs "devShells.${system}" d [ "default" ]
        ++ (if d ? default then
          require (d.default.drvPath != "") "devShells.${system}.default does not instantiate"
          ++ require (d.default.drvAttrs ? PROTOC) "devShells.${system}.default does not set PROTOC"
        else [ ]);
    in
    report (map (s: "devShells.${s}") systems) (concatMap perSystem systems);

  # Applied to the whole `nixosModules`, `homeModules` or `homeManagerModules` output.
  modules = what: modules:
    report [ what ] (requireAttrs what modules [ "default" ]
      ++ require (all (n: builtins.isFunction modules.${n} || builtins.isAttrs modules.${n}) (attrNames modules))
      "${what} holds something that is not a module"
      ++ require (length (attrNames modules) >= 1) "${what} is empty");

  inherit systems;
}
