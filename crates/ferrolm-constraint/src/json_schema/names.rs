//! Regexes for JSON object member names written canonically (as serde_json writes
//! them), so that "a name other than these" is a regular language: with one way to
//! write each character, two names are equal exactly when their texts are.

use std::collections::BTreeMap;

/// One character of a string body as serde_json writes it: itself, or for `"`, `\`
/// and controls their one escape (`\n` rather than `\u000a`, lowercase hex).
pub const CANONICAL_CHAR: &str = r#"(?:[^"\\\x00-\x1f]|\\["\\bfnrt]|\\u00(?:0[0-7]|0b|0e|0f|1[0-9a-f]))"#;

/// The escapes among [`CANONICAL_CHAR`]'s spellings.
const CANONICAL_ESCAPE: &str = r#"\\["\\bfnrt]|\\u00(?:0[0-7]|0b|0e|0f|1[0-9a-f])"#;

/// The canonical text of one character.
pub fn unit(c: char) -> String {
    let quoted = serde_json::Value::String(c.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// The canonical encoding of every character of the body except `excluded` ones.
fn char_except(excluded: &[char]) -> String {
    let plain = |c: &char| unit(*c).len() == c.len_utf8();
    if excluded.iter().all(plain) {
        // Only characters written as themselves: every escape stays (short form).
        let raw: String = excluded.iter().map(|c| regex_syntax::escape(&c.to_string())).collect();
        return format!(r#"(?:[^"\\\x00-\x1f{raw}]|\\["\\bfnrt]|\\u00(?:0[0-7]|0b|0e|0f|1[0-9a-f]))"#);
    }
    let raw: String = excluded
        .iter()
        .filter(|c| unit(**c).len() == c.len_utf8())
        .map(|c| regex_syntax::escape(&c.to_string()))
        .collect();
    let escapes: Vec<String> = ['"', '\\', '\u{8}', '\u{c}', '\n', '\r', '\t']
        .into_iter()
        .filter(|c| !excluded.contains(c))
        .map(|c| regex_syntax::escape(&unit(c)))
        .collect();
    let controls: Vec<String> = (0u32..0x20)
        .filter_map(char::from_u32)
        .filter(|c| !excluded.contains(c) && unit(*c).starts_with("\\u"))
        .map(|c| regex_syntax::escape(&unit(c)))
        .collect();
    let mut alternatives = vec![format!(r#"[^"\\\x00-\x1f{raw}]"#)];
    alternatives.extend(escapes);
    alternatives.extend(controls);
    format!("(?:{})", alternatives.join("|"))
}

#[derive(Default)]
struct Node {
    is_name: bool,
    children: BTreeMap<char, Node>,
}

/// The names as a trie of characters.
fn name_trie(names: &[&str]) -> Node {
    let mut root = Node::default();
    for name in names {
        let mut node = &mut root;
        for c in name.chars() {
            node = node.children.entry(c).or_default();
        }
        node.is_name = true;
    }
    root
}

/// A regex for the body (between the quotes) of every name except `names`: a name
/// either leaves the trie of `names` at some character (then anything follows), or
/// ends inside it where no name ends. The tail after leaving is written once, not per
/// node (objects with many members made regexes of megabytes).
///
/// The pieces are written into one string as the trie is walked (a string per node,
/// formatted into its parent's, copied the text of each name once per character of it:
/// a few per cent of a schema's compile time went there).
pub fn name_except(names: &[&str]) -> String {
    let root = name_trie(names);
    let mut out = String::with_capacity(names.iter().map(|n| n.len() * 16 + 32).sum::<usize>() + 256);
    if has_written_out_char(&root) {
        out.push_str("(?:");
        write_leaves(&root, &mut out);
        out.push(')');
    } else {
        // Names of plain ASCII only: a character outside ASCII, or an escape, leaves
        // the trie wherever it comes, so it is written once, after "any path along the
        // trie", rather than at every node (each copy of its UTF-8 sequences made DFA
        // states of its own: about 14 per node). Every way out then goes on in the one
        // loop of canonical characters: the loop every string shares, whose masks
        // come from an index (`region.rs`).
        out.push_str("(?:");
        write_ascii_leaves(&root, &mut out);
        out.push('|');
        write_any_path(&root, &mut out);
        out.push_str("(?:[^\\x00-\\x7f]|");
        out.push_str(CANONICAL_ESCAPE);
        out.push_str("))");
    }
    out.push_str(CANONICAL_CHAR);
    out.push('*');
    let mark = out.len();
    out.push('|');
    if !write_ends_inside(&root, &mut out) {
        out.truncate(mark);
    }
    out
}

/// Whether some name has a character that is not plain printable ASCII (one written
/// as an escape, or outside ASCII).
fn has_written_out_char(node: &Node) -> bool {
    node.children.iter().any(|(&c, child)| !is_plain_ascii(c) || has_written_out_char(child))
}

/// A printable ASCII character that serde_json writes as itself.
fn is_plain_ascii(c: char) -> bool {
    (' '..='\u{7f}').contains(&c) && c != '"' && c != '\\'
}

/// `c` as a regex literal.
fn push_escaped(c: char, out: &mut String) {
    regex_syntax::escape_into(c.encode_utf8(&mut [0; 4]), out);
}

/// The canonical text of `c` (see [`unit`]) as a regex literal.
fn push_escaped_unit(c: char, out: &mut String) {
    match is_plain_ascii(c) {
        true => push_escaped(c, out),
        false => regex_syntax::escape_into(&unit(c), out),
    }
}

/// A path along the trie, then a plain ASCII character that leaves it.
fn write_ascii_leaves(node: &Node, out: &mut String) {
    for (&c, child) in &node.children {
        push_escaped(c, out);
        out.push_str("(?:");
        write_ascii_leaves(child, out);
        out.push_str(")|");
    }
    out.push_str(r#"[\x20-\x7f--["\\"#);
    for &c in node.children.keys() {
        push_escaped(c, out);
    }
    out.push_str("]]");
}

/// Any path from `node` along the trie, the empty one included.
fn write_any_path(node: &Node, out: &mut String) {
    if node.children.is_empty() {
        return;
    }
    out.push_str("(?:");
    for (i, (&c, child)) in node.children.iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        push_escaped(c, out);
        write_any_path(child, out);
    }
    out.push_str(")?");
}

/// A path along the trie, then a character that leaves it.
fn write_leaves(node: &Node, out: &mut String) {
    for (&c, child) in &node.children {
        push_escaped_unit(c, out);
        out.push_str("(?:");
        write_leaves(child, out);
        out.push_str(")|");
    }
    let next: Vec<char> = node.children.keys().copied().collect();
    out.push_str(&char_except(&next));
}

/// A path along the trie ending at a node where no name ends; `false` (and nothing
/// written) when there is none.
fn write_ends_inside(node: &Node, out: &mut String) -> bool {
    let start = out.len();
    out.push_str("(?:");
    // The empty path first, where no name ends here.
    let mut any = !node.is_name;
    for (&c, child) in &node.children {
        let mark = out.len();
        if any {
            out.push('|');
        }
        push_escaped_unit(c, out);
        out.push_str("(?:");
        if write_ends_inside(child, out) {
            out.push(')');
            any = true;
        } else {
            out.truncate(mark);
        }
    }
    if !any {
        out.truncate(start);
        return false;
    }
    out.push(')');
    true
}

/// A regex for the body of every name that none of `patterns` matches and that is not
/// one of `names`, for patterns of the forms whose complement is simple: literal
/// prefixes (`^_`, `^x-`), and the patterns matching every name (`.*`) or every name
/// without line terminators (`^.*$`, `^.+$`); `Some(None)` when there is no such name,
/// `None` for other patterns.
pub fn name_outside(patterns: &[&str], names: &[&str]) -> Option<Option<String>> {
    const LINE_TERMINATOR: &str = "(?:\\\\n|\\\\r|\u{2028}|\u{2029})";
    if let [single] = patterns {
        let has_terminator = |n: &&str| n.contains(['\n', '\r', '\u{2028}', '\u{2029}']);
        match *single {
            // Every name matches: no other name.
            _ if matches_every_name(single) => return Some(None),
            // The names with a line terminator (and for `.+`, the empty one).
            "^.*$" | "^.+$" if !names.iter().any(has_terminator) => {
                let with = format!("{CANONICAL_CHAR}*{LINE_TERMINATOR}{CANONICAL_CHAR}*");
                let empty = single.contains('+') && !names.contains(&"");
                return Some(Some(if empty { format!("{with}|") } else { with }));
            }
            _ => {}
        }
    }
    if let [single] = patterns {
        if let Some(others) = outside_class_run(single, names) {
            return Some(Some(others));
        }
    }
    // Literal prefixes: a trie where a prefix blocks its whole subtree.
    let meta = |c: char| "\\.^$|?*+()[]{}/".contains(c);
    let mut prefixes = Vec::new();
    for pattern in patterns {
        let literal = pattern.strip_prefix('^').filter(|l| !l.is_empty() && !l.chars().any(meta))?;
        prefixes.push(literal);
    }
    let mut root = Node::default();
    let mut blocked = Vec::new();
    for prefix in &prefixes {
        blocked.push(prefix.chars().collect::<Vec<_>>());
    }
    for name in names {
        // A declared name under a prefix is already outside the others.
        if !prefixes.iter().any(|p| name.starts_with(p)) {
            let mut node = &mut root;
            for c in name.chars() {
                node = node.children.entry(c).or_default();
            }
            node.is_name = true;
        }
    }
    Some(Some(outside(&root, &mut Vec::new(), &blocked)))
}

/// The names outside `^[A][B]*$`, `^[A]+$` or `^[A]*$`, for classes of printable ASCII
/// characters and ranges (`[_a-zA-Z]`, `[a-z0-9-]`): empty (unless `*`), a first
/// character outside A, or a later one outside B. `None` for other patterns, or when a
/// name in `names` is outside too (it would have to be taken out).
fn outside_class_run(pattern: &str, names: &[&str]) -> Option<String> {
    let body = pattern.strip_prefix("^[")?.strip_suffix('$')?;
    let (first, rest) = body.split_once(']')?;
    let (second, empty_ok) = match rest {
        "+" => (first, false),
        "*" => (first, true),
        _ => (rest.strip_prefix('[')?.strip_suffix("]*")?, false),
    };
    let (a, b) = (class_set(first)?, class_set(second)?);
    let matches = |name: &str| {
        let mut chars = name.chars();
        match chars.next() {
            None => empty_ok,
            Some(c) if empty_ok => a.contains(&c) && chars.all(|c| a.contains(&c)),
            Some(c) => a.contains(&c) && chars.all(|c| b.contains(&c)),
        }
    };
    if names.iter().any(|n| !matches(n)) {
        return None;
    }
    let class = |set: &[char]| {
        format!("[{}]", set.iter().map(|c| regex_syntax::escape(&c.to_string())).collect::<String>())
    };
    let (a_in, a_out, b_in, b_out) = (class(&a), char_except(&a), class(&b), char_except(&b));
    Some(if empty_ok {
        format!("{a_in}*{a_out}{CANONICAL_CHAR}*")
    } else {
        format!("|{a_out}{CANONICAL_CHAR}*|{a_in}{b_in}*{b_out}{CANONICAL_CHAR}*")
    })
}

/// The characters of a class body of printable ASCII literals and ranges; `None` for
/// anything else (escapes, negation, characters JSON escapes).
fn class_set(body: &str) -> Option<Vec<char>> {
    let chars: Vec<char> = body.chars().collect();
    let plain = |c: char| c.is_ascii_graphic() && !"\\\"[]^".contains(c);
    let mut set = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if !plain(c) {
            return None;
        }
        if chars.get(i + 1) == Some(&'-') && i + 2 < chars.len() {
            let end = chars[i + 2];
            if !plain(end) || end < c {
                return None;
            }
            set.extend(c..=end);
            i += 3;
        } else {
            set.push(c);
            i += 1;
        }
    }
    set.sort_unstable();
    set.dedup();
    (!set.is_empty()).then_some(set)
}

/// Whether a pattern matches every name (search semantics: `.*`, `^`, the empty one, ...).
pub fn matches_every_name(pattern: &str) -> bool {
    matches!(pattern, "" | ".*" | "^.*" | ".*$" | "^" | "$")
}

/// `name_outside` below a trie node reached by `path`.
fn outside(node: &Node, path: &mut Vec<char>, blocked: &[Vec<char>]) -> String {
    // The characters after `path` that complete a prefix (their subtree is blocked), and
    // those that lead along one.
    let mut completing = Vec::new();
    let mut leading: BTreeMap<char, ()> = BTreeMap::new();
    for prefix in blocked {
        if prefix.len() > path.len() && prefix[..path.len()] == path[..] {
            let c = prefix[path.len()];
            if prefix.len() == path.len() + 1 {
                completing.push(c);
            } else {
                leading.insert(c, ());
            }
        }
    }
    let mut alternatives = Vec::new();
    if !node.is_name {
        alternatives.push(String::new());
    }
    let mut next: Vec<char> = completing.clone();
    let steps: Vec<char> = node.children.keys().chain(leading.keys()).copied().collect();
    for c in steps {
        if completing.contains(&c) || next.contains(&c) {
            continue;
        }
        next.push(c);
        let empty = Node::default();
        let child = node.children.get(&c).unwrap_or(&empty);
        path.push(c);
        let rest = outside(child, path, blocked);
        path.pop();
        alternatives.push(format!("{}(?:{rest})", regex_syntax::escape(&unit(c))));
    }
    alternatives.push(format!("{}{CANONICAL_CHAR}*", char_except(&next)));
    alternatives.join("|")
}

/// A regex for the body of every name of `min..=max` characters except `names`;
/// `None` when there is none.
pub fn name_except_len(names: &[&str], min: u64, max: Option<u64>) -> Option<String> {
    let root = name_trie(names);
    except_len(&root, 0, min, max)
}

fn except_len(node: &Node, depth: u64, min: u64, max: Option<u64>) -> Option<String> {
    let mut alternatives = Vec::new();
    if !node.is_name && depth >= min && max.is_none_or(|m| depth <= m) {
        alternatives.push(String::new());
    }
    if max.is_none_or(|m| depth < m) {
        for (&c, child) in &node.children {
            if let Some(rest) = except_len(child, depth + 1, min, max) {
                alternatives.push(format!("{}(?:{rest})", regex_syntax::escape(&unit(c))));
            }
        }
        let next: Vec<char> = node.children.keys().copied().collect();
        let low = min.saturating_sub(depth + 1);
        let repeat = match max {
            None => format!("{{{low},}}"),
            Some(m) => format!("{{{low},{}}}", m - depth - 1),
        };
        alternatives.push(format!("{}{CANONICAL_CHAR}{repeat}", char_except(&next)));
    }
    (!alternatives.is_empty()).then(|| alternatives.join("|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The construction before it was written in one pass (a string per trie node):
    /// the reference the one-pass writer must equal, character for character.
    fn name_except_reference(names: &[&str]) -> String {
        fn ascii_leaves(node: &Node) -> String {
            let mut alternatives: Vec<String> = node
                .children
                .iter()
                .map(|(&c, child)| {
                    format!("{}(?:{})", regex_syntax::escape(&c.to_string()), ascii_leaves(child))
                })
                .collect();
            let next: String = node.children.keys().map(|c| regex_syntax::escape(&c.to_string())).collect();
            alternatives.push(format!(r#"[\x20-\x7f--["\\{next}]]"#));
            alternatives.join("|")
        }
        fn any_path(node: &Node) -> String {
            if node.children.is_empty() {
                return String::new();
            }
            let alternatives: Vec<String> = node
                .children
                .iter()
                .map(|(&c, child)| format!("{}{}", regex_syntax::escape(&c.to_string()), any_path(child)))
                .collect();
            format!("(?:{})?", alternatives.join("|"))
        }
        fn leaves(node: &Node) -> String {
            let mut alternatives: Vec<String> = node
                .children
                .iter()
                .map(|(&c, child)| format!("{}(?:{})", regex_syntax::escape(&unit(c)), leaves(child)))
                .collect();
            let next: Vec<char> = node.children.keys().copied().collect();
            alternatives.push(char_except(&next));
            alternatives.join("|")
        }
        fn ends_inside(node: &Node) -> Option<String> {
            let mut alternatives = Vec::new();
            if !node.is_name {
                alternatives.push(String::new());
            }
            for (&c, child) in &node.children {
                if let Some(rest) = ends_inside(child) {
                    alternatives.push(format!("{}(?:{rest})", regex_syntax::escape(&unit(c))));
                }
            }
            (!alternatives.is_empty()).then(|| format!("(?:{})", alternatives.join("|")))
        }
        let root = name_trie(names);
        let ending_inside = ends_inside(&root);
        let leaving = if has_written_out_char(&root) {
            format!("(?:{}){CANONICAL_CHAR}*", leaves(&root))
        } else {
            format!(
                "(?:{}|{}(?:[^\\x00-\\x7f]|{CANONICAL_ESCAPE})){CANONICAL_CHAR}*",
                ascii_leaves(&root),
                any_path(&root)
            )
        };
        match ending_inside {
            Some(inside) => format!("{leaving}|{inside}"),
            None => leaving,
        }
    }

    #[test]
    fn the_one_pass_writer_writes_the_reference_construction() {
        let sets: &[&[&str]] = &[
            &[],
            &[""],
            &["a"],
            &["a", "ab", "é\"", ""],
            &["a", "ab", "a-]", "^b", "ba", "b"],
            &["name", "names", "nam", "version", "ver", "x-kubernetes", "$schema", "a.b", "[x]"],
            &["tab\there", "new\nline", "\u{1}", "quote\"", "back\\slash", "\u{7f}", "日本", "ü"],
        ];
        for names in sets {
            assert_eq!(name_except(names), name_except_reference(names), "{names:?}");
        }
    }

    fn is_other_name(names: &[&str], text: &str) -> bool {
        let body = name_except(names);
        regex::Regex::new(&format!("^(?:{body})$")).unwrap().is_match(text)
    }

    #[test]
    fn every_name_but_the_declared_ones() {
        let names = ["a", "ab", "é\"", ""];
        for declared in ["a", "ab", "é\\\"", ""] {
            assert!(!is_other_name(&names, declared), "{declared}");
        }
        for other in ["b", "abc", "é", "aa", "\\n", "x\\u0001", "é\\\"x"] {
            assert!(is_other_name(&names, other), "{other}");
        }
        assert!(!is_other_name(&names, "\\u000a"), "not canonical");
        assert!(!is_other_name(&names, "\\/"), "not canonical");
    }

    /// Names of plain ASCII take the shorter construction (`ascii_leaves`); checked
    /// against the definition on every short string over an alphabet with class
    /// metacharacters, a non-ASCII letter, an escaped character and a control.
    #[test]
    fn every_name_but_plain_ascii_declared_ones() {
        let alphabet = ['a', 'b', '-', ']', '^', 'é', '\n', '\u{1}', '"'];
        let names = ["a", "ab", "a-]", "^b", "ba", "b"];
        assert!(!has_written_out_char(&name_trie(&names)));
        let body = name_except(&names);
        let regex = regex::Regex::new(&format!("^(?:{body})$")).unwrap();
        let mut strings = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> =
                strings.iter().flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}"))).collect();
            strings.extend(longer.into_iter().filter(|s| s.chars().count() == 4 || s.len() < 6));
            strings.sort();
            strings.dedup();
        }
        for name in &strings {
            let text: String = name.chars().map(unit).collect();
            assert_eq!(regex.is_match(&text), !names.contains(&name.as_str()), "{name:?} written {text:?}");
        }
        assert!(!regex.is_match("\\u0061"), "not canonical");
    }

    #[test]
    fn names_outside_simple_patterns() {
        let outside = |patterns: &[&str], names: &[&str], text: &str| {
            let body = name_outside(patterns, names).unwrap().unwrap();
            regex::Regex::new(&format!("^(?:{body})$")).unwrap().is_match(text)
        };
        for (text, expected) in
            [("", true), ("a", false), ("x_", true), ("_", false), ("x", true), ("x-", false)]
        {
            assert_eq!(outside(&["^_", "^x-"], &["a"], text), expected, "{text:?} (prefixes)");
        }
        assert!(
            outside(&["^x-"], &[], "x") && outside(&["^x-"], &[], "xy") && !outside(&["^x-"], &[], "x-y")
        );
        for (text, expected) in [("", true), ("a", false), ("a\\nb", true), ("\u{2028}", true)] {
            assert_eq!(outside(&["^.+$"], &[], text), expected, "{text:?} (.+)");
        }
        assert!(!outside(&["^.*$"], &[], ""));
        assert_eq!(name_outside(&[".*"], &[]), Some(None));
        for (text, expected) in
            [("", true), ("a", false), ("_a-9", false), ("9a", true), ("a b", true), ("a\\n", true)]
        {
            assert_eq!(outside(&["^[_a-zA-Z][a-zA-Z0-9_-]*$"], &[], text), expected, "{text:?} (class run)");
        }
        assert!(!outside(&["^[a-z]*$"], &[], "") && outside(&["^[a-z]*$"], &[], "aB"));
        assert_eq!(name_outside(&["^[a-z]+$"], &["A"]), None, "a declared name outside");
        assert_eq!(name_outside(&["^[\\w]+$"], &[]), None);
    }

    #[test]
    fn names_of_some_lengths_but_the_declared_ones() {
        let body = name_except_len(&["ab", "abc"], 2, Some(3)).unwrap();
        let re = regex::Regex::new(&format!("^(?:{body})$")).unwrap();
        for (text, expected) in [("ab", false), ("abc", false), ("a", false), ("abcd", false), ("ax", true)] {
            assert_eq!(re.is_match(text), expected, "{text}");
        }
        for (text, expected) in [("abd", true), ("éé", true), ("\\n\\n\\n", true), ("", false)] {
            assert_eq!(re.is_match(text), expected, "{text}");
        }
        assert_eq!(name_except_len(&[""], 0, Some(0)), None);
    }
}
