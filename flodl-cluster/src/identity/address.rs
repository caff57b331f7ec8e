//! The controller's network address as the launcher's environment gives it.

use std::fmt;

/// The port the controller listens on when `FLODL_CONTROLLER_PORT` is not set (torchrun's store
/// usually holds 29500 and its rendezvous 29400, so this one is clear of both).
pub const DEFAULT_CONTROLLER_PORT: u16 = 29600;

/// Where the controller listens: a host name or IP address, and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ControllerAddr {
    /// A host name, an IPv4 address or an IPv6 address (without brackets).
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl ControllerAddr {
    /// Splits `host`, `host:port`, `[v6]` or `[v6]:port`; `None` when the text is none of them
    /// (an empty host, a bad port, unbalanced brackets).
    pub fn parse(text: &str) -> Option<(String, Option<u16>)> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix('[') {
            let (host, after) = rest.split_once(']')?;
            if host.is_empty() {
                return None;
            }
            return match after {
                "" => Some((host.to_owned(), None)),
                _ => Some((host.to_owned(), Some(port(after.strip_prefix(':')?)?))),
            };
        }
        match text.matches(':').count() {
            0 if !text.is_empty() => Some((text.to_owned(), None)),
            1 => {
                let (host, p) = text.split_once(':')?;
                (!host.is_empty()).then_some(())?;
                Some((host.to_owned(), Some(port(p)?)))
            }
            // A bare IPv6 address: its colons are not a port separator.
            n if n > 1 && text.parse::<std::net::Ipv6Addr>().is_ok() => {
                Some((text.to_owned(), None))
            }
            _ => None,
        }
    }
}

/// A port from 1 to 65535.
pub(crate) fn port(text: &str) -> Option<u16> {
    text.trim().parse::<u16>().ok().filter(|p| *p != 0)
}

impl fmt::Display for ControllerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}
