//! The guest's provisioning, as text: one idempotent `mode: system` script that Lima runs on
//! every boot (cloud-init on Ubuntu, lima-init.sh on the NixOS image). It
//!
//! 1. raises sshd's `MaxSessions`: every terminal and hook is one session on Lima's shared
//!    ControlMaster connection, and OpenSSH's default of 10 is hit by a busy project;
//! 2. marks the mounted views and common dirs `safe.directory` (they belong to the host's uid);
//! 3. stacks, for each view, the git store overlay on the common dir's path — the read-only
//!    common dir below, the view's layer (`upper/`, `work/`) on top — in a mount namespace of
//!    its own (one common dir can carry only one overlay, and each view has its own layer),
//!    with the view's writable `worktrees/<view>` moved back on top. The overlay is mounted
//!    `userxattr`: its upper layer is a virtiofs share, where `trusted.*` xattrs (overlayfs's
//!    default) do not pass; its whiteouts (`c 0,0`) and `user.overlay.*` marks are what the
//!    host's quarantine reads back as deletions;
//! 4. installs `enter`, which runs a command in its view's namespace as the Lima user;
//! 5. writes the sentinel, last: Lima does not fail `start` when provisioning fails, so the
//!    backend refuses a VM whose sentinel does not hold this script's hash.
//!
//! Any failure exits non-zero before the sentinel: a view without its overlay is never
//! handed out with a writable store instead.

use sha2::Digest;

use crate::mounts::ViewLayout;

/// The guest directory provisioning owns (a tmpfs: it is rebuilt on every boot).
pub const STATE_DIR: &str = "/run/sandbox-lima";
/// Where the sentinel is written.
pub const SENTINEL: &str = "/run/sandbox-lima/provisioned";
/// The helper commands run through.
pub const ENTER: &str = "/run/sandbox-lima/enter";
/// What runs [`ENTER`]: a shell reading it, never the file executed. Debian's and Ubuntu's
/// initramfs-tools mount `/run` `noexec` (and systemd keeps it so): a real Lima VM on either
/// refused `/run/sandbox-lima/enter` with "Permission denied" (docs/lima.md).
pub const ENTER_SHELL: &str = "/bin/sh";
/// The `MaxSessions` provisioning sets.
pub const MAX_SESSIONS: u32 = 128;

/// Single-quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

const ENTER_SCRIPT: &str = r#"#!/bin/sh
# enter <view id> <dir> <command> [args...]: runs the command as the calling user, in the
# view's mount namespace (the git store overlay), in <dir>. 125: the view is not set up.
set -eu
id=$1
dir=$2
shift 2
ns=/run/sandbox-lima/ns/$id
if [ ! -e "$ns" ]; then
  echo "sandbox-lima: the view $id has no git store overlay in this VM (provisioning did not set it up); restart the VM: sandbox lima stop" >&2
  exit 125
fi
uid=$(id -u)
gid=$(id -g)
exec sudo -n --preserve-env nsenter --mount="$ns" -- \
  setpriv --reuid="$uid" --regid="$gid" --init-groups -- \
  env PATH="$PATH" HOME="$HOME" USER="$(id -un)" LOGNAME="$(id -un)" \
  sh -c 'cd "$1" || { echo "sandbox-lima: no directory $1 in the VM" >&2; exit 125; }; shift; exec "$@"' \
  sandbox-lima "$dir" "$@"
"#;

/// The provisioning script for these views.
pub fn script(views: &[ViewLayout]) -> String {
    let mut s = String::new();
    s.push_str("#!/bin/bash\n# sandbox-lima provisioning (generated; see crates/sandbox-lima/src/provision.rs)\n");
    s.push_str("set -eu -o pipefail\n");
    s.push_str(&format!("state={STATE_DIR}\n"));
    s.push_str("rm -f \"$state/provisioned\"\nmkdir -p \"$state/ns\" \"$state/stash\"\n");
    // A mount namespace is kept by binding its nsfs file, which the kernel refuses (EINVAL)
    // under a shared mount — and systemd makes every mount shared, /run included. The
    // directory of the namespace files is a private mount of its own.
    s.push_str(
        "mountpoint -q \"$state/ns\" || mount --bind \"$state/ns\" \"$state/ns\"\nmount --make-private \"$state/ns\"\n\n",
    );
    s.push_str(&format!(
        r#"# 1. sshd's session limit.
want={MAX_SESSIONS}
have=$(sshd -T 2>/dev/null | awk 'tolower($1) == "maxsessions" {{ print $2 }}')
if [ "${{have:-10}}" -lt "$want" ]; then
  if [ -d /etc/ssh/sshd_config.d ] && [ -w /etc/ssh/sshd_config.d ]; then
    echo "MaxSessions $want" >/etc/ssh/sshd_config.d/90-sandbox-lima.conf
    systemctl reload ssh.service 2>/dev/null || systemctl reload sshd.service
  else
    echo "sandbox-lima: cannot raise sshd MaxSessions to $want (no writable /etc/ssh/sshd_config.d)" >&2
    exit 1
  fi
fi

"#
    ));
    s.push_str("# 2. safe.directory for the mounted paths.\n");
    s.push_str("safe() { git config --system --get-all safe.directory 2>/dev/null | grep -Fxq -- \"$1\" || git config --system --add safe.directory \"$1\"; }\n");
    let mut safe: Vec<&std::path::Path> = Vec::new();
    for v in views {
        for p in [v.view_path.as_path(), v.common_dir.as_path()] {
            if !safe.contains(&p) {
                safe.push(p);
            }
        }
    }
    for p in safe {
        s.push_str(&format!("safe {}\n", sh_quote(&p.to_string_lossy())));
    }
    s.push_str(
        r#"
# 3. Each view's git store overlay, in a mount namespace of its own.
layer() {
  local id=$1 common=$2 admin=$3 layer=$4
  local ns=$state/ns/$id stash=$state/stash/$id
  if [ -e "$ns" ] && findmnt --noheadings "$ns" >/dev/null; then return 0; fi
  touch "$ns"
  mkdir -p "$stash"
  if ! unshare --mount="$ns" --propagation private -- /bin/sh -eu -c '
      mount --bind "$3" "$5"
      mount -t overlay overlay -o "lowerdir=$2,upperdir=$4/upper,workdir=$4/work,userxattr" "$2"
      mount --move "$5" "$3"' sh "$id" "$common" "$admin" "$layer" "$stash"; then
    umount "$ns" 2>/dev/null || true
    rm -f "$ns"
    echo "sandbox-lima: cannot stack the git store overlay of $common for $admin (on a Linux host the layer's virtiofs share must carry xattrs: Lima starts virtiofsd without --xattr, so describe a virtiofsd that adds it, as docs/lima.md says; the kernel's reason is in dmesg)" >&2
    exit 1
  fi
}
"#,
    );
    for v in views {
        s.push_str(&format!(
            "layer {} {} {} {}\n",
            sh_quote(&v.id),
            sh_quote(&v.common_dir.to_string_lossy()),
            sh_quote(&v.admin_dir.to_string_lossy()),
            sh_quote(&v.layer_dir.to_string_lossy()),
        ));
    }
    s.push_str("\n# 4. The helper commands run through.\n");
    s.push_str(&format!(
        "cat >\"$state/enter.new\" <<'SANDBOX_ENTER'\n{ENTER_SCRIPT}SANDBOX_ENTER\nchmod 755 \"$state/enter.new\"\nmv \"$state/enter.new\" {ENTER}\n\n"
    ));
    s.push_str("# 5. The sentinel, last.\n");
    s.push_str("echo @HASH@ >\"$state/provisioned\"\n");
    let hash = hash(&s);
    s.replace("@HASH@", &hash)
}

/// The hash provisioning writes to the sentinel (of the script with a placeholder for itself).
fn hash(text: &str) -> String {
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The sentinel value a script writes: read back from its last line.
pub fn sentinel_of(script: &str) -> Option<String> {
    script
        .lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("echo ")?
                .strip_suffix(" >\"$state/provisioned\"")
        })
        .map(str::to_string)
}
