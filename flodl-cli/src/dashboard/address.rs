//! Where the dashboard listens and who may read it: the bind address and the access token.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

use super::error::DashboardError;

/// The port `--dashboard` alone tries first on 127.0.0.1 (a free port when it is taken).
pub(crate) const DEFAULT_PORT: u16 = 7411;

/// The address `--dashboard [ADDR]` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bind {
    /// 127.0.0.1 on [`DEFAULT_PORT`], or on a free port when that one is taken (`--dashboard`
    /// alone, or `auto`).
    Loopback,
    /// Exactly this address (`HOST:PORT`, or a bare `PORT` on 127.0.0.1; port 0 picks a free one).
    At(SocketAddr),
}

impl Bind {
    /// Whether the address only accepts connections from this machine.
    pub(crate) fn is_loopback(self) -> bool {
        match self {
            Bind::Loopback => true,
            Bind::At(addr) => addr.ip().is_loopback(),
        }
    }
}

impl fmt::Display for Bind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bind::Loopback => f.write_str("auto"),
            Bind::At(addr) => addr.fmt(f),
        }
    }
}

impl FromStr for Bind {
    type Err = DashboardError;

    /// `auto` (or nothing), `PORT`, `IP:PORT`, `[IPv6]:PORT` or `localhost:PORT`.
    fn from_str(s: &str) -> Result<Self, DashboardError> {
        let text = s.trim();
        let bad = |why| DashboardError::BadAddress { text: s.to_owned(), why };
        if text.is_empty() || text.eq_ignore_ascii_case("auto") {
            return Ok(Bind::Loopback);
        }
        if let Ok(port) = text.parse::<u16>() {
            return Ok(Bind::At(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)));
        }
        if let Some(port) = text.strip_prefix("localhost:") {
            let port = port.parse::<u16>().map_err(|_| bad("the port must be 0-65535"))?;
            return Ok(Bind::At(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)));
        }
        text.parse::<SocketAddr>().map(Bind::At).map_err(|_| {
            bad("expected auto, a port, or IP:PORT (an IP address, e.g. 0.0.0.0:7411)")
        })
    }
}

impl serde::Serialize for Bind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Bind {
    /// The text `FromStr` reads (a port may be a number).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        flodl_ddp::as_text::one::deserialize(d)
    }
}

/// Whether a request's `Host` header (`name` or `name:port`) names this machine's loopback:
/// `localhost`, an address in 127.0.0.0/8, or `[::1]`. A browser sends the name of the page's
/// site, so a site that rebinds its own name to 127.0.0.1 still sends its own name and is turned
/// away.
pub(crate) fn names_loopback(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).unwrap_or(name);
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Who may read the dashboard.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Access {
    /// Anyone who can connect (a loopback address and no token asked for).
    Open,
    /// Only requests whose URL carries `?token=` with this value.
    Token(String),
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: never in logs.
        match self {
            Access::Open => f.write_str("Open"),
            Access::Token(_) => f.write_str("Token(..)"),
        }
    }
}

impl Access {
    /// The access rule for `bind`: a given token always; else a random one per run when the
    /// address is reachable from other machines; else open.
    ///
    /// # Errors
    /// The given token is empty or holds characters a URL would have to escape.
    pub(crate) fn for_bind(bind: Bind, given: Option<&str>) -> Result<Self, DashboardError> {
        match given {
            Some(token) => {
                if token.is_empty() {
                    return Err(DashboardError::BadToken("it is empty"));
                }
                if !token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b)) {
                    return Err(DashboardError::BadToken(
                        "use letters, digits and - . _ ~ only (it travels in the URL)",
                    ));
                }
                Ok(Access::Token(token.to_owned()))
            }
            None if bind.is_loopback() => Ok(Access::Open),
            None => Ok(Access::Token(format!("{:032x}", rand::random::<u128>()))),
        }
    }

    /// Whether a request carrying `presented` (its `token` query parameter) may be answered.
    pub(crate) fn admits(&self, presented: Option<&str>) -> Verdict {
        match (self, presented) {
            (Access::Open, _) => Verdict::Admit,
            (Access::Token(_), None) => Verdict::Missing,
            (Access::Token(want), Some(got)) if same(want.as_bytes(), got.as_bytes()) => {
                Verdict::Admit
            }
            (Access::Token(_), Some(_)) => Verdict::Wrong,
        }
    }

    /// The query string a URL needs (`?token=...`, or nothing).
    pub(crate) fn query(&self) -> String {
        match self {
            Access::Open => String::new(),
            Access::Token(t) => format!("?token={t}"),
        }
    }
}

/// The answer to a request's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve it.
    Admit,
    /// No token: 401.
    Missing,
    /// A token that is not this run's: 403.
    Wrong,
}

/// Equality whose time does not depend on where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_are_loopback() {
        for host in
            ["127.0.0.1:7411", "localhost:7411", "LOCALHOST", "[::1]:80", "[::1]", "127.3.2.1"]
        {
            assert!(names_loopback(host), "{host}");
        }
        for host in [
            "evil.example:7411",
            "evil.example",
            "10.0.0.1:7411",
            "127.0.0.1.nip.io:7411",
            "[::2]:80",
            "localhost.evil.example",
            "",
            ":7411",
        ] {
            assert!(!names_loopback(host), "{host}");
        }
    }

    #[test]
    fn addresses_parse_to_the_bind_they_name() -> Result<(), DashboardError> {
        let local = |port| Bind::At(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
        let cases = [
            ("", Bind::Loopback),
            ("auto", Bind::Loopback),
            ("8080", local(8080)),
            ("0", local(0)),
            ("localhost:9000", local(9000)),
            ("127.0.0.1:7", local(7)),
            ("0.0.0.0:80", Bind::At("0.0.0.0:80".parse().map_err(|_| bad())?)),
            ("[::1]:81", Bind::At("[::1]:81".parse().map_err(|_| bad())?)),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Bind>()?, want, "{text}");
        }
        for text in ["example.org:80", "127.0.0.1", "70000", "localhost:x", "1.2.3.4:99999"] {
            let err = text.parse::<Bind>().err().map(|e| e.to_string());
            assert!(err.as_deref().is_some_and(|e| e.contains(text)), "{text}: {err:?}");
        }
        Ok(())
    }

    fn bad() -> DashboardError {
        DashboardError::BadAddress { text: String::new(), why: "test address" }
    }

    /// Loopback is open unless a token is given; any other address gets a random token per
    /// run; a wrong or missing token is refused.
    #[test]
    fn tokens_guard_every_address_but_loopback() -> Result<(), DashboardError> {
        let lan: Bind = "0.0.0.0:0".parse()?;
        let v6: Bind = "[::1]:0".parse()?;
        assert_eq!(Access::for_bind(Bind::Loopback, None)?, Access::Open);
        assert_eq!(Access::for_bind(v6, None)?, Access::Open);
        let given = Access::for_bind(Bind::Loopback, Some("s3cret"))?;
        assert_eq!(given, Access::Token("s3cret".into()));
        assert_eq!(given.query(), "?token=s3cret");
        let (a, b) = (Access::for_bind(lan, None)?, Access::for_bind(lan, None)?);
        let Access::Token(ta) = &a else { panic!("{a:?}: no token on 0.0.0.0") };
        assert!(ta.len() == 32 && a != b, "tokens must be random per run");
        for (access, presented, want) in [
            (&Access::Open, None, Verdict::Admit),
            (&Access::Open, Some("x"), Verdict::Admit),
            (&given, None, Verdict::Missing),
            (&given, Some("s3cret"), Verdict::Admit),
            (&given, Some("s3cre"), Verdict::Wrong),
            (&given, Some("s3cret!"), Verdict::Wrong),
            (&given, Some(""), Verdict::Wrong),
        ] {
            assert_eq!(access.admits(presented), want, "{access:?} {presented:?}");
        }
        for bad in ["", "a b", "a&b", "é"] {
            assert!(Access::for_bind(Bind::Loopback, Some(bad)).is_err(), "{bad:?}");
        }
        assert!(!format!("{given:?}").contains("s3cret"));
        Ok(())
    }
}
