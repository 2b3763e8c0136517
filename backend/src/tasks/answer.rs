//! Final-answer extraction and normalisation for free-text (GSM8K / MATH style) tasks.
//!
//! [`extract_answer`] finds the answer in a response: the last balanced `\boxed{...}`,
//! else the rest of the line after the last `####`, else the last number in the text.
//! [`answers_match`] compares a predicted and a reference answer after
//! [`normalize_answer`], numerically where both are numbers (`0.50` = `1/2` =
//! `\frac{1}{2}`).

use std::collections::HashMap;

use super::arithmetic::canonical_integer;
use super::expr::Rational;

/// Inputs longer than this are not normalised (only compared verbatim, trimmed); this
/// bounds the work on adversarial responses.
pub const MAX_ANSWER_LEN: usize = 4096;

/// An answer found in a response, and how it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extracted {
    /// The contents of the last balanced `\boxed{...}`.
    Boxed(String),
    /// The rest of the line after the last `####`.
    Hashes(String),
    /// The last number in the text (no explicit answer marker).
    LastNumber(String),
}

impl Extracted {
    pub fn text(&self) -> &str {
        match self {
            Extracted::Boxed(s) | Extracted::Hashes(s) | Extracted::LastNumber(s) => s,
        }
    }

    /// Found through an explicit marker (`\boxed` or `####`).
    pub fn is_marked(&self) -> bool {
        !matches!(self, Extracted::LastNumber(_))
    }
}

/// Byte positions of matching `{`/`}` pairs (open -> close), one linear pass.
fn brace_pairs(s: &str) -> HashMap<usize, usize> {
    let mut stack = Vec::new();
    let mut pairs = HashMap::new();
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'{' => stack.push(i),
            b'}' => {
                if let Some(open) = stack.pop() {
                    pairs.insert(open, i);
                }
            }
            _ => {}
        }
    }
    pairs
}

/// The contents of the last balanced, non-empty `\boxed{...}` (or `\fbox{...}`).
pub(crate) fn last_boxed(s: &str) -> Option<String> {
    let pairs = brace_pairs(s);
    let mut starts: Vec<usize> = s
        .match_indices("\\boxed")
        .map(|(i, m)| i + m.len())
        .chain(s.match_indices("\\fbox").map(|(i, m)| i + m.len()))
        .collect();
    starts.sort_unstable();
    for &after in starts.iter().rev() {
        let open = after + (s[after..].len() - s[after..].trim_start().len());
        if s.as_bytes().get(open) != Some(&b'{') {
            continue;
        }
        if let Some(&close) = pairs.get(&open) {
            let inner = s[open + 1..close].trim();
            if !inner.is_empty() {
                return Some(inner.to_string());
            }
        }
    }
    None
}

/// The last number in `s`: optional sign, digits with `,` groups, decimals, `a/b`.
fn last_number(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let n = b.len();
    let digit = |i: usize| i < n && b[i].is_ascii_digit();
    let mut last = None;
    let mut i = 0;
    while i < n {
        if !(digit(i) || (b[i] == b'.' && digit(i + 1))) {
            i += 1;
            continue;
        }
        let mut start = i;
        if start > 0 && b[start - 1] == b'-' && (start < 2 || !b[start - 2].is_ascii_alphanumeric())
        {
            start -= 1;
        }
        while digit(i) || (i < n && b[i] == b',' && digit(i + 1)) {
            i += 1;
        }
        if i < n && b[i] == b'.' && digit(i + 1) {
            i += 1;
            while digit(i) {
                i += 1;
            }
        }
        if i < n && b[i] == b'/' && digit(i + 1) {
            i += 1;
            while digit(i) {
                i += 1;
            }
        }
        last = Some((start, i));
    }
    last.map(|(a, z)| s[a..z].to_string())
}

/// The final answer of a response; see the module docs.
pub fn extract_answer(response: &str) -> Option<Extracted> {
    if let Some(b) = last_boxed(response) {
        return Some(Extracted::Boxed(b));
    }
    if let Some(pos) = response.rfind("####") {
        let line = response[pos + 4..]
            .trim_start()
            .lines()
            .next()
            .unwrap_or("")
            .trim();
        if !line.is_empty() {
            return Some(Extracted::Hashes(line.to_string()));
        }
    }
    last_number(response).map(Extracted::LastNumber)
}

/// If `s` (trimmed) is exactly `\cmd{...}` for one of `cmds`, its contents.
fn unwrap_whole<'a>(s: &'a str, cmds: &[&str]) -> Option<&'a str> {
    let s = s.trim();
    for cmd in cmds {
        if let Some(rest) = s.strip_prefix(cmd) {
            let rest = rest.trim_start();
            if rest.starts_with('{') && rest.ends_with('}') {
                let inner = &rest[1..rest.len() - 1];
                // The first brace must close at the very end.
                if brace_pairs(rest).get(&0) == Some(&(rest.len() - 1)) {
                    return Some(inner);
                }
            }
        }
    }
    None
}

const TEXT_CMDS: [&str; 8] = [
    "\\textbf",
    "\\textrm",
    "\\textit",
    "\\text",
    "\\mathrm",
    "\\mathbf",
    "\\mbox",
    "\\operatorname",
];

/// Splits `s` into the text outside `\text{...}`-like wrappers and the text inside them.
/// A `^2`-style exponent right after a wrapper (units like `\text{cm}^2`) counts as inside.
fn split_text_wrappers(s: &str) -> (String, String) {
    let pairs = brace_pairs(s);
    let (mut outside, mut inside) = (String::new(), String::new());
    let mut i = 0;
    'scan: while i < s.len() {
        if s.as_bytes()[i] == b'\\' {
            for cmd in TEXT_CMDS {
                if !s[i..].starts_with(cmd) {
                    continue;
                }
                let after = i + cmd.len();
                let open = after + (s[after..].len() - s[after..].trim_start().len());
                if s.as_bytes().get(open) != Some(&b'{') {
                    continue;
                }
                if let Some(&close) = pairs.get(&open) {
                    inside.push_str(&s[open + 1..close]);
                    i = close + 1;
                    if s.as_bytes().get(i) == Some(&b'^') {
                        match s.as_bytes().get(i + 1) {
                            Some(b'{') => {
                                if let Some(&c) = pairs.get(&(i + 1)) {
                                    i = c + 1;
                                }
                            }
                            Some(c) if c.is_ascii_digit() => i += 2,
                            _ => {}
                        }
                    }
                    continue 'scan;
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or(' ');
        outside.push(ch);
        i += ch.len_utf8();
    }
    (outside, inside)
}

/// `^-?\d{1,3}(,\d{3})+(\.\d+)?$`: a number with thousands separators.
fn is_grouped_number(s: &str) -> bool {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match body.split_once('.') {
        Some((a, f)) => (a, Some(f)),
        None => (body, None),
    };
    if let Some(f) = frac {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    let groups: Vec<&str> = int.split(',').collect();
    groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3)
}

/// `-?digits[.digits]` or `-?.digits` as an exact rational (at most 30 digits).
fn parse_plain(s: &str) -> Option<Rational> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let digits = int.len() + frac.len();
    if digits == 0 || digits > 30 || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut num: i128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        num = num * 10 + (b - b'0') as i128;
    }
    let den = 10i128.pow(frac.len() as u32);
    Rational::new(if neg { -num } else { num }, den)
}

/// One argument of `\frac`: `{...}` or a single character. Returns (argument, rest).
fn frac_arg(s: &str) -> Option<(&str, &str)> {
    if s.starts_with('{') {
        let close = *brace_pairs(s).get(&0)?;
        Some((&s[1..close], &s[close + 1..]))
    } else {
        let c = s.chars().next()?;
        Some((&s[..c.len_utf8()], &s[c.len_utf8()..]))
    }
}

/// A normalised answer as an exact number: integers, decimals, `a/b`, `\frac{a}{b}`,
/// `\frac ab`, with an optional leading sign.
pub(crate) fn parse_number(s: &str) -> Option<Rational> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let v = if let Some(rest) = body.strip_prefix("\\frac") {
        let (a, rest) = frac_arg(rest)?;
        let (b, rest) = frac_arg(rest)?;
        if !rest.is_empty() {
            return None;
        }
        parse_plain(a)?.checked_div(parse_plain(b)?)?
    } else if let Some((a, b)) = body.split_once('/') {
        parse_plain(a)?.checked_div(parse_plain(b)?)?
    } else {
        parse_plain(body)?
    };
    if neg {
        v.checked_neg()
    } else {
        Some(v)
    }
}

/// Canonical text of an answer: see the module docs for the rules. Idempotent.
pub fn normalize_answer(s: &str) -> String {
    let mut s = s.trim().to_string();
    if s.len() > MAX_ANSWER_LEN {
        return s;
    }
    while let Some(inner) = unwrap_whole(&s, &["\\boxed", "\\fbox"]) {
        s = inner.trim().to_string();
    }
    s = s.replace('\u{2212}', "-");
    for (from, to) in [("\\dfrac", "\\frac"), ("\\tfrac", "\\frac")] {
        s = s.replace(from, to);
    }
    for junk in [
        "\\left",
        "\\right",
        "\\!",
        "\\,",
        "\\;",
        "\\:",
        "\\ ",
        "\\$",
        "$",
        "\\%",
        "%",
        "^{\\circ}",
        "^\\circ",
        "\\circ",
        "°",
        "~",
    ] {
        s = s.replace(junk, " ");
    }
    let (outside, inside) = split_text_wrappers(&s);
    s = if outside.trim().is_empty() {
        inside
    } else {
        outside
    };
    // "5 apples", "18 dollars": a number, a space, then words only (at least two
    // letters, so that "2 x" stays as it is).
    let t = s.trim();
    if let Some(cut) = t.find(|c: char| c.is_alphabetic()) {
        let (num, rest) = t.split_at(cut);
        if num.ends_with(char::is_whitespace)
            && rest.chars().all(|c| c.is_alphabetic() || c.is_whitespace())
            && rest.chars().filter(|c| c.is_alphabetic()).count() >= 2
            && parse_plain(&num.trim().replace(',', "")).is_some()
        {
            s = num.to_string();
        }
    }
    s.retain(|c| !c.is_whitespace());
    // "x=5", "f(2)=7": keep the right-hand side of the last '=' (not of "<=", ">=", "!=").
    if !s.contains(',') {
        if let Some(p) = s.rfind('=') {
            let lhs_end = s[..p].chars().last();
            if !matches!(lhs_end, Some('<' | '>' | '!')) && p + 1 < s.len() {
                s = s[p + 1..].to_string();
            }
        }
    }
    while s.ends_with('.') {
        s.pop();
    }
    if let Some(rest) = s.strip_prefix('+') {
        s = rest.to_string();
    }
    if is_grouped_number(&s) {
        s.retain(|c| c != ',');
    }
    s
}

/// Whether a predicted answer matches the reference, after normalisation; numbers compare
/// by exact value.
pub fn answers_match(predicted: &str, reference: &str) -> bool {
    if predicted.len() > MAX_ANSWER_LEN || reference.len() > MAX_ANSWER_LEN {
        return predicted.trim() == reference.trim();
    }
    let (a, b) = (normalize_answer(predicted), normalize_answer(reference));
    if a.is_empty() || b.is_empty() {
        return false;
    }
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (parse_number(&a), parse_number(&b)) {
        return x == y;
    }
    // Integers too long for exact rationals.
    if let (Some(x), Some(y)) = (canonical_integer(&a), canonical_integer(&b)) {
        return x == y;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_table() {
        use Extracted::*;
        let cases: &[(&str, Option<Extracted>)] = &[
            ("The answer is \\boxed{42}.", Some(Boxed("42".into()))),
            ("\\boxed{1} then \\boxed{2}", Some(Boxed("2".into()))),
            ("\\boxed{\\frac{1}{2}}", Some(Boxed("\\frac{1}{2}".into()))),
            ("$\\boxed{x^{2}+1}$ done", Some(Boxed("x^{2}+1".into()))),
            ("\\boxed {7}", Some(Boxed("7".into()))),
            ("\\fbox{7}", Some(Boxed("7".into()))),
            // Truncated last box: the earlier balanced one wins.
            ("\\boxed{3} ... \\boxed{4", Some(Boxed("3".into()))),
            ("\\boxed{} so 12", Some(LastNumber("12".into()))),
            ("\\boxed{5} #### 6", Some(Boxed("5".into()))),
            ("She has 3 apples.\n#### 72", Some(Hashes("72".into()))),
            ("#### 1 #### 2\nQuestion: 99", Some(Hashes("2".into()))),
            ("#### \n 8", Some(Hashes("8".into()))),
            ("####", None),
            (
                "So she paid $1,234.50 in total.",
                Some(LastNumber("1,234.50".into())),
            ),
            ("It drops to -5 degrees", Some(LastNumber("-5".into()))),
            ("7-3 is 4", Some(LastNumber("4".into()))),
            ("x-3", Some(LastNumber("3".into()))),
            ("about 3/4 of it", Some(LastNumber("3/4".into()))),
            ("list: 1, 2, 3", Some(LastNumber("3".into()))),
            ("value .5", Some(LastNumber(".5".into()))),
            ("no numbers here", None),
            ("", None),
            ("ünïcödé 🙂 ٣", None),
            ("🙂 12 🙂", Some(LastNumber("12".into()))),
        ];
        for (text, want) in cases {
            assert_eq!(&extract_answer(text), want, "{text:?}");
        }
        assert!(Boxed("1".into()).is_marked());
        assert!(Hashes("1".into()).is_marked());
        assert!(!LastNumber("1".into()).is_marked());
    }

    #[test]
    fn extraction_is_linear_on_adversarial_input() {
        let s = "\\boxed{".repeat(50_000);
        assert_eq!(extract_answer(&s), None);
        let s = format!("{}{}", "{".repeat(100_000), "}".repeat(100_000));
        assert_eq!(extract_answer(&s), None);
        let s = "1,".repeat(100_000);
        assert!(extract_answer(&s).is_some());
    }

    #[test]
    fn normalize_table() {
        let cases: &[(&str, &str)] = &[
            (" 42 ", "42"),
            ("42.", "42"),
            ("$42$", "42"),
            ("\\$18", "18"),
            ("1,234", "1234"),
            ("-1,234,567.5", "-1234567.5"),
            ("1,2", "1,2"),
            ("(1,234)", "(1,234)"),
            ("\\dfrac{1}{2}", "\\frac{1}{2}"),
            ("\\tfrac12", "\\frac12"),
            ("x = 5", "5"),
            ("f(2)=7", "7"),
            ("x \\leq 3", "x\\leq3"),
            ("x<=3", "x<=3"),
            ("x=1, y=2", "x=1,y=2"),
            ("5 \\text{ cm}", "5"),
            ("20\\text{ cm}^2", "20"),
            ("\\text{(B)}", "(B)"),
            ("\\textbf{Yes}", "Yes"),
            ("18 dollars", "18"),
            ("5 apples", "5"),
            ("1,500 people", "1500"),
            ("2 x", "2x"),
            ("2x", "2x"),
            ("50\\%", "50"),
            ("90^\\circ", "90"),
            ("\\boxed{7}", "7"),
            ("\\left( 1, 2 \\right)", "(1,2)"),
            ("\u{2212}3", "-3"),
            ("+3", "3"),
            ("", ""),
        ];
        for (input, want) in cases {
            let got = normalize_answer(input);
            assert_eq!(&got, want, "{input:?}");
            assert_eq!(normalize_answer(&got), got, "not idempotent on {input:?}");
        }
    }

    #[test]
    fn match_table() {
        let yes: &[(&str, &str)] = &[
            ("42", "42"),
            ("42.0", "42"),
            ("0.50", "0.5"),
            ("1/2", "\\frac{1}{2}"),
            ("\\frac12", "0.5"),
            ("\\dfrac{3}{4}", "0.75"),
            ("-\\frac{1}{2}", "\\frac{-1}{2}"),
            ("$1,234", "1234"),
            ("1234.00", "1,234"),
            ("x = 5", "5"),
            ("5 \\text{ meters}", "5"),
            ("007", "7"),
            ("\\boxed{9}", "9"),
            ("(1,2)", "\\left(1, 2\\right)"),
            ("x^2+1", "x^2 + 1"),
            (
                "123456789012345678901234567890123456789012345678901",
                "0123456789012345678901234567890123456789012345678901",
            ),
        ];
        for (a, b) in yes {
            assert!(answers_match(a, b), "{a:?} should match {b:?}");
            assert!(answers_match(b, a), "{b:?} should match {a:?}");
        }
        let no: &[(&str, &str)] = &[
            ("41", "42"),
            ("0.51", "0.5"),
            ("1/3", "0.33"),
            ("-5", "5"),
            ("", "5"),
            ("5", ""),
            ("", ""),
            ("five", "5"),
            ("1/0", "0"),
            ("\\frac{1}{0}", "1"),
            (
                "123456789012345678901234567890123456789012345678901",
                "123456789012345678901234567890123456789012345678902",
            ),
            ("🙂", "5"),
        ];
        for (a, b) in no {
            assert!(!answers_match(a, b), "{a:?} should not match {b:?}");
        }
        let huge = "9".repeat(MAX_ANSWER_LEN + 1);
        assert!(answers_match(&huge, &huge));
        assert!(!answers_match(&huge, "9"));
    }

    #[test]
    fn parse_number_table() {
        let r = |n, d| Rational::new(n, d);
        assert_eq!(parse_number("3"), r(3, 1));
        assert_eq!(parse_number("-3.25"), r(-13, 4));
        assert_eq!(parse_number(".5"), r(1, 2));
        assert_eq!(parse_number("\\frac{2}{4}"), r(1, 2));
        assert_eq!(parse_number("\\frac34"), r(3, 4));
        assert_eq!(parse_number("\\frac{1.5}{3}"), r(1, 2));
        assert_eq!(parse_number("6/4"), r(3, 2));
        assert_eq!(parse_number("\\frac{1}{2}x"), None);
        assert_eq!(parse_number("1/2/3"), None);
        assert_eq!(parse_number("\\frac"), None);
        assert_eq!(parse_number("\\frac{"), None);
        assert_eq!(parse_number("-"), None);
        assert_eq!(parse_number("."), None);
        assert_eq!(parse_number("1e5"), None);
        assert_eq!(parse_number(&"9".repeat(31)), None);
        assert_eq!(parse_number("\\frac🙂🙂"), None);
    }
}
