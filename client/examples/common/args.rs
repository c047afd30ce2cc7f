//! The examples' command-line options: `--name value`, `--name=value` and `--flag`, with
//! `--help` printing the usage. Hand-rolled so that building an example costs no argument
//! parser crate (see the README's build time of the consumer example).

// Each example uses a part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::str::FromStr;

pub struct Opts {
    values: HashMap<String, String>,
    usage: &'static str,
}

impl Opts {
    /// Parses the process's arguments. `options` take a value, `flags` do not; anything
    /// else, or a bad value later, prints the usage and exits with status 2.
    pub fn parse(usage: &'static str, options: &[&str], flags: &[&str]) -> Opts {
        let mut values = HashMap::new();
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            if arg == "--help" || arg == "-h" {
                println!("{usage}");
                std::process::exit(0);
            }
            let Some(name) = arg.strip_prefix("--") else {
                fail(usage, &format!("unexpected argument {arg:?}"))
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_owned(), v.to_owned()),
                None if flags.contains(&name) => (name.to_owned(), "true".to_owned()),
                None => (
                    name.to_owned(),
                    it.next().unwrap_or_else(|| fail(usage, &format!("--{name} needs a value"))),
                ),
            };
            if !options.contains(&name.as_str()) && !flags.contains(&name.as_str()) {
                fail(usage, &format!("unknown option --{name}"));
            }
            values.insert(name, value);
        }
        Opts { values, usage }
    }

    /// The value of `--name`, if given.
    pub fn opt<T: FromStr>(&self, name: &str) -> Option<T> {
        let v = self.values.get(name)?;
        Some(v.parse().unwrap_or_else(|_| fail(self.usage, &format!("--{name}: bad value {v:?}"))))
    }

    /// The value of `--name`, or `default`.
    pub fn get<T: FromStr>(&self, name: &str, default: T) -> T {
        self.opt(name).unwrap_or(default)
    }

    /// Whether `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }
}

fn fail(usage: &str, problem: &str) -> ! {
    eprintln!("error: {problem}\n\n{usage}");
    std::process::exit(2);
}
