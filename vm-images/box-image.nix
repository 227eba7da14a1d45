# The image BoxLite boots: bash, coreutils, git, python3 and CA certificates, the box's user,
# and a default command that keeps the box up. Built as a layered image stream and converted to
# an OCI layout directory, which is what `box.create`'s `rootfs` and `sandbox exec --rootfs`
# take, and what the CLI reads from SANDBOX_BOX_IMAGE / SANDBOX_PACKAGE_BOX_IMAGE.
#
# It matches `cargo xtask box-image` (xtask/src/box_image.rs), which builds the same thing from
# Debian packages where Nix is not available: the same user (`sandbox`, uid and gid 1000: fixed,
# so the image is the same for every host; 1000 is the first regular user on most Linux hosts,
# whose mounted worktrees it can then write), the same labels and the same default command.
{ pkgs }:
let
  inherit (pkgs) lib;
  name = "sandbox-box";
  tag = "latest";

  user = { name = "sandbox"; uid = 1000; gid = 1000; home = "/home/sandbox"; };

  passwd = ''
    root:x:0:0:root:/root:/bin/bash
    ${user.name}:x:${toString user.uid}:${toString user.gid}:sandbox box user:${user.home}:/bin/bash
    nobody:x:65534:65534:nobody:/var/empty:/bin/sh
  '';
  group = ''
    root:x:0:
    ${user.name}:x:${toString user.gid}:
    nogroup:x:65534:
  '';

  config = {
    # Keeps the box up between execs; BoxLite runs every command with exec.
    Cmd = [ "/bin/sleep" "infinity" ];
    WorkingDir = "/";
    Env = [
      "PATH=/bin:/usr/bin"
      "LANG=C.UTF-8"
      "SSL_CERT_FILE=/etc/ssl/certs/ca-bundle.crt"
      "GIT_SSL_CAINFO=/etc/ssl/certs/ca-bundle.crt"
    ];
    # The labels `cargo xtask box-image` sets: the backend reads the box's user from them.
    Labels = {
      "dev.sandbox.box.user" = user.name;
      "dev.sandbox.box.uid" = toString user.uid;
    };
  };

  stream = pkgs.dockerTools.streamLayeredImage {
    inherit name tag config;
    contents = with pkgs; [
      bashInteractive
      coreutils
      gitMinimal
      python3
      cacert
      dockerTools.binSh
      dockerTools.usrBinEnv
    ];
    extraCommands = ''
      mkdir -p etc tmp root dev ${lib.removePrefix "/" user.home}
      chmod 1777 tmp
      cat > etc/passwd <<'EOF'
      ${passwd}EOF
      cat > etc/group <<'EOF'
      ${group}EOF
    '';
    fakeRootCommands = ''
      chown ${toString user.uid}:${toString user.gid} ./${lib.removePrefix "/" user.home}
    '';
  };
in
pkgs.runCommand "${name}-oci"
{
  nativeBuildInputs = [ pkgs.skopeo pkgs.jq ];
  passthru = { inherit stream name tag user config; };
} ''
  export HOME="$TMPDIR"
  ${stream} > image.tar
  skopeo --insecure-policy --tmpdir "$TMPDIR" copy docker-archive:image.tar "oci:$out:${tag}"

  # What the box needs, checked in the layout itself: the default command, and the user's
  # entry in the /etc/passwd the layers make (the last layer that has one wins).
  blob() { echo "$out/blobs/sha256/''${1#sha256:}"; }
  manifest=$(blob "$(jq -r '.manifests[0].digest' "$out/index.json")")
  jq -e '.config.Cmd == ["/bin/sleep", "infinity"]' "$(blob "$(jq -r '.config.digest' "$manifest")")" > /dev/null
  mkdir check
  for layer in $(jq -r '.layers[].digest' "$manifest"); do
    tar -xf "$(blob "$layer")" -C check --wildcards etc/passwd ./etc/passwd 2> /dev/null || true
  done
  grep -qx '${user.name}:x:${toString user.uid}:${toString user.gid}:.*' check/etc/passwd
''
