//! Regexes for the string `format`s we generate. Each matches the JSON-encoded string
//! body; none contains a character JSON would escape.

const DATE: &str = r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])";
const TIME: &str = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\.[0-9]{1,9})?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
const UUID: &str = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
const IPV4_OCTET: &str = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
/// The common subset of addresses (RFC 5321 dot-atoms); quoted local parts are not
/// generated.
const EMAIL: &str = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*";

/// The regex of a supported format, or `None`.
pub fn format_regex(format: &str) -> Option<String> {
    Some(match format {
        "date" => DATE.to_string(),
        "time" => TIME.to_string(),
        "date-time" => format!("{DATE}[Tt]{TIME}"),
        "uuid" => UUID.to_string(),
        "ipv4" => format!(r"{IPV4_OCTET}(?:\.{IPV4_OCTET}){{3}}"),
        "email" => EMAIL.to_string(),
        _ => return None,
    })
}
