//! Shared plumbing: where things live (the cache), and running a command as a logged step
//! with a progress display.

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Which kernel a command builds and boots: each has its own configuration, build directory,
/// module builds and initramfs in the cache; the kernel tree, rdma-core and the userspace
/// binaries are shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// The lab kernel (`test`, `run`, `vm`, `kernel`, `modules`, `initramfs`):
    /// `linux/p2pbuf.config` as it is, its debug block included. Builds under `build/`.
    Debug,
    /// The benchmark kernel (`bench`): `linux/p2pbuf.config` without its
    /// `# BEGIN debug` ... `# END debug` block. Builds under `build/bench/`.
    Bench,
    /// The KCSAN kernel (`test --boot kcsan` only): `linux/p2pbuf.config` with its debug
    /// block, KASAN replaced by KCSAN (the two cannot share a kernel). Builds under
    /// `build/kcsan/`.
    Kcsan,
}

impl Flavour {
    /// Added to the build steps' headings: nothing for the lab kernel.
    pub fn note(self) -> &'static str {
        match self {
            Flavour::Debug => "",
            Flavour::Bench => " (bench kernel: no debug block)",
            Flavour::Kcsan => " (KCSAN kernel: the debug block with KCSAN instead of KASAN)",
        }
    }

    /// The directory under the cache's `build/` where this flavour builds (none: `build/`
    /// itself, the lab kernel's).
    pub fn subdir(self) -> Option<&'static str> {
        match self {
            Flavour::Debug => None,
            Flavour::Bench => Some("bench"),
            Flavour::Kcsan => Some("kcsan"),
        }
    }
}

/// Everything a subcommand needs to know about where it runs.
pub struct Ctx {
    /// Root of the p2pbuf checkout.
    pub root: PathBuf,
    /// Cache directory outside the clone (kernel tree, build output, tools, VM files).
    pub cache: PathBuf,
    /// Print every line of every step instead of a spinner.
    pub verbose: bool,
    /// The kernel this command builds and boots.
    pub flavour: Flavour,
}

impl Ctx {
    pub fn new(cache: Option<PathBuf>, verbose: bool) -> Result<Self> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("xtask has no parent directory")?
            .to_path_buf();
        let cache = match cache {
            Some(c) => c,
            None => {
                Self::default_cache().context("neither --cache, XDG_CACHE_HOME nor HOME is set")?
            }
        };
        if cache.starts_with(&root) {
            bail!(
                "the cache ({}) must be outside the checkout ({})",
                cache.display(),
                root.display()
            );
        }
        fs::create_dir_all(cache.join("logs"))
            .with_context(|| format!("cannot create the cache directory {}", cache.display()))?;
        Ok(Self {
            root,
            cache,
            verbose,
            flavour: Flavour::Debug,
        })
    }

    /// The same context for the kernel `flavour`.
    pub fn with_flavour(self, flavour: Flavour) -> Self {
        Self { flavour, ..self }
    }

    /// A copy of this context for the kernel `flavour` (a run that boots two kernels).
    pub fn flavoured(&self, flavour: Flavour) -> Self {
        Self {
            root: self.root.clone(),
            cache: self.cache.clone(),
            verbose: self.verbose,
            flavour,
        }
    }

    /// `$XDG_CACHE_HOME/p2pbuf`, else `~/.cache/p2pbuf`.
    fn default_cache() -> Option<PathBuf> {
        match std::env::var_os("XDG_CACHE_HOME") {
            Some(x) if !x.is_empty() => Some(PathBuf::from(x).join("p2pbuf")),
            _ => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/p2pbuf")),
        }
    }

    /// For a cargo build of the userspace crates: their build scripts take rdma-core's
    /// headers (`build/rdma-root`) and libclang from `$P2PBUF_CACHE`, else from the default
    /// cache, as `new` does. So this sets the variable only for another cache: setting it
    /// always would make the next plain `cargo build` rerun those scripts and rebuild.
    pub fn cargo_env(&self, cmd: &mut Command) {
        if Self::default_cache().as_ref() != Some(&self.cache) {
            cmd.env("P2PBUF_CACHE", &self.cache);
        }
    }

    /// `path` as given when absolute, else relative to the repository root (the `--out`
    /// options).
    pub fn in_repo(&self, path: PathBuf) -> PathBuf {
        if path.is_absolute() {
            path
        } else {
            self.root.join(path)
        }
    }

    pub fn log_path(&self, name: &str) -> PathBuf {
        self.cache.join("logs").join(format!("{name}.log"))
    }
    pub fn tools_bin(&self) -> PathBuf {
        self.cache.join("tools/bin")
    }
    pub fn libclang_dir(&self) -> PathBuf {
        self.cache
            .join("tools/libclang/libclang-18.1.1.data/platlib/clang/native")
    }
    /// Where the flavour's kernel, modules and initramfs are built: `build/` for the lab
    /// kernel (as before flavours existed), `build/bench/` for the benchmark kernel,
    /// `build/kcsan/` for the KCSAN kernel.
    pub fn flavour_build(&self) -> PathBuf {
        let build = self.cache.join("build");
        match self.flavour.subdir() {
            None => build,
            Some(d) => build.join(d),
        }
    }
    /// The kernel build directory (`make O=`) of the flavour. For the lab kernel
    /// `P2PBUF_KBUILD` overrides it (a developer's second build, with `P2PBUF_KSRC` for its
    /// tree and `--skip-kernel`); the other flavours' are always `build/<flavour>/linux`.
    pub fn kbuild(&self) -> PathBuf {
        match std::env::var_os("P2PBUF_KBUILD") {
            Some(d) if !d.is_empty() && self.flavour == Flavour::Debug => PathBuf::from(d),
            _ => self.flavour_build().join("linux"),
        }
    }
    pub fn vm_dir(&self) -> PathBuf {
        self.cache.join("vm")
    }
    /// The unpacked kernel tree, as recorded by `setup`.
    pub fn ksrc(&self) -> Result<PathBuf> {
        if let Some(d) = std::env::var_os("P2PBUF_KSRC").filter(|d| !d.is_empty()) {
            return Ok(PathBuf::from(d));
        }
        let stamp = self.cache.join("kernel-tree");
        let name = fs::read_to_string(&stamp).with_context(|| {
            format!(
                "no kernel tree yet ({} missing): run `cargo xtask setup`",
                stamp.display()
            )
        })?;
        Ok(self.cache.join(name.trim()))
    }
    /// Clang/LLVM of the cache (Debian trixie's, unpacked by `setup`).
    pub fn llvm_prefix(&self) -> PathBuf {
        self.cache.join("tools/llvm")
    }
    /// Its `bin/`: clang, ld.lld, llvm-ar, ...
    pub fn llvm_bin(&self) -> PathBuf {
        self.llvm_prefix()
            .join(format!("usr/lib/llvm-{}/bin", crate::setup::LLVM_MAJOR))
    }
    /// Written by `setup` once the toolchain works: its prefix, then one `package=version` line
    /// per Debian package.
    pub fn llvm_stamp(&self) -> PathBuf {
        self.llvm_prefix().join(".p2pbuf-llvm")
    }
    /// What the kernel is compiled with (the stamp's text); an error that says to run `setup`
    /// when there is no toolchain yet.
    pub fn llvm_id(&self) -> Result<String> {
        let stamp = self.llvm_stamp();
        fs::read_to_string(&stamp).with_context(|| {
            format!(
                "no Clang/LLVM toolchain in the cache yet ({} missing): run `cargo xtask setup`",
                stamp.display()
            )
        })
    }
    /// The toolchain of every `make` on the kernel tree (the kernel, its configuration, the
    /// out-of-tree modules, `patches --build-each`): clang, ld.lld and the LLVM binutils of the
    /// cache (`LLVM=<bin>/`), the Rust tools of the cache on PATH, and libclang for bindgen.
    ///
    /// Without the `CARGO_PKG_*` variables that `cargo run` gives xtask: clippy-driver reads
    /// `CARGO_PKG_RUST_VERSION` as the crate's MSRV, so xtask's own `rust-version` (1.89) met
    /// the kernel's `.clippy.toml` (1.85) and every kernel crate warned that the two differ.
    pub fn kernel_toolchain(&self, c: &mut Command) -> Result<()> {
        self.llvm_id()?;
        strip_cargo_pkg_env(c);
        c.arg(format!("LLVM={}/", self.llvm_bin().display()))
            .env("PATH", self.path_with_tools())
            .env("LIBCLANG_PATH", self.libclang_dir());
        Ok(())
    }
    /// A `make` for the kernel tree (`O=` the build directory) with [`Ctx::kernel_toolchain`].
    pub fn kmake(&self) -> Result<Command> {
        let mut c = Command::new("make");
        c.current_dir(self.ksrc()?)
            .arg(format!("O={}", self.kbuild().display()));
        self.kernel_toolchain(&mut c)?;
        Ok(c)
    }
    pub fn path_with_tools(&self) -> std::ffi::OsString {
        let mut paths = vec![self.tools_bin()];
        if let Some(p) = std::env::var_os("PATH") {
            paths.extend(std::env::split_paths(&p));
        }
        std::env::join_paths(paths).unwrap_or_default()
    }
    pub fn jobs(&self) -> usize {
        std::thread::available_parallelism()
            .map(|n| n.get() + 1)
            .unwrap_or(3)
    }
}

/// Removes from `c`'s environment the `CARGO_PKG_*` variables this process inherited from
/// `cargo run` (see [`Ctx::kernel_toolchain`]).
pub fn strip_cargo_pkg_env(c: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CARGO_PKG_") {
            c.env_remove(&k);
        }
    }
}

/// Prints a step heading.
pub fn heading(msg: &str) {
    println!("\x1b[1m==> {msg}\x1b[0m");
}

/// Runs `cmd` as the step `title`, its stdout and stderr going to the log `log`.
///
/// Shows a spinner with the elapsed time and the latest output line on a terminal, and a
/// heartbeat line every minute otherwise. On failure prints the end of the log and its path.
pub fn run_step(ctx: &Ctx, title: &str, log: &str, cmd: &mut Command) -> Result<()> {
    let run = run_step_status(ctx, title, log, cmd)?;
    if run.status.success() {
        return Ok(());
    }
    Err(run.failed(title))
}

/// How a step run by [`run_step_status`] ended.
pub struct StepRun {
    pub status: std::process::ExitStatus,
    pub secs: f64,
    pub log_path: PathBuf,
}

impl StepRun {
    /// Reports the step as failed: a red `error:` with the end of the log, and the error to
    /// return.
    pub fn failed(&self, title: &str) -> anyhow::Error {
        eprintln!(
            "\x1b[31merror\x1b[0m: {title} failed ({}) after {:.1}s; last lines of the log:",
            self.status, self.secs
        );
        for l in tail(&self.log_path, 25) {
            eprintln!("    {l}");
        }
        anyhow::anyhow!("{title} failed; full log: {}", self.log_path.display())
    }
}

/// [`run_step`], but a non-zero exit is left to the caller: it is logged, not reported, so
/// that a caller that can go on (see `setup::debian_orig_tarball`) prints no error.
pub fn run_step_status(ctx: &Ctx, title: &str, log: &str, cmd: &mut Command) -> Result<StepRun> {
    let log_path = ctx.log_path(log);
    let mut logf = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open log {}", log_path.display()))?;
    writeln!(logf, "\n### {title}\n### {:?}", cmd)?;
    let (reader, writer) = std::io::pipe().context("pipe")?;
    cmd.stdout(writer.try_clone()?)
        .stderr(writer)
        .stdin(std::process::Stdio::null());
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| {
        format!(
            "{title}: cannot start {:?} (is it installed? `cargo xtask setup` installs it)",
            cmd.get_program()
        )
    })?;
    // Drop the pipe's write ends that `cmd` still holds, so that EOF comes when the child exits.
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let tty = std::io::stderr().is_terminal() && !ctx.verbose;
    let pb = if tty {
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner:.cyan} {prefix:.bold} [{elapsed}] {wide_msg:.dim}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_prefix(title.to_string());
        pb.enable_steady_tick(Duration::from_millis(120));
        Some(pb)
    } else {
        println!("--> {title} (log: {})", log_path.display());
        None
    };
    let verbose = ctx.verbose;
    let mut lines = BufReader::new(reader);
    let mut buf = String::new();
    let mut next_beat = Duration::from_secs(60);
    loop {
        buf.clear();
        match lines.read_line(&mut buf) {
            Ok(0) => break,
            Ok(_) => {
                let _ = logf.write_all(buf.as_bytes());
                let line = buf.trim_end();
                if verbose {
                    println!("    {line}");
                }
                if let Some(pb) = &pb {
                    pb.set_message(line.to_string());
                } else if start.elapsed() >= next_beat {
                    println!(
                        "    ... {title}: {}s, at: {line}",
                        start.elapsed().as_secs()
                    );
                    next_beat += Duration::from_secs(60);
                }
            }
            Err(_) => {}
        }
    }
    let status = child.wait()?;
    let secs = start.elapsed().as_secs_f64();
    if let Some(pb) = &pb {
        pb.finish_and_clear();
    }
    if status.success() {
        println!("    {title}: done in {secs:.1}s");
    } else {
        let _ = writeln!(logf, "### exit: {status}");
    }
    Ok(StepRun {
        status,
        secs,
        log_path,
    })
}

/// The last component of `path` as a string (lossy; empty for none).
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// The file name of `path` without its extension, as a string (lossy; empty for none).
pub fn file_stem(path: &Path) -> String {
    path.file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let s = fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Runs a command and returns its stdout, failing with its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// SHA-256 over the contents of `files` (in order) and the extra strings.
pub fn hash_files(files: &[PathBuf], extra: &[&str]) -> Result<String> {
    let mut h = Sha256::new();
    for f in files {
        h.update(
            f.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        h.update(fs::read(f).with_context(|| format!("cannot read {}", f.display()))?);
    }
    for e in extra {
        h.update(e.as_bytes());
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A stamp file holding a hash: `fresh` says whether it already holds `hash`.
pub struct Stamp(pub PathBuf);
impl Stamp {
    pub fn fresh(&self, hash: &str) -> bool {
        fs::read_to_string(&self.0)
            .map(|s| s.trim() == hash)
            .unwrap_or(false)
    }
    pub fn set(&self, hash: &str) -> Result<()> {
        if let Some(d) = self.0.parent() {
            fs::create_dir_all(d)?;
        }
        fs::write(&self.0, hash).with_context(|| format!("cannot write {}", self.0.display()))
    }
    pub fn clear(&self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// `git` in `dir` with the identity of xtask's own commits (its private trees: the kernel
/// source, patch worktrees) and no hooks.
pub fn xtask_git(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir).args([
        "-c",
        "user.name=p2pbuf xtask",
        "-c",
        "user.email=xtask@p2pbuf.invalid",
        "-c",
        "core.hooksPath=/dev/null",
    ]);
    c
}

#[cfg(test)]
mod tests {
    /// `cargo test` sets `CARGO_PKG_RUST_VERSION` as `cargo run` does: the kernel's clippy must
    /// not see it (it took xtask's 1.89 for the kernel crates' MSRV and warned on each).
    #[test]
    fn kernel_makes_do_not_inherit_cargo_pkg_variables() {
        assert!(std::env::var_os("CARGO_PKG_RUST_VERSION").is_some());
        let mut c = std::process::Command::new("true");
        super::strip_cargo_pkg_env(&mut c);
        let removed: Vec<String> = c
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().to_string())
            .collect();
        assert!(
            removed.iter().any(|k| k == "CARGO_PKG_RUST_VERSION"),
            "{removed:?}"
        );
        assert!(
            removed.iter().all(|k| k.starts_with("CARGO_PKG_")),
            "{removed:?}"
        );
    }

    use super::*;

    #[test]
    fn kernel_make_uses_the_llvm_of_the_cache() {
        let cache = std::env::temp_dir().join(format!("p2pbuf-util-test-{}", std::process::id()));
        let ctx = Ctx::new(Some(cache.clone()), false).unwrap();
        let mut make = Command::new("make");
        let err = ctx.kernel_toolchain(&mut make).unwrap_err();
        assert!(err.to_string().contains("run `cargo xtask setup`"), "{err}");
        fs::create_dir_all(ctx.llvm_prefix()).unwrap();
        fs::write(ctx.llvm_stamp(), "prefix=x\n").unwrap();
        ctx.kernel_toolchain(&mut make).unwrap();
        let args: Vec<String> = make
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [format!(
                "LLVM={}/tools/llvm/usr/lib/llvm-{}/bin/",
                cache.display(),
                crate::setup::LLVM_MAJOR
            )]
        );
        let envs: Vec<_> = make.get_envs().map(|(k, _)| k.to_owned()).collect();
        assert!(envs.contains(&"PATH".into()) && envs.contains(&"LIBCLANG_PATH".into()));
        fs::remove_dir_all(cache).unwrap();
    }
}
