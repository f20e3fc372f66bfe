//! The one parser of a node's URL (`http[s]://host[:port][/]`), for
//! everything that dials a node: peers, the CLI's and MCP's HTTP client,
//! the follower. It is the parser the schemathesis run hardened on peers
//! (user info, bracketed hosts that are not IPv6, ports that are not
//! numbers), shared so the clients refuse the same URLs.

use hyper::Uri;

/// A node's URL, checked and normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUrl {
    /// `http[s]://host:port`, the port always written, an IPv6 host in
    /// brackets, no trailing `/`.
    pub base: String,
    /// The host to dial and to name in TLS (an IPv6 address without
    /// brackets).
    pub host: String,
    /// The port (80 or 443 when the URL names none).
    pub port: u16,
    /// `https://`.
    pub secure: bool,
}

/// A URL that names no node this process can dial.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad node URL {url:?}: {reason}")]
pub struct UrlError {
    /// The URL given.
    pub url: String,
    /// Why it is refused.
    pub reason: &'static str,
}

impl NodeUrl {
    /// Parses and normalizes `url`.
    ///
    /// ```
    /// use meshlog_node::url::NodeUrl;
    /// let node = NodeUrl::parse("http://[::1]:7070/")?;
    /// assert_eq!(node.base, "http://[::1]:7070");
    /// assert_eq!(node.host, "::1");
    /// assert!(NodeUrl::parse("http://user@host").is_err());
    /// # Ok::<(), meshlog_node::url::UrlError>(())
    /// ```
    pub fn parse(url: &str) -> Result<NodeUrl, UrlError> {
        let bad = |reason| UrlError {
            url: url.to_owned(),
            reason,
        };
        let uri: Uri = url.trim().parse().map_err(|_| bad("not a URL"))?;
        let secure = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("the scheme must be http or https")),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("a node URL has no path or query"));
        }
        // `Uri` takes user info (dropped from the normalized URL), any text
        // in brackets, and a port that is not a number (`port_u16` is then
        // `None`, which read as the default port); none names a node (found
        // by schemathesis).
        let authority = uri.authority().map_or("", |a| a.as_str());
        if authority.contains('@') {
            return Err(bad("a node URL has no user info"));
        }
        let port = match authority.strip_prefix(host).unwrap_or("") {
            "" if secure => 443,
            "" => 80,
            rest => rest
                .strip_prefix(':')
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(|| bad("the port must be a number from 0 to 65535"))?,
        };
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            if inner.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(bad("a host in brackets must be an IPv6 address"));
            }
        }
        // Dialed without brackets, shown with them.
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let scheme = if secure { "https" } else { "http" };
        let base = format!("{scheme}://{}:{port}", bracketed(&host));
        Ok(NodeUrl {
            base,
            host,
            port,
            secure,
        })
    }

    /// `host:port`, an IPv6 host in brackets: what a `Host` header and a
    /// WebSocket URL name.
    pub fn authority(&self) -> String {
        format!("{}:{}", bracketed(&self.host), self.port)
    }
}

fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::NodeUrl;

    fn base(url: &str) -> String {
        NodeUrl::parse(url).unwrap().base
    }

    #[test]
    fn node_urls_are_normalized_and_checked() {
        assert_eq!(base("http://127.0.0.1:7071"), "http://127.0.0.1:7071");
        assert_eq!(base(" http://127.0.0.1:7071/ "), "http://127.0.0.1:7071");
        assert_eq!(base("http://node-b"), "http://node-b:80");
        assert_eq!(base("https://node-b"), "https://node-b:443");
        assert!(NodeUrl::parse("ftp://127.0.0.1:7071").is_err());
        assert!(NodeUrl::parse("127.0.0.1:7071").is_err());
        assert!(NodeUrl::parse("http://127.0.0.1:7071/x").is_err());
        assert!(NodeUrl::parse("http://127.0.0.1:7071?x=1").is_err());
    }

    /// Found by the schemathesis run on peers (`tests/schemathesis/run.sh`);
    /// the follower's own parser took these too, until it became this one.
    #[test]
    fn node_urls_with_user_info_a_bad_port_or_a_bracketed_non_ipv6_host_are_refused() {
        for url in [
            "http://[zz]",
            "http://[:]",
            "http://[1.2.3.4]",
            "http://user@host",
            "http://host:65530*",
            "http://host:65536",
            "http://host:",
        ] {
            assert!(NodeUrl::parse(url).is_err(), "{url}");
        }
        assert_eq!(base("http://host:08"), "http://host:8");
        let v6 = NodeUrl::parse("http://[::1]:7").unwrap();
        assert_eq!(v6.base, "http://[::1]:7");
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.authority(), "[::1]:7");
    }
}
