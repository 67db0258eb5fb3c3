//! `multipleOf`: the decimal numbers that are multiples of `n = p / 10^k` form a
//! regular language. We build its automaton over `-`, digits and `.` (a remainder of
//! the digits read so far modulo `p`, and how many fraction digits were read),
//! minimize it and write it back as a regex by state elimination, refusing what would
//! be too large. A number written `D / 10^L` (its digits `D`, `L` fraction digits, the
//! last one nonzero) is a multiple exactly when `L <= k` and `p` divides
//! `D * 10^(k - L)`; integers alone (type `integer`) are the multiples of
//! `p / gcd(p, 10^k)`. Numbers are generated without exponent and integral ones
//! without fraction (`4`, not `4.0`).
//!
//! Bounds: both finite and few multiples between them: the multiples listed; a bound
//! that only fixes the sign (the nearest multiple inside it is 0 or ±n): folded into
//! the automaton; others are `UnsupportedSchema`.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::Translator;
use crate::error::Result;

/// Largest automaton we build (remainders × fraction lengths).
const MAX_STATES: u128 = 20_000;
/// Most states of the minimal automaton we turn into a regex.
const MAX_MINIMAL_STATES: usize = 48;
/// Largest regex state elimination may write.
const MAX_REGEX: usize = 60_000;
/// Most multiples between two bounds we list.
const MAX_LISTED: i128 = 1_000;

/// A decimal `mantissa / 10^scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Decimal {
    mantissa: i128,
    scale: u32,
}

/// The exact decimal a JSON number is written as (`None`: too long to handle).
fn decimal(value: &Value) -> Option<Decimal> {
    let text = match value {
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let (negative, text) = text.strip_prefix('-').map_or((false, text.as_str()), |t| (true, t));
    let (mantissa_text, exponent) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (int, frac) = mantissa_text.split_once('.').unwrap_or((mantissa_text, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return None;
    }
    let mut mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    let mut scale = frac.len() as i32 - exponent;
    while scale < 0 {
        mantissa = mantissa.checked_mul(10)?;
        scale += 1;
    }
    while scale > 0 && mantissa % 10 == 0 && mantissa != 0 {
        mantissa /= 10;
        scale -= 1;
    }
    if scale > 30 {
        return None;
    }
    Some(Decimal { mantissa: if negative { -mantissa } else { mantissa }, scale: scale as u32 })
}

fn pow10(e: u32) -> Option<i128> {
    10i128.checked_pow(e)
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

fn div_floor(a: i128, b: i128) -> i128 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// Which signs and zero the bounds leave.
#[derive(Clone, Copy)]
struct Signs {
    negative: bool,
    zero: bool,
    positive: bool,
}

impl<'a> Translator<'a> {
    /// Integers (`integer_only`) or numbers under `multipleOf` and the bounds.
    pub(super) fn multiple(
        &self,
        map: &Map<String, Value>,
        integer_only: bool,
        path: &str,
    ) -> Result<String> {
        let value = &map["multipleOf"];
        let step = decimal(value)
            .filter(|d| d.mantissa > 0)
            .ok_or_else(|| self.invalid(path, "`multipleOf` must be a positive number"))?;
        if map.contains_key(super::negate::NOT_ENUM) {
            return Err(self.unsupported("multipleOf next to excluded values", path));
        }
        let (mut p, mut k) = (step.mantissa, step.scale);
        if integer_only {
            // t * p / 10^k is an integer when 10^k / gcd divides t.
            let g = gcd(p, pow10(k).ok_or_else(|| self.unsupported("multipleOf", path))?);
            p /= g;
            k = 0;
        }
        // Multiples t * p / 10^k; the bounds as a range of t.
        let mut low: Option<i128> = None;
        let mut high: Option<i128> = None;
        for (key, lower, exclusive) in [
            ("minimum", true, false),
            ("exclusiveMinimum", true, true),
            ("maximum", false, false),
            ("exclusiveMaximum", false, true),
        ] {
            let Some(bound) = map.get(key) else { continue };
            let b =
                decimal(bound).ok_or_else(|| self.unsupported(&format!("{key} next to multipleOf"), path))?;
            // t * p * 10^b.scale compared with b.mantissa * 10^k.
            let scaled = |x: i128, e: u32| pow10(e).and_then(|f| x.checked_mul(f));
            let (Some(left), Some(right)) = (scaled(p, b.scale), scaled(b.mantissa, k)) else {
                return Err(self.unsupported(&format!("{key} next to multipleOf"), path));
            };
            let floor = div_floor(right, left);
            let exact = floor * left == right;
            if lower {
                let t = if exact && !exclusive { floor } else { floor + 1 };
                low = Some(low.map_or(t, |l| l.max(t)));
            } else {
                let t = if exact && exclusive { floor - 1 } else { floor };
                high = Some(high.map_or(t, |h| h.min(t)));
            }
        }
        if let (Some(l), Some(h)) = (low, high) {
            if l > h {
                return Err(self.nothing(path, "no multiple of `multipleOf` lies between the bounds"));
            }
            if h - l < MAX_LISTED {
                return Ok((l..=h)
                    .map(|t| regex_syntax::escape(&write_decimal(t * p, k)))
                    .collect::<Vec<_>>()
                    .join("|"));
            }
        }
        // What is left is sign-only when the nearest multiple inside each bound is 0 or ±n.
        if low.is_some_and(|l| l != 0 && l != 1) || high.is_some_and(|h| h != 0 && h != -1) {
            return Err(self.unsupported("multipleOf with bounds other than the sign", path));
        }
        let signs = Signs {
            negative: low.is_none(),
            zero: low.is_none_or(|l| l == 0) && high.is_none_or(|h| h == 0),
            positive: high.is_none(),
        };
        if (p as u128) * (k as u128 + 1) > MAX_STATES {
            return Err(self.unsupported("multipleOf (too large a modulus)", path));
        }
        multiple_regex(p as usize, k, integer_only, signs)
            .ok_or_else(|| self.unsupported("multipleOf (too large a regex)", path))
    }
}

/// `mantissa / 10^scale` without exponent or trailing fraction zeros.
fn write_decimal(mantissa: i128, scale: u32) -> String {
    let sign = if mantissa < 0 { "-" } else { "" };
    let digits = mantissa.unsigned_abs().to_string();
    let scale = scale as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

/// Input symbols: digits 0-9, then `.` and `-`.
const DOT: usize = 10;
const MINUS: usize = 11;
const SYMBOLS: usize = 12;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Start,
    Minus,
    Zero { negative: bool },
    Int { r: usize },
    Dot { r: usize },
    Frac { r: usize, len: u32, nonzero: bool },
}

/// The regex of the multiples of `p / 10^k` with the given signs.
fn multiple_regex(p: usize, k: u32, integer_only: bool, signs: Signs) -> Option<String> {
    let pow_mod = |e: u32| (0..e).fold(1 % p, |acc, _| acc * 10 % p);
    let accepting = |key: Key| match key {
        Key::Zero { negative } => !negative && signs.zero,
        Key::Int { r } => r * pow_mod(k) % p == 0,
        Key::Frac { r, len, nonzero } => nonzero && r * pow_mod(k - len) % p == 0,
        _ => false,
    };
    let step = |key: Key, symbol: usize| -> Option<Key> {
        let digit = (symbol < 10).then_some(symbol);
        match (key, digit) {
            (Key::Start, None) if symbol == MINUS && signs.negative => Some(Key::Minus),
            (Key::Start, Some(0)) => Some(Key::Zero { negative: false }),
            (Key::Minus, Some(0)) => Some(Key::Zero { negative: true }),
            (Key::Start, Some(d)) if signs.positive => Some(Key::Int { r: d % p }),
            (Key::Minus, Some(d)) if d > 0 => Some(Key::Int { r: d % p }),
            (Key::Int { r }, Some(d)) => Some(Key::Int { r: (10 * r + d) % p }),
            (Key::Zero { negative }, None) if symbol == DOT && k > 0 && !integer_only => {
                let allowed = if negative { signs.negative } else { signs.positive };
                allowed.then_some(Key::Dot { r: 0 })
            }
            (Key::Int { r }, None) if symbol == DOT && k > 0 && !integer_only => Some(Key::Dot { r }),
            (Key::Dot { r }, Some(d)) => Some(Key::Frac { r: (10 * r + d) % p, len: 1, nonzero: d != 0 }),
            (Key::Frac { r, len, .. }, Some(d)) if len < k => {
                Some(Key::Frac { r: (10 * r + d) % p, len: len + 1, nonzero: d != 0 })
            }
            _ => None,
        }
    };
    // Reachable states; `None` transitions go to the dead state (index = len).
    let mut ids: HashMap<Key, usize> = HashMap::new();
    let mut keys = vec![Key::Start];
    ids.insert(Key::Start, 0);
    let mut table: Vec<[Option<usize>; SYMBOLS]> = Vec::new();
    let mut i = 0;
    while i < keys.len() {
        let mut row = [None; SYMBOLS];
        for (symbol, slot) in row.iter_mut().enumerate() {
            if let Some(next) = step(keys[i], symbol) {
                let id = *ids.entry(next).or_insert_with(|| {
                    keys.push(next);
                    keys.len() - 1
                });
                *slot = Some(id);
            }
        }
        table.push(row);
        i += 1;
        if keys.len() as u128 > MAX_STATES * 2 {
            return None;
        }
    }
    let accept: Vec<bool> = keys.iter().map(|k| accepting(*k)).collect();
    let (table, accept) = minimize(&table, &accept);
    if table.len() > MAX_MINIMAL_STATES {
        return None;
    }
    eliminate(&table, &accept)
}

/// Moore's partition refinement; drops states that cannot reach acceptance. State 0
/// stays the start.
fn minimize(
    table: &[[Option<usize>; SYMBOLS]],
    accept: &[bool],
) -> (Vec<[Option<usize>; SYMBOLS]>, Vec<bool>) {
    let n = table.len();
    // Live states: reach an accepting one.
    let mut live = accept.to_vec();
    let mut changed = true;
    while changed {
        changed = false;
        for s in 0..n {
            if !live[s] && table[s].iter().flatten().any(|&t| live[t]) {
                live[s] = true;
                changed = true;
            }
        }
    }
    // Classes: dead = usize::MAX.
    let mut class: Vec<usize> =
        (0..n).map(|s| if !live[s] { usize::MAX } else { accept[s] as usize }).collect();
    loop {
        let mut signatures: HashMap<(usize, [usize; SYMBOLS]), usize> = HashMap::new();
        let mut next = vec![usize::MAX; n];
        for s in 0..n {
            if !live[s] {
                continue;
            }
            let mut row = [usize::MAX; SYMBOLS];
            for (symbol, t) in table[s].iter().enumerate() {
                row[symbol] = t.map_or(usize::MAX, |t| class[t]);
            }
            let count = signatures.len();
            next[s] = *signatures.entry((class[s], row)).or_insert(count);
        }
        let before =
            class.iter().filter(|&&c| c != usize::MAX).collect::<std::collections::HashSet<_>>().len();
        let stable = signatures.len() == before;
        class = next;
        if stable {
            break;
        }
    }
    // Renumber with the start's class first.
    let mut order: HashMap<usize, usize> = HashMap::new();
    let mut stack = vec![0usize];
    let mut representatives = Vec::new();
    if class[0] == usize::MAX {
        return (Vec::new(), Vec::new());
    }
    order.insert(class[0], 0);
    representatives.push(0);
    while let Some(s) = stack.pop() {
        for t in table[s].iter().flatten() {
            let c = class[*t];
            if c != usize::MAX && !order.contains_key(&c) {
                order.insert(c, representatives.len());
                representatives.push(*t);
                stack.push(*t);
            }
        }
    }
    let new_table = representatives
        .iter()
        .map(|&s| {
            let mut row = [None; SYMBOLS];
            for (symbol, t) in table[s].iter().enumerate() {
                row[symbol] = t.and_then(|t| order.get(&class[t]).copied());
            }
            row
        })
        .collect();
    let new_accept = representatives.iter().map(|&s| accept[s]).collect();
    (new_table, new_accept)
}

/// State elimination: every stored edge regex can be concatenated as is.
fn eliminate(table: &[[Option<usize>; SYMBOLS]], accept: &[bool]) -> Option<String> {
    let n = table.len();
    if n == 0 {
        return None;
    }
    let (start, end) = (n, n + 1);
    let mut edges: HashMap<(usize, usize), String> = HashMap::new();
    let union = |edges: &mut HashMap<(usize, usize), String>, from: usize, to: usize, regex: String| {
        let merged = match edges.remove(&(from, to)) {
            Some(old) if old != regex => format!("(?:{old}|{regex})"),
            _ => regex,
        };
        edges.insert((from, to), merged);
    };
    for (s, row) in table.iter().enumerate() {
        let mut targets: Vec<usize> = row.iter().flatten().copied().collect();
        targets.sort_unstable();
        targets.dedup();
        for t in targets {
            let symbols: Vec<usize> = (0..SYMBOLS).filter(|&x| row[x] == Some(t)).collect();
            union(&mut edges, s, t, label(&symbols));
        }
        if accept[s] {
            union(&mut edges, s, end, String::new());
        }
    }
    union(&mut edges, start, 0, String::new());
    let mut remaining: Vec<usize> = (0..n).collect();
    while !remaining.is_empty() {
        // The state with the fewest paths through it.
        let cost = |q: usize| {
            let ins = edges.keys().filter(|(a, b)| *b == q && *a != q).count();
            let outs = edges.keys().filter(|(a, b)| *a == q && *b != q).count();
            ins * outs
        };
        let (index, &q) = remaining.iter().enumerate().min_by_key(|(_, &q)| cost(q)).expect("nonempty");
        remaining.swap_remove(index);
        let looped = edges.remove(&(q, q)).map(|l| format!("(?:{l})*")).unwrap_or_default();
        let ins: Vec<(usize, String)> =
            edges.iter().filter(|((_, b), _)| *b == q).map(|((a, _), r)| (*a, r.clone())).collect();
        let outs: Vec<(usize, String)> =
            edges.iter().filter(|((a, _), _)| *a == q).map(|((_, b), r)| (*b, r.clone())).collect();
        edges.retain(|(a, b), _| *a != q && *b != q);
        for (a, into) in &ins {
            for (b, out) in &outs {
                let regex = format!("{into}{looped}{out}");
                if regex.len() > MAX_REGEX {
                    return None;
                }
                union(&mut edges, *a, *b, regex);
            }
        }
    }
    edges.remove(&(start, end))
}

/// A regex for one of `symbols`.
fn label(symbols: &[usize]) -> String {
    let digits: Vec<usize> = symbols.iter().copied().filter(|&s| s < 10).collect();
    let mut parts = Vec::new();
    if !digits.is_empty() {
        parts.push(if digits.len() == 1 {
            digits[0].to_string()
        } else {
            let mut class = String::from("[");
            let mut i = 0;
            while i < digits.len() {
                let mut j = i;
                while j + 1 < digits.len() && digits[j + 1] == digits[j] + 1 {
                    j += 1;
                }
                if j > i {
                    class.push_str(&format!("{}-{}", digits[i], digits[j]));
                } else {
                    class.push_str(&digits[i].to_string());
                }
                i = j + 1;
            }
            class.push(']');
            class
        });
    }
    if symbols.contains(&DOT) {
        parts.push(r"\.".into());
    }
    if symbols.contains(&MINUS) {
        parts.push("-".into());
    }
    if parts.len() == 1 {
        parts.pop().expect("one")
    } else {
        format!("(?:{})", parts.join("|"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regex(p: usize, k: u32, integer_only: bool, signs: Signs) -> regex::Regex {
        let body = multiple_regex(p, k, integer_only, signs).unwrap();
        regex::Regex::new(&format!("^(?:{body})$")).unwrap()
    }

    const ALL: Signs = Signs { negative: true, zero: true, positive: true };

    #[test]
    fn integers_divisible() {
        for p in [1, 2, 3, 5, 6, 7, 12, 25] {
            let re = regex(p, 0, true, ALL);
            for x in -300i64..300 {
                assert_eq!(re.is_match(&x.to_string()), x % p as i64 == 0, "{x} by {p}");
            }
            assert!(!re.is_match("-0") && !re.is_match("00") && !re.is_match("4.0"));
        }
    }

    #[test]
    fn decimals_divisible() {
        // 1.5 = 15 / 10, 0.25 = 25 / 100.
        for (p, k) in [(15usize, 1u32), (25, 2), (1, 2), (3, 1)] {
            let re = regex(p, k, false, ALL);
            for hundredths in -2000i64..2000 {
                let text = write_decimal(hundredths as i128, 2);
                // hundredths / 100 = t * p / 10^k  <=>  hundredths * 10^k = t * p * 100.
                let expected = (hundredths * 10i64.pow(k)) % (p as i64 * 100) == 0;
                assert_eq!(re.is_match(&text), expected, "{text} by {p}/10^{k}");
            }
        }
    }

    #[test]
    fn signs_folded() {
        let positive = Signs { negative: false, zero: false, positive: true };
        let re = regex(3, 0, true, positive);
        assert!(re.is_match("3") && !re.is_match("0") && !re.is_match("-3") && !re.is_match("4"));
        let non_positive = Signs { negative: true, zero: true, positive: false };
        let re = regex(5, 1, false, non_positive);
        assert!(re.is_match("0") && re.is_match("-0.5") && !re.is_match("0.5") && !re.is_match("-0"));
    }

    #[test]
    fn decimals_read_exactly() {
        let d = |v: Value| decimal(&v).unwrap();
        assert_eq!(d(serde_json::json!(1.5)), Decimal { mantissa: 15, scale: 1 });
        assert_eq!(d(serde_json::json!(1e-8)), Decimal { mantissa: 1, scale: 8 });
        assert_eq!(d(serde_json::json!(-300)), Decimal { mantissa: -300, scale: 0 });
        assert_eq!(d(serde_json::json!(0.0001)), Decimal { mantissa: 1, scale: 4 });
        assert_eq!(write_decimal(-45, 1), "-4.5");
        assert_eq!(write_decimal(30, 1), "3");
        assert_eq!(write_decimal(5, 3), "0.005");
    }
}
