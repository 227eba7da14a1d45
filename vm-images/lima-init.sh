# Configures this NixOS guest from Lima's cidata disk on every boot: the user Lima logs in as,
# its SSH keys, the host directories Lima shares (the sandbox view and its git data), and the
# instance's own provisioning scripts. Everything the guest runs is already in the image, so
# this installs nothing. Lima waits for /run/lima-ssh-ready and /run/lima-boot-done to hold
# this boot's instance id; a mount that fails withholds boot-done, so `limactl start` fails
# loudly instead of handing out a guest without its working tree.
cidata=/mnt/lima-cidata
status=0

# KEY=VALUE lines whose values may contain spaces: export them one at a time.
load_env() {
  local line
  while IFS= read -r line; do
    if [ -n "$line" ]; then export "${line?}"; fi
  done <"$1"
}
load_env "$cidata/lima.env"
if [ -f "$cidata/param.env" ]; then load_env "$cidata/param.env"; fi

# Older limactl versions do not put LIMA_CIDATA_IID in lima.env: the instance id is then the
# `instance-id:` of cloud-init's meta-data (nixos-lima does the same).
iid=${LIMA_CIDATA_IID:-}
if [ -z "$iid" ]; then
  iid=$(awk -F': *' '$1 == "instance-id" { print $2; exit }' "$cidata/meta-data")
  if [ -z "$iid" ]; then
    echo "sandbox-lima-init: no instance id in lima.env or meta-data" >&2
    exit 1
  fi
fi

# Lima features this image does not implement fail the boot loudly instead of being ignored:
# a guest that silently lacks a mount type or a provisioning mode is not what was asked for.
unsupported() {
  echo "sandbox-lima-init: unsupported Lima feature: $1 (this NixOS image implements 9p and virtiofs mounts and system/user provisioning)" >&2
  status=1
}
for dir in "$cidata"/provision.*; do
  [ -e "$dir" ] || continue
  case ${dir##*/} in
    provision.system | provision.user) ;;
    *) unsupported "provisioning mode ${dir##*/provision.}" ;;
  esac
done
# lima.env sets these to 1 (or leaves them empty) as the instance's YAML asks.
if [ "${LIMA_CIDATA_CONTAINERD_SYSTEM:-}" = 1 ] || [ "${LIMA_CIDATA_CONTAINERD_USER:-}" = 1 ]; then
  unsupported "containerd"
fi
if [ "${LIMA_CIDATA_UPGRADE_PACKAGES:-}" = 1 ]; then unsupported "upgradePackages"; fi
if [ "${LIMA_CIDATA_ROSETTA_ENABLED:-}" = true ] || [ "${LIMA_CIDATA_ROSETTA_ENABLED:-}" = 1 ]; then
  unsupported "rosetta"
fi
if [ "${LIMA_CIDATA_DISKS:-0}" != 0 ]; then unsupported "additionalDisks"; fi
if env | grep -q '^LIMA_CIDATA_\(DATAFILE\|YQ_PROVISION\)_'; then unsupported "provisioning modes data and yq"; fi

user=$LIMA_CIDATA_USER
home=$LIMA_CIDATA_HOME
shell=${LIMA_CIDATA_SHELL:-/bin/bash}

# 1. The user, with the uid and home directory the host chose (Lima's defaults follow the host).
if ! id -u "$user" >/dev/null 2>&1; then
  useradd --uid "$LIMA_CIDATA_UID" --home-dir "$home" --create-home --shell "$shell" \
    --comment "${LIMA_CIDATA_COMMENT:-}" --user-group --groups wheel,users "$user"
fi
gid=$(id -g "$user")
# Lima documents both /home/<user>.guest and /home/<user>.linux.
for alias in "/home/$user.guest" "/home/$user.linux"; do
  if [ "$alias" != "$home" ] && [ ! -e "$alias" ]; then ln -s "$home" "$alias"; fi
done

# 2. Its SSH keys: the ssh-authorized-keys list of user-data.
install -d -m 700 -o "$LIMA_CIDATA_UID" -g "$gid" "$home/.ssh"
keys=$(mktemp)
awk '
  /^[[:space:]]*ssh[-_]authorized[-_]keys:/ { inkeys = 1; next }
  inkeys && /^[[:space:]]*- / { sub(/^[[:space:]]*- /, ""); gsub(/^"|"$/, ""); print; next }
  inkeys { inkeys = 0 }
' "$cidata/user-data" >"$keys"
install -m 600 -o "$LIMA_CIDATA_UID" -g "$gid" "$keys" "$home/.ssh/authorized_keys"
rm -f "$keys"

# 3. The shared directories. user-data lists them cloud-init style:
#    - [tag, mountpoint, type, "options", "0", "0"]
# (reverse-sshfs mounts are made by the host agent over ssh and do not appear here).
mounts=$(awk '
  /^mounts:/ { inmounts = 1; next }
  inmounts && /^- \[/ {
    line = $0
    sub(/^- \[/, "", line); sub(/\][[:space:]]*$/, "", line)
    n = split(line, field, /, /)
    for (i = 1; i <= n; i++) gsub(/^"|"$/, "", field[i])
    if (field[2] != "/mnt/lima-rosetta") print field[1] "\t" field[2] "\t" field[3] "\t" field[4]
    next
  }
  inmounts && /^[^ -]/ { inmounts = 0 }
' "$cidata/user-data")
while IFS=$'\t' read -r tag mountpoint fstype options; do
  [ -n "$tag" ] || continue
  case $fstype in
    9p | virtiofs) ;;
    *) unsupported "mount type $fstype ($mountpoint)"; continue ;;
  esac
  mkdir -p "$mountpoint"
  if mountpoint -q "$mountpoint"; then continue; fi
  if ! mount -t "$fstype" -o "$options" "$tag" "$mountpoint"; then
    echo "sandbox-lima-init: cannot mount $tag ($fstype) on $mountpoint" >&2
    status=1
  fi
done <<<"$mounts"

# 4. Provisioning scripts from the instance's YAML, if it has any (the sandbox backend's
#    own needs are met by the image).
if [ -d "$cidata/provision.system" ]; then
  for script in "$cidata"/provision.system/*; do
    if ! "$script"; then
      echo "sandbox-lima-init: system provisioning script $script failed" >&2
      status=1
    fi
  done
fi
if [ -d "$cidata/provision.user" ]; then
  for script in "$cidata"/provision.user/*; do
    copy="$home/.lima-user-script"
    install -m 755 -o "$LIMA_CIDATA_UID" -g "$gid" "$script" "$copy"
    if ! runuser --login "$user" --command "$copy"; then
      echo "sandbox-lima-init: user provisioning script $script failed" >&2
      status=1
    fi
    rm -f "$copy"
  done
fi

# 5. Tell the host agent (it compares the instance id, which changes on every boot).
echo "$iid" >/run/lima-ssh-ready
if [ "$status" = 0 ]; then
  echo "$iid" >/run/lima-boot-done
fi
exit "$status"
