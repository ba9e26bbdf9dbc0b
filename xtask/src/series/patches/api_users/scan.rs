//! The lines of a patch as `api_users` reads them: the files and hunks of a `git format-patch`
//! file, the blocks of rustfmt-formatted Rust (by indentation), the item a line defines and the
//! identifiers it mentions.

use std::collections::HashMap;

/// Who an item belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Owner {
    /// Module level.
    Free,
    /// An inherent `impl` of this type (`None`: the `impl` line is outside the diff).
    Inherent(Option<String>),
    /// A `pub trait`.
    Trait(String),
}

/// What an item is, as far as its uses go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum What {
    Fn,
    /// struct, enum, union, trait, type (also a trait's associated type).
    Type,
    /// const or static.
    Const,
}

/// How an identifier occurs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum How {
    /// Plain: a call, a type, a bound, an argument.
    Bare,
    /// A method call, `.name(`.
    Dot,
    /// After `seg::` (`seg` empty where it is no plain identifier, e.g. `<T as Tr>::name`).
    Path(String),
    /// The name being defined by `fn`, `type` or `const`.
    Def(What),
    /// Defined or bound otherwise (`struct`, `let`, ...).
    Other,
}

#[derive(Debug, Clone)]
pub(super) struct Occ {
    pub(super) name: String,
    pub(super) how: How,
}

/// The block a line is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Block {
    Module,
    Impl {
        ty: Option<String>,
        tr: Option<String>,
    },
    Trait {
        name: String,
        public: bool,
    },
    /// A function, struct, match, macro, ...: nothing in it is an item.
    Body,
}

/// A line as the scanner saw it.
#[derive(Debug, Clone)]
pub(super) struct LineInfo {
    pub(super) block: Block,
    /// Part of a `use` declaration.
    pub(super) in_use: bool,
    /// The functions the line is in, named as their items are.
    pub(super) within: Vec<String>,
}

/// Block structure by indentation (the kernel's Rust is rustfmt-formatted): a line that ends in
/// `{` opens a block that ends at the next line indented as much or less.
pub(super) struct Scanner {
    /// The open blocks: indentation, kind, and the name of the function it is the body of.
    stack: Vec<(usize, Block, Option<String>)>,
    /// The last line at each indentation that starts with a word: the head of a `{` that
    /// stands alone (after a `where` clause or a long signature).
    heads: HashMap<usize, String>,
    in_use: bool,
    /// Scanning a hunk of a file whose beginning is unknown: an indented line outside any known
    /// block is in an unknown `impl`.
    partial: bool,
}

impl Scanner {
    pub(super) fn new(partial: bool, header: &str) -> Self {
        let mut stack = vec![];
        if partial {
            if let Some(b) = head_block(header.trim()) {
                stack.push((0, b, None));
            }
        }
        Scanner {
            stack,
            heads: HashMap::new(),
            in_use: false,
            partial,
        }
    }

    pub(super) fn line(&mut self, text: &str) -> LineInfo {
        let trimmed = text.trim();
        let indent = text.len() - text.trim_start().len();
        let code = strip_rust(text);
        let code_t = code.trim();
        if code_t.is_empty() {
            // Blank or a comment: in the block the next line decides; report the current one.
            return LineInfo {
                block: self.current(indent.max(1)),
                in_use: false,
                within: vec![],
            };
        }
        while self.stack.last().is_some_and(|(i, _, _)| *i >= indent) {
            self.stack.pop();
        }
        let block = self.current(indent);
        let unpub = code_t
            .strip_prefix("pub(crate) ")
            .or_else(|| code_t.strip_prefix("pub(super) "))
            .or_else(|| code_t.strip_prefix("pub "))
            .unwrap_or(code_t);
        let in_use = self.in_use || unpub.starts_with("use ");
        self.in_use = in_use && !code_t.ends_with(';');
        if code_t.ends_with('{') {
            let starts_word = trimmed.starts_with(|c: char| c.is_ascii_alphabetic())
                && !trimmed.starts_with("where");
            let head = if starts_word {
                code_t.to_string()
            } else {
                self.heads.get(&indent).cloned().unwrap_or_default()
            };
            // Blocks that hold items open at module level (or where that is unknown).
            let b = match &block {
                Block::Module => head_block(&head).unwrap_or(Block::Body),
                Block::Impl { ty: None, tr: None } if self.stack.is_empty() => {
                    head_block(&head).unwrap_or(Block::Body)
                }
                _ => Block::Body,
            };
            let fname = fn_name(&head).map(|n| match &block {
                Block::Impl { ty: Some(t), .. } => format!("{t}::{n}"),
                Block::Trait { name, .. } => format!("{name}::{n}"),
                _ => n.to_string(),
            });
            self.stack.push((indent, b, fname));
        }
        if trimmed.starts_with(|c: char| c.is_ascii_alphabetic()) && !trimmed.starts_with("where") {
            self.heads.insert(indent, code_t.to_string());
        }
        let within = self.stack.iter().filter_map(|e| e.2.clone()).collect();
        LineInfo {
            block,
            in_use,
            within,
        }
    }

    fn current(&self, indent: usize) -> Block {
        match self.stack.last() {
            Some((_, b, _)) => b.clone(),
            None if indent > 0 && self.partial => Block::Impl { ty: None, tr: None },
            None => Block::Module,
        }
    }
}

/// The block a head opens: an `impl`, a `trait` or a `mod` (a test module is a body).
pub(super) fn head_block(head: &str) -> Option<Block> {
    let h = head.strip_prefix("pub ").unwrap_or(head);
    let h = h.strip_prefix("pub(crate) ").unwrap_or(h);
    let h = h.strip_prefix("unsafe ").unwrap_or(h);
    if let Some(rest) = h.strip_prefix("impl") {
        if !rest.starts_with(['<', ' ']) {
            return None;
        }
        let rest = skip_generics(rest.trim_start());
        let rest = rest.split(" where").next().unwrap_or(rest);
        let rest = rest.split('{').next().unwrap_or(rest).trim();
        let (tr, ty) = match split_for(rest) {
            Some((tr, ty)) => (Some(last_segment(tr)), ty),
            None => (None, rest),
        };
        return Some(Block::Impl {
            ty: Some(last_segment(ty)).filter(|t| !t.is_empty()),
            tr: tr.filter(|t| !t.is_empty()),
        });
    }
    if let Some(rest) = h.strip_prefix("trait ") {
        return Some(Block::Trait {
            name: ident_at(rest).to_string(),
            public: head.starts_with("pub "),
        });
    }
    if let Some(rest) = h.strip_prefix("mod ") {
        return Some(if ident_at(rest).contains("test") {
            Block::Body
        } else {
            Block::Module
        });
    }
    None
}

/// `s` without a leading `<...>`.
pub(super) fn skip_generics(s: &str) -> &str {
    if !s.starts_with('<') {
        return s;
    }
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return &s[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// `Trait for Type` split at its ` for ` outside `<>`.
pub(super) fn split_for(s: &str) -> Option<(&str, &str)> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ if depth == 0 && s[i..].starts_with(" for ") => {
                return Some((&s[..i], &s[i + 5..]));
            }
            _ => {}
        }
    }
    None
}

/// The type or trait a path names: `core::ops::Deref` is `Deref`, `Device<Core<'a>>` is
/// `Device`, `&'a Foo` is `Foo`.
pub(super) fn last_segment(s: &str) -> String {
    let s = s.trim().trim_start_matches('&');
    let s = s.trim_start();
    let s = if s.starts_with('\'') {
        s.split_once(' ').map_or("", |x| x.1)
    } else {
        s
    };
    let s = s.trim_start_matches("mut ").trim_start_matches("dyn ");
    let s = s.split('<').next().unwrap_or(s);
    s.rsplit("::").next().unwrap_or(s).trim().to_string()
}

/// The identifier at the start of `s`.
pub(super) fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// A Rust line without its comment (doc and plain) and with its string literals emptied.
pub(super) fn strip_rust(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push('"');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// A C line without comments and with string literals emptied (a line inside a block comment
/// is recognised by its leading `*`).
pub(super) fn strip_c(line: &str) -> String {
    let t = line.trim_start();
    if t.starts_with('*') || t.starts_with("/*") && !t.contains("*/") {
        return String::new();
    }
    let mut s = strip_rust(line);
    while let Some(a) = s.find("/*") {
        match s[a..].find("*/") {
            Some(b) => s.replace_range(a..a + b + 2, " "),
            None => s.truncate(a),
        }
    }
    s
}

/// The identifiers of a code line and how each occurs.
pub(super) fn occurrences(code: &str) -> Vec<Occ> {
    let b = code.as_bytes();
    let mut v = vec![];
    let mut i = 0;
    let mut prev_word = "";
    while i < b.len() {
        let c = b[i];
        if !(c.is_ascii_alphabetic() || c == b'_') {
            if !c.is_ascii_whitespace() {
                prev_word = "";
            }
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        // A lifetime or a number suffix is no identifier.
        if start > 0 && (b[start - 1] == b'\'' || b[start - 1].is_ascii_digit()) {
            prev_word = "";
            continue;
        }
        let name = &code[start..i];
        let before = code[..start].trim_end();
        let after = code[i..].trim_start();
        let how = if let Some(p) = before.strip_suffix("::") {
            How::Path(path_segment(p))
        } else if before.ends_with('.') && !before.ends_with("..") {
            if after.starts_with('(') || after.starts_with("::<") {
                How::Dot
            } else {
                How::Other
            }
        } else {
            match prev_word {
                "fn" => How::Def(What::Fn),
                "type" => How::Def(What::Type),
                "const" if !after.starts_with('{') => How::Def(What::Const),
                "struct" | "enum" | "union" | "trait" | "static" | "mod" | "let" | "mut"
                | "macro_rules" => How::Other,
                _ => How::Bare,
            }
        };
        v.push(Occ {
            name: name.to_string(),
            how,
        });
        prev_word = name;
    }
    v
}

/// The identifier before a `::` (empty where it is none, as after `>`).
pub(super) fn path_segment(before: &str) -> String {
    let b = before.trim_end();
    let start = b
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    b[start..].to_string()
}

/// `s` without the qualifiers of a function: `const fn`, `unsafe fn`, `extern "C" fn`.
pub(super) fn strip_fn_qualifiers(s: &str) -> &str {
    let mut r = s;
    loop {
        let before = r;
        if let Some(x) = r.strip_prefix("const ") {
            if ["fn ", "unsafe ", "extern ", "async "]
                .iter()
                .any(|q| x.starts_with(q))
            {
                r = x;
            }
        }
        r = r.strip_prefix("unsafe ").unwrap_or(r);
        r = r.strip_prefix("async ").unwrap_or(r);
        if let Some(x) = r.strip_prefix("extern ") {
            r = match x.strip_prefix('"') {
                Some(abi) => abi.split_once('"').map_or("", |a| a.1).trim_start(),
                None => x,
            };
        }
        if r == before {
            return r;
        }
    }
}

/// The name of the function a line (a block's head) defines, if it defines one.
pub(super) fn fn_name(head: &str) -> Option<&str> {
    let h = head.trim();
    let h = ["pub ", "pub(crate) ", "pub(super) "]
        .iter()
        .find_map(|p| h.strip_prefix(p))
        .unwrap_or(h);
    let name = ident_at(strip_fn_qualifiers(h).strip_prefix("fn ")?);
    (!name.is_empty()).then_some(name)
}

/// Whether the function whose signature starts on `line` (its parameters on `next` where
/// `line` ends with the `(`) takes `self`.
pub(super) fn takes_self(line: &str, next: Option<&str>) -> bool {
    let Some((_, params)) = skip_fn_generics(line).split_once('(') else {
        return false;
    };
    let params = if params.trim().is_empty() {
        next.unwrap_or("")
    } else {
        params
    };
    let p = params.trim_start().trim_start_matches('&');
    let p = match p.strip_prefix('\'') {
        Some(lt) => lt.split_once(' ').map_or("", |x| x.1),
        None => p,
    };
    let p = p
        .trim_start()
        .strip_prefix("mut ")
        .unwrap_or(p.trim_start());
    p.starts_with("self") && ident_at(p) == "self"
}

/// A signature line from its name on, its generic parameters left out (`fn f<F: Fn(u8)>(`).
pub(super) fn skip_fn_generics(line: &str) -> &str {
    let Some(i) = line.find("fn ") else {
        return line;
    };
    let rest = &line[i + 3..];
    let name = ident_at(rest.trim_start());
    let after = rest.trim_start()[name.len()..].trim_start();
    if after.starts_with('<') {
        skip_generics(after)
    } else {
        after
    }
}

/// The item a line of a `rust/` file defines, in its block.
pub(super) fn definition(code: &str, block: &Block) -> Option<(String, Owner, What)> {
    let t = code.trim();
    let (public, rest) = match t.strip_prefix("pub ") {
        Some(r) => (true, r),
        None => (false, t),
    };
    let owner = match block {
        Block::Module if public => Owner::Free,
        Block::Impl { tr: None, ty } if public => Owner::Inherent(ty.clone()),
        Block::Trait { name, public: true } if !public => Owner::Trait(name.clone()),
        _ => return None,
    };
    let r = strip_fn_qualifiers(rest);
    let (what, rest) = if let Some(x) = r.strip_prefix("fn ") {
        (What::Fn, x)
    } else if let Some(x) = ["struct ", "enum ", "union ", "trait ", "type "]
        .iter()
        .find_map(|k| r.strip_prefix(k))
    {
        (What::Type, x)
    } else if let Some(x) = ["const ", "static "].iter().find_map(|k| r.strip_prefix(k)) {
        (What::Const, x.strip_prefix("mut ").unwrap_or(x))
    } else {
        return None;
    };
    let name = ident_at(rest.trim_start());
    if name.is_empty() || name == "_" {
        return None;
    }
    // Associated items are functions and consts in inherent impls; traits hold all three.
    // (A type in a hunk outside any known block is taken to be at module level.)
    let owner = match owner {
        Owner::Inherent(None) if what == What::Type => Owner::Free,
        Owner::Inherent(_) if what == What::Type => return None,
        o => o,
    };
    Some((name.to_string(), owner, what))
}

/// A hunk of a file's diff.
pub(super) struct Hunk {
    pub(super) old_start: usize,
    pub(super) old_len: usize,
    pub(super) new_start: usize,
    pub(super) header: String,
    /// (`' '`, `'-'` or `'+'`, the line).
    pub(super) lines: Vec<(char, String)>,
}

/// One file of a patch.
pub(super) struct FileDiff {
    pub(super) old: Option<String>,
    pub(super) new: Option<String>,
    pub(super) hunks: Vec<Hunk>,
}

/// The files a `git format-patch` file changes. A hunk is read by its line counts, so the
/// `-- ` signature after the last one is no removed line.
pub(super) fn parse_patch(text: &str) -> Vec<FileDiff> {
    let mut files = vec![];
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with("diff --git ") {
            files.push(FileDiff {
                old: None,
                new: None,
                hunks: vec![],
            });
            continue;
        }
        let Some(f) = files.last_mut() else { continue };
        if let Some(p) = l.strip_prefix("--- ") {
            f.old = p.strip_prefix("a/").map(str::to_string);
        } else if let Some(p) = l.strip_prefix("+++ ") {
            f.new = p.strip_prefix("b/").map(str::to_string);
        } else if let Some(h) = l.strip_prefix("@@ -") {
            let Some((ranges, header)) = h.split_once(" @@") else {
                continue;
            };
            let Some((old, new)) = ranges.split_once(" +") else {
                continue;
            };
            let range = |r: &str| -> (usize, usize) {
                let (a, b) = r.split_once(',').unwrap_or((r, "1"));
                (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
            };
            let ((old_start, old_len), (new_start, new_len)) = (range(old), range(new));
            let (mut o, mut n) = (old_len, new_len);
            let mut hunk = Hunk {
                old_start,
                old_len,
                new_start,
                header: header.trim().to_string(),
                lines: vec![],
            };
            while o > 0 || n > 0 {
                let Some(l) = lines.next() else { break };
                let (kind, rest) = match l.chars().next() {
                    Some(c @ (' ' | '-' | '+')) => (c, &l[1..]),
                    Some('\\') => continue,
                    None => (' ', ""),
                    Some(_) => break,
                };
                match kind {
                    ' ' => {
                        o = o.saturating_sub(1);
                        n = n.saturating_sub(1);
                    }
                    '-' => o = o.saturating_sub(1),
                    _ => n = n.saturating_sub(1),
                }
                hunk.lines.push((kind, rest.to_string()));
            }
            f.hunks.push(hunk);
        }
    }
    files
}

/// The file after the diff, from the file before it; `None` where the context does not match.
pub(super) fn apply(old: &[String], hunks: &[Hunk]) -> Option<Vec<String>> {
    let mut new = Vec::with_capacity(old.len());
    let mut at = 0;
    for h in hunks {
        let start = if h.old_len == 0 {
            h.old_start
        } else {
            h.old_start.checked_sub(1)?
        };
        new.extend_from_slice(old.get(at..start)?);
        at = start;
        for (k, l) in &h.lines {
            match k {
                ' ' | '-' => {
                    if old.get(at)? != l {
                        return None;
                    }
                    at += 1;
                    if *k == ' ' {
                        new.push(l.clone());
                    }
                }
                _ => new.push(l.clone()),
            }
        }
    }
    new.extend_from_slice(old.get(at..)?);
    Some(new)
}

pub(super) fn scan_all(lines: &[String]) -> Vec<LineInfo> {
    let mut s = Scanner::new(false, "");
    lines.iter().map(|l| s.line(l)).collect()
}
