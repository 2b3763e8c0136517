//! Exact rationals and a small, bounded expression parser (`+ - * /`, parentheses,
//! non-negative integer literals). Used by the countdown verifier; never panics.

use std::fmt;

/// An exact rational `num/den` in lowest terms with `den > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rational {
    num: i128,
    den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    // Callers pass values whose magnitude fits (never i128::MIN).
    a = a.abs();
    b = b.abs();
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Rational {
    pub const ZERO: Rational = Rational { num: 0, den: 1 };

    pub fn integer(n: i128) -> Self {
        Rational { num: n, den: 1 }
    }

    /// `num/den` reduced; `None` if `den == 0` or a value is `i128::MIN`.
    pub fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 || num == i128::MIN || den == i128::MIN {
            return None;
        }
        let g = gcd(num, den);
        let (mut n, mut d) = (num / g, den / g);
        if d < 0 {
            n = -n;
            d = -d;
        }
        Some(Rational { num: n, den: d })
    }

    pub fn numer(&self) -> i128 {
        self.num
    }

    pub fn denom(&self) -> i128 {
        self.den
    }

    pub fn is_integer(&self) -> bool {
        self.den == 1
    }

    pub fn checked_add(self, o: Rational) -> Option<Rational> {
        let n = self
            .num
            .checked_mul(o.den)?
            .checked_add(o.num.checked_mul(self.den)?)?;
        Rational::new(n, self.den.checked_mul(o.den)?)
    }

    pub fn checked_neg(self) -> Option<Rational> {
        Some(Rational {
            num: self.num.checked_neg()?,
            den: self.den,
        })
    }

    pub fn checked_sub(self, o: Rational) -> Option<Rational> {
        self.checked_add(o.checked_neg()?)
    }

    pub fn checked_mul(self, o: Rational) -> Option<Rational> {
        // Cross-reduce first to keep intermediates small.
        let g1 = gcd(self.num, o.den).max(1);
        let g2 = gcd(o.num, self.den).max(1);
        let n = (self.num / g1).checked_mul(o.num / g2)?;
        let d = (self.den / g2).checked_mul(o.den / g1)?;
        Rational::new(n, d)
    }

    /// `None` on division by zero or overflow.
    pub fn checked_div(self, o: Rational) -> Option<Rational> {
        if o.num == 0 {
            return None;
        }
        self.checked_mul(Rational::new(o.den, o.num)?)
    }
}

impl fmt::Display for Rational {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

/// Longest expression accepted, in bytes (after trimming).
pub const MAX_EXPR_LEN: usize = 256;
/// Deepest parenthesis nesting accepted.
pub const MAX_EXPR_DEPTH: usize = 32;
/// Most digits in one literal.
pub const MAX_LITERAL_DIGITS: usize = 18;

/// Why an expression was rejected or could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    #[error("expression is empty")]
    Empty,
    #[error("expression is {0} bytes, more than {MAX_EXPR_LEN}")]
    TooLong(usize),
    #[error("parentheses nested deeper than {MAX_EXPR_DEPTH}")]
    TooDeep,
    #[error("unexpected {found:?} at byte {pos}")]
    Unexpected { pos: usize, found: char },
    #[error("unexpected end of expression")]
    UnexpectedEnd,
    #[error("number at byte {0} has more than {MAX_LITERAL_DIGITS} digits")]
    LiteralTooLong(usize),
    #[error("division by zero")]
    DivisionByZero,
    #[error("arithmetic overflow")]
    Overflow,
}

/// A syntactically valid expression: its literals in order, and its value (or why it has
/// none: division by zero, overflow).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedExpr {
    pub literals: Vec<u64>,
    pub value: Result<Rational, ExprError>,
}

type Value = Result<Rational, ExprError>;

struct Parser<'a> {
    s: &'a [u8],
    src: &'a str,
    pos: usize,
    depth: usize,
    literals: Vec<u64>,
}

fn combine(a: Value, op: u8, b: Value) -> Value {
    let (a, b) = (a?, b?);
    match op {
        b'+' => a.checked_add(b).ok_or(ExprError::Overflow),
        b'-' => a.checked_sub(b).ok_or(ExprError::Overflow),
        b'*' => a.checked_mul(b).ok_or(ExprError::Overflow),
        _ => {
            if b == Rational::ZERO {
                Err(ExprError::DivisionByZero)
            } else {
                a.checked_div(b).ok_or(ExprError::Overflow)
            }
        }
    }
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn unexpected(&self) -> ExprError {
        match self.src.get(self.pos..).and_then(|r| r.chars().next()) {
            Some(found) => ExprError::Unexpected {
                pos: self.pos,
                found,
            },
            None => ExprError::UnexpectedEnd,
        }
    }

    // expr := term (('+' | '-') term)*
    fn expr(&mut self) -> Result<Value, ExprError> {
        let mut v = self.term()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.pos += 1;
            let r = self.term()?;
            v = combine(v, op, r);
        }
        Ok(v)
    }

    // term := factor (('*' | '/') factor)*
    fn term(&mut self) -> Result<Value, ExprError> {
        let mut v = self.factor()?;
        while let Some(op @ (b'*' | b'/')) = self.peek() {
            self.pos += 1;
            let r = self.factor()?;
            v = combine(v, op, r);
        }
        Ok(v)
    }

    // factor := literal | '(' expr ')'
    fn factor(&mut self) -> Result<Value, ExprError> {
        match self.peek() {
            Some(b'(') => {
                if self.depth == MAX_EXPR_DEPTH {
                    return Err(ExprError::TooDeep);
                }
                self.depth += 1;
                self.pos += 1;
                let v = self.expr()?;
                if self.peek() != Some(b')') {
                    return Err(self.unexpected());
                }
                self.pos += 1;
                self.depth -= 1;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.pos;
                while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
                    self.pos += 1;
                }
                if self.pos - start > MAX_LITERAL_DIGITS {
                    return Err(ExprError::LiteralTooLong(start));
                }
                let n: u64 = self.src[start..self.pos]
                    .parse()
                    .map_err(|_| ExprError::LiteralTooLong(start))?;
                self.literals.push(n);
                Ok(Ok(Rational::integer(n as i128)))
            }
            _ => Err(self.unexpected()),
        }
    }
}

/// Parses `src` (surrounding whitespace ignored). A syntax error is `Err`; a valid
/// expression whose evaluation fails (division by zero) is `Ok` with `value: Err`.
pub fn parse_expression(src: &str) -> Result<ParsedExpr, ExprError> {
    let src = src.trim();
    if src.is_empty() {
        return Err(ExprError::Empty);
    }
    if src.len() > MAX_EXPR_LEN {
        return Err(ExprError::TooLong(src.len()));
    }
    let mut p = Parser {
        s: src.as_bytes(),
        src,
        pos: 0,
        depth: 0,
        literals: Vec::new(),
    };
    let value = p.expr()?;
    if p.peek().is_some() {
        return Err(p.unexpected());
    }
    Ok(ParsedExpr {
        literals: p.literals,
        value,
    })
}

/// The exact value of `src`, or why there is none.
pub fn eval_expression(src: &str) -> Result<Rational, ExprError> {
    parse_expression(src)?.value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: i128, d: i128) -> Rational {
        Rational::new(n, d).unwrap()
    }

    #[test]
    fn rational_arith() {
        assert_eq!(r(2, 4), r(1, 2));
        assert_eq!(r(1, -2), r(-1, 2));
        assert_eq!(r(1, 2).checked_add(r(1, 3)), Some(r(5, 6)));
        assert_eq!(r(1, 2).checked_sub(r(1, 2)), Some(Rational::ZERO));
        assert_eq!(r(2, 3).checked_mul(r(3, 4)), Some(r(1, 2)));
        assert_eq!(r(1, 2).checked_div(Rational::ZERO), None);
        assert_eq!(Rational::new(1, 0), None);
        assert_eq!(Rational::new(i128::MIN, 1), None);
        let big = Rational::integer(i128::MAX);
        assert_eq!(big.checked_add(big), None);
        assert_eq!(big.checked_mul(big), None);
        assert_eq!(r(7, 3).to_string(), "7/3");
        assert_eq!(Rational::integer(-4).to_string(), "-4");
    }

    #[test]
    fn eval_table() {
        let ok: &[(&str, Rational)] = &[
            ("1", r(1, 1)),
            ("1+2*3", r(7, 1)),
            ("(1+2)*3", r(9, 1)),
            ("10-3-2", r(5, 1)),
            ("10-(3-2)", r(9, 1)),
            ("8/4/2", r(1, 1)),
            ("8/(4/2)", r(4, 1)),
            ("7/2", r(7, 2)),
            ("3*(7/3)", r(7, 1)),
            (" ( 3 + 4 ) * 5 ", r(35, 1)),
            ("((((((((1))))))))", r(1, 1)),
            ("2-5", r(-3, 1)),
        ];
        for (s, v) in ok {
            assert_eq!(eval_expression(s), Ok(*v), "{s}");
        }
        let nested = format!("{}1{}", "(".repeat(32), ")".repeat(32));
        assert_eq!(eval_expression(&nested), Ok(r(1, 1)));
        let too_deep = format!("{}1{}", "(".repeat(33), ")".repeat(33));
        assert_eq!(eval_expression(&too_deep), Err(ExprError::TooDeep));
        let very_deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(matches!(
            eval_expression(&very_deep),
            Err(ExprError::TooLong(_))
        ));
        let bad: &[(&str, ExprError)] = &[
            ("", ExprError::Empty),
            ("   ", ExprError::Empty),
            ("1+", ExprError::UnexpectedEnd),
            ("(1+2", ExprError::UnexpectedEnd),
            ("1+2)", ExprError::Unexpected { pos: 3, found: ')' }),
            ("-1", ExprError::Unexpected { pos: 0, found: '-' }),
            ("1++2", ExprError::Unexpected { pos: 2, found: '+' }),
            ("2^3", ExprError::Unexpected { pos: 1, found: '^' }),
            (
                "3×4",
                ExprError::Unexpected {
                    pos: 1, found: '×'
                },
            ),
            ("1 2", ExprError::Unexpected { pos: 2, found: '2' }),
            ("()", ExprError::Unexpected { pos: 1, found: ')' }),
            ("1/0", ExprError::DivisionByZero),
            ("5/(3-3)", ExprError::DivisionByZero),
            ("1234567890123456789", ExprError::LiteralTooLong(0)),
            ("1.5", ExprError::Unexpected { pos: 1, found: '.' }),
            ("x", ExprError::Unexpected { pos: 0, found: 'x' }),
            (
                "１",
                ExprError::Unexpected {
                    pos: 0,
                    found: '１',
                },
            ),
        ];
        for (s, e) in bad {
            assert_eq!(eval_expression(s).as_ref(), Err(e), "{s:?}");
        }
        let over = "999999999999999999*".repeat(3) + "999999999999999999";
        assert_eq!(eval_expression(&over), Err(ExprError::Overflow));
    }

    #[test]
    fn literals_recorded_even_on_div_by_zero() {
        let p = parse_expression("3/(7-7)+9").unwrap();
        assert_eq!(p.literals, vec![3, 7, 7, 9]);
        assert_eq!(p.value, Err(ExprError::DivisionByZero));
    }

    #[test]
    fn no_panic_on_junk() {
        let long = "9".repeat(300);
        let junk = [
            "\u{0}",
            "((((",
            "))))",
            "*",
            "/",
            "1/",
            long.as_str(),
            "🙂+1",
            "1+🙂",
            "(1)(2)",
            "1 + ( 2 * ( 3 - ( 4 / ( 5 ) ) ) )",
            "\u{202e}1+2",
        ];
        for s in junk {
            assert!(eval_expression(s).is_err() || s.contains('+'), "{s:?}");
        }
        // A fixed-seed fuzz over the expression alphabet.
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let alphabet: Vec<char> = "0123456789+-*/() é".chars().collect();
        for _ in 0..20_000 {
            let len = rng.random_range(0..40);
            let s: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let _ = eval_expression(&s);
        }
    }
}
