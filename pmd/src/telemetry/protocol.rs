//! The telemetry v2 wire format: what a client sends, what the server answers, and how an
//! answer is kept within the size the client reads.
//!
//! Every message is one `SOCK_SEQPACKET` record. The server speaks first, with the greeting
//! ([`greeting`]); then each request is one record `COMMAND[,PARAM]` and each answer one
//! record `{"COMMAND":DATA}`, where DATA is `null` for an unknown command or a bad parameter
//! (DPDK lib/telemetry/telemetry.c: `client_handler`, `perform_command`, `output_json`).
#![deny(unsafe_code)]

use std::fmt::Write as _;

/// The longest answer a client reads, in bytes (DPDK's `MAX_OUTPUT_LEN`); the greeting says
/// so as `max_output_len`.
pub const MAX_OUTPUT_LEN: usize = 16 * 1024;

/// Commands are shorter than this many bytes (DPDK's `MAX_CMD_LEN`); a longer one is unknown,
/// and an answer names at most this many bytes of it.
pub const MAX_CMD_LEN: usize = 56;

/// The most bytes of one request the server reads: one record into a 1024-byte buffer that
/// keeps a byte for the terminating NUL (telemetry.c: `client_handler`). The rest of a longer
/// record is discarded by the socket.
pub const MAX_REQUEST_LEN: usize = 1023;

/// One request: the command and its parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// Text before the first `,` (leading commas skipped, as `strtok_r` does).
    pub cmd: &'a str,
    /// Text after that `,`, if any.
    pub param: Option<&'a str>,
}

/// Splits one request record. The record ends at its first NUL byte (DPDK handles it as a C
/// string); trailing whitespace (a newline typed into `socat`) is dropped, which DPDK does
/// not do but no command name contains. `None` for a record with no command at all: the
/// answer then names `none`, as DPDK's does.
pub fn parse(text: &str) -> Option<Request<'_>> {
    let text = text.split('\0').next().unwrap_or("").trim_end();
    // strtok_r(buffer, ",") skips leading delimiters, then takes up to the next one;
    // strtok_r(NULL, "\0") takes the rest, or nothing when the rest is empty.
    let text = text.trim_start_matches(',');
    if text.is_empty() {
        return None;
    }
    Some(match text.split_once(',') {
        Some((cmd, param)) => Request {
            cmd,
            param: (!param.is_empty()).then_some(param),
        },
        None => Request {
            cmd: text,
            param: None,
        },
    })
}

/// Whether `cmd` may be registered: starts with `/`, shorter than [`MAX_CMD_LEN`], only ASCII
/// letters, digits, `_` and `/` (telemetry.c: `register_cmd`).
pub fn valid_command(cmd: &str) -> bool {
    cmd.starts_with('/')
        && cmd.len() < MAX_CMD_LEN
        && cmd
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'/')
}

/// An answer's data, as DPDK's `rte_tel_data` holds it: a dictionary keeps its entries in the
/// order they were added (so `/ethdev/stats` lists `ipackets` first, as DPDK does).
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// `null`.
    Null,
    /// `true` / `false` (DPDK has none; ours only).
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer (counters).
    Uint(u64),
    /// A number with a fraction (seconds); `null` when not finite.
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Data>),
    /// A dictionary, in insertion order.
    Dict(Vec<(String, Data)>),
}

impl Data {
    /// An empty dictionary, to [`Data::add`] to.
    pub fn dict() -> Self {
        Data::Dict(Vec::new())
    }

    /// Adds `name: value` to a dictionary (does nothing to anything else).
    pub fn add(&mut self, name: &str, value: impl Into<Data>) -> &mut Self {
        if let Data::Dict(entries) = self {
            entries.push((name.to_string(), value.into()));
        }
        self
    }

    /// `self` with `name: value` added (builder form of [`Data::add`]).
    pub fn with(mut self, name: &str, value: impl Into<Data>) -> Self {
        self.add(name, value);
        self
    }

    /// The entry `name` of a dictionary.
    pub fn get(&self, name: &str) -> Option<&Data> {
        match self {
            Data::Dict(entries) => entries.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The whole value as compact JSON (no size limit).
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        let mut skipped = 0;
        write_fit(self, usize::MAX, &mut out, &mut skipped);
        out
    }
}

impl From<u64> for Data {
    fn from(v: u64) -> Self {
        Data::Uint(v)
    }
}
impl From<u32> for Data {
    fn from(v: u32) -> Self {
        Data::Uint(v.into())
    }
}
impl From<u16> for Data {
    fn from(v: u16) -> Self {
        Data::Uint(v.into())
    }
}
impl From<usize> for Data {
    fn from(v: usize) -> Self {
        Data::Uint(v as u64)
    }
}
impl From<i64> for Data {
    fn from(v: i64) -> Self {
        Data::Int(v)
    }
}
impl From<i32> for Data {
    fn from(v: i32) -> Self {
        Data::Int(v.into())
    }
}
impl From<bool> for Data {
    fn from(v: bool) -> Self {
        Data::Bool(v)
    }
}
impl From<f64> for Data {
    fn from(v: f64) -> Self {
        Data::Float(v)
    }
}
impl From<&str> for Data {
    fn from(v: &str) -> Self {
        Data::Str(v.to_string())
    }
}
impl From<String> for Data {
    fn from(v: String) -> Self {
        Data::Str(v)
    }
}
impl<T: Into<Data>> From<Vec<T>> for Data {
    fn from(v: Vec<T>) -> Self {
        Data::Array(v.into_iter().map(Into::into).collect())
    }
}
impl<T: Into<Data>> From<Option<T>> for Data {
    fn from(v: Option<T>) -> Self {
        v.map_or(Data::Null, Into::into)
    }
}

/// A JSON value (what the apps already build their reports with); an object's keys come in
/// `serde_json`'s order.
impl From<serde_json::Value> for Data {
    fn from(v: serde_json::Value) -> Self {
        use serde_json::Value;
        match v {
            Value::Null => Data::Null,
            Value::Bool(b) => Data::Bool(b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => Data::Uint(u),
                (None, Some(i)) => Data::Int(i),
                _ => Data::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Data::Str(s),
            Value::Array(a) => Data::Array(a.into_iter().map(Data::from).collect()),
            Value::Object(o) => Data::Dict(o.into_iter().map(|(k, v)| (k, v.into())).collect()),
        }
    }
}

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// Writes `v` into `out` in at most `budget` bytes. A scalar that does not fit is not
/// written (false). A container always is when `[]`/`{}` fits: each entry that does not fit
/// in what is left is skipped and counted in `skipped`, and the next ones are still tried,
/// as DPDK's JSON writers do (telemetry_json.h: an append that would overflow leaves the
/// buffer as it was).
fn write_fit(v: &Data, budget: usize, out: &mut String, skipped: &mut usize) -> bool {
    let scalar = match v {
        Data::Null => "null".to_string(),
        Data::Bool(b) => b.to_string(),
        Data::Int(i) => i.to_string(),
        Data::Uint(u) => u.to_string(),
        Data::Float(f) => serde_json::Number::from_f64(*f).map_or("null".into(), |n| n.to_string()),
        Data::Str(s) => json_str(s),
        Data::Array(items) => {
            return write_container(
                ('[', ']'),
                items.iter().map(|i| (None, i)),
                budget,
                out,
                skipped,
            )
        }
        Data::Dict(entries) => {
            return write_container(
                ('{', '}'),
                entries.iter().map(|(k, v)| (Some(k.as_str()), v)),
                budget,
                out,
                skipped,
            )
        }
    };
    if scalar.len() <= budget {
        out.push_str(&scalar);
        true
    } else {
        false
    }
}

fn write_container<'a>(
    (open, close): (char, char),
    entries: impl Iterator<Item = (Option<&'a str>, &'a Data)>,
    budget: usize,
    out: &mut String,
    skipped: &mut usize,
) -> bool {
    if budget < 2 {
        return false;
    }
    let start = out.len();
    out.push(open);
    let mut first = true;
    let mut entry = String::new();
    for (key, value) in entries {
        // What is left for this entry: the budget less what is written, less the closing
        // bracket and the comma before it.
        let used = out.len() - start;
        let room = budget.saturating_sub(used + 1 + usize::from(!first));
        entry.clear();
        if let Some(k) = key {
            entry.push_str(&json_str(k));
            entry.push(':');
        }
        let fits = entry.len() <= room && {
            let key_len = entry.len();
            write_fit(value, room - key_len, &mut entry, skipped)
        };
        if fits {
            if !first {
                out.push(',');
            }
            out.push_str(&entry);
            first = false;
        } else {
            *skipped += 1;
        }
    }
    out.push(close);
    true
}

/// The answer record to `cmd`: `{"CMD":DATA}`, or `{"CMD":null}` for `None` (unknown command,
/// bad parameter). The command is named by at most its first [`MAX_CMD_LEN`] bytes, and
/// the whole record stays within `max_len` bytes: entries that do not fit are left out (and
/// counted: the second value). `cmd` `None` (a record without a command) is named `none`.
pub fn render(cmd: Option<&str>, data: Option<&Data>, max_len: usize) -> (String, usize) {
    let cmd = cmd.unwrap_or("none");
    let mut end = cmd.len().min(MAX_CMD_LEN);
    while !cmd.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(256);
    let _ = write!(out, "{{{}:", json_str(&cmd[..end]));
    let mut skipped = 0;
    let budget = max_len.saturating_sub(out.len() + 1);
    let written = match data {
        Some(d) => write_fit(d, budget, &mut out, &mut skipped),
        None => false,
    };
    if !written {
        // A scalar too long for the record (a help text, say) is as good as none.
        out.push_str("null");
        skipped += usize::from(data.is_some());
    }
    out.push('}');
    (out, skipped)
}

/// The greeting the server writes to each client as it connects:
/// `{"version":"..","pid":N,"max_output_len":16384}`, compact (telemetry.c: `client_handler`).
pub fn greeting(version: &str, pid: u32, max_output_len: usize) -> String {
    format!(
        "{{\"version\":{},\"pid\":{pid},\"max_output_len\":{max_output_len}}}",
        json_str(version)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_split_at_the_first_comma() {
        assert_eq!(
            parse("/ethdev/stats,0"),
            Some(Request {
                cmd: "/ethdev/stats",
                param: Some("0")
            })
        );
        assert_eq!(
            parse("/ethdev/xstats,1,hide_zero=true"),
            Some(Request {
                cmd: "/ethdev/xstats",
                param: Some("1,hide_zero=true")
            })
        );
        let bare = Request {
            cmd: "/",
            param: None,
        };
        assert_eq!(parse("/"), Some(bare));
        // An empty parameter is none; leading commas are skipped as strtok_r does.
        assert_eq!(parse("/,"), Some(bare));
        assert_eq!(parse(",,/"), Some(bare));
        assert_eq!(parse("/\n"), Some(bare));
        assert_eq!(parse("/\0garbage"), Some(bare));
        assert_eq!(parse(",,,"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn command_names_follow_the_registration_rules() {
        assert!(valid_command("/ethdev/stats"));
        assert!(valid_command("/pmd/lcores"));
        assert!(!valid_command("ethdev/stats"));
        assert!(!valid_command("/a b"));
        assert!(!valid_command("/a,b"));
        assert!(!valid_command(&format!("/{}", "x".repeat(MAX_CMD_LEN - 1))));
        assert!(valid_command(&format!("/{}", "x".repeat(MAX_CMD_LEN - 2))));
    }

    #[test]
    fn greetings_are_compact_and_escaped() {
        assert_eq!(
            greeting("pmd 0.1.0", 42, MAX_OUTPUT_LEN),
            r#"{"version":"pmd 0.1.0","pid":42,"max_output_len":16384}"#
        );
        let g: serde_json::Value = serde_json::from_str(&greeting("a\"b", 1, 2)).unwrap();
        assert_eq!(g["version"], "a\"b");
    }

    #[test]
    fn answers_name_the_command_and_keep_dictionary_order() {
        let d = Data::dict().with("ipackets", 5u64).with("opackets", 7u64);
        assert_eq!(
            render(Some("/ethdev/stats"), Some(&d), MAX_OUTPUT_LEN),
            (r#"{"/ethdev/stats":{"ipackets":5,"opackets":7}}"#.into(), 0)
        );
        assert_eq!(
            render(Some("/nope"), None, MAX_OUTPUT_LEN).0,
            r#"{"/nope":null}"#
        );
        assert_eq!(render(None, None, MAX_OUTPUT_LEN).0, r#"{"none":null}"#);
        let arr = Data::from(vec![0u16, 1]);
        assert_eq!(
            render(Some("/ethdev/list"), Some(&arr), 100).0,
            r#"{"/ethdev/list":[0,1]}"#
        );
        let s = Data::from("help \"text\"");
        assert_eq!(
            render(Some("/help"), Some(&s), 100).0,
            r#"{"/help":"help \"text\""}"#
        );
    }

    #[test]
    fn a_long_command_is_named_by_its_first_56_bytes_and_stays_valid_json() {
        let long = "x".repeat(2000);
        let (out, _) = render(Some(&long), None, MAX_OUTPUT_LEN);
        assert_eq!(out, format!("{{\"{}\":null}}", "x".repeat(MAX_CMD_LEN)));
        // Quotes and multi-byte characters: escaped, cut at a character boundary.
        let odd = format!("\"{}", "é".repeat(40));
        let (out, _) = render(Some(&odd), None, MAX_OUTPUT_LEN);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let key = v.as_object().unwrap().keys().next().unwrap().clone();
        assert!(key.len() <= MAX_CMD_LEN && key.starts_with('"'), "{key}");
    }

    #[test]
    fn answers_that_do_not_fit_drop_entries_and_stay_valid_json() {
        let mut d = Data::dict();
        for i in 0..5000u64 {
            d.add(&format!("counter_{i}"), i);
        }
        let (out, skipped) = render(Some("/ethdev/xstats"), Some(&d), MAX_OUTPUT_LEN);
        assert!(out.len() <= MAX_OUTPUT_LEN, "{}", out.len());
        assert!(
            out.len() > MAX_OUTPUT_LEN - 40,
            "fills the record: {}",
            out.len()
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let kept = v["/ethdev/xstats"].as_object().unwrap().len();
        assert!(kept > 100);
        assert_eq!(kept + skipped, 5000);
        assert_eq!(v["/ethdev/xstats"]["counter_0"], 0);
        // A smaller entry after one that does not fit still goes in, as DPDK's writers do.
        let d = Data::dict()
            .with("a", 1u64)
            .with("big", "x".repeat(100))
            .with("b", 2u64);
        let (out, skipped) = render(Some("/c"), Some(&d), 40);
        assert_eq!((out.as_str(), skipped), (r#"{"/c":{"a":1,"b":2}}"#, 1));
        // Nested containers keep what fits of them.
        let d = Data::dict().with("q", vec![1_000_000u64; 100]);
        let (out, skipped) = render(Some("/c"), Some(&d), 60);
        assert!(out.len() <= 60 && skipped > 0, "{out}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
        // A string that cannot fit at all: null.
        let (out, skipped) = render(Some("/help"), Some(&Data::from("y".repeat(100))), 30);
        assert_eq!((out.as_str(), skipped), (r#"{"/help":null}"#, 1));
    }

    #[test]
    fn json_values_convert_with_their_types() {
        let v = serde_json::json!({"t_s": 1.5, "port": 0, "neg": -1, "ok": true, "e": null,
            "list": ["a"]});
        let d = Data::from(v);
        assert_eq!(d.get("t_s"), Some(&Data::Float(1.5)));
        assert_eq!(d.get("port"), Some(&Data::Uint(0)));
        assert_eq!(d.get("neg"), Some(&Data::Int(-1)));
        assert_eq!(d.get("ok"), Some(&Data::Bool(true)));
        assert_eq!(d.get("e"), Some(&Data::Null));
        assert_eq!(
            d.to_json(),
            r#"{"e":null,"list":["a"],"neg":-1,"ok":true,"port":0,"t_s":1.5}"#
        );
        assert_eq!(Data::Float(f64::NAN).to_json(), "null");
    }
}
