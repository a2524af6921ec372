//! Where oncepay may send a merchant's events: an endpoint's URL and the addresses it may reach.
//!
//! A merchant names the URL, so a careless or hostile one could point oncepay at what only oncepay's
//! own network can reach: a database, an admin port, a cloud's metadata service. So an endpoint must
//! be `https` (plain `http` only where a setting allows it), must carry no credentials, and may not
//! reach loopback, private, link-local, shared, multicast or metadata addresses unless a setting
//! allows private addresses (tests and `cargo xtask up` deliver to 127.0.0.1). The api checks the
//! URL when it is saved ([`check`]); the worker checks every address a name resolves to, and
//! connects only to an allowed one ([`address_allowed`]), so a name that resolves elsewhere later
//! (DNS rebinding) gains nothing.
//!
//! An endpoint may instead be a RabbitMQ exchange, `rabbitmq:merchant.<name>`, where an installation
//! allows it ([`destination`]): the worker publishes to that exchange on oncepay's own node. Only
//! exchanges named `merchant.…` may be one, so an endpoint can never publish into oncepay's own
//! exchanges or RabbitMQ's (`amq.…`), and the worker's RabbitMQ user needs rights on those alone.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest URL an endpoint may have.
pub const MAX_URL_LEN: usize = 2048;

/// What an installation allows beyond public `https` endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
pub struct UrlPolicy {
    /// Plain `http` URLs.
    #[serde(default)]
    pub allow_http: bool,
    /// Loopback, private, link-local and the other non-public addresses.
    #[serde(default)]
    pub allow_private_addresses: bool,
    /// RabbitMQ exchanges (`rabbitmq:merchant.…`).
    #[serde(default)]
    pub allow_exchanges: bool,
}

/// How an endpoint that is a RabbitMQ exchange is written: this, then the exchange's name.
pub const EXCHANGE_SCHEME: &str = "rabbitmq:";

/// What every exchange an endpoint names starts with.
pub const EXCHANGE_PREFIX: &str = "merchant.";

/// The longest exchange name RabbitMQ takes, in bytes.
pub const MAX_EXCHANGE_LEN: usize = 255;

/// Where an endpoint's events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// An HTTP request to this URL.
    Url(url::Url),
    /// A message published to the exchange of this name.
    Exchange(String),
}

impl std::fmt::Display for Destination {
    /// The text an endpoint is saved with.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(url) => f.write_str(url.as_str()),
            Self::Exchange(name) => write!(f, "{EXCHANGE_SCHEME}{name}"),
        }
    }
}

/// Why a URL cannot be an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefusal {
    /// Not an absolute URL, or too long.
    #[error("`url` must be an absolute URL of at most {MAX_URL_LEN} characters")]
    NotAUrl,
    /// Not `https` (or `http` where allowed).
    #[error("`url` must be https")]
    Scheme,
    /// A user name or password in the URL.
    #[error("`url` must not carry a user name or a password")]
    Credentials,
    /// A fragment, which no server sees.
    #[error("`url` must not have a fragment")]
    Fragment,
    /// An address that only oncepay's own network can reach.
    #[error("`url` names an address oncepay does not deliver to ({0}): it must be public")]
    Address(IpAddr),
    /// An exchange, where the installation delivers over HTTP only.
    #[error("`url` names a RabbitMQ exchange, and this installation delivers events over https only")]
    ExchangesOff,
    /// An exchange name that cannot be one.
    #[error(
        "`url` must name an exchange as `rabbitmq:merchant.` then letters, digits, `.`, `-`, `_` or `:`, at most \
         {MAX_EXCHANGE_LEN} characters after `rabbitmq:`"
    )]
    Exchange,
}

/// Checks what an endpoint is saved with: an `http(s)` URL as [`check`] does, or an exchange.
pub fn destination(text: &str, policy: UrlPolicy) -> Result<Destination, UrlRefusal> {
    match text.strip_prefix(EXCHANGE_SCHEME) {
        Some(_) if !policy.allow_exchanges => Err(UrlRefusal::ExchangesOff),
        Some(name) => exchange(name).map(|name| Destination::Exchange(name.to_owned())),
        None => check(text, policy).map(Destination::Url),
    }
}

/// Checks an exchange's name: [`EXCHANGE_PREFIX`], then at least one of the characters RabbitMQ
/// allows, at most [`MAX_EXCHANGE_LEN`] in all.
pub fn exchange(name: &str) -> Result<&str, UrlRefusal> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    match name.strip_prefix(EXCHANGE_PREFIX) {
        Some(rest) if !rest.is_empty() && name.len() <= MAX_EXCHANGE_LEN && name.chars().all(allowed) => Ok(name),
        _ => Err(UrlRefusal::Exchange),
    }
}

/// Checks a URL an endpoint is saved with, and returns it parsed. A host name is checked when the
/// worker resolves it, on every delivery.
pub fn check(text: &str, policy: UrlPolicy) -> Result<url::Url, UrlRefusal> {
    if text.len() > MAX_URL_LEN {
        return Err(UrlRefusal::NotAUrl);
    }
    let url = url::Url::parse(text).map_err(|_| UrlRefusal::NotAUrl)?;
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        _ => return Err(UrlRefusal::Scheme),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlRefusal::Credentials);
    }
    if url.fragment().is_some() {
        return Err(UrlRefusal::Fragment);
    }
    match url.host() {
        None => Err(UrlRefusal::NotAUrl),
        Some(url::Host::Ipv4(ip)) if !address_allowed(IpAddr::V4(ip), policy) => Err(UrlRefusal::Address(ip.into())),
        Some(url::Host::Ipv6(ip)) if !address_allowed(IpAddr::V6(ip), policy) => Err(UrlRefusal::Address(ip.into())),
        Some(_) => Ok(url),
    }
}

/// Whether oncepay may connect to `ip` for a merchant.
pub fn address_allowed(ip: IpAddr, policy: UrlPolicy) -> bool {
    policy.allow_private_addresses || is_public(ip)
}

/// Whether `ip` is an address of the public internet.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_unspecified()
        || a == 0 // "this network"
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16, the clouds' metadata service among them
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier-grade NAT)
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || ip.is_documentation()
        || ip.is_multicast()
        || a >= 240) // reserved, and the broadcast address
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local, fd00:ec2::254 (a metadata service) among them
        || (first & 0xffc0) == 0xfe80 // link-local
        || (first & 0xffc0) == 0xfec0 // site-local, deprecated
        || (first == 0x2001 && ip.segments()[1] == 0x0db8) // documentation
        || (first == 0x0064 && ip.segments()[1] == 0xff9b) // NAT64, which reaches IPv4 behind it
        || ip.to_ipv4().is_some_and(|v4| !is_public_v4(v4))) // IPv4-compatible
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRICT: UrlPolicy = UrlPolicy { allow_http: false, allow_private_addresses: false, allow_exchanges: false };

    #[test]
    fn a_public_https_url_is_an_endpoint() {
        let url = check("https://merchant.example/hooks?x=1", STRICT).unwrap();
        assert_eq!(url.host_str(), Some("merchant.example"));
        assert!(check("https://93.184.215.14/hooks", STRICT).is_ok());
        assert!(check("https://[2606:4700::1111]/hooks", STRICT).is_ok());
    }

    #[test]
    fn plain_http_only_where_allowed() {
        assert_eq!(check("http://merchant.example/", STRICT), Err(UrlRefusal::Scheme));
        assert!(check("http://merchant.example/", UrlPolicy { allow_http: true, ..STRICT }).is_ok());
        assert_eq!(check("ftp://merchant.example/", UrlPolicy { allow_http: true, ..STRICT }), Err(UrlRefusal::Scheme));
    }

    #[test]
    fn credentials_fragments_and_non_urls_are_refused() {
        assert_eq!(check("https://user:pw@merchant.example/", STRICT), Err(UrlRefusal::Credentials));
        assert_eq!(check("https://merchant.example/#x", STRICT), Err(UrlRefusal::Fragment));
        assert_eq!(check("merchant.example/hooks", STRICT), Err(UrlRefusal::NotAUrl));
        assert_eq!(
            check(&format!("https://merchant.example/{}", "a".repeat(MAX_URL_LEN)), STRICT),
            Err(UrlRefusal::NotAUrl)
        );
    }

    #[test]
    fn addresses_only_our_network_reaches_are_refused_unless_allowed() {
        for url in [
            "https://127.0.0.1/",
            "https://10.1.2.3/",
            "https://172.16.0.1/",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://[::1]/",
            "https://[fd00:ec2::254]/",
            "https://[fe80::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://[64:ff9b::a00:1]/",
            "https://224.0.0.1/",
            "https://255.255.255.255/",
        ] {
            assert!(matches!(check(url, STRICT), Err(UrlRefusal::Address(_))), "{url} was not refused");
            assert!(check(url, UrlPolicy { allow_private_addresses: true, ..STRICT }).is_ok(), "{url} refused");
        }
    }

    #[test]
    fn an_exchange_is_an_endpoint_only_where_allowed_and_only_one_named_merchant_something() {
        let exchanges = UrlPolicy { allow_exchanges: true, ..STRICT };
        assert_eq!(
            destination("rabbitmq:merchant.acme-events", exchanges),
            Ok(Destination::Exchange("merchant.acme-events".into()))
        );
        assert_eq!(
            destination("rabbitmq:merchant.acme-events", exchanges).unwrap().to_string(),
            "rabbitmq:merchant.acme-events"
        );
        assert_eq!(destination("rabbitmq:merchant.acme-events", STRICT), Err(UrlRefusal::ExchangesOff));
        let longest = format!("merchant.{}", "a".repeat(MAX_EXCHANGE_LEN - EXCHANGE_PREFIX.len()));
        assert!(exchange(&longest).is_ok());
        for bad in
            ["", "merchant.", "oncepay.payments", "amq.topic", "merchant.a b", "merchant.é", &format!("{longest}a")]
        {
            assert_eq!(destination(&format!("rabbitmq:{bad}"), exchanges), Err(UrlRefusal::Exchange), "{bad}");
        }
        // A URL is still checked as a URL where exchanges are allowed.
        assert_eq!(
            destination("https://merchant.example/hooks", exchanges).unwrap().to_string(),
            "https://merchant.example/hooks"
        );
        assert_eq!(destination("http://merchant.example/", exchanges), Err(UrlRefusal::Scheme));
    }

    #[test]
    fn public_addresses_are_public() {
        for ip in ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }
}
