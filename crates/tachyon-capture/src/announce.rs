//! Discovery across machines (opt-in): a program that accepts captures can announce itself by
//! UDP once a second (Tracy's client broadcasts the same way), and `tachyon capture --list
//! --network` listens for the announcements for a moment.
//!
//! ```text
//! program → anyone    MAGIC (8) | version u32 | pid u32 | port u16 | name_len u8 | name
//! ```
//!
//! The capture's address is the datagram's source address (the program does not say which of
//! its addresses to use). A datagram is untrusted: anything that does not parse is ignored, and
//! one is at most [`MAX_DATAGRAM`] bytes.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// The first bytes of an announcement.
pub const MAGIC: [u8; 8] = *b"TACHYANN";
/// The UDP port announcements go to by default (UDP's, beside the TCP listener's default).
pub const ANNOUNCE_PORT: u16 = crate::protocol::DEFAULT_PORT;
/// How often a program announces itself.
pub const PERIOD: Duration = Duration::from_secs(1);
/// Longest program name an announcement carries (longer names are cut at a character edge).
pub const MAX_NAME: usize = 64;
/// Largest announcement.
pub const MAX_DATAGRAM: usize = 8 + 4 + 4 + 2 + 1 + MAX_NAME;

/// One program that announced itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    /// The address the announcement came from (where the program is).
    pub addr: IpAddr,
    /// Its pid (on its machine).
    pub pid: u32,
    /// The TCP port it accepts captures on.
    pub port: u16,
    /// The protocol version it speaks.
    pub version: u32,
    /// Its name (control characters removed).
    pub name: String,
}

/// The datagram announcing `name` (pid, port, protocol version).
pub fn encode(pid: u32, port: u16, version: u32, name: &str) -> Vec<u8> {
    let mut cut = name.len().min(MAX_NAME);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let name = &name.as_bytes()[..cut];
    let mut b = Vec::with_capacity(MAX_DATAGRAM);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&port.to_le_bytes());
    b.push(name.len() as u8);
    b.extend_from_slice(name);
    b
}

/// Parses a datagram from `from`; `None` unless it is a whole, well-formed announcement.
pub fn decode(b: &[u8], from: IpAddr) -> Option<Announcement> {
    if b.len() < 19 || b.len() > MAX_DATAGRAM || b[..8] != MAGIC {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let len = b[18] as usize;
    if len > MAX_NAME || b.len() != 19 + len {
        return None;
    }
    let name = std::str::from_utf8(&b[19..]).ok()?;
    Some(Announcement {
        addr: from,
        version: u32_at(8),
        pid: u32_at(12),
        port: u16::from_le_bytes([b[16], b[17]]),
        name: name.chars().filter(|c| !c.is_control()).collect(),
    })
}

/// A socket that sends announcements to `to` (broadcast allowed).
pub fn sender(to: SocketAddr) -> io::Result<UdpSocket> {
    let any: SocketAddr = if to.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any)?;
    if to.is_ipv4() {
        s.set_broadcast(true)?;
    }
    s.connect(to)?;
    Ok(s)
}

/// Listens on `bind` for `for_how_long` and returns the programs heard, one per address and
/// pid (the latest announcement wins), sorted by address, then pid.
pub fn listen(bind: SocketAddr, for_how_long: Duration) -> io::Result<Vec<Announcement>> {
    let s = UdpSocket::bind(bind)?;
    let deadline = Instant::now() + for_how_long;
    let mut heard = BTreeMap::new();
    let mut buf = [0u8; MAX_DATAGRAM + 1];
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        s.set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
        match s.recv_from(&mut buf) {
            Ok((n, from)) => {
                if let Some(a) = decode(&buf[..n], from.ip()) {
                    heard.insert((a.addr, a.pid), a);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(heard.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const HOME: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn announcements_round_trip_and_long_names_are_cut() {
        let b = encode(42, 8110, 1, "demo");
        let a = decode(&b, HOME).expect("parses");
        assert_eq!(
            (a.pid, a.port, a.version, a.name.as_str()),
            (42, 8110, 1, "demo")
        );
        let long = "é".repeat(40); // 80 bytes: cut at a character edge, 64 bytes
        let a = decode(&encode(1, 2, 3, &long), HOME).expect("parses");
        assert_eq!(a.name, "é".repeat(32));
    }

    #[test]
    fn malformed_datagrams_are_ignored() {
        let good = encode(7, 9000, 1, "x\u{7}y");
        assert_eq!(decode(&good, HOME).unwrap().name, "xy");
        assert!(decode(&good[..good.len() - 1], HOME).is_none()); // name cut short
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(decode(&bad, HOME).is_none());
        let mut bad = good.clone();
        bad[18] = 200; // a name longer than the limit
        assert!(decode(&bad, HOME).is_none());
        let mut bad = good;
        bad.push(0); // trailing bytes
        assert!(decode(&bad, HOME).is_none());
        assert!(decode(&[], HOME).is_none());
        let mut bad = encode(7, 9000, 1, "ab");
        bad[19] = 0xff; // not UTF-8
        assert!(decode(&bad, HOME).is_none());
    }

    #[test]
    #[cfg_attr(miri, ignore = "sockets are foreign functions Miri does not model")]
    fn announcements_are_heard_over_loopback() {
        // A port of our own: bind it, learn it, close it and listen there.
        let port = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let to = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let s = sender(to).unwrap();
        let talker = std::thread::spawn(move || {
            for _ in 0..40 {
                let _ = s.send(&encode(123, 4567, 1, "far-away"));
                let _ = s.send(b"garbage");
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        let heard = listen(to, Duration::from_millis(600)).unwrap();
        talker.join().unwrap();
        assert_eq!(heard.len(), 1, "{heard:?}");
        assert_eq!(heard[0].name, "far-away");
        assert_eq!((heard[0].pid, heard[0].port), (123, 4567));
        assert_eq!(heard[0].addr, HOME);
    }
}
