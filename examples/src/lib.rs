//! What the example programs share: their command lines. Each program keeps its own help
//! text and options; [`Cli`] does the rest the same way for all of them (`--help` prints the
//! help and exits 0; a bad command line prints the reason and the help and exits 2).

use std::str::FromStr;

/// A program's command line, read option by option.
pub struct Cli {
    prog: &'static str,
    help: &'static str,
    args: std::iter::Skip<std::env::Args>,
}

impl Cli {
    /// The command line of `prog`, whose help text is `help`.
    pub fn new(prog: &'static str, help: &'static str) -> Self {
        Self {
            prog,
            help,
            args: std::env::args().skip(1),
        }
    }

    /// The next option; `--help` (or `-h`) prints the help and exits 0.
    pub fn next_option(&mut self) -> Option<String> {
        let a = self.args.next()?;
        if a == "-h" || a == "--help" {
            println!("{}", self.help);
            std::process::exit(0);
        }
        Some(a)
    }

    /// The value after `option`, parsed, and accepted by `ok`; else a usage error that says
    /// `option` needs `what`.
    pub fn value<T: FromStr>(&mut self, option: &str, what: &str, ok: impl Fn(&T) -> bool) -> T {
        match self.args.next().and_then(|v| v.parse::<T>().ok()) {
            Some(v) if ok(&v) => v,
            _ => self.usage(&format!("{option} needs {what}")),
        }
    }

    /// The value after `option` as it is; a usage error if there is none.
    pub fn text(&mut self, option: &str, what: &str) -> String {
        self.args
            .next()
            .unwrap_or_else(|| self.usage(&format!("{option} needs {what}")))
    }

    /// An option this program does not have: a usage error.
    pub fn unexpected(&self, option: &str) -> ! {
        self.usage(&format!("unexpected argument {option:?}"))
    }

    /// Says what is wrong with the command line, then the help; exits 2.
    pub fn usage(&self, msg: &str) -> ! {
        eprintln!("{}: {msg}\n\n{}", self.prog, self.help);
        std::process::exit(2);
    }
}
