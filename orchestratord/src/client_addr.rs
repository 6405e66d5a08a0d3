//! Which address a request comes from: the peer's, or — when the peer is one of
//! `http.trusted_proxies` — the one the proxies forwarded in `X-Forwarded-For` (the rightmost
//! address that is not a trusted proxy: what the proxy nearest to us saw; anything left of it
//! is the client's own say and may be forged).

use std::net::IpAddr;

use axum::http::HeaderMap;
use ipnet::IpNet;

pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let forwarded: Vec<IpAddr> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .collect();
    forwarded
        .iter()
        .rev()
        .find(|ip| !is_trusted(ip))
        .or(forwarded.first())
        .copied()
        .unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        h
    }

    /// SEC-AUTH-3: behind a trusted proxy the client is the forwarded address the proxy saw;
    /// from anyone else the header is ignored.
    #[test]
    fn forwarded_addresses_count_only_from_trusted_proxies() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        let stranger: IpAddr = "203.0.113.9".parse().unwrap();
        let h = xff("198.51.100.7, 192.0.2.1, 10.9.9.9");
        assert_eq!(
            client_ip(proxy, &h, &trusted),
            "192.0.2.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_ip(stranger, &h, &trusted), stranger);
        assert_eq!(client_ip(proxy, &HeaderMap::new(), &trusted), proxy);
        assert_eq!(client_ip(proxy, &h, &[]), proxy);
    }
}
