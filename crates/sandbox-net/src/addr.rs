//! Which addresses count as "the internet": a name on the allow-list may only resolve to
//! those, unless the list names the address itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A globally routable unicast address: not loopback, private (RFC 1918, unique-local),
/// link-local, shared (CGNAT, RFC 6598), unspecified, broadcast, multicast, benchmarking,
/// or reserved. An IPv4-mapped or -compatible IPv6 address is judged as its IPv4 address,
/// so `::ffff:10.0.0.1` is private.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_is_public(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4_is_public(v4),
            None => v6_is_public(v6),
        },
    }
}

fn v4_is_public(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        // "This network" 0.0.0.0/8.
        || a == 0
        // Shared address space (CGNAT) 100.64.0.0/10.
        || (a == 100 && (b & 0xc0) == 64)
        // IETF protocol assignments 192.0.0.0/24.
        || (a == 192 && b == 0 && c == 0)
        // Benchmarking 198.18.0.0/15.
        || (a == 198 && (b & 0xfe) == 18)
        // Reserved 240.0.0.0/4.
        || a >= 240)
}

fn v6_is_public(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // Unique local fc00::/7.
        || (s[0] & 0xfe00) == 0xfc00
        // Link-local fe80::/10 and the deprecated site-local fec0::/10.
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        // IPv4-compatible ::a.b.c.d (deprecated; never routed).
        || (s[0..6] == [0; 6])
        // NAT64 well-known prefix 64:ff9b::/96 and its local-use 64:ff9b:1::/48 reach
        // whatever IPv4 address they embed: not a public address of their own.
        || (s[0] == 0x64 && s[1] == 0xff9b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(s: &str) -> bool {
        is_public(s.parse().unwrap())
    }

    #[test]
    fn private_loopback_and_link_local_are_not_public() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "198.18.0.1",
            "240.0.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "fec0::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(!public(ip), "{ip} counted as public");
        }
    }

    #[test]
    fn routable_addresses_are_public() {
        for ip in [
            "93.184.216.34",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.1.1",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:93.184.216.34",
        ] {
            assert!(public(ip), "{ip} counted as not public");
        }
    }
}
