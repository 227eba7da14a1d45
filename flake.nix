{
  description = "sandbox: run AI coding agents' commands inside an isolation boundary";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    crane.url = "github:ipetkov/crane";
    rust-overlay = {
      url = "github:oxalica/rust-overlay";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    home-manager = {
      url = "github:nix-community/home-manager";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs = { self, nixpkgs, crane, rust-overlay, home-manager }:
    let
      inherit (nixpkgs) lib;

      systems = [ "x86_64-linux" "aarch64-linux" "aarch64-darwin" ];
      forAllSystems = f: lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});

      version = (builtins.fromTOML (builtins.readFile ./Cargo.toml)).workspace.package.version;

      # Only what cargo reads, tests included, so an edit to docs or Nix files rebuilds nothing.
      # `cargo xtask nix-check` checks that every file a test reads is in here.
      src = lib.fileset.toSource {
        root = ./.;
        fileset = lib.fileset.unions [
          ./Cargo.toml
          ./Cargo.lock
          ./.cargo
          ./crates
          ./xtask
        ];
      };

      buildFor = pkgs: import ./nix/packages.nix { inherit pkgs crane rust-overlay src version; };

      perSystem = system: pkgs:
        let
          built = buildFor pkgs;
          inherit (built) sandbox;
          isLinux = pkgs.stdenv.hostPlatform.isLinux;

          moduleChecks = import ./tests/modules { inherit self nixpkgs home-manager pkgs system; };

          vmTests = lib.optionalAttrs isLinux {
            vm-escape = import ./tests/vm/escape.nix { inherit self pkgs; };
            vm-tool-paths = import ./tests/vm/tool-paths.nix { inherit self pkgs; };
            vm-home-manager = import ./tests/vm/home-manager.nix { inherit self pkgs home-manager; };
            vm-lima-boot = import ./tests/vm/lima-boot.nix { inherit pkgs; };
          };

          # Where the BoxLite variant exists (x86_64-linux): a box booted from the flake's
          # image, inside the test VM. It needs KVM inside the test VM (nested virtualisation),
          # which a builder with `kvm` need not offer, so it is not in `checks` (a `nix flake
          # check` on such a builder would fail): `nix build .#vm-boxlite-escape` runs it
          # (legacyPackages, which `nix flake check` does not build).
          nestedKvmTests = lib.optionalAttrs (built.boxlite != { }) {
            vm-boxlite-escape = import ./tests/vm/boxlite-escape.nix { inherit self pkgs; };
          };
        in
        {
          packages = {
            inherit sandbox;
            inherit (built) sandbox-unwrapped nono;
            default = sandbox;
            # The CLI with Lima's limactl baked in too (the default package finds one on PATH).
            sandbox-lima = built.lima { name = "sandbox-lima"; };
          }
          # `sandbox-boxlite` (the CLI with the BoxLite backend, its runtime and the box image
          # baked in) and `boxlite-runtime`: x86_64-linux, the one system with a pinned wheel.
          // built.boxlite
          // lib.optionalAttrs isLinux (
            # The guest images of the Lima and BoxLite backends, built on their own, so the
            # default package never builds a disk image (`nix run .#sandbox` stays cheap).
            let images = import ./vm-images { inherit nixpkgs system; };
            in images // {
              # `sandbox-lima` whose Lima VMs boot the flake's NixOS guest (with its digest)
              # instead of Ubuntu 24.04: the same CLI, re-wrapped, never recompiled.
              sandbox-with-lima-image = built.lima {
                name = "sandbox-with-lima-image";
                limaImage = images.lima-image;
              };
            }
          );

          apps = rec {
            sandbox = {
              type = "app";
              program = lib.getExe self.packages.${system}.sandbox;
              meta.description = "Run a command inside the sandbox: nix run .#sandbox -- run -- <cmd>";
            };
            default = sandbox;
          };

          # What `nix flake check` builds: these, and nothing from `packages` but what they
          # use. The images, the Lima and BoxLite variants and the nested-KVM test are built
          # by the workflow in addition (docs/nix.md, "What is checked where").
          checks = built.crateChecks // moduleChecks // vmTests // { inherit sandbox; };

          legacyPackages = nestedKvmTests;

          devShells.default = built.craneLib.devShell {
            checks = built.crateChecks;
            packages = [
              built.nono
              pkgs.cargo-nextest
              pkgs.rust-analyzer
              pkgs.deadnix
              pkgs.nixpkgs-fmt
              pkgs.shellcheck
              pkgs.python3
            ];
          };
        };

      outputsBySystem = forAllSystems perSystem;
      collect = name: lib.mapAttrs (_: outputs: outputs.${name}) outputsBySystem;
    in
    {
      packages = collect "packages";
      apps = collect "apps";
      checks = collect "checks";
      legacyPackages = collect "legacyPackages";
      devShells = collect "devShells";

      # `sandbox` (and `sandbox-unwrapped`) built from the package set it is applied to. The
      # modules use it, so they build against the system's own nixpkgs.
      overlays.default = final: _prev:
        let built = buildFor final; in
        { inherit (built) sandbox sandbox-unwrapped; };

      nixosModules.default = import ./nixos-modules/nixos.nix { inherit self; };
      homeModules.default = import ./nixos-modules/home-manager.nix { inherit self; };
      # The name home-manager's own documentation used before `homeModules`.
      homeManagerModules = self.homeModules;
    };
}
