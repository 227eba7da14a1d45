# Assertions about the flake's outputs, used by `cargo xtask nix-check` through
# `nix eval <flake>#<output> --apply '(import …/structure.nix).<output>'`. Each function returns
# { checked = [ what was looked at ]; failures = [ messages ]; }.
#
# Nothing here depends on the stand-ins: on a machine with the real inputs the same functions
# can be applied to the real outputs (docs/nix.md shows how).
let
  inherit (builtins) all attrNames concatMap filter hasAttr length map;

  systems = [ "x86_64-linux" "aarch64-darwin" ];
  isLinux = system: builtins.match ".*-linux" system != null;

  require = cond: message: if cond then [ ] else [ message ];
  requireAttrs = what: set: names:
    concatMap (n: require (hasAttr n set) "${what} has no attribute ${n} (it has: ${toString (attrNames set)})") names;

  # Instantiating forces every interpolated string: tool paths, scripts, module evaluations.
  instantiates = what: drv: require (drv.drvPath != "") "${what} does not instantiate";

  # The variables the CLI reads tool paths from (crates/sandbox-cli/src/tools.rs): compiled
  # in (the old scheme) or set on a build, they would make a tool bump recompile the CLI.
  compiledToolVars = [ "SANDBOX_NONO" "SANDBOX_LIMACTL" "SANDBOX_MKE2FS" "SANDBOX_LIMA_IMAGE" "SANDBOX_BOX_IMAGE" "SANDBOX_PACKAGE_NONO" "SANDBOX_BOXLITE_RUNTIME" "SANDBOX_PACKAGE_BOX_IMAGE" ];

  # The BoxLite variant exists where a wheel with its runtime files is pinned.
  hasBoxlite = system: system == "x86_64-linux";

  storePath = drv: builtins.unsafeDiscardStringContext drv.outPath;

  versionAtLeast = a: b: builtins.compareVersions a b >= 0;

  report = checked: failures: { inherit checked failures; };
in
{
  packages = packages:
    let
      perSystem = system:
        let
          p = packages.${system} or { };
          expected = [ "sandbox" "default" "sandbox-unwrapped" "nono" "sandbox-lima" ]
            ++ (if isLinux system then [ "lima-image" "box-image" "sandbox-with-lima-image" ] else [ ])
            ++ (if hasBoxlite system then [ "sandbox-boxlite" "boxlite-runtime" ] else [ ]);
          missing = requireAttrs "packages.${system}" p expected;
          env = drv: drv.drvAttrs;
          has = drv: var: hasAttr var (env drv);
          inherit (p) sandbox;
          unwrapped = p.sandbox-unwrapped;
          deps = (env unwrapped).cargoArtifacts or null;
          toolPaths = sandbox.toolPaths or { };
        in
        if missing != [ ] then missing else
        concatMap (n: instantiates "packages.${system}.${n}" p.${n}) expected
        ++ require (p.default.drvPath == sandbox.drvPath) "packages.${system}.default is not packages.${system}.sandbox"
        ++ require ((sandbox.meta.mainProgram or null) == "sandbox") "packages.${system}.sandbox has no meta.mainProgram = \"sandbox\""
        # Only the tools some backend uses (nono), set by the wrapper, from the nono package.
        ++ require (attrNames toolPaths == [ "SANDBOX_PACKAGE_NONO" ]) "packages.${system}.sandbox wraps ${toString (attrNames toolPaths)}, not exactly SANDBOX_PACKAGE_NONO"
        ++ require (builtins.match "${builtins.unsafeDiscardStringContext p.nono.outPath}/bin/nono" (toolPaths.SANDBOX_PACKAGE_NONO or "") != null)
          "packages.${system}.sandbox points SANDBOX_PACKAGE_NONO at ${toolPaths.SANDBOX_PACKAGE_NONO or "nothing"}, not packages.${system}.nono's bin/nono"
        ++ require (versionAtLeast (p.nono.version or "0") "0.81.0") "packages.${system}.nono is ${p.nono.version or "unversioned"}; the nono backend needs 0.81.0 or later"
        # nono 0.81.0 needs Rust 1.95: built with the CLI's pinned toolchain, not nixpkgs' rustc.
        ++ require (builtins.elem (storePath sandbox.toolchain) (map storePath ((env p.nono).nativeBuildInputs or [ ])))
          "packages.${system}.nono is not built with the pinned toolchain (${sandbox.toolchain.name or "none"}); nixpkgs' rustc may be older than nono's rust-version"
        # The shipped build is `dist` (fat LTO).
        ++ require (((env unwrapped).CARGO_PROFILE or null) == "dist") "packages.${system}.sandbox-unwrapped is not built with CARGO_PROFILE = \"dist\" (it has ${(env unwrapped).CARGO_PROFILE or "crane's default, release"})"
        ++ lima system p
        ++ concatMap (v: require (!(has unwrapped v)) "packages.${system}.sandbox-unwrapped sets ${v}: a tool bump would recompile the CLI") compiledToolVars
        ++ require (deps != null) "packages.${system}.sandbox-unwrapped does not reuse dependency artifacts (cargoArtifacts)"
        ++ (if deps == null then [ ] else
        concatMap (v: require (!(has deps v)) "the dependency build (${deps.name}) sets ${v}") compiledToolVars
        # BoxLite's build settings belong to the variant that enables the crate.
        ++ concatMap (v: require (!(has deps v)) "the dependency build sets ${v}, which only the boxlite feature reads") [ "PROTOC" "BOXLITE_DEPS_STUB" ])
        ++ (if hasBoxlite system then boxlite system p else require (!(p ? sandbox-boxlite)) "packages.${system}.sandbox-boxlite exists, but no BoxLite wheel is pinned for ${system}");

      # The Lima variants: the default package's tools plus limactl from nixpkgs' lima, and
      # (Linux) the flake's guest image; the same CLI, never recompiled.
      lima = system: p:
        let
          variant = name: extra:
            let
              what = "packages.${system}.${name}";
              tools = p.${name}.toolPaths or { };
            in
            require (removeAttrs tools ([ "SANDBOX_PACKAGE_LIMACTL" ] ++ attrNames extra) == (p.sandbox.toolPaths or { }))
              "${what} does not wrap the default package's tools plus Lima's (it wraps ${toString (attrNames tools)})"
            ++ require (builtins.match "/nix/store/[^/]*-lima-[^/]*/bin/limactl" (tools.SANDBOX_PACKAGE_LIMACTL or "") != null)
              "${what} sets SANDBOX_PACKAGE_LIMACTL to ${tools.SANDBOX_PACKAGE_LIMACTL or "nothing"}, not nixpkgs' lima's bin/limactl"
            ++ concatMap (v: require ((tools.${v} or null) == extra.${v}) "${what} sets ${v} to ${tools.${v} or "nothing"}, not ${extra.${v}}") (attrNames extra)
            ++ require ((p.${name}.sandbox-unwrapped.drvPath or "") == p.sandbox-unwrapped.drvPath) "${what} compiles the CLI again instead of re-wrapping sandbox-unwrapped";
        in
        variant "sandbox-lima" { }
        ++ (if isLinux system then variant "sandbox-with-lima-image" { SANDBOX_PACKAGE_LIMA_IMAGE = storePath p.lima-image; } else [ ]);

      # The BoxLite variant: the same CLI with the feature on, its own dependency build with
      # the crate's build settings, and a wrapper that adds the runtime files and the box image
      # to the default package's tools.
      boxlite = system: p:
        let
          what = "packages.${system}.sandbox-boxlite";
          variant = p.sandbox-boxlite;
          tools = variant.toolPaths or { };
          unwrapped = variant.sandbox-unwrapped;
          env = unwrapped.drvAttrs;
          deps = env.cargoArtifacts.drvAttrs or { };
          runtime = p.boxlite-runtime;
        in
        require (removeAttrs tools [ "SANDBOX_BOXLITE_RUNTIME" "SANDBOX_PACKAGE_BOX_IMAGE" ] == (p.sandbox.toolPaths or { }))
          "${what} does not wrap the default package's tools (it wraps ${toString (attrNames tools)})"
        ++ require ((tools.SANDBOX_BOXLITE_RUNTIME or null) == storePath runtime)
          "${what} sets SANDBOX_BOXLITE_RUNTIME to ${tools.SANDBOX_BOXLITE_RUNTIME or "nothing"}, not packages.${system}.boxlite-runtime"
        ++ require ((tools.SANDBOX_PACKAGE_BOX_IMAGE or null) == storePath p.box-image)
          "${what} sets SANDBOX_PACKAGE_BOX_IMAGE to ${tools.SANDBOX_PACKAGE_BOX_IMAGE or "nothing"}, not packages.${system}.box-image"
        ++ require (builtins.match ".*--features boxlite.*" (env.cargoExtraArgs or "") != null)
          "${what} is not built with --features boxlite (cargoExtraArgs: ${env.cargoExtraArgs or ""})"
        ++ concatMap (v: require (!(hasAttr v env)) "${what}'s CLI build sets ${v}: a tool bump would recompile it") compiledToolVars
        ++ require ((deps.BOXLITE_DEPS_STUB or null) == "1") "${what}'s dependency build does not set BOXLITE_DEPS_STUB=1 (the crate's build script would download its runtime)"
        ++ require (builtins.match ".*/bin/protoc" (deps.PROTOC or "") != null) "${what}'s dependency build does not point PROTOC at a protoc"
        ++ require ((env.cargoArtifacts.drvPath or "") != (p.sandbox-unwrapped.drvAttrs.cargoArtifacts.drvPath or ""))
          "${what} shares the default package's dependency build, which lacks the boxlite crate"
        ++ require (builtins.match "https://files\\.pythonhosted\\.org/packages/.*/boxlite-${runtime.version}-cp311-cp311-manylinux_2_28_x86_64\\.whl" (runtime.wheelUrl or "") != null)
          "packages.${system}.boxlite-runtime does not fetch the ${runtime.version or "?"} wheel from PyPI (url: ${runtime.wheelUrl or "none"})"
        # (`hash` is what fetchurl takes; the real one passes it on as outputHash.)
        ++ require (builtins.match "sha256-.{43}=" (runtime.wheel.drvAttrs.outputHash or runtime.wheel.drvAttrs.hash or "") != null)
          "packages.${system}.boxlite-runtime's wheel has no pinned sha256 (a fixed-output fetch needs one)";
    in
    report (map (s: "packages.${s}") systems) (concatMap perSystem systems);

  checks = checks:
    let
      perSystem = system:
        let
          c = checks.${system} or { };
          expected = [ "clippy" "fmt" "nextest" "sandbox" "module-home-manager" ]
            ++ (if isLinux system then [ "module-nixos" "vm-escape" "vm-tool-paths" "vm-home-manager" "vm-lima-boot" ] else [ ]);
          missing = requireAttrs "checks.${system}" c expected;
          artifacts = n: c.${n}.drvAttrs.cargoArtifacts.drvPath or "none";
          packageArtifacts = c.sandbox.sandbox-unwrapped.drvAttrs.cargoArtifacts.drvPath or "none";
          profile = n: c.${n}.drvAttrs.CARGO_PROFILE or "crane's default, release";
        in
        if missing != [ ] then missing else
        concatMap (n: instantiates "checks.${system}.${n}" c.${n}) (attrNames c)
        # clippy and nextest build what .ci/run builds (the dev profile), from one dependency
        # build of their own: the package's is `dist`, fat LTO without debug assertions.
        ++ concatMap (n: require (profile n == "dev") "checks.${system}.${n} builds with CARGO_PROFILE ${profile n}, not dev (what .ci/run tests)") [ "clippy" "nextest" ]
        ++ require (artifacts "clippy" == artifacts "nextest") "checks.${system}.clippy and nextest do not share one dependency build"
        ++ require ((c.clippy.drvAttrs.cargoArtifacts.drvAttrs.CARGO_PROFILE or null) == "dev") "checks.${system}.clippy's dependency build is not the dev profile"
        ++ require (artifacts "clippy" != packageArtifacts) "checks.${system}.clippy reuses the package's dist-profile dependency build"
        ++ require ((c.nextest.drvAttrs.SANDBOX_PACKAGE_NONO or null) == (c.sandbox.toolPaths.SANDBOX_PACKAGE_NONO or "none")) "checks.${system}.nextest does not run with the package's nono"
        ++ require (!(c.nextest.drvAttrs ? SANDBOX_PACKAGE_LIMACTL)) "checks.${system}.nextest sets SANDBOX_PACKAGE_LIMACTL: the tests would run limactl inside the build sandbox"
        # Needs nested KVM, which a builder with `kvm` need not have (legacyPackages, below).
        ++ require (!(c ? vm-boxlite-escape)) "checks.${system}.vm-boxlite-escape is in checks, but it needs nested KVM, which `nix flake check` on a KVM builder need not have"
        ++ concatMap (n: require ((c.${n}.type or null) == "derivation") "checks.${system}.${n} is not a derivation") (attrNames c)
        # Every VM test is scheduled on a builder with KVM (the BoxLite one boots a guest in
        # its guest).
        ++ concatMap
          (n: require (builtins.elem "kvm" (c.${n}.drvAttrs.requiredSystemFeatures or [ ])) "checks.${system}.${n} does not require the kvm system feature")
          (filter (n: builtins.match "vm-.*" n != null) (attrNames c));
    in
    report (map (s: "checks.${s}") systems) (concatMap perSystem systems);

  # Tests `nix flake check` does not build: those that need nested KVM.
  legacyPackages = legacyPackages:
    let
      perSystem = system:
        let l = legacyPackages.${system} or { }; in
        if !(hasBoxlite system) then require (!(l ? vm-boxlite-escape)) "legacyPackages.${system}.vm-boxlite-escape exists without the BoxLite variant"
        else
          requireAttrs "legacyPackages.${system}" l [ "vm-boxlite-escape" ]
          ++ (if l ? vm-boxlite-escape then
            instantiates "legacyPackages.${system}.vm-boxlite-escape" l.vm-boxlite-escape
            ++ require (builtins.elem "kvm" (l.vm-boxlite-escape.drvAttrs.requiredSystemFeatures or [ ])) "legacyPackages.${system}.vm-boxlite-escape does not require the kvm system feature"
          else [ ]);
    in
    report (map (s: "legacyPackages.${s}") systems) (concatMap perSystem systems);

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
        ++ (if d ? default then instantiates "devShells.${system}.default" d.default else [ ]);
    in
    report (map (s: "devShells.${s}") systems) (concatMap perSystem systems);

  overlays = overlays:
    report [ "overlays" ] (requireAttrs "overlays" overlays [ "default" ]
      ++ require (builtins.isFunction (overlays.default or null)) "overlays.default is not a function final: prev: { … }");

  # Applied to the whole `nixosModules`, `homeModules` or `homeManagerModules` output.
  modules = what: modules:
    report [ what ] (requireAttrs what modules [ "default" ]
      ++ require (all (n: builtins.isFunction modules.${n} || builtins.isAttrs modules.${n}) (attrNames modules))
      "${what} holds something that is not a module"
      ++ require (length (attrNames modules) >= 1) "${what} is empty");

  # The test scripts of the VM tests of one system, for byte-compiling. (The stand-in
  # runNixOSTest keeps each in passthru.testScript.)
  testScripts = system: checks:
    builtins.mapAttrs (_: c: c.testScript)
      (builtins.intersectAttrs
        (builtins.listToAttrs (map (n: { name = n; value = null; }) (filter (n: builtins.match "vm-.*" n != null) (attrNames checks.${system}))))
        checks.${system});

  inherit systems;
}
