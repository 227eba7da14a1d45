# The image BoxLite boots: bash, coreutils, git and CA certificates, nothing else. Built as a
# layered image stream and converted to an OCI layout directory, which is what the CLI reads
# from SANDBOX_BOX_IMAGE.
{ pkgs }:
let
  name = "sandbox-box";
  tag = "latest";

  stream = pkgs.dockerTools.streamLayeredImage {
    inherit name tag;
    contents = with pkgs; [
      bashInteractive
      coreutils
      gitMinimal
      cacert
      dockerTools.binSh
      dockerTools.usrBinEnv
    ];
    extraCommands = ''
      mkdir -p tmp root
      chmod 1777 tmp
    '';
    config = {
      Cmd = [ "/bin/bash" ];
      WorkingDir = "/root";
      Env = [
        "PATH=/bin:/usr/bin"
        "HOME=/root"
        "SSL_CERT_FILE=/etc/ssl/certs/ca-bundle.crt"
        "GIT_SSL_CAINFO=/etc/ssl/certs/ca-bundle.crt"
      ];
    };
  };
in
pkgs.runCommand "${name}-oci"
{
  nativeBuildInputs = [ pkgs.skopeo ];
  passthru = { inherit stream name tag; };
} ''
  export HOME="$TMPDIR"
  ${stream} > image.tar
  skopeo --insecure-policy --tmpdir "$TMPDIR" copy docker-archive:image.tar "oci:$out:${tag}"
  test -f "$out/index.json"
''
