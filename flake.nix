{
  description = "sandbox: run AI coding agents' commands inside an isolation boundary";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    crane.url = "github:ipetkov/crane";
    home-manager = {
      url = "github:nix-community/home-manager";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs = { self, nixpkgs, crane, home-manager }:
    let
      inherit (nixpkgs) lib;

      systems = [ "x86_64-linux" "aarch64-linux" "aarch64-darwin" ];
      linuxSystems = [ "x86_64-linux" "aarch64-linux" ];
      forAllSystems = f: lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});

      # The Linux system a host of `system` runs its guests as: same CPU, Linux kernel.
      guestSystemFor = system: builtins.replaceStrings [ "-darwin" ] [ "-linux" ] system;

      version = (builtins.fromTOML (builtins.readFile ./Cargo.toml)).workspace.package.version;

      # Guest images (vm-images/): the Lima NixOS disk image and the BoxLite OCI layout.
      images = lib.genAttrs linuxSystems (system: import ./vm-images { inherit nixpkgs system; });

      perSystem = system: pkgs:
        let
          craneLib = crane.mkLib pkgs;

          # Only what cargo reads, so an edit to docs or Nix files rebuilds nothing.
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

          # Shared by the dependency build and every derivation that reuses it: changing
          # anything here rebuilds all dependencies.
          commonArgs = {
            pname = "sandbox";
            inherit version src;
            strictDeps = true;
            nativeBuildInputs = [ pkgs.protobuf ];
            buildInputs = lib.optionals pkgs.stdenv.hostPlatform.isDarwin [ pkgs.libiconv ];
            # boxlite's build script compiles .proto files and would download its runtime;
            # the runtime files come from elsewhere (DESIGN §5).
            PROTOC = lib.getExe' pkgs.protobuf "protoc";
            BOXLITE_DEPS_STUB = "1";
            # The shipped build: fat LTO (Cargo.toml); `release` is the quick local profile.
            CARGO_PROFILE = "dist";
          };

          # Workspace dependencies, built once and shared by the package and the checks.
          cargoArtifacts = craneLib.buildDepsOnly commonArgs;

          # Absolute tool paths compiled into the binary (`option_env!`). They are set on the
          # final package only, so bumping a tool rebuilds one crate, not the dependencies.
          toolPaths = {
            SANDBOX_LIMACTL = lib.getExe' pkgs.lima "limactl";
            SANDBOX_NONO = lib.getExe' pkgs.nono "nono";
            SANDBOX_MKE2FS = lib.getExe' pkgs.e2fsprogs "mke2fs";
          };

          imagePaths = guestImages: {
            SANDBOX_LIMA_IMAGE = "${guestImages.lima-image}/${guestImages.lima-image.passthru.filePath}";
            SANDBOX_BOX_IMAGE = "${guestImages.box-image}";
          };

          mkSandbox = guestImages:
            let
              bakedPaths = toolPaths // lib.optionalAttrs (guestImages != null) (imagePaths guestImages);
            in
            craneLib.buildPackage (commonArgs // bakedPaths // {
              inherit cargoArtifacts;
              cargoExtraArgs = "--locked --package sandbox-cli";
              # The workspace's tests run once, in checks.nextest.
              doCheck = false;
              nativeBuildInputs = commonArgs.nativeBuildInputs ++ [ pkgs.installShellFiles ];
              postInstall = lib.optionalString (pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform) ''
                installShellCompletion --cmd sandbox \
                  --bash <("$out/bin/sandbox" completions bash) \
                  --zsh <("$out/bin/sandbox" completions zsh) \
                  --fish <("$out/bin/sandbox" completions fish)
                "$out/bin/sandbox" man > sandbox.1
                installManPage sandbox.1
              '';
              passthru = { inherit cargoArtifacts bakedPaths; };
              meta = {
                description = "Run AI coding agents' commands inside an isolation boundary";
                license = lib.licenses.asl20;
                mainProgram = "sandbox";
                platforms = lib.platforms.linux ++ lib.platforms.darwin;
              };
            });

          # Linux hosts bake their own guest images. A macOS host needs aarch64-linux images,
          # which only a Linux builder can make, so its default package leaves them out.
          sandbox-without-images = mkSandbox null;
          sandbox-with-images = mkSandbox images.${guestSystemFor system};
          sandbox = if pkgs.stdenv.hostPlatform.isLinux then sandbox-with-images else sandbox-without-images;

          crateChecks = {
            clippy = craneLib.cargoClippy (commonArgs // {
              inherit cargoArtifacts;
              cargoClippyExtraArgs = "--all-targets -- --deny warnings";
            });

            fmt = craneLib.cargoFmt { inherit (commonArgs) pname version src; };

            nextest = craneLib.cargoNextest (commonArgs // {
              inherit cargoArtifacts;
              # Tests build real repositories (DESIGN §7).
              nativeBuildInputs = commonArgs.nativeBuildInputs ++ [ pkgs.git ];
              cargoNextestExtraArgs = "--no-tests=pass";
            });
          };

          moduleChecks = import ./tests/modules { inherit self nixpkgs home-manager pkgs system; };

          vmTests = lib.optionalAttrs pkgs.stdenv.hostPlatform.isLinux {
            vm-escape = import ./tests/vm/escape.nix { inherit self pkgs; };
            vm-tool-paths = import ./tests/vm/tool-paths.nix { inherit self pkgs; };
            vm-home-manager = import ./tests/vm/home-manager.nix { inherit self pkgs home-manager; };
          };
        in
        {
          packages = {
            inherit sandbox sandbox-with-images sandbox-without-images;
            default = sandbox;
          } // lib.optionalAttrs pkgs.stdenv.hostPlatform.isLinux {
            inherit (images.${system}) lima-image box-image;
          };

          apps = rec {
            sandbox = {
              type = "app";
              program = lib.getExe self.packages.${system}.sandbox;
              meta.description = "Run a command inside the sandbox: nix run .#sandbox -- run -- <cmd>";
            };
            default = sandbox;
          };

          checks = crateChecks // moduleChecks // vmTests // { inherit sandbox; };

          devShells.default = craneLib.devShell {
            checks = crateChecks;
            inherit (commonArgs) PROTOC BOXLITE_DEPS_STUB;
            packages = [
              pkgs.protobuf
              pkgs.nono
              pkgs.lima
              pkgs.cargo-nextest
              pkgs.rust-analyzer
              pkgs.deadnix
              pkgs.nixpkgs-fmt
              pkgs.shellcheck
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
      devShells = collect "devShells";

      nixosModules.default = import ./nixos-modules/nixos.nix { inherit self; };
      homeModules.default = import ./nixos-modules/home-manager.nix { inherit self; };
      # The name home-manager's own documentation used before `homeModules`.
      homeManagerModules = self.homeModules;
    };
}
