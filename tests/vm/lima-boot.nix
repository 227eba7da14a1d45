# The Lima guest's NixOS configuration (vm-images/lima.nix, what `.#lima-image` is built from)
# booted the way `limactl start` boots it: with a cidata ISO (volume label `cidata`) attached as
# a CD-ROM, holding `meta-data`, `user-data`, `lima.env` and provisioning scripts laid out as
# Lima writes them. lima.env has no LIMA_CIDATA_IID (older limactl versions), so the instance id
# must come from meta-data's `instance-id:`.
#
# `guest` gets a supported instance: the boot service creates Lima's user (uid, comment with a
# space, home and its alias), installs the SSH key, mounts the 9p share user-data lists, runs the
# system and user provisioning scripts and writes the instance id to /run/lima-ssh-ready and
# /run/lima-boot-done. `unsupported` asks for containerd and a `boot` provisioning script, which
# the image does not implement: the service fails, names both, and boot-done never appears (so
# `limactl start` would fail instead of handing out the VM).
#
# The nodes are NixOS test VMs (the driver's backdoor is how the test looks inside), so the disk
# is the test framework's, not the qcow2 file; everything the guest runs at boot is the image's.
{ pkgs }:
let
  inherit (pkgs) lib;
  cidataMount = import ../../vm-images/lima-cidata-mount.nix;

  user = "alice";
  uid = "1234";
  home = "/home/${user}.linux";
  sshKey = "ssh-ed25519 AAAAC3NzaC1lZDI2NTE5AAAAIHz2dR0bwyOoY2pYgCmq7N1bqH9t0nYtq0yRvMk6cFg9 alice@host";

  # What the 9p share holds, and where user-data asks for it.
  share = pkgs.runCommand "lima-boot-share" { } ''
    mkdir -p $out
    echo shared-from-host > $out/marker
  '';
  shareMountPoint = "/tmp/lima";

  # A cidata ISO with `files` (path inside the volume -> content), as Lima's cidata.iso.
  cidata = name: files: pkgs.runCommand "cidata-${name}.iso" { nativeBuildInputs = [ pkgs.xorriso ]; } ''
    mkdir cidata
    ${lib.concatStrings (lib.mapAttrsToList (path: text: ''
      mkdir -p "cidata/$(dirname ${path})"
      cat > cidata/${path} <<'LIMA_CIDATA_EOF'
      ${text}
      LIMA_CIDATA_EOF
      chmod 755 cidata/${path}
    '') files)}
    xorriso -as mkisofs -quiet -V cidata -J -R -o $out cidata
  '';

  metaData = iid: ''
    instance-id: ${iid}
    local-hostname: lima-sandbox
  '';

  # Lima's cidata.TEMPLATE.d/user-data, for the parts the image reads.
  userData = ''
    #cloud-config
    # vim:syntax=yaml

    growpart:
      mode: auto
      devices: ['/']
    mounts:
    - [mount0, ${shareMountPoint}, 9p, "rw,trans=virtio,version=9p2000.L,msize=131072,cache=mmap,nofail", "0", "0"]

    users:
      - name: "${user}"
        uid: "${uid}"
        homedir: "${home}"
        shell: /bin/bash
        sudo: ALL=(ALL) NOPASSWD:ALL
        lock_passwd: true
        ssh-authorized-keys:
          - "${sshKey}"
  '';

  # Lima's cidata.TEMPLATE.d/lima.env, without LIMA_CIDATA_IID.
  limaEnv = extra: ''
    LIMA_CIDATA_NAME=sandbox
    LIMA_CIDATA_USER=${user}
    LIMA_CIDATA_UID=${uid}
    LIMA_CIDATA_COMMENT=Alice Lima
    LIMA_CIDATA_HOME=${home}
    LIMA_CIDATA_SHELL=/bin/bash
    LIMA_CIDATA_MOUNTS=1
    LIMA_CIDATA_MOUNTTYPE=9p
    LIMA_CIDATA_DISKS=0
    LIMA_CIDATA_GUEST_INSTALL_PREFIX=/usr/local
    LIMA_CIDATA_UPGRADE_PACKAGES=
    LIMA_CIDATA_CONTAINERD_USER=
    LIMA_CIDATA_SLIRP_GATEWAY=192.168.5.2
    LIMA_CIDATA_SLIRP_DNS=192.168.5.3
    LIMA_CIDATA_SLIRP_IP_ADDRESS=192.168.5.15
    LIMA_CIDATA_ROSETTA_ENABLED=
    LIMA_CIDATA_VMTYPE=qemu
    ${extra}
  '';

  goodIid = "sandbox-lima-boot-iid-1";
  badIid = "sandbox-lima-boot-iid-2";

  supportedIso = cidata "supported" {
    "meta-data" = metaData goodIid;
    "user-data" = userData;
    "lima.env" = limaEnv "LIMA_CIDATA_CONTAINERD_SYSTEM=";
    "provision.system/00000000" = ''
      #!/bin/sh
      echo system > /run/lima-provisioned-system
    '';
    "provision.user/00000001" = ''
      #!/bin/sh
      id -un > "$HOME/lima-provisioned-user"
    '';
  };

  unsupportedIso = cidata "unsupported" {
    "meta-data" = metaData badIid;
    "user-data" = userData;
    "lima.env" = limaEnv "LIMA_CIDATA_CONTAINERD_SYSTEM=1";
    "provision.boot/00000000" = ''
      #!/bin/sh
      true
    '';
  };

  # The cidata ISO as a CD-ROM, the way current limactl attaches it to QEMU (a read-only raw
  # drive on a virtio-scsi CD; older versions used `-cdrom` except on riscv64), plus Lima's 9p
  # share. The ids differ from Lima's `cdrom0`/`scsi0` so as not to meet the test VM's own.
  node = name: iso: {
    imports = [ ../../vm-images/lima.nix ];
    networking.hostName = lib.mkForce name;
    virtualisation.fileSystems.${cidataMount.mountPoint} = cidataMount.fileSystem;
    virtualisation.qemu.options = [
      "-drive id=cidata,if=none,format=raw,readonly=on,file=${iso}"
      "-device virtio-scsi-pci,id=cidatascsi"
      "-device scsi-cd,bus=cidatascsi.0,drive=cidata"
      "-virtfs local,path=${share},mount_tag=mount0,security_model=none,readonly=on"
    ];
    virtualisation.memorySize = 1024;
  };
in
assert !(lib.hasInfix "LIMA_CIDATA_IID" (limaEnv "")); # the meta-data fallback is what boots
pkgs.testers.runNixOSTest {
  name = "sandbox-lima-boot";
  globalTimeout = 10 * 60;

  nodes.guest = node "guest" supportedIso;
  nodes.unsupported = node "unsupported" unsupportedIso;

  testScript = ''
    USER = "${user}"
    HOME = "${home}"
    GOOD_IID = "${goodIid}"
    BAD_IID = "${badIid}"

    start_all()

    with subtest("the cidata CD-ROM is mounted where lima-init reads it"):
        guest.wait_for_unit("multi-user.target")
        fstype = guest.succeed("findmnt -n -o FSTYPE ${cidataMount.mountPoint}").strip()
        assert fstype == "iso9660", f"cidata is mounted as {fstype!r}"
        guest.succeed("test -f ${cidataMount.mountPoint}/lima.env")
        guest.fail("grep -q LIMA_CIDATA_IID ${cidataMount.mountPoint}/lima.env")

    with subtest("boot-done appears and holds meta-data's instance id"):
        guest.wait_for_file("/run/lima-boot-done")
        done = guest.succeed("cat /run/lima-boot-done").strip()
        assert done == GOOD_IID, f"/run/lima-boot-done holds {done!r}, not meta-data's {GOOD_IID!r}"
        ready = guest.succeed("cat /run/lima-ssh-ready").strip()
        assert ready == GOOD_IID, f"/run/lima-ssh-ready holds {ready!r}"
        guest.succeed("systemctl is-active sandbox-lima-init.service")

    with subtest("Lima's user, with the uid, comment, home and shell lima.env names"):
        entry = guest.succeed(f"getent passwd {USER}").strip().split(":")
        assert entry[2] == "${uid}", entry
        assert entry[4] == "Alice Lima", entry
        assert entry[5] == HOME, entry
        assert entry[6] == "/bin/bash", entry
        guest.succeed(f"test \"$(readlink /home/{USER}.guest)\" = {HOME}")
        guest.succeed(f"id -nG {USER} | tr ' ' '\\n' | grep -qx wheel")

    with subtest("the key from user-data is the user's only authorized key"):
        keys = guest.succeed(f"cat {HOME}/.ssh/authorized_keys").strip()
        assert keys == "${sshKey}", f"authorized_keys: {keys!r}"
        owner = guest.succeed(f"stat -c %U:%a {HOME}/.ssh/authorized_keys").strip()
        assert owner == f"{USER}:600", owner
        guest.wait_for_unit("sshd.service")

    with subtest("the 9p share user-data lists is mounted"):
        fstype = guest.succeed("findmnt -n -o FSTYPE ${shareMountPoint}").strip()
        assert fstype == "9p", f"${shareMountPoint} is {fstype!r}"
        marker = guest.succeed("cat ${shareMountPoint}/marker").strip()
        assert marker == "shared-from-host", marker

    with subtest("system and user provisioning scripts ran"):
        guest.succeed("grep -qx system /run/lima-provisioned-system")
        ran_as = guest.succeed(f"cat {HOME}/lima-provisioned-user").strip()
        assert ran_as == USER, f"the user script ran as {ran_as!r}"

    with subtest("an unsupported Lima feature fails the boot loudly"):
        unsupported.wait_until_succeeds("systemctl is-failed sandbox-lima-init.service", timeout=300)
        log = unsupported.succeed("journalctl -b -u sandbox-lima-init.service")
        assert "unsupported Lima feature: containerd" in log, log
        assert "unsupported Lima feature: provisioning mode boot" in log, log
        ready = unsupported.succeed("cat /run/lima-ssh-ready").strip()
        assert ready == BAD_IID, f"/run/lima-ssh-ready holds {ready!r}"
        unsupported.fail("test -e /run/lima-boot-done")
  '';
}
