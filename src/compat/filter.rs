//! The subset of Consul's `filter` expressions tandem evaluates.
//!
//! Grammar: `expr := term (("and" | "or") term)*` with `and` binding tighter; `term :=
//! "not" term | "(" expr ")" | match`; `match := selector ("==" | "!=") value | selector
//! ["not"] "contains" value | value ["not"] "in" selector | selector ("is empty" | "is not
//! empty")`. A value is a double-quoted or back-quoted string, or a bare word. Selectors
//! are those the caller resolves (for a health entry: `Service.ID`, `Service.Service`,
//! `Service.Tags`, `Service.Meta.<key>`, `Checks.Status`, ...). A selector that yields a
//! list (`Service.Tags`, `Checks.Status`) matches `==`, `contains` and `in` when any
//! element does, `!=` when none does. Everything else is refused with the reason, so a
//! client learns at once that its filter is not applied.

/// Longest filter accepted, in bytes.
pub const FILTER_BYTES_MAX: usize = 1024;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Op(&'static str),
    Open,
    Close,
}

/// A parsed filter.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    And(Box<Filter>, Box<Filter>),
    Or(Box<Filter>, Box<Filter>),
    Not(Box<Filter>),
    Eq(String, String),
    Ne(String, String),
    Contains(String, String),
    Empty(String),
}

/// What a selector yields for one entry: `None` when the selector is unknown.
pub type Resolve<'a> = dyn Fn(&str) -> Option<Vec<String>> + 'a;

impl Filter {
    /// Parses `s`; `known` says which selectors exist (checked now, not per entry).
    pub fn parse(s: &str, known: &dyn Fn(&str) -> bool) -> Result<Filter, String> {
        if s.len() > FILTER_BYTES_MAX {
            return Err(format!("a filter of at most {FILTER_BYTES_MAX} bytes"));
        }
        let toks = lex(s)?;
        let mut p = Parser { toks, at: 0, known };
        let f = p.or()?;
        if p.at != p.toks.len() {
            return Err(format!("unexpected {:?} in the filter", p.toks[p.at]));
        }
        Ok(f)
    }

    /// Whether an entry matches.
    pub fn matches(&self, get: &Resolve<'_>) -> bool {
        let vals = |sel: &str| get(sel).unwrap_or_default();
        match self {
            Filter::And(a, b) => a.matches(get) && b.matches(get),
            Filter::Or(a, b) => a.matches(get) || b.matches(get),
            Filter::Not(a) => !a.matches(get),
            Filter::Eq(sel, v) | Filter::Contains(sel, v) => vals(sel).iter().any(|x| x == v),
            Filter::Ne(sel, v) => !vals(sel).iter().any(|x| x == v),
            Filter::Empty(sel) => vals(sel).iter().all(String::is_empty),
        }
    }
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        match c {
            c if c.is_whitespace() => {}
            '(' => out.push(Tok::Open),
            ')' => out.push(Tok::Close),
            '=' | '!' => {
                if it.next_if(|(_, n)| *n == '=').is_none() {
                    return Err(format!("'{c}' must be followed by '=' (at byte {i})"));
                }
                out.push(Tok::Op(if c == '=' { "==" } else { "!=" }));
            }
            '"' | '`' => {
                let mut v = String::new();
                loop {
                    match it.next() {
                        None => return Err("an unterminated string in the filter".into()),
                        Some((_, '\\')) if c == '"' => match it.next() {
                            Some((_, e)) => v.push(e),
                            None => return Err("an unterminated string in the filter".into()),
                        },
                        Some((_, e)) if e == c => break,
                        Some((_, e)) => v.push(e),
                    }
                }
                out.push(Tok::Str(v));
            }
            _ => {
                let mut w = String::from(c);
                while let Some((_, n)) = it.next_if(|(_, n)| !n.is_whitespace() && !"()=!\"`".contains(*n)) {
                    w.push(n);
                }
                out.push(Tok::Word(w));
            }
        }
    }
    Ok(out)
}

struct Parser<'k> {
    toks: Vec<Tok>,
    at: usize,
    known: &'k dyn Fn(&str) -> bool,
}

impl Parser<'_> {
    fn peek_word(&self, w: &str) -> bool {
        matches!(self.toks.get(self.at), Some(Tok::Word(x)) if x == w)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn or(&mut self) -> Result<Filter, String> {
        let mut f = self.and()?;
        while self.peek_word("or") {
            self.at += 1;
            f = Filter::Or(Box::new(f), Box::new(self.and()?));
        }
        Ok(f)
    }

    fn and(&mut self) -> Result<Filter, String> {
        let mut f = self.term()?;
        while self.peek_word("and") {
            self.at += 1;
            f = Filter::And(Box::new(f), Box::new(self.term()?));
        }
        Ok(f)
    }

    fn term(&mut self) -> Result<Filter, String> {
        if self.peek_word("not") {
            self.at += 1;
            return Ok(Filter::Not(Box::new(self.term()?)));
        }
        if self.toks.get(self.at) == Some(&Tok::Open) {
            self.at += 1;
            let f = self.or()?;
            if self.next() != Some(Tok::Close) {
                return Err("a '(' without its ')' in the filter".into());
            }
            return Ok(f);
        }
        let first = match self.next() {
            Some(Tok::Word(w)) | Some(Tok::Str(w)) => w,
            other => return Err(format!("expected a selector or a value, found {other:?}")),
        };
        // `value [not] in selector`
        let negated_in =
            self.peek_word("not") && matches!(self.toks.get(self.at + 1), Some(Tok::Word(w)) if w == "in");
        if self.peek_word("in") || negated_in {
            self.at += if negated_in { 2 } else { 1 };
            let sel = self.selector()?;
            let m = Filter::Contains(sel, first);
            return Ok(if negated_in { Filter::Not(Box::new(m)) } else { m });
        }
        let sel = self.check_selector(first)?;
        match self.next() {
            Some(Tok::Op("==")) => Ok(Filter::Eq(sel, self.value()?)),
            Some(Tok::Op("!=")) => Ok(Filter::Ne(sel, self.value()?)),
            Some(Tok::Word(w)) if w == "contains" => Ok(Filter::Contains(sel, self.value()?)),
            Some(Tok::Word(w)) if w == "not" && self.peek_word("contains") => {
                self.at += 1;
                Ok(Filter::Not(Box::new(Filter::Contains(sel, self.value()?))))
            }
            Some(Tok::Word(w)) if w == "is" => {
                let not = self.peek_word("not");
                if not {
                    self.at += 1;
                }
                if !self.peek_word("empty") {
                    return Err("expected 'is empty' or 'is not empty'".into());
                }
                self.at += 1;
                let m = Filter::Empty(sel);
                Ok(if not { Filter::Not(Box::new(m)) } else { m })
            }
            other => {
                Err(format!("tandem supports ==, !=, contains, in and is empty in filters; found {other:?}"))
            }
        }
    }

    fn selector(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Word(w)) => self.check_selector(w),
            other => Err(format!("expected a selector, found {other:?}")),
        }
    }

    fn check_selector(&self, w: String) -> Result<String, String> {
        if (self.known)(&w) {
            Ok(w)
        } else {
            Err(format!("tandem does not filter on selector {w:?}"))
        }
    }

    fn value(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Word(w)) | Some(Tok::Str(w)) => Ok(w),
            other => Err(format!("expected a value, found {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sel: &str) -> Option<Vec<String>> {
        match sel {
            "Service.ID" => Some(vec!["web1".into()]),
            "Service.Tags" => Some(vec!["blue".into(), "v2".into()]),
            "Checks.Status" => Some(vec!["passing".into(), "warning".into()]),
            "Service.Meta.team" => Some(vec!["core".into()]),
            _ => None,
        }
    }

    fn eval(s: &str) -> Result<bool, String> {
        let known = |s: &str| entry(s).is_some() || s.starts_with("Service.Meta.");
        Ok(Filter::parse(s, &known)?.matches(&entry))
    }

    #[test]
    fn the_supported_forms_evaluate_as_consul_does() {
        assert_eq!(eval(r#"Service.ID == "web1""#), Ok(true));
        assert_eq!(eval("Service.ID != web1"), Ok(false));
        assert_eq!(eval(r#""blue" in Service.Tags"#), Ok(true));
        assert_eq!(eval(r#""red" not in Service.Tags"#), Ok(true));
        assert_eq!(eval("Service.Tags contains v2 and Service.Meta.team == core"), Ok(true));
        assert_eq!(eval(r#"Checks.Status == critical or (not Service.ID == web2)"#), Ok(true));
        assert_eq!(eval("Checks.Status != critical"), Ok(true));
        assert_eq!(eval("Service.Meta.other is empty"), Ok(true));
    }

    #[test]
    fn what_is_not_supported_is_refused_with_the_reason() {
        assert!(eval("Service.ID > 80").unwrap_err().contains("supports"));
        assert!(eval("Node.Node == x").unwrap_err().contains("selector"));
        assert!(eval("(Service.ID == a").is_err());
        assert!(eval("Service.ID = a").is_err());
        assert!(eval(&"x".repeat(2000)).is_err());
    }
}
