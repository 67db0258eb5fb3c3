//! Regexes for the string `format`s we generate. Each matches the JSON-encoded string
//! body; none contains a character JSON would escape. Where a format's full grammar is
//! large (hostnames' total length, emails), the regex is a plainly valid subset: we must
//! never generate an invalid value, not every valid one.

/// RFC 3339 full-date: days per month, and February 29 in leap years only (divisible
/// by 4, centuries only when divisible by 400).
const DATE: &str = concat!(
    r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)",
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    r"|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29",
);
/// RFC 3339 full-time. A leap second is valid only at 23:59 UTC; we write it only with
/// a zero offset (a valid subset: other offsets would need every local 23:59 spelled out).
const TIME: &str = concat!(
    r"(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])",
    r"|23:59:60(?:\.[0-9]+)?(?:[Zz]|[+-]00:00))",
);
const UUID: &str = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
const IPV4_OCTET: &str = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
/// The common subset of addresses (RFC 5321 dot-atoms); quoted local parts are not
/// generated.
const EMAIL: &str = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*";

/// RFC 1123 labels; at most four of at most 62 characters keep the name within 253.
const HOSTNAME: &str =
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?){0,3}";
const H16: &str = "[0-9a-fA-F]{1,4}";
/// URI characters of a path segment, query or fragment (RFC 3986 `pchar`).
const PCHAR: &str = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})";

/// RFC 3986 `URI`, whole: a scheme, then `//` and an authority (user info, a registered
/// name, an IPv4 address or a bracketed IPv6 / IPvFuture literal, a port) and a path, or a
/// path alone (`urn:x`, `mailto:a@b`), then a query and a fragment.
fn uri() -> String {
    let plain = r"[A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2}";
    let ip_literal = format!(r"\[(?:{}|[vV][0-9A-Fa-f]+\.[A-Za-z0-9._~!$&'()*+,;=:-]+)\]", ipv6());
    let authority = format!("(?:(?:{plain}|:)*@)?(?:{ip_literal}|(?:{plain})*)(?::[0-9]*)?");
    let path_tail = format!("(?:/{PCHAR}*)*");
    let hier = format!("//{authority}{path_tail}|/(?:{PCHAR}+{path_tail})?|{PCHAR}+{path_tail}|");
    format!(r"[A-Za-z][A-Za-z0-9+.-]*:(?:{hier})(?:\?(?:{PCHAR}|[/?])*)?(?:#(?:{PCHAR}|[/?])*)?")
}

/// RFC 4291 text form (RFC 3986 `IPv6address`): eight groups, or fewer around `::`,
/// the last two possibly an IPv4 address.
fn ipv6() -> String {
    let ipv4 = format!(r"{IPV4_OCTET}(?:\.{IPV4_OCTET}){{3}}");
    let ls32 = format!("(?:{H16}:{H16}|{ipv4})");
    let groups = |n: usize| format!("(?:{H16}:){{{n}}}");
    let before =
        |n: usize| if n == 0 { String::new() } else { format!("(?:(?:{H16}:){{0,{}}}{H16})?", n - 1) };
    let forms = [
        format!("{}{ls32}", groups(6)),
        format!("::{}{ls32}", groups(5)),
        format!("{}::{}{ls32}", before(1), groups(4)),
        format!("{}::{}{ls32}", before(2), groups(3)),
        format!("{}::{}{ls32}", before(3), groups(2)),
        format!("{}::{}{ls32}", before(4), groups(1)),
        format!("{}::{ls32}", before(5)),
        format!("{}::{H16}", before(6)),
        format!("{}::", before(7)),
    ];
    forms.map(|f| format!("(?:{f})")).join("|")
}

/// How a known format's regex is written: the one list of the formats this engine
/// asserts (the normaliser keeps a `format` keyword only when it is here).
fn writer(format: &str) -> Option<fn() -> String> {
    static IPV6: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static URI: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    Some(match format {
        "date" => || format!("(?:{DATE})"),
        "time" => || TIME.to_string(),
        "date-time" => || format!("(?:{DATE})[Tt](?:{TIME})"),
        "uuid" => || UUID.to_string(),
        "ipv4" => || format!(r"{IPV4_OCTET}(?:\.{IPV4_OCTET}){{3}}"),
        "email" => || EMAIL.to_string(),
        "hostname" => || HOSTNAME.to_string(),
        // the long ones are written once per process: a schema may name a format on
        // every string
        "ipv6" => || IPV6.get_or_init(ipv6).clone(),
        "uri" => || URI.get_or_init(uri).clone(),
        _ => return None,
    })
}

/// Whether `format` is one [`format_regex`] writes (without writing it).
pub fn is_supported_format(format: &str) -> bool {
    writer(format).is_some()
}

/// The regex of a supported format, or `None`.
pub fn format_regex(format: &str) -> Option<String> {
    writer(format).map(|write| write())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(format: &str, text: &str) -> bool {
        let re = format_regex(format).unwrap();
        regex::Regex::new(&format!("^(?:{re})$")).unwrap().is_match(text)
    }

    #[test]
    fn the_supported_formats_are_those_with_a_regex() {
        for format in ["date", "time", "date-time", "uuid", "ipv4", "email", "hostname", "ipv6", "uri"] {
            assert!(format_regex(format).is_some() && is_supported_format(format), "{format}");
        }
        for format in ["binary", "uri-reference", "", "URI"] {
            assert!(format_regex(format).is_none() && !is_supported_format(format), "{format}");
        }
        assert_eq!(format_regex("uri"), format_regex("uri"));
    }

    #[test]
    fn ipv6_forms() {
        for ok in [
            "::",
            "::1",
            "1::",
            "1:2:3:4:5:6:7:8",
            "fe80::1:2",
            "::ffff:192.168.0.1",
            "1:2:3:4:5:6:1.2.3.4",
            "a::b:c",
        ] {
            assert!(matches("ipv6", ok), "{ok}");
        }
        for bad in ["1:2:3:4:5:6:7:8:9", "1::2::3", ":::", "12345::", "1:2:3:4:5:6:7", "::1.2.3"] {
            assert!(!matches("ipv6", bad), "{bad}");
        }
    }

    #[test]
    fn hostnames_and_uris() {
        assert!(matches("hostname", "example.com") && matches("hostname", "a-b.c"));
        assert!(
            !matches("hostname", "-a.com") && !matches("hostname", "a..b") && !matches("hostname", "a_b")
        );
        assert!(matches("uri", "https://example.com/a/b?x=1&y=%20#top"));
        assert!(matches("uri", "http://10.0.0.1:8080/"));
        for ok in
            ["urn:002-schema", "mailto:a@b.c", "file:///etc/x", "ftp://u:p@[::1]:21/a", "x:", "a+b.c-d:/p//q"]
        {
            assert!(matches("uri", ok), "{ok}");
        }
        for bad in ["1a:b", ":x", "http://a b", "http://[::g]/", "a:b#c#d", "s:%zz"] {
            assert!(!matches("uri", bad), "{bad}");
        }
        assert!(!matches("uri", "example.com") && !matches("uri", "https://exa mple.com"));
    }
}
