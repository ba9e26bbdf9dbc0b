//! `cargo xtask setup`: installs what is missing, and nothing else.
//!
//! Debian packages through the system's apt (root or password-less sudo), `rust-src` through
//! rustup, `bindgen-cli` through cargo into the cache, libclang 18 from its PyPI wheel into the
//! cache, and the Linux 7.2 source from Debian's `linux-source-7.2` through a private apt
//! configuration in the cache (the system's sources are never edited).

use crate::util::{heading, output, run_step, Ctx};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian packages the lab uses (build, VM, and the real tools that go into the initramfs).
pub const DEB_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "flex",
    "bison",
    "bc",
    "libelf-dev",
    "libssl-dev",
    "cpio",
    "kmod",
    "make",
    "gcc",
    "libc6-dev",
    "python3",
    "pciutils",
    "iproute2",
    "nvme-cli",
    "cmake",
    "ninja-build",
    "pkg-config",
    "libnl-3-dev",
    "libnl-route-3-dev",
    "libudev-dev",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "libibverbs-dev",
    "librdmacm-dev",
    "perftest",
    "jq",
];

/// The pinned kernel: Debian's `linux-source-7.2` at this version; any other 7.2.y the archive
/// still has is taken when this one is gone.
pub const KERNEL_PIN: &str = "7.2.13-1";
const BINDGEN_VERSION: &str = "0.73.2";
const LIBCLANG_WHEEL: &str = "libclang==18.1.1";

pub fn setup(ctx: &Ctx) -> Result<()> {
    heading("setup: host prerequisites");
    debian_packages(ctx)?;
    rust_src(ctx)?;
    bindgen(ctx)?;
    libclang(ctx)?;
    heading("setup: Linux 7.2 source");
    kernel_source(ctx)?;
    Ok(())
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u"))
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

/// The command prefix that gets root: nothing, or `sudo -n`; `None` if neither works.
fn root_prefix() -> Option<Vec<&'static str>> {
    if is_root() {
        return Some(vec![]);
    }
    let ok = Command::new("sudo")
        .args(["-n", "true"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then(|| vec!["sudo", "-n"])
}

/// Packages of `wanted` that dpkg does not list as installed.
pub fn missing_packages(wanted: &[&str]) -> Vec<String> {
    wanted
        .iter()
        .filter(|p| {
            Command::new("dpkg-query")
                .args(["-W", "-f=${db:Status-Abbrev}", p])
                .output()
                .map(|o| !String::from_utf8_lossy(&o.stdout).starts_with("ii"))
                .unwrap_or(true)
        })
        .map(|p| p.to_string())
        .collect()
}

fn debian_packages(ctx: &Ctx) -> Result<()> {
    let missing = missing_packages(DEB_PACKAGES);
    if missing.is_empty() {
        println!("    Debian packages: all {} present", DEB_PACKAGES.len());
        return Ok(());
    }
    let list = missing.join(" ");
    let Some(prefix) = root_prefix() else {
        bail!("missing Debian packages: {list}. Install them with `sudo apt-get install {list}` (this needs root, which xtask does not have), then run again");
    };
    let apt = |args: &[&str]| {
        let mut c = Command::new(prefix.first().copied().unwrap_or("apt-get"));
        c.args(prefix.iter().skip(1));
        if !prefix.is_empty() {
            c.arg("apt-get");
        }
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run_step(
        ctx,
        "apt-get update",
        "setup-apt",
        &mut apt(&["update", "-q"]),
    )
    .context("apt-get update failed: is the network (deb.debian.org) reachable?")?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(&missing);
    run_step(
        ctx,
        &format!("apt-get install {list}"),
        "setup-apt",
        &mut install,
    )?;
    Ok(())
}

fn rust_src(ctx: &Ctx) -> Result<()> {
    let installed = output(Command::new("rustup").args(["component", "list", "--installed"]))
        .context("rustup is needed for rust-src (install Rust with rustup: https://rustup.rs)")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        println!("    rust-src: present");
        return Ok(());
    }
    run_step(
        ctx,
        "rustup component add rust-src",
        "setup-rust",
        Command::new("rustup").args(["component", "add", "rust-src"]),
    )
}

fn bindgen(ctx: &Ctx) -> Result<()> {
    let bin = ctx.tools_bin().join("bindgen");
    if let Ok(v) = output(Command::new(&bin).arg("--version")) {
        if v.contains(BINDGEN_VERSION) {
            println!("    bindgen: {}", v.trim());
            return Ok(());
        }
    }
    run_step(
        ctx,
        &format!("cargo install bindgen-cli {BINDGEN_VERSION} (about 3 min)"),
        "setup-bindgen",
        Command::new("cargo")
            .args([
                "install",
                "--locked",
                "bindgen-cli",
                "--version",
                BINDGEN_VERSION,
                "--root",
            ])
            .arg(ctx.cache.join("tools")),
    )
}

fn libclang(ctx: &Ctx) -> Result<()> {
    let so = ctx.libclang_dir().join("libclang.so");
    if so.exists() {
        println!("    libclang: {}", so.display());
        return Ok(());
    }
    let dl = ctx.cache.join("dl");
    fs::create_dir_all(&dl)?;
    run_step(
        ctx,
        &format!("pip download {LIBCLANG_WHEEL}"),
        "setup-libclang",
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
            ])
            .arg(&dl)
            .arg(LIBCLANG_WHEEL),
    )?;
    let wheel = find_file(&dl, |n| {
        n.starts_with("libclang-18.1.1") && n.ends_with(".whl")
    })?
    .context("pip downloaded no libclang wheel")?;
    let dest = ctx.cache.join("tools/libclang");
    fs::create_dir_all(&dest)?;
    run_step(
        ctx,
        "unpack libclang wheel",
        "setup-libclang",
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&dest),
    )?;
    if !so.exists() {
        bail!("the libclang wheel has no {}", so.display());
    }
    Ok(())
}

fn find_file(dir: &Path, pred: impl Fn(&str) -> bool) -> Result<Option<PathBuf>> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| pred(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found.pop())
}

/// A private apt configuration in the cache: Debian sid and trixie-backports, source too.
pub fn private_apt(ctx: &Ctx) -> Result<Vec<String>> {
    let d = ctx.cache.join("apt");
    for sub in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(d.join(sub))?;
    }
    let sources = d.join("sources.list");
    fs::write(
        &sources,
        "deb http://deb.debian.org/debian sid main\n\
         deb http://deb.debian.org/debian trixie-backports main\n\
         deb-src http://deb.debian.org/debian sid main\n",
    )?;
    let o = |k: &str, v: &Path| format!("-o{k}={}", v.display());
    Ok(vec![
        o("Dir::Etc::SourceList", &sources),
        o("Dir::Etc::SourceParts", Path::new("/dev/null")),
        o("Dir::State::Lists", &d.join("lists")),
        o("Dir::Cache", &d.join("cache")),
        "-oDebug::NoLocking=1".into(),
        "-oAPT::Sandbox::User=root".into(),
    ])
}

/// Refreshes the private apt lists at most once a day.
pub fn private_apt_update(ctx: &Ctx, opts: &[String]) -> Result<()> {
    let marker = ctx.cache.join("apt/updated");
    let fresh = fs::metadata(&marker)
        .and_then(|m| m.modified())
        .map(|t| t.elapsed().map(|e| e.as_secs() < 86400).unwrap_or(false))
        .unwrap_or(false);
    if fresh {
        return Ok(());
    }
    run_step(
        ctx,
        "apt-get update (private lists: sid, trixie-backports)",
        "setup-kernel",
        Command::new("apt-get").args(opts).arg("update"),
    )
    .context("could not reach deb.debian.org for the private apt lists")?;
    fs::write(marker, "")?;
    Ok(())
}

fn kernel_source(ctx: &Ctx) -> Result<()> {
    if let Ok(tree) = ctx.ksrc() {
        if tree.join(".git").exists() && tree.join("Makefile").exists() {
            println!("    kernel tree: {}", tree.display());
            return Ok(());
        }
    }
    let dl = ctx.cache.join("dl");
    fs::create_dir_all(&dl)?;
    let deb = match find_file(&dl, |n| {
        n.starts_with("linux-source-7.2_") && n.ends_with(".deb")
    })? {
        Some(d) => d,
        None => {
            let opts = private_apt(ctx)?;
            private_apt_update(ctx, &opts)?;
            let pinned = format!("linux-source-7.2={KERNEL_PIN}");
            let r = run_step(
                ctx,
                &format!("apt-get download {pinned}"),
                "setup-kernel",
                Command::new("apt-get")
                    .args(&opts)
                    .arg("download")
                    .arg(&pinned)
                    .current_dir(&dl),
            );
            if r.is_err() {
                println!(
                    "    {KERNEL_PIN} is gone from the archive; taking the newest 7.2.y it has"
                );
                run_step(
                    ctx,
                    "apt-get download linux-source-7.2",
                    "setup-kernel",
                    Command::new("apt-get")
                        .args(&opts)
                        .args(["download", "linux-source-7.2"])
                        .current_dir(&dl),
                )?;
            }
            find_file(&dl, |n| {
                n.starts_with("linux-source-7.2_") && n.ends_with(".deb")
            })?
            .context("apt-get download left no linux-source-7.2 package")?
        }
    };
    // linux-source-7.2_7.2.13-1_all.deb -> 7.2.13
    let fname = deb
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let version = fname
        .trim_start_matches("linux-source-7.2_")
        .split(['-', '_'])
        .next()
        .unwrap_or("7.2")
        .to_string();
    let name = format!("linux-{version}");
    let tree = ctx.cache.join(&name);
    let x = ctx.cache.join("dl/x");
    let _ = fs::remove_dir_all(&x);
    let _ = fs::remove_dir_all(&tree);
    run_step(
        ctx,
        "dpkg -x linux-source-7.2",
        "setup-kernel",
        Command::new("dpkg").arg("-x").arg(&deb).arg(&x),
    )?;
    run_step(
        ctx,
        "unpack linux-source-7.2.tar.xz (about 30 s)",
        "setup-kernel",
        Command::new("tar")
            .arg("xf")
            .arg(x.join("usr/src/linux-source-7.2.tar.xz"))
            .arg("-C")
            .arg(&ctx.cache),
    )?;
    fs::rename(ctx.cache.join("linux-source-7.2"), &tree)?;
    let _ = fs::remove_dir_all(&x);
    // A git repository: the pristine tree, then one commit that drops Debian's top-level
    // ignore pattern (it hides new files of the series from git). The series applies on
    // `p2pbuf-base`.
    let git = |args: &[&str]| -> Command {
        let mut c = Command::new("git");
        c.current_dir(&tree)
            .args([
                "-c",
                "user.name=p2pbuf xtask",
                "-c",
                "user.email=xtask@p2pbuf.invalid",
                "-c",
                "core.hooksPath=/dev/null",
            ])
            .args(args);
        c
    };
    run_step(
        ctx,
        "git init kernel tree",
        "setup-kernel",
        &mut git(&["init", "-q", "-b", "pristine"]),
    )?;
    run_step(
        ctx,
        "git add kernel tree (about 1 min)",
        "setup-kernel",
        &mut git(&["add", "-f", "-A"]),
    )?;
    let msg = format!("Linux {version} (Debian {fname})");
    run_step(
        ctx,
        "git commit pristine tree",
        "setup-kernel",
        &mut git(&["commit", "-q", "-m", &msg]),
    )?;
    run_step(
        ctx,
        "git tag",
        "setup-kernel",
        &mut git(&["tag", &format!("v{version}")]),
    )?;
    let gi = tree.join(".gitignore");
    let s = fs::read_to_string(&gi)?;
    if let Some(i) = s.find("#\n# Debian packaging") {
        fs::write(&gi, &s[..i])?;
        run_step(
            ctx,
            "git commit ignore fix",
            "setup-kernel",
            &mut git(&[
                "commit",
                "-q",
                "-a",
                "-m",
                "p2pbuf: drop Debian's top-level ignore so series files are tracked",
            ]),
        )?;
    }
    run_step(
        ctx,
        "git tag p2pbuf-base",
        "setup-kernel",
        &mut git(&["tag", "p2pbuf-base"]),
    )?;
    fs::write(ctx.cache.join("kernel-tree"), &name)?;
    println!("    kernel tree: {}", tree.display());
    Ok(())
}
