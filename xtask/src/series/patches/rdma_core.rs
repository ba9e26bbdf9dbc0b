//! The rdma-core side of the rxe series, as it is sent: a pull request to rdma-core (which
//! takes changes on GitHub, each commit signed off), made of the patches of `linux/rdma-core/`
//! that its description (`pull-request.md`, line `Send: 0001, 0003`) names, signed off by the
//! sender, with the description beside them. The others stay in the lab.

use crate::mail::{self, Ident};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// The description of the pull request, in `linux/rdma-core/`.
const DESCRIPTION: &str = "pull-request.md";

/// What [`emit`] wrote.
pub(super) struct PullRequest {
    pub(super) dir: PathBuf,
    pub(super) sent: Vec<String>,
    pub(super) held_back: Vec<String>,
}

/// The numbers (`0001`) the description's `Send:` line names.
fn send_list(description: &str) -> Result<Vec<String>> {
    let line = description
        .lines()
        .find_map(|l| l.strip_prefix("Send:"))
        .context("no `Send: NNNN, ...` line")?;
    let v: Vec<String> = line
        .split(',')
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    if v.is_empty()
        || v.iter()
            .any(|n| n.len() != 4 || !n.bytes().all(|b| b.is_ascii_digit()))
    {
        bail!("`Send:{line}`: list four-digit patch numbers, e.g. `Send: 0001, 0003`");
    }
    Ok(v)
}

/// `text` (a `git format-patch` mail) with `Signed-off-by: me` added to its message, after its
/// other trailers, unless it is there already.
fn sign(text: &str, me: &Ident) -> Result<String> {
    let (head, rest) = text
        .split_once("\n\n")
        .context("no blank line after the headers")?;
    let (msg, diff) = rest
        .split_once("\n---\n")
        .context("no `---` line before the diffstat")?;
    let msg = mail::add_trailers(&format!("{msg}\n"), &[format!("Signed-off-by: {me}")])?;
    Ok(format!("{head}\n\n{}\n---\n{diff}", msg.trim_end()))
}

/// Writes `out/rdma-core/`: the patches to send, signed off, and `PULL_REQUEST.md`.
pub(super) fn emit(root: &Path, out: &Path, me: &Ident) -> Result<PullRequest> {
    let src = root.join("linux/rdma-core");
    let description = fs::read_to_string(src.join(DESCRIPTION)).with_context(|| {
        format!(
            "{}: the pull request's description",
            src.join(DESCRIPTION).display()
        )
    })?;
    let send =
        send_list(&description).with_context(|| format!("{}", src.join(DESCRIPTION).display()))?;
    let mut patches: Vec<PathBuf> = fs::read_dir(&src)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    patches.sort();
    let dir = out.join("rdma-core");
    fs::create_dir_all(&dir)?;
    let (mut sent, mut held_back) = (vec![], vec![]);
    for p in &patches {
        let name = crate::util::file_name(p);
        if send.iter().any(|n| name.starts_with(n.as_str())) {
            let text = fs::read_to_string(p)?;
            fs::write(
                dir.join(&name),
                sign(&text, me).with_context(|| name.clone())?,
            )?;
            sent.push(name);
        } else {
            held_back.push(name);
        }
    }
    if let Some(n) = send
        .iter()
        .find(|n| !sent.iter().any(|s| s.starts_with(n.as_str())))
    {
        bail!("{DESCRIPTION} names patch {n}, which linux/rdma-core does not have");
    }
    fs::write(dir.join("PULL_REQUEST.md"), description)?;
    Ok(PullRequest {
        dir,
        sent,
        held_back,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_send_line_is_read_and_checked() {
        assert_eq!(
            send_list("# t\n\nSend: 0001, 0003\n").unwrap(),
            ["0001", "0003"]
        );
        assert!(send_list("# t\n").is_err());
        assert!(send_list("Send: 1, 3\n").is_err());
    }

    #[test]
    fn a_sign_off_goes_after_the_trailers_once() {
        let me = mail::parse_ident("A Sender <a@example.org>").unwrap();
        let text = "From 0 Mon\nSubject: [PATCH] x: y\n\nBody.\n\nFixes: 123456789abc (\"z\")\n---\n a | 1 +\n";
        let once = sign(text, &me).unwrap();
        assert!(
            once.contains(
                "Fixes: 123456789abc (\"z\")\nSigned-off-by: A Sender <a@example.org>\n---\n"
            ),
            "{once}"
        );
        assert_eq!(sign(&once, &me).unwrap(), once);
    }

    /// The description in the tree names patches that exist.
    #[test]
    fn the_tree_s_pull_request_names_its_patches() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let d = fs::read_to_string(root.join("linux/rdma-core").join(DESCRIPTION)).unwrap();
        for n in send_list(&d).unwrap() {
            let found = fs::read_dir(root.join("linux/rdma-core"))
                .unwrap()
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with(&n));
            assert!(
                found,
                "{DESCRIPTION} names {n}, which linux/rdma-core does not have"
            );
        }
    }
}
