//! What a patch needs to be sent: the sender's identity and sign-off, the trailers
//! (`Cc: stable`), the recipients from `get_maintainer.pl`, and the checks' output filters.

use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};

/// What the stored patches have where the sender goes: the `M:` of the MAINTAINERS entries
/// the series add (the project's people maintain what it adds; the subsystem's maintainers are
/// at most `R:`, as they have not been asked). [`fill_sender`] puts the sender there at
/// emission; the lab's tree keeps the placeholder.
pub const SENDER_PLACEHOLDER: &str = "@SENDER@";

/// `text` (a patch, or MAINTAINERS) with [`SENDER_PLACEHOLDER`] replaced by `sender`.
pub fn fill_sender(text: &str, sender: &Ident) -> String {
    text.replace(SENDER_PLACEHOLDER, &sender.to_string())
}

/// A person, as in `Name <mail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub email: String,
}

impl std::fmt::Display for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} <{}>", self.name, self.email)
    }
}

impl Ident {
    /// The address is in a domain reserved for examples and tests (RFC 2606, RFC 6761):
    /// nobody can be reached there, so a sign-off with it certifies nothing.
    pub fn is_placeholder(&self) -> bool {
        let domain = self
            .email
            .rsplit_once('@')
            .map(|(_, d)| d.to_ascii_lowercase())
            .unwrap_or_default();
        let domain = domain.trim_end_matches('.');
        ["invalid", "example", "test", "localhost"]
            .iter()
            .any(|tld| domain == *tld || domain.ends_with(&format!(".{tld}")))
            || ["example.com", "example.net", "example.org"]
                .iter()
                .any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
    }
}

const IDENT_HELP: &str = "set yours in the p2pbuf checkout (`git config user.name \"Your Name\"` \
     and `git config user.email you@example.org`) or pass `--signoff \"Your Name \
     <you@example.org>\"`: the Signed-off-by certifies the Developer's Certificate of Origin \
     (Documentation/process/submitting-patches.rst) and must be the sender's own";

/// `Name <mail>` (as `--signoff` takes it).
pub fn parse_ident(s: &str) -> Result<Ident> {
    let s = s.trim();
    let ok = (|| {
        let (name, rest) = s.split_once('<')?;
        let email = rest.strip_suffix('>')?.trim();
        let name = name.trim();
        let (local, domain) = email.split_once('@')?;
        let bad = |t: &str| t.contains(['<', '>', '\n', '\r']);
        (!name.is_empty()
            && !local.is_empty()
            && domain.contains('.')
            && !email.contains(char::is_whitespace)
            && !bad(name)
            && !bad(email))
        .then(|| Ident {
            name: name.to_string(),
            email: email.to_string(),
        })
    })();
    ok.with_context(|| format!("`{s}` is not `Name <mail@domain>`"))
}

/// The identity that signs off: `--signoff` if given, else `git config user.name` and
/// `user.email` (`None` where unset). Refuses, saying what to set, when there is none.
pub fn signer(flag: Option<&str>, name: Option<&str>, email: Option<&str>) -> Result<Ident> {
    if let Some(f) = flag {
        return parse_ident(f).context("--signoff");
    }
    let name = name.map(str::trim).filter(|n| !n.is_empty());
    let email = email.map(str::trim).filter(|e| !e.is_empty());
    match (name, email) {
        (Some(n), Some(e)) => parse_ident(&format!("{n} <{e}>"))
            .with_context(|| format!("git config user.name/user.email: {IDENT_HELP}")),
        (None, None) => {
            bail!("no identity to sign off with: git config user.name and user.email are unset; {IDENT_HELP}")
        }
        (None, _) => {
            bail!("no identity to sign off with: git config user.name is unset; {IDENT_HELP}")
        }
        (_, None) => {
            bail!("no identity to sign off with: git config user.email is unset; {IDENT_HELP}")
        }
    }
}

/// A commit message without its `Signed-off-by:` lines: those of its trailer block (the last
/// paragraph), which is dropped if nothing else is left in it. Other text is kept as it is.
pub fn strip_signoffs(msg: &str) -> String {
    let lines: Vec<&str> = msg.trim_end().lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.trim().is_empty())
        .map_or(lines.len(), |p| p + 1);
    // A one-paragraph message has no trailer block (the subject is not one).
    if start == 0 || start >= lines.len() {
        return format!("{}\n", lines.join("\n"));
    }
    let mut kept: Vec<&str> = lines[..start].to_vec();
    let trailers: Vec<&str> = lines[start..]
        .iter()
        .copied()
        .filter(|l| !l.to_ascii_lowercase().starts_with("signed-off-by:"))
        .collect();
    if trailers.is_empty() {
        while kept.last().is_some_and(|l| l.trim().is_empty()) {
            kept.pop();
        }
    }
    kept.extend(trailers);
    format!("{}\n", kept.join("\n"))
}

/// The trailers an emitted patch gets: `Cc: stable` where the series says so, then the
/// sender's sign-off.
pub fn emit_trailers(stable: bool, signer: &Ident) -> Vec<String> {
    let mut v = Vec::new();
    if stable {
        v.push("Cc: stable@vger.kernel.org".to_string());
    }
    v.push(format!("Signed-off-by: {signer}"));
    v
}

/// Whether a patch mail (or commit message) says what it fixes: a `Fixes:` trailer line in its
/// message, before the diffstat's `---`.
pub fn has_fixes_tag(text: &str) -> bool {
    text.lines()
        .take_while(|l| *l != "---")
        .any(|l| l.starts_with("Fixes: "))
}

/// The subject of a `git format-patch` mail, as `git am` takes it: the `Subject:` header with
/// its folded lines joined and the `[PATCH ...]` prefix dropped (None without the header, or
/// with an unclosed prefix). It does not decode RFC 2047 words: given `git mailinfo`'s output
/// (decoded, unfolded, the prefix already dropped) it returns that output's subject.
pub fn patch_subject(text: &str) -> Option<String> {
    let mut lines = text.lines();
    let mut subject = lines.find_map(|l| l.strip_prefix("Subject: "))?.to_string();
    for l in lines {
        match l.strip_prefix(' ') {
            Some(more) if !l.trim().is_empty() => {
                subject.push(' ');
                subject.push_str(more.trim());
            }
            _ => break,
        }
    }
    match subject.strip_prefix('[') {
        Some(rest) => Some(rest.split_once("] ")?.1.to_string()),
        None => Some(subject),
    }
}

/// `msg` with `trailers` appended after its existing trailers by `git interpret-trailers`,
/// each only if the message does not already carry it (so never a second identical
/// `Signed-off-by:`).
pub fn add_trailers(msg: &str, trailers: &[String]) -> Result<String> {
    if trailers.is_empty() {
        return Ok(msg.to_string());
    }
    let mut c = Command::new("git");
    // On the command line they override any trailer.* configuration of the user.
    c.args([
        "interpret-trailers",
        "--where",
        "end",
        "--if-exists",
        "addIfDifferent",
    ]);
    for t in trailers {
        c.arg("--trailer").arg(t);
    }
    pipe(&mut c, msg).context("git interpret-trailers")
}

/// Runs `c` with `input` on its stdin; its stdout, or an error with its stderr.
pub fn pipe(c: &mut Command, input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {:?}", c.get_program()))?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let input = input.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output()?;
    let _ = writer.join();
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            c,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Who gets a series: `to` the people (maintainers, reviewers), `cc` the lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recipients {
    pub to: Vec<String>,
    pub cc: Vec<String>,
}

/// Parses `get_maintainer.pl --no-rolestats` output: one `Name <mail>` (a person) or bare
/// `mail` (a list) per line; duplicates dropped, order kept.
pub fn parse_get_maintainer(out: &str) -> Recipients {
    let mut r = Recipients::default();
    for l in out.lines().map(str::trim).filter(|l| l.contains('@')) {
        let (list, addr) = if l.contains('<') {
            (&mut r.to, l.to_string())
        } else {
            (&mut r.cc, l.to_string())
        };
        if !list.contains(&addr) {
            list.push(addr);
        }
    }
    r
}

/// A warning line of `scripts/kernel-doc` (`Warning: file:line ...`, `warning: ...`).
pub fn is_kernel_doc_warning(l: &str) -> bool {
    let l = l.trim_start().to_ascii_lowercase();
    l.starts_with("warning:")
        || l.starts_with("error:")
        || l.contains(": warning:")
        || l.contains(": error:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_subjects_of_mails_and_of_mailinfo_output() {
        let text = "From 0 Mon\nSubject: [PATCH v2 3/5] rust: dma-buf: add\n the lock\n\nbody\n";
        assert_eq!(
            patch_subject(text).as_deref(),
            Some("rust: dma-buf: add the lock")
        );
        assert_eq!(
            patch_subject("Subject: PCI: x\n\n").as_deref(),
            Some("PCI: x")
        );
        assert_eq!(patch_subject("Subject: [PATCH x\n"), None);
        assert_eq!(patch_subject("From 0 Mon\n\nbody\n"), None);
        // `git mailinfo`'s output: decoded, unfolded, the prefix dropped.
        let info =
            "Author: Jöran Doe\nEmail: j@kernel.org\nSubject: PCI: Jöran's fix\nDate: Mon\n\n";
        assert_eq!(patch_subject(info).as_deref(), Some("PCI: Jöran's fix"));
    }

    #[test]
    fn identities_and_refusal() {
        let me = parse_ident(" Jane Doe <jane@kernel.org> ").unwrap();
        assert_eq!(me.to_string(), "Jane Doe <jane@kernel.org>");
        assert!(!me.is_placeholder());
        for bad in [
            "Jane Doe",
            "<jane@kernel.org>",
            "Jane <jane>",
            "Jane <jane@localhost>",
            "Jane <ja ne@kernel.org>",
            "Jane <jane@kernel.org",
        ] {
            assert!(parse_ident(bad).is_err(), "{bad}");
        }
        // The flag wins over git config.
        let got = signer(Some("A B <a@b.org>"), Some("C"), Some("c@d.org")).unwrap();
        assert_eq!(got.to_string(), "A B <a@b.org>");
        let got = signer(None, Some("C D"), Some("c@d.org")).unwrap();
        assert_eq!(got.to_string(), "C D <c@d.org>");
        assert!(
            format!("{:#}", signer(Some("nobody"), None, None).unwrap_err()).contains("--signoff")
        );
        // Without any, a refusal that says what to set.
        for (n, e, what) in [
            (None, None, "user.name and user.email are unset"),
            (Some(" "), Some("c@d.org"), "user.name is unset"),
            (Some("C"), None, "user.email is unset"),
        ] {
            let err = signer(None, n, e).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
            assert!(err.contains("git config user.name \"Your Name\""), "{err}");
            assert!(err.contains("--signoff"), "{err}");
        }
        for p in [
            "p2pbuf developers <dev@p2pbuf.invalid>",
            "p2pbuf xtask <xtask@p2pbuf.invalid>",
            "M <m@users.noreply.a-seed-993aeadd.example>",
            "X <x@example.com>",
            "T <t@box.test>",
        ] {
            assert!(parse_ident(p).unwrap().is_placeholder(), "{p}");
        }
        assert!(!parse_ident("E <e@examples.com>").unwrap().is_placeholder());
    }

    #[test]
    fn the_sender_fills_the_placeholder() {
        let me = parse_ident("Jane Doe <jane@kernel.org>").unwrap();
        let hunk = "+DMA BUFFER SHARING FRAMEWORK [RUST]\n+M:\t@SENDER@\n+R:\tA <a@b.org>\n";
        let got = fill_sender(hunk, &me);
        assert_eq!(
            got,
            "+DMA BUFFER SHARING FRAMEWORK [RUST]\n+M:\tJane Doe <jane@kernel.org>\n+R:\tA <a@b.org>\n"
        );
        assert!(!got.contains(SENDER_PLACEHOLDER));
        assert_eq!(fill_sender("no placeholder\n", &me), "no placeholder\n");
    }

    #[test]
    fn strips_stored_signoffs_only_from_the_trailers() {
        let msg = "sub\n\nBody mentions Signed-off-by: in text.\n\nFixes: 123 (\"x\")\nSigned-off-by: A <a@x.org>\nLink: https://l\n";
        assert_eq!(
            strip_signoffs(msg),
            "sub\n\nBody mentions Signed-off-by: in text.\n\nFixes: 123 (\"x\")\nLink: https://l\n"
        );
        assert_eq!(
            strip_signoffs("sub\n\nBody.\n\nSigned-off-by: A <a@x.org>\n\n"),
            "sub\n\nBody.\n"
        );
        assert_eq!(strip_signoffs("sub\n"), "sub\n");
        assert_eq!(strip_signoffs("sub\n\nBody.\n"), "sub\n\nBody.\n");
    }

    #[test]
    fn fixes_tags_are_found_in_the_message_only() {
        assert!(has_fixes_tag(
            "Subject: x\n\nBody.\n\nFixes: 0123456789ab (\"y\")\n---\n a | 1\n"
        ));
        assert!(!has_fixes_tag(
            "Subject: x\n\nBody.\n---\n+Fixes: in the diff\n"
        ));
    }

    #[test]
    fn trailers_go_after_the_existing_ones_once() {
        let me = parse_ident("Jane Doe <jane@kernel.org>").unwrap();
        let t = emit_trailers(true, &me);
        let msg =
            "dma-buf: fix\n\nBody.\n\nFixes: 0123456789ab (\"dma-buf: x\")\nLink: https://l\n";
        let out = add_trailers(msg, &t).unwrap();
        assert_eq!(
            out,
            "dma-buf: fix\n\nBody.\n\nFixes: 0123456789ab (\"dma-buf: x\")\nLink: https://l\nCc: stable@vger.kernel.org\nSigned-off-by: Jane Doe <jane@kernel.org>\n"
        );
        // Run again (an export of an emitted patch): nothing is added twice.
        assert_eq!(add_trailers(&out, &t).unwrap(), out);
        // A message without trailers gets its own block; no Cc: stable unless asked.
        assert_eq!(
            add_trailers("sub\n\nBody.\n", &emit_trailers(false, &me)).unwrap(),
            "sub\n\nBody.\n\nSigned-off-by: Jane Doe <jane@kernel.org>\n"
        );
        // The sender's sign-off already there is not repeated (the stable Cc still comes).
        let out = add_trailers(
            "sub\n\nBody.\n\nSigned-off-by: Jane Doe <jane@kernel.org>\n",
            &t,
        );
        assert_eq!(
            out.unwrap(),
            "sub\n\nBody.\n\nSigned-off-by: Jane Doe <jane@kernel.org>\nCc: stable@vger.kernel.org\n"
        );
    }

    #[test]
    fn parses_get_maintainer_output() {
        let out = "Sumit Semwal <sumit.semwal@linaro.org>\n\"Christian König\" <christian.koenig@amd.com>\nlinux-media@vger.kernel.org\ndri-devel@lists.freedesktop.org\nlinaro-mm-sig@lists.linaro.org\nlinux-kernel@vger.kernel.org\nSumit Semwal <sumit.semwal@linaro.org>\n\n";
        let r = parse_get_maintainer(out);
        assert_eq!(
            r.to,
            [
                "Sumit Semwal <sumit.semwal@linaro.org>",
                "\"Christian König\" <christian.koenig@amd.com>"
            ]
        );
        assert_eq!(
            r.cc,
            [
                "linux-media@vger.kernel.org",
                "dri-devel@lists.freedesktop.org",
                "linaro-mm-sig@lists.linaro.org",
                "linux-kernel@vger.kernel.org"
            ]
        );
        assert_eq!(parse_get_maintainer(""), Recipients::default());
    }

    #[test]
    fn kernel_doc_warnings() {
        assert!(is_kernel_doc_warning(
            "Warning: drivers/dma-buf/dma-buf-mapping.c:104 No description found"
        ));
        assert!(is_kernel_doc_warning("x.c:3: warning: Function parameter"));
        assert!(!is_kernel_doc_warning(
            "drivers/x.c: no structured comments"
        ));
    }
}
