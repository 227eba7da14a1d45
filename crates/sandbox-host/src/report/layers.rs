//! Layered enforcement accounting: what a native run enforces is the union of its layers.
//!
//! A property the policy needs (filesystem confinement, no truncate outside the grants, …) is
//! enforced when any layer this run has covers it: the private view, Landlock at some ABI,
//! seccomp, and — as they land — the pid and network namespaces. A property Landlock cannot
//! give on this kernel is not a gap when another layer holds it; a property no layer holds is
//! reported, either as a gap (the run fails closed unless `--allow-degraded`) or as a
//! downgrade (the run starts and says so at its start, every time, as for the missing view).
//!
//! [`account`] is a pure function of (what the policy needs, what the kernel and the run
//! have); the probes that fill [`Layers`] live with the backend.

use serde::Serialize;

/// What a run has, as probed on this machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Layers {
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: i32,
    /// The private view: user + mount namespaces and a new root holding only the policy's
    /// paths, read-only where not granted for writing, with a minimal `/dev`.
    pub view: bool,
    /// The command in a pid namespace of its own (no pid outside is addressable).
    pub pid_namespace: bool,
    /// The command in a network namespace of its own (no abstract socket outside exists).
    pub net_namespace: bool,
}

/// What the policy needs enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needs {
    /// `--block-net`: TCP only to the allowed ports.
    pub tcp_ports: bool,
    pub scope_signals: bool,
    pub scope_abstract_unix: bool,
}

/// A property of the policy, as the accounting names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Property {
    Filesystem,
    Truncate,
    DeviceIoctl,
    TcpPorts,
    Signals,
    AbstractUnix,
}

/// A layer that holds a property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Layer {
    View,
    /// Landlock, from this ABI on.
    Landlock(i32),
    PidNamespace,
    NetNamespace,
}

impl Layer {
    pub fn name(self) -> String {
        match self {
            Layer::View => "the private view".into(),
            Layer::Landlock(abi) => format!("Landlock ABI {abi}"),
            Layer::PidNamespace => "a pid namespace".into(),
            Layer::NetNamespace => "a network namespace".into(),
        }
    }

    fn present(self, layers: &Layers) -> bool {
        match self {
            Layer::View => layers.view,
            Layer::Landlock(abi) => layers.landlock_abi >= abi,
            Layer::PidNamespace => layers.pid_namespace,
            Layer::NetNamespace => layers.net_namespace,
        }
    }
}

/// How a property no layer holds is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Missing {
    /// The run fails closed unless degraded runs are allowed.
    Gap,
    /// The run starts and says so, every time.
    Downgrade,
}

impl Property {
    /// The layers that can hold it, best first.
    pub fn layers(self) -> &'static [Layer] {
        match self {
            // The view: a path outside the grants does not exist, and what exists read-only
            // is a read-only mount.
            Property::Filesystem => &[Layer::View, Layer::Landlock(1)],
            // truncate(2) on a read-only mount fails with EROFS.
            Property::Truncate => &[Layer::View, Layer::Landlock(3)],
            // The view's /dev holds only null, zero, full, random, urandom and tty (and the
            // granted devices), which Landlock's rule would allow anyway.
            Property::DeviceIoctl => &[Layer::View, Layer::Landlock(5)],
            // The namespace has no route out: only what the supervisor relays in.
            Property::TcpPorts => &[Layer::NetNamespace, Layer::Landlock(4)],
            Property::Signals => &[Layer::Landlock(6), Layer::PidNamespace],
            Property::AbstractUnix => &[Layer::Landlock(6), Layer::NetNamespace],
        }
    }

    /// Filesystem and network rules are what a grant means: without them, fail closed.
    /// Signal and abstract-socket scoping that no layer of this run can give is a downgrade,
    /// reported on every run like the missing view. With the view the pid namespace holds
    /// signals on every kernel; the network namespace will hold abstract sockets.
    pub fn when_missing(self) -> Missing {
        match self {
            Property::Filesystem
            | Property::Truncate
            | Property::DeviceIoctl
            | Property::TcpPorts => Missing::Gap,
            Property::Signals | Property::AbstractUnix => Missing::Downgrade,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Property::Filesystem => "filesystem: only the listed paths, with the listed rights",
            Property::Truncate => "no truncate(2) of files outside the grants",
            Property::DeviceIoctl => "device ioctls only on granted devices",
            Property::TcpPorts => "TCP connect/bind limited to the allowed ports (--block-net)",
            Property::Signals => "no signals to processes outside the sandbox",
            Property::AbstractUnix => "no abstract unix sockets of processes outside the sandbox",
        }
    }
}

/// One property's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub property: Property,
    /// The layers of this run that hold it (empty: missing).
    pub held_by: Vec<Layer>,
}

impl Verdict {
    /// "filesystem: … (the private view, Landlock ABI 2)".
    pub fn enforced_line(&self) -> String {
        let by: Vec<String> = self.held_by.iter().map(|l| l.name()).collect();
        format!("{} ({})", self.property.describe(), by.join(", "))
    }

    /// "no signals … (needs Landlock ABI 6 or a pid namespace)".
    pub fn missing_line(&self) -> String {
        let needs: Vec<String> = self.property.layers().iter().map(|l| l.name()).collect();
        format!(
            "{} (needs {})",
            self.property.describe(),
            needs.join(" or ")
        )
    }
}

/// The accounting of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Accounting {
    pub held: Vec<Verdict>,
    pub gaps: Vec<Verdict>,
    pub downgrades: Vec<Verdict>,
}

/// What `layers` hold of `needs`.
pub fn account(needs: &Needs, layers: &Layers) -> Accounting {
    let mut wanted = vec![
        Property::Filesystem,
        Property::Truncate,
        Property::DeviceIoctl,
    ];
    if needs.tcp_ports {
        wanted.push(Property::TcpPorts);
    }
    if needs.scope_signals {
        wanted.push(Property::Signals);
    }
    if needs.scope_abstract_unix {
        wanted.push(Property::AbstractUnix);
    }
    let mut out = Accounting::default();
    for property in wanted {
        let held_by: Vec<Layer> = property
            .layers()
            .iter()
            .copied()
            .filter(|l| l.present(layers))
            .map(|l| match l {
                // Name the kernel's ABI, not the minimum.
                Layer::Landlock(_) => Layer::Landlock(layers.landlock_abi),
                other => other,
            })
            .collect();
        let verdict = Verdict { property, held_by };
        if !verdict.held_by.is_empty() {
            out.held.push(verdict);
        } else if property.when_missing() == Missing::Gap {
            out.gaps.push(verdict);
        } else {
            out.downgrades.push(verdict);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: Needs = Needs {
        tcp_ports: false,
        scope_signals: true,
        scope_abstract_unix: true,
    };
    const BLOCK_NET: Needs = Needs {
        tcp_ports: true,
        ..DEFAULT
    };

    fn layers(abi: i32, view: bool) -> Layers {
        Layers {
            landlock_abi: abi,
            view,
            ..Layers::default()
        }
    }

    fn names(v: &[Verdict]) -> Vec<Property> {
        v.iter().map(|v| v.property).collect()
    }

    /// Every ABI 0..=7, with and without the view: the filesystem properties are held by the
    /// view alone, or by Landlock from their ABI; signals and abstract sockets from ABI 6; the
    /// TCP rules only by Landlock 4.
    #[test]
    fn every_abi_with_and_without_the_view() {
        for abi in 0..=7 {
            for view in [false, true] {
                let a = account(&BLOCK_NET, &layers(abi, view));
                let held = names(&a.held);
                let gaps = names(&a.gaps);
                let downgrades = names(&a.downgrades);
                let ctx = format!("abi {abi}, view {view}: {a:?}");
                for (p, min) in [
                    (Property::Filesystem, 1),
                    (Property::Truncate, 3),
                    (Property::DeviceIoctl, 5),
                ] {
                    if view || abi >= min {
                        assert!(held.contains(&p), "{p:?} held, {ctx}");
                    } else {
                        assert!(gaps.contains(&p), "{p:?} a gap, {ctx}");
                    }
                }
                assert_eq!(held.contains(&Property::TcpPorts), abi >= 4, "{ctx}");
                assert_eq!(gaps.contains(&Property::TcpPorts), abi < 4, "{ctx}");
                for p in [Property::Signals, Property::AbstractUnix] {
                    assert_eq!(held.contains(&p), abi >= 6, "{ctx}");
                    assert_eq!(downgrades.contains(&p), abi < 6, "{ctx}");
                    assert!(!gaps.contains(&p), "{ctx}");
                }
                // Each property is judged exactly once.
                assert_eq!(held.len() + gaps.len() + downgrades.len(), 6, "{ctx}");
                // The default policy (no --block-net) never fails closed with the view.
                let d = account(&DEFAULT, &layers(abi, view));
                assert_eq!(d.gaps.is_empty(), view || abi >= 5, "default, {ctx}");
            }
        }
    }

    #[test]
    fn debian_12_with_the_view_runs_the_default() {
        // 6.1: Landlock ABI 2, user namespaces.
        let a = account(&DEFAULT, &layers(2, true));
        assert!(a.gaps.is_empty(), "{a:?}");
        let truncate = a
            .held
            .iter()
            .find(|v| v.property == Property::Truncate)
            .unwrap();
        assert_eq!(truncate.held_by, vec![Layer::View]);
        let fs = a
            .held
            .iter()
            .find(|v| v.property == Property::Filesystem)
            .unwrap();
        assert_eq!(fs.held_by, vec![Layer::View, Layer::Landlock(2)]);
        assert_eq!(
            names(&a.downgrades),
            vec![Property::Signals, Property::AbstractUnix]
        );
        assert!(a.downgrades[0].missing_line().contains("a pid namespace"));
    }

    #[test]
    fn the_namespaces_hold_what_old_landlock_cannot() {
        let a = account(
            &DEFAULT,
            &Layers {
                landlock_abi: 2,
                view: true,
                pid_namespace: true,
                net_namespace: true,
            },
        );
        assert!(a.gaps.is_empty() && a.downgrades.is_empty(), "{a:?}");
        let signals = a
            .held
            .iter()
            .find(|v| v.property == Property::Signals)
            .unwrap();
        assert_eq!(signals.held_by, vec![Layer::PidNamespace]);
    }

    #[test]
    fn without_the_view_old_landlock_fails_closed_and_names_what_is_missing() {
        let a = account(&DEFAULT, &layers(2, false));
        assert_eq!(
            names(&a.gaps),
            vec![Property::Truncate, Property::DeviceIoctl]
        );
        assert!(a.gaps[0].missing_line().contains("Landlock ABI 3"), "{a:?}");
        let a = account(&DEFAULT, &layers(0, false));
        assert!(names(&a.gaps).contains(&Property::Filesystem), "{a:?}");
    }
}
