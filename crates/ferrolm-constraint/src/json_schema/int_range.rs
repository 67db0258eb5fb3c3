//! Regexes for the numbers in a range, as JSON writes them: no leading zeros, no `+`,
//! no `-0`; integers, and decimals between integer bounds.

/// A regex for the integers `x` with `min <= x <= max` (either bound may be open).
/// Returns `None` when the range is empty.
pub fn integer_range_regex(min: Option<i128>, max: Option<i128>) -> Option<String> {
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo > hi {
            return None;
        }
    }
    let mut alternatives = Vec::new();
    // Negative part: x in [min, -1] is "-" followed by |x| in [1 or -max, -min].
    if min.is_none_or(|lo| lo < 0) {
        let abs_lo = max.map_or(1, |hi| (-hi).max(1));
        let abs_hi = min.map(|lo| -lo);
        if abs_hi.is_none_or(|h| h >= abs_lo) {
            let abs = natural_range(abs_lo as u128, abs_hi.map(|h| h as u128));
            alternatives.push(format!("-(?:{abs})"));
        }
    }
    // Non-negative part: x in [max(min, 0), max].
    if max.is_none_or(|hi| hi >= 0) {
        let lo = min.map_or(0, |lo| lo.max(0)) as u128;
        alternatives.push(natural_range(lo, max.map(|hi| hi as u128)));
    }
    Some(alternatives.join("|"))
}

/// A bound of a number range: the integer, and whether it is excluded.
pub type Bound = (i128, bool);

/// A regex for the numbers `x` between integer bounds, written without an exponent
/// (the generated subset): integers (optionally with a zero fraction `.0`) and
/// decimals with a nonzero fraction. `None` when no number lies between the bounds.
///
/// A decimal `i.f` with a nonzero fraction lies strictly between `i` and `i + 1`, so
/// it is in range exactly when `[i, i + 1]` is, whatever the bounds' exclusivity; the
/// same holds for `-i.f` between `-(i + 1)` and `-i`.
pub fn number_range_regex(min: Option<Bound>, max: Option<Bound>) -> Option<String> {
    const ZERO_FRACTION: &str = r"(?:\.0+)?";
    const NONZERO_FRACTION: &str = r"\.[0-9]*[1-9][0-9]*";
    let mut alternatives = Vec::new();
    let integer_min = min.map(|(m, exclusive)| m + i128::from(exclusive));
    let integer_max = max.map(|(m, exclusive)| m - i128::from(exclusive));
    if let Some(integers) = integer_range_regex(integer_min, integer_max) {
        alternatives.push(format!("(?:{integers}){ZERO_FRACTION}"));
    }
    // Non-negative decimals: integer part in [max(min, 0), max - 1].
    let lo = min.map_or(0, |(m, _)| m.max(0));
    let hi = max.map(|(m, _)| m - 1);
    if hi.is_none_or(|h| h >= lo) {
        let parts = natural_range(lo as u128, hi.map(|h| h as u128));
        alternatives.push(format!("(?:{parts}){NONZERO_FRACTION}"));
    }
    // Negative decimals: integer part in [max(0, -max), -min - 1].
    let lo = max.map_or(0, |(m, _)| (-m).max(0));
    let hi = min.map(|(m, _)| -m - 1);
    if hi.is_none_or(|h| h >= lo) {
        let parts = natural_range(lo as u128, hi.map(|h| h as u128));
        alternatives.push(format!("-(?:{parts}){NONZERO_FRACTION}"));
    }
    (!alternatives.is_empty()).then(|| alternatives.join("|"))
}

/// Non-negative integers in `[lo, hi]` (`hi = None`: unbounded).
fn natural_range(lo: u128, hi: Option<u128>) -> String {
    let lo_len = digits(lo).len();
    let hi_len = hi.map(|h| digits(h).len());
    let mut alternatives = Vec::new();
    let last_len = hi_len.unwrap_or(lo_len);
    for len in lo_len..=last_len {
        let smallest = if len == 1 { 0 } else { 10u128.pow(len as u32 - 1) };
        let largest = 10u128.pow(len as u32) - 1;
        let a = lo.max(smallest);
        let b = hi.map_or(largest, |h| h.min(largest));
        if a <= b {
            alternatives.push(same_length(&digits(a), &digits(b)));
        }
    }
    if hi.is_none() {
        // Every number with more digits than `lo` is in range.
        alternatives.push(format!("[1-9][0-9]{{{lo_len},}}"));
    }
    alternatives.join("|")
}

fn digits(n: u128) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// Digit strings of one length between `lo` and `hi` inclusive (`lo <= hi`).
fn same_length(lo: &[u8], hi: &[u8]) -> String {
    debug_assert_eq!(lo.len(), hi.len());
    let Some((&l, lo_rest)) = lo.split_first() else {
        return String::new();
    };
    let (&h, hi_rest) = hi.split_first().expect("same length");
    let rest = lo_rest.len();
    let any_rest = if rest == 0 { String::new() } else { format!("[0-9]{{{rest}}}") };
    if l == h {
        // Grouped: the rest may be an alternation.
        return format!("{}(?:{})", l as char, same_length(lo_rest, hi_rest));
    }
    let lo_rest_is_min = lo_rest.iter().all(|&d| d == b'0');
    let hi_rest_is_max = hi_rest.iter().all(|&d| d == b'9');
    let mut alternatives = Vec::new();
    // The first digit l, then anything >= lo_rest (if lo_rest is all zeros, anything).
    let (first_full, last_full) =
        (if lo_rest_is_min { l } else { l + 1 }, if hi_rest_is_max { h } else { h - 1 });
    if !lo_rest_is_min {
        let nines = vec![b'9'; rest];
        alternatives.push(format!("{}(?:{})", l as char, same_length(lo_rest, &nines)));
    }
    if first_full <= last_full {
        alternatives.push(format!("{}{any_rest}", digit_class(first_full, last_full)));
    }
    if !hi_rest_is_max {
        let zeros = vec![b'0'; rest];
        alternatives.push(format!("{}(?:{})", h as char, same_length(&zeros, hi_rest)));
    }
    alternatives.join("|")
}

fn digit_class(from: u8, to: u8) -> String {
    if from == to {
        (from as char).to_string()
    } else {
        format!("[{}-{}]", from as char, to as char)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn matches(min: Option<i128>, max: Option<i128>, x: i128) -> bool {
        let Some(pattern) = integer_range_regex(min, max) else {
            return false;
        };
        regex::Regex::new(&format!("^(?:{pattern})$")).unwrap().is_match(&x.to_string())
    }

    #[test]
    fn small_ranges() {
        assert_eq!(integer_range_regex(Some(0), Some(9)).unwrap(), "[0-9]");
        assert!(matches(Some(15), None, 15) && matches(Some(15), None, 12345));
        assert!(!matches(Some(15), None, 14) && !matches(Some(15), None, -15));
        assert!(matches(None, Some(-3), -3) && matches(None, Some(-3), -400));
        assert!(!matches(None, Some(-3), -2) && !matches(None, Some(-3), 0));
        assert!(matches(None, None, 0) && matches(None, None, -7));
        assert_eq!(integer_range_regex(Some(2), Some(1)), None);
    }

    /// `text` (a decimal without exponent) compared with an integer, exactly.
    fn compare(text: &str, bound: i128) -> std::cmp::Ordering {
        let (negative, digits) = text.strip_prefix('-').map_or((false, text), |d| (true, d));
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let int: i128 = int.parse().unwrap();
        let nonzero_fraction = frac.bytes().any(|b| b != b'0');
        let fraction = if nonzero_fraction { std::cmp::Ordering::Greater } else { std::cmp::Ordering::Equal };
        if negative {
            // -(int + f) against bound: (int + f) against -bound, reversed.
            int.cmp(&(-bound)).then(fraction).reverse()
        } else {
            int.cmp(&bound).then(fraction)
        }
    }

    proptest! {
        #[test]
        fn number_range_regex_matches_exactly_the_range(
            lo in proptest::option::of((-30i128..30, any::<bool>())),
            hi in proptest::option::of((-30i128..30, any::<bool>())),
        ) {
            let Some(pattern) = number_range_regex(lo, hi) else {
                // Empty: then no value in [-40, 40] (in tenths) may be in range.
                for tenths in -400i128..400 {
                    let text = format!("{}{}.{}", if tenths < 0 { "-" } else { "" }, tenths.abs() / 10, tenths.abs() % 10);
                    let inside = lo.is_none_or(|(l, e)| if e { compare(&text, l).is_gt() } else { compare(&text, l).is_ge() })
                        && hi.is_none_or(|(h, e)| if e { compare(&text, h).is_lt() } else { compare(&text, h).is_le() });
                    prop_assert!(!inside, "{} is in [{:?}, {:?}] but the range was called empty", text, lo, hi);
                }
                return Ok(());
            };
            let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
            let mut texts: Vec<String> = Vec::new();
            for n in -40i128..40 {
                texts.push(n.to_string());
                for frac in ["0", "00", "5", "05", "999", "001"] {
                    let int = n.abs();
                    let sign = if n < 0 { "-" } else { "" };
                    texts.push(format!("{sign}{int}.{frac}"));
                }
            }
            texts.extend(["-0.5".to_string(), "-0.001".to_string(), "0.5".to_string()]);
            for text in texts {
                let inside = lo.is_none_or(|(l, e)| if e { compare(&text, l).is_gt() } else { compare(&text, l).is_ge() })
                    && hi.is_none_or(|(h, e)| if e { compare(&text, h).is_lt() } else { compare(&text, h).is_le() });
                // "-0.0"-style texts are never generated; only require they are not
                // accepted when out of range.
                let negative_zero = text.starts_with("-0") && !text[1..].bytes().any(|b| (b'1'..=b'9').contains(&b));
                let generated_form = !negative_zero;
                if generated_form {
                    prop_assert_eq!(re.is_match(&text), inside, "{} for [{:?}, {:?}]", text, lo, hi);
                } else {
                    prop_assert!(!re.is_match(&text) || inside, "{}", text);
                }
            }
            prop_assert!(!re.is_match("1e5") && !re.is_match("01") && !re.is_match("1."));
        }

        #[test]
        fn range_regex_matches_exactly_the_range(
            lo in proptest::option::of(-1200i128..1200), hi in proptest::option::of(-1200i128..1200),
        ) {
            prop_assume!(lo.zip(hi).is_none_or(|(l, h)| l <= h));
            let pattern = integer_range_regex(lo, hi).unwrap();
            let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
            for x in -1500i128..1500 {
                let inside = lo.is_none_or(|l| x >= l) && hi.is_none_or(|h| x <= h);
                prop_assert_eq!(re.is_match(&x.to_string()), inside, "{} for [{:?}, {:?}]", x, lo, hi);
            }
            prop_assert!(!re.is_match("-0") && !re.is_match("01"));
        }
    }
}
