//! The tidy test: flodl-ddp's module dependencies as its source states them, checked against
//! the architecture. It reads every file of `flodl-ddp/src`, finds the modules each one uses —
//! `use crate::…` trees, `crate::`/`super::`/`self::` paths in code, paths through a child
//! module, items re-exported by the crate root, and the string paths of serde attributes
//! (`#[serde(deserialize_with = "crate::link::text::string")]`) — and fails on (a) a circle of
//! files, (b) an import running up the declared floors, (c) a file over the line limit, naming
//! the edge or the file. Comments and string literals are skipped (doc links are no import).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

/// The longest a source file of flodl-ddp may be, in lines.
pub(crate) const MAX_LINES: usize = 1000;

/// flodl-ddp's floors, top first: a file may import its own floor and the floors below it,
/// never one above. A floor is a set of module paths (a module and everything inside it, unless
/// a longer path names another floor). ARCHITECTURE.md states the same order.
pub(crate) const FLOORS: &[(&str, &[&str])] = &[
    ("crate root", &[""]),
    ("face", &["runtime"]),
    ("engine", &["runtime::engine"]),
    ("cooperative", &["cooperative"]),
    ("mlp", &["mlp"]),
    ("contract", &["contract"]),
    ("link", &["link"]),
    // The crate's error gathers the typed errors of the floors below it (`#[from]`), which
    // never name it: control's `LogicError`, checkpoint's `CheckpointError`.
    ("error", &["error", "config_error"]),
    ("control", &["control"]),
    // The exactly-once ledger: its entries, book and audit (plain data and file I/O).
    ("ledger", &["ledger"]),
    ("checkpoint", &["checkpoint"]),
    // The words the crate's error and its wire share: bounded text, a rank's failure and the
    // capabilities it may name (plain data, importing nothing of the crate above them).
    ("vocabulary", &["link::text", "link::failure", "contract::capability"]),
    ("state", &["state"]),
];

/// Edges allowed to run up, each with why (`from` file → `to` file, paths under `src/`).
pub(crate) const ALLOWED_UP: &[(&str, &str, &str)] = &[
    ("runtime/engine/capture.rs", "runtime/spec.rs", SPEC_WHY),
    ("runtime/engine/coordinator/mod.rs", "runtime/spec.rs", SPEC_WHY),
    ("runtime/engine/rank/mod.rs", "runtime/spec.rs", SPEC_WHY),
    ("runtime/engine/run_config.rs", "runtime/spec.rs", SPEC_WHY),
    ("runtime/engine/start.rs", "runtime/spec.rs", SPEC_WHY),
];

/// Why the engine may read `runtime/spec.rs`.
const SPEC_WHY: &str = "RunSpec, the run's description every process agrees on, is built by \
    the face and read by the engine; it stays in the face until the one-configuration reshape \
    settles it (then it moves below the engine and these lines go)";

/// Findings known and owned by other work, by their text: the test fails on any finding not
/// listed here and on any listed one that is gone (remove it then), so the list only shrinks.
pub(crate) const KNOWN: &[&str] = &[];

/// One finding, naming the file or the edge.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Violation {
    /// Files that import each other in a circle (each edge with the path that makes it).
    Cycle(Vec<Edge>),
    /// An import from a floor to one above it.
    Up { edge: Edge, from: &'static str, to: &'static str },
    /// A file longer than the limit.
    TooLong { file: String, lines: usize, limit: usize },
    /// A file whose module no floor holds.
    NoFloor { file: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Cycle(edges) => {
                write!(f, "import cycle:")?;
                for e in edges {
                    write!(f, " {e};")?;
                }
                Ok(())
            }
            Violation::Up { edge, from, to } => {
                write!(f, "import runs up from floor `{from}` to floor `{to}`: {edge}")
            }
            Violation::TooLong { file, lines, limit } => {
                write!(f, "{file} has {lines} lines (limit {limit})")
            }
            Violation::NoFloor { file } => write!(f, "{file} is on no declared floor"),
        }
    }
}

/// A file's use of another file, with the path that makes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Edge {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) via: String,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} (`{}`)", self.from, self.to, self.via)
    }
}

/// The rules a tree is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    pub(crate) floors: &'a [(&'static str, &'a [&'a str])],
    pub(crate) allowed_up: &'a [(&'a str, &'a str, &'a str)],
    pub(crate) max_lines: usize,
}

/// flodl-ddp's rules.
pub(crate) const FLODL_DDP: Rules<'static> =
    Rules { floors: FLOORS, allowed_up: ALLOWED_UP, max_lines: MAX_LINES };

/// Reads every `.rs` file under `src` as (path relative to `src`, with `/`, text).
pub(crate) fn read_tree(src: &Path) -> std::io::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).unwrap_or(&path);
                let rel =
                    rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>();
                out.push((rel.join("/"), std::fs::read_to_string(&path)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The module path a file defines (`runtime/engine/mod.rs` → `runtime::engine`, `lib.rs` →
/// the root).
fn module_of(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Source text with comments removed and string/char literals blanked, and the string
/// literals found, by the offset of their opening quote in the cleaned text.
struct Cleaned {
    code: Vec<char>,
    strings: BTreeMap<usize, String>,
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn clean(text: &str) -> Cleaned {
    let s: Vec<char> = text.chars().collect();
    let mut code = Vec::with_capacity(s.len());
    let mut strings = BTreeMap::new();
    let mut i = 0;
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    while i < s.len() {
        let c = s[i];
        let prev_ident = code.last().is_some_and(|p: &char| is_ident(*p));
        if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            code.push(' ');
        } else if !prev_ident && (c == 'r' || (c == 'b' && at(i + 1) == 'r')) && {
            let mut j = i + if c == 'b' { 2 } else { 1 };
            while at(j) == '#' {
                j += 1;
            }
            at(j) == '"'
        } {
            // A raw string: r#"…"#.
            i += if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while at(i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            let mut content = String::new();
            while i < s.len() {
                if s[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                    i += 1 + hashes;
                    break;
                }
                content.push(s[i]);
                i += 1;
            }
            strings.insert(code.len(), content);
            code.extend(['"', '"']);
        } else if c == '"' {
            i += 1;
            let mut content = String::new();
            while i < s.len() && s[i] != '"' {
                if s[i] == '\\' {
                    content.push(s[i]);
                    i += 1;
                }
                if i < s.len() {
                    content.push(s[i]);
                    i += 1;
                }
            }
            i += 1;
            strings.insert(code.len(), content);
            code.extend(['"', '"']);
        } else if c == '\'' && (at(i + 1) == '\\' || (at(i + 2) == '\'' && at(i + 1) != '\'')) {
            // A char literal ('a', '\n', '\u{1F600}'); a lifetime has no closing quote.
            i += 1;
            if at(i) == '\\' {
                i += 2;
            } else {
                i += 1;
            }
            while i < s.len() && s[i] != '\'' {
                i += 1;
            }
            i += 1;
            code.extend(['\'', '\'']);
        } else {
            code.push(c);
            i += 1;
        }
    }
    Cleaned { code, strings }
}

/// A token of cleaned code.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
    /// A string literal, by its key in `Cleaned::strings`.
    Str(usize),
}

fn tokens(cleaned: &Cleaned) -> Vec<Tok> {
    let s = &cleaned.code;
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident(c) {
            let start = i;
            while i < s.len() && is_ident(s[i]) {
                i += 1;
            }
            out.push(Tok::Ident(s[start..i].iter().collect()));
        } else if c == ':' && s.get(i + 1) == Some(&':') {
            out.push(Tok::Path);
            i += 2;
        } else if c == '"' && cleaned.strings.contains_key(&i) {
            out.push(Tok::Str(i));
            i += 2;
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

/// A path found in a file: its segments, in the module it was written in.
#[derive(Debug, Clone)]
struct Found {
    module: Vec<String>,
    segments: Vec<String>,
    /// The name it is bound to (its last segment, or the alias after `as`).
    alias: Option<String>,
}

/// Parses a `use`-style tree starting at `toks[i]` (a segment): every leaf as a full path.
fn parse_tree(
    toks: &[Tok],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::Ident(id)) => {
                if id != "self" || path.is_empty() {
                    path.push(id.clone());
                }
                i += 1;
                if toks.get(i) == Some(&Tok::Path) {
                    i += 1;
                    continue;
                }
                let mut alias = Some(path.last().cloned().unwrap_or_default());
                if toks.get(i) == Some(&Tok::Ident("as".into())) {
                    if let Some(Tok::Ident(a)) = toks.get(i + 1) {
                        alias = Some(a.clone());
                    }
                    i += 2;
                }
                out.push((path, alias));
                return i;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        _ => i = parse_tree(toks, i, &path, out),
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                out.push((path, None));
                return i + 1;
            }
            _ => {
                if !path.is_empty() {
                    out.push((path, None));
                }
                return i;
            }
        }
    }
}

/// The modules a file declares inline (`mod memory { … }`), as full module paths.
fn paths_in(file: &str, text: &str) -> (Vec<Found>, Vec<Vec<String>>) {
    let cleaned = clean(text);
    let toks = tokens(&cleaned);
    let base = module_of(file);
    let mut found = Vec::new();
    let mut inline = Vec::new();
    // Inline modules open: (name, brace depth at which they close).
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let module = |stack: &[(String, usize)]| {
        let mut m = base.clone();
        m.extend(stack.iter().map(|(n, _)| n.clone()));
        m
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    stack.push((name.clone(), depth));
                    inline.push(module(&stack));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                let mut leaves = Vec::new();
                let start = if toks.get(i + 1) == Some(&Tok::Path) { i + 2 } else { i + 1 };
                let end = parse_tree(&toks, start, &[], &mut leaves);
                for (segments, alias) in leaves {
                    found.push(Found { module: module(&stack), segments, alias });
                }
                i = end.max(i + 1);
                continue;
            }
            Tok::Punct('#') => {
                // #[serde(key = "path", …)]: the string paths serde calls.
                let attr = toks.get(i + 1) == Some(&Tok::Punct('['))
                    && toks.get(i + 2) == Some(&Tok::Ident("serde".into()));
                if attr {
                    let mut j = i + 3;
                    let mut level = 0usize;
                    while let Some(t) = toks.get(j) {
                        match t {
                            Tok::Punct('[' | '(') => level += 1,
                            Tok::Punct(']' | ')') => {
                                level = level.saturating_sub(1);
                                if level == 0 {
                                    break;
                                }
                            }
                            Tok::Str(at) => {
                                let keyed = matches!(
                                    toks.get(j.wrapping_sub(1)),
                                    Some(Tok::Punct('='))
                                ) && matches!(
                                    toks.get(j.wrapping_sub(2)),
                                    Some(Tok::Ident(k)) if SERDE_PATH_KEYS.contains(&k.as_str())
                                );
                                let value = &cleaned.strings[at];
                                if keyed && !value.is_empty() {
                                    let segments = value.split("::").map(str::to_owned).collect();
                                    found.push(Found {
                                        module: module(&stack),
                                        segments,
                                        alias: None,
                                    });
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    i = j;
                    continue;
                }
            }
            Tok::Ident(_)
                if toks.get(i + 1) == Some(&Tok::Path)
                    && !matches!(toks.get(i.wrapping_sub(1)), Some(Tok::Path)) =>
            {
                // A path in code: crate::a::b, super::x, or child::y.
                let mut leaves = Vec::new();
                let end = parse_tree(&toks, i, &[], &mut leaves);
                for (segments, _) in leaves {
                    found.push(Found { module: module(&stack), segments, alias: None });
                }
                i = end.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    (found, inline)
}

/// The serde attribute keys whose string value is a path serde calls or names.
const SERDE_PATH_KEYS: &[&str] = &[
    "with",
    "serialize_with",
    "deserialize_with",
    "default",
    "getter",
    "from",
    "try_from",
    "into",
    "remote",
];

/// The crate's modules (file and inline), the file of each, and the crate root's re-exports.
struct Crate {
    files: BTreeMap<Vec<String>, String>,
    reexports: BTreeMap<String, Vec<String>>,
}

impl Crate {
    /// Where `found` points: the file holding the longest module prefix of its absolute path.
    fn resolve(&self, found: &Found) -> Option<(Vec<String>, String)> {
        let abs = self.absolute(&found.module, &found.segments)?;
        self.file_of(&abs, 0)
    }

    fn absolute(&self, module: &[String], segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut rest = &segments[1..];
        let mut abs = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => {
                let mut m = module.to_vec();
                m.pop();
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m
            }
            child => {
                let mut m = module.to_vec();
                m.push(child.to_owned());
                if !self.files.contains_key(&m) {
                    return None;
                }
                m.pop();
                rest = segments;
                m
            }
        };
        abs.extend(rest.iter().cloned());
        Some(abs)
    }

    /// The longest module prefix of `abs` and its file; an item of the root goes through the
    /// root's re-exports.
    fn file_of(&self, abs: &[String], hops: usize) -> Option<(Vec<String>, String)> {
        let n = (0..=abs.len()).rev().find(|&n| self.files.contains_key(&abs[..n]))?;
        if n == 0
            && hops < 4
            && let Some(target) = abs.first().and_then(|name| self.reexports.get(name))
        {
            let mut t = target.clone();
            t.extend(abs[1..].iter().cloned());
            return self.file_of(&t, hops + 1);
        }
        Some((abs[..n].to_vec(), self.files[&abs[..n]].clone()))
    }
}

/// Every file-to-file use of the tree (`(path under src, text)`), self-uses left out.
pub(crate) fn edges(tree: &[(String, String)]) -> Vec<Edge> {
    let mut krate = Crate { files: BTreeMap::new(), reexports: BTreeMap::new() };
    let mut found = Vec::new();
    for (file, text) in tree {
        krate.files.insert(module_of(file), file.clone());
        let (paths, inline) = paths_in(file, text);
        for m in inline {
            krate.files.insert(m, file.clone());
        }
        found.push((file.clone(), paths));
    }
    for (file, paths) in &found {
        if module_of(file).is_empty() {
            for p in paths {
                if let (Some(alias), Some(abs)) = (&p.alias, krate.absolute(&p.module, &p.segments))
                    && !abs.is_empty()
                {
                    krate.reexports.insert(alias.clone(), abs);
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for (file, paths) in &found {
        for p in paths {
            if let Some((_, to)) = krate.resolve(p)
                && &to != file
            {
                out.insert(Edge { from: file.clone(), to, via: p.segments.join("::") });
            }
        }
    }
    // One edge per pair of files: the first path that makes it.
    let mut seen = BTreeSet::new();
    out.into_iter().filter(|e| seen.insert((e.from.clone(), e.to.clone()))).collect()
}

/// The floor of `file`: the one naming the longest prefix of its module.
fn floor_of(rules: &Rules<'_>, file: &str) -> Option<(usize, &'static str)> {
    let module = module_of(file).join("::");
    let mut best: Option<(usize, usize, &'static str)> = None;
    for (index, (name, modules)) in rules.floors.iter().enumerate() {
        for m in *modules {
            let holds = if m.is_empty() {
                module.is_empty()
            } else {
                module == *m || module.starts_with(&format!("{m}::"))
            };
            let len = if m.is_empty() { 0 } else { m.len() + 1 };
            if holds && best.is_none_or(|(l, _, _)| len > l) {
                best = Some((len, index, name));
            }
        }
    }
    best.map(|(_, i, n)| (i, n))
}

/// Checks a tree against `rules`.
pub(crate) fn check(tree: &[(String, String)], rules: &Rules<'_>) -> Vec<Violation> {
    let mut out = Vec::new();
    for (file, text) in tree {
        let lines = text.lines().count();
        if lines > rules.max_lines {
            out.push(Violation::TooLong { file: file.clone(), lines, limit: rules.max_lines });
        }
        if floor_of(rules, file).is_none() {
            out.push(Violation::NoFloor { file: file.clone() });
        }
    }
    let edges = edges(tree);
    for e in &edges {
        if let (Some((from, from_name)), Some((to, to_name))) =
            (floor_of(rules, &e.from), floor_of(rules, &e.to))
        {
            let allowed = rules.allowed_up.iter().any(|(f, t, _)| *f == e.from && *t == e.to);
            if to < from && !allowed {
                out.push(Violation::Up { edge: e.clone(), from: from_name, to: to_name });
            }
        }
    }
    out.extend(cycles(&edges).into_iter().map(Violation::Cycle));
    out.sort();
    out
}

/// One circle of files through each strongly connected set of more than one file.
fn cycles(edges: &[Edge]) -> Vec<Vec<Edge>> {
    let mut next: BTreeMap<&str, Vec<&Edge>> = BTreeMap::new();
    for e in edges {
        next.entry(&e.from).or_default().push(e);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::from([from.to_owned()]);
        let mut todo = vec![from.to_owned()];
        while let Some(f) = todo.pop() {
            for e in next.get(f.as_str()).into_iter().flatten() {
                if seen.insert(e.to.clone()) {
                    todo.push(e.to.clone());
                }
            }
        }
        seen
    };
    let files: BTreeSet<&str> = edges.iter().map(|e| e.from.as_str()).collect();
    let reachable: BTreeMap<&str, BTreeSet<String>> =
        files.iter().map(|f| (*f, reach(f))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for f in &files {
        if done.contains(*f) {
            continue;
        }
        let component: BTreeSet<String> = reachable[f]
            .iter()
            .filter(|g| reachable.get(g.as_str()).is_some_and(|r| r.contains(*f)))
            .cloned()
            .collect();
        done.extend(component.iter().cloned());
        if component.len() < 2 {
            continue;
        }
        // A shortest way back to `f` inside the component (breadth first).
        let mut prev: BTreeMap<String, &Edge> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([f.to_string()]);
        'search: while let Some(g) = queue.pop_front() {
            for e in next.get(g.as_str()).into_iter().flatten() {
                if !component.contains(&e.to) || prev.contains_key(&e.to) {
                    continue;
                }
                prev.insert(e.to.clone(), e);
                if e.to == *f {
                    break 'search;
                }
                queue.push_back(e.to.clone());
            }
        }
        let mut path = Vec::new();
        let mut at = f.to_string();
        while let Some(e) = prev.get(&at) {
            path.push((*e).clone());
            at = e.from.clone();
            if at == *f {
                break;
            }
        }
        path.reverse();
        out.push(path);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Vec<(String, String)> {
        files.iter().map(|(f, t)| ((*f).to_owned(), (*t).to_owned())).collect()
    }

    const TWO_FLOORS: &[(&str, &[&str])] = &[("root", &[""]), ("top", &["top"]), ("low", &["low"])];

    fn rules(max_lines: usize) -> Rules<'static> {
        Rules { floors: TWO_FLOORS, allowed_up: &[], max_lines }
    }

    /// The words that mark a flavor chosen at run time rather than by an enum.
    const NOT_AN_ENUM: &[&str] = &["dyn ", "any::", "as_any", "downcast"];

    /// The lines of `text`'s code (its `mod tests` and comments left out) holding a word of
    /// [`NOT_AN_ENUM`], as `file:line: text`.
    fn trait_objects(file: &str, text: &str) -> Vec<String> {
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
        code.lines()
            .enumerate()
            .filter(|(_, line)| !line.trim_start().starts_with("//"))
            .filter(|(_, line)| NOT_AN_ENUM.iter().any(|w| line.contains(w)))
            .map(|(n, line)| format!("{file}:{}: {}", n + 1, line.trim()))
            .collect()
    }

    /// The link's flavors are private enums behind structs: no trait object, no `Any`, no
    /// downcast in `link/`'s code (its tests may box a closure); a synthetic file with one is
    /// caught.
    #[test]
    fn link_flavors_are_enums() -> anyhow::Result<()> {
        let caught = trait_objects("x.rs", "// dyn in a comment\nfn f(x: &dyn Frames) {}\n");
        anyhow::ensure!(caught == ["x.rs:2: fn f(x: &dyn Frames) {}"], "caught {caught:?}");
        let tree = read_tree(&crate::workspace::root().join("flodl-ddp").join("src"))?;
        let found: Vec<String> = tree
            .iter()
            .filter(|(file, _)| file.starts_with("link/"))
            .flat_map(|(file, text)| trait_objects(file, text))
            .collect();
        anyhow::ensure!(
            found.is_empty(),
            "link/ chooses a flavor at run time:\n{}",
            found.join("\n")
        );
        Ok(())
    }

    /// flodl-ddp as it is: no circle, no import up a floor, no file over the limit.
    #[test]
    fn flodl_ddp_is_tidy() -> anyhow::Result<()> {
        let src = crate::workspace::root().join("flodl-ddp").join("src");
        let tree = read_tree(&src)?;
        anyhow::ensure!(tree.len() > 50, "read only {} files under {}", tree.len(), src.display());
        let found: Vec<String> = check(&tree, &FLODL_DDP).iter().map(ToString::to_string).collect();
        let new: Vec<&String> = found.iter().filter(|f| !KNOWN.contains(&f.as_str())).collect();
        let gone: Vec<&&str> = KNOWN.iter().filter(|k| !found.iter().any(|f| f == **k)).collect();
        anyhow::ensure!(
            new.is_empty() && gone.is_empty(),
            "flodl-ddp is not tidy:\n{}\nknown findings that are gone (remove them from KNOWN):\n{}",
            new.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"),
            gone.iter().map(|s| **s).collect::<Vec<_>>().join("\n"),
        );
        Ok(())
    }

    /// Every allowed exception still names an edge that exists (a stale one would hide nothing).
    #[test]
    fn allowed_up_edges_exist() -> anyhow::Result<()> {
        let tree = read_tree(&crate::workspace::root().join("flodl-ddp").join("src"))?;
        let edges = edges(&tree);
        for (from, to, why) in ALLOWED_UP {
            anyhow::ensure!(
                edges.iter().any(|e| e.from == *from && e.to == *to),
                "allowed edge {from} -> {to} ({why}) no longer exists: remove it"
            );
        }
        Ok(())
    }

    /// A synthetic case: its name, its files (path, text) and the findings expected.
    type Case = (&'static str, &'static [(&'static str, &'static str)], &'static [&'static str]);

    /// Synthetic trees, each with the findings expected (as substrings of their text, in order).
    #[test]
    fn synthetic_trees() -> anyhow::Result<()> {
        let cases: &[Case] = &[
            (
                "clean: down one floor, comments and strings are no import",
                &[
                    ("lib.rs", "mod top; mod low;"),
                    ("top/mod.rs", "use crate::low::Thing; // crate::top::x\n"),
                    (
                        "low/mod.rs",
                        "/* use crate::top::a; */ const S: &str = \"crate::top::b\"; pub struct Thing;",
                    ),
                ],
                &[],
            ),
            (
                "a circle between two files of one floor",
                &[
                    ("lib.rs", "mod top;"),
                    ("top/a.rs", "use crate::top::b::B;\npub struct A;"),
                    ("top/b.rs", "use super::a::A; pub struct B;"),
                ],
                &[
                    "import cycle: top/a.rs -> top/b.rs (`crate::top::b::B`); top/b.rs -> top/a.rs (`super::a::A`);",
                ],
            ),
            (
                "a circle through a use tree and a code path",
                &[
                    ("lib.rs", "mod top;"),
                    ("top/a.rs", "use crate::{top::{b::{self, B}}};"),
                    ("top/b.rs", "fn f() { let x = crate::top::c::make(); }"),
                    ("top/c.rs", "fn g() -> u8 { 'x'; super::a::h() }"),
                ],
                &[
                    "import cycle: top/a.rs -> top/b.rs",
                    "top/b.rs -> top/c.rs",
                    "top/c.rs -> top/a.rs (`super::a::h`)",
                ],
            ),
            (
                "an import up a floor, through a serde string path",
                &[
                    ("lib.rs", "mod top; mod low;"),
                    ("top/mod.rs", "use crate::low::L;"),
                    (
                        "low/mod.rs",
                        "#[derive(Deserialize)]\nstruct L { #[serde(deserialize_with = \"crate::top::text\")] s: String }",
                    ),
                ],
                &[
                    "import runs up from floor `low` to floor `top`: low/mod.rs -> top/mod.rs (`crate::top::text`)",
                ],
            ),
            (
                "an import up a floor through the root's re-export",
                &[
                    ("lib.rs", "mod top; mod low; pub use top::Face;"),
                    ("top/mod.rs", "pub struct Face;"),
                    ("low/mod.rs", "fn f(_: crate::Face) {}"),
                ],
                &[
                    "import runs up from floor `low` to floor `top`: low/mod.rs -> top/mod.rs (`crate::Face`)",
                ],
            ),
            (
                "an inline module's super is its file's module",
                &[
                    ("lib.rs", "mod top; mod low;"),
                    ("low/mod.rs", "mod inner { use super::super::top::X; }"),
                    ("top/mod.rs", "pub struct X;"),
                ],
                &["low/mod.rs -> top/mod.rs (`super::super::top::X`)"],
            ),
            (
                "a file over the limit, and one on no floor",
                &[
                    ("lib.rs", "mod top; mod other;"),
                    ("top/mod.rs", "a\nb\nc\nd\n"),
                    ("other.rs", ""),
                ],
                &["other.rs is on no declared floor", "top/mod.rs has 4 lines (limit 3)"],
            ),
        ];
        for (name, files, expected) in cases {
            let text: Vec<String> =
                check(&tree(files), &rules(3)).iter().map(ToString::to_string).collect();
            let all = text.join("\n");
            anyhow::ensure!(
                expected.iter().all(|e| all.contains(e))
                    && (expected.is_empty() == text.is_empty()),
                "{name}: expected {expected:?}, found:\n{all}"
            );
        }
        Ok(())
    }
}
