//! Clang/LLVM 18 for the kernel, from Debian trixie's packages unpacked into the cache's
//! `tools/llvm` (no system install): what it takes, and how it is made to run on bookworm.

use super::{find_file, private_apt, private_apt_update};
use crate::util::{output, run_step, Ctx};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel's compiler: Clang/LLVM of this major version (`make LLVM=<dir>/`), from Debian
/// trixie's `llvm-toolchain-18`. A Rust kernel with KASAN needs clang (`RUST` depends on
/// `!KASAN || CC_IS_CLANG`), Linux 7.3 needs clang >= 17.0.1, and bookworm's newest is 16. 18 is
/// the major of the libclang wheel that bindgen uses: with clang as CC, kbuild hands bindgen
/// clang's own flags, so both must know the same ones.
pub const LLVM_MAJOR: u32 = 18;
/// The Debian suite the toolchain comes from.
const LLVM_SUITE: &str = "trixie";
/// Debian trixie packages unpacked (`dpkg -x`, no dependency resolution) into `tools/llvm`: the
/// compiler, linker and binutils, clang's resource headers, the libraries they load (trixie's,
/// glibc 2.41 among them: bookworm's 2.36 is too old for them), and patchelf, which points the
/// binaries at that glibc.
const LLVM_PACKAGES: &[&str] = &[
    "clang-18",
    "libclang-cpp18",
    "libclang-common-18-dev",
    "libllvm18",
    "lld-18",
    "llvm-18",
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "libedit2",
    "libbsd0",
    "libmd0",
    "libffi8",
    "libtinfo6",
    "libxml2",
    "liblzma5",
    "libz3-4",
    "libzstd1",
    "zlib1g",
    "patchelf",
];
/// What kbuild runs with `LLVM=1`: each must start from the cache.
const LLVM_KBUILD_TOOLS: &[&str] = &[
    "clang",
    "ld.lld",
    "llvm-ar",
    "llvm-nm",
    "llvm-objcopy",
    "llvm-objdump",
    "llvm-readelf",
    "llvm-strip",
];

/// Clang/LLVM for the kernel, in `tools/llvm` (a Debian file-system tree: the binaries are in
/// `usr/lib/llvm-18/bin`). Debian trixie's packages are unpacked with `dpkg -x` together with
/// the trixie libraries they load, glibc among them; patchelf then points every binary at that
/// glibc's dynamic loader and those libraries (an absolute interpreter and RPATH), so they run
/// on bookworm as ordinary programs: clang finds its resource headers next to itself and can
/// start itself again, and nothing in the environment (no LD_LIBRARY_PATH) leaks into the
/// programs it starts. The stamp `tools/llvm/.p2pbuf-llvm` (the prefix and the package versions)
/// is written last; a cache that moved, or an install that stopped half way, is redone.
pub(super) fn llvm(ctx: &Ctx) -> Result<()> {
    let prefix = ctx.llvm_prefix();
    let clang = ctx.llvm_bin().join("clang");
    if let Ok(id) = ctx.llvm_id() {
        if id.lines().next() == Some(llvm_prefix_line(&prefix).as_str()) {
            if let Ok(v) = output(Command::new(&clang).arg("--version")) {
                println!(
                    "    clang: {} ({})",
                    v.lines().next().unwrap_or("").trim(),
                    ctx.llvm_bin().display()
                );
                return Ok(());
            }
        }
    }
    let dl = ctx.cache.join("dl/llvm");
    install_llvm(ctx, &dl).with_context(|| {
        format!(
            "could not install Clang/LLVM {LLVM_MAJOR} (Debian {LLVM_SUITE}'s packages) into {}. \
             The kernel is built with clang: KASAN in a Rust kernel needs it. Check that \
             deb.debian.org answers, then run `cargo xtask setup` again; `rm -rf {} {}` makes \
             it start from a fresh download",
            prefix.display(),
            prefix.display(),
            dl.display()
        )
    })
}

fn llvm_prefix_line(prefix: &Path) -> String {
    format!("prefix={}", prefix.display())
}

// Over 100 lines on purpose: one sequence (check the downloaded .debs, unpack each, point every
// ELF at trixie's loader and libraries, record what was done), sharing the prefix's paths;
// read top to bottom, it is the order of the install.
fn install_llvm(ctx: &Ctx, dl: &Path) -> Result<()> {
    let prefix = ctx.llvm_prefix();
    let _ = fs::remove_file(ctx.llvm_stamp());
    fs::create_dir_all(dl)?;
    let deb_of = |p: &str| {
        let stem = format!("{p}_");
        find_file(dl, |n| n.starts_with(&stem) && n.ends_with(".deb"))
    };
    let mut missing = vec![];
    for p in LLVM_PACKAGES {
        if deb_of(p)?.is_none() {
            missing.push(format!("{p}/{LLVM_SUITE}"));
        }
    }
    if !missing.is_empty() {
        let opts = private_apt(ctx)?;
        private_apt_update(ctx, &opts)?;
        run_step(
            ctx,
            &format!(
                "apt-get download clang-{LLVM_MAJOR} and its libraries from Debian {LLVM_SUITE} \
                 (about 77 MB)"
            ),
            "setup-llvm",
            Command::new("apt-get")
                .args(&opts)
                .arg("download")
                .args(&missing)
                .current_dir(dl),
        )?;
    }
    let _ = fs::remove_dir_all(&prefix);
    fs::create_dir_all(&prefix)?;
    let start = std::time::Instant::now();
    let mut record = llvm_prefix_line(&prefix) + "\n";
    for p in LLVM_PACKAGES {
        let deb = deb_of(p)?
            .with_context(|| format!("apt-get download left no {p} package in {}", dl.display()))?;
        output(Command::new("dpkg").arg("-x").arg(&deb).arg(&prefix))?;
        let version = output(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Version"))?;
        record += &format!("{p}={}\n", version.trim());
    }
    println!(
        "    unpacked {} packages into {} in {:.1}s",
        LLVM_PACKAGES.len(),
        prefix.display(),
        start.elapsed().as_secs_f64()
    );

    let start = std::time::Instant::now();
    let libdir = prefix.join("usr/lib/x86_64-linux-gnu");
    let llvm_lib = prefix.join(format!("usr/lib/llvm-{LLVM_MAJOR}/lib"));
    let ldso = libdir.join("ld-linux-x86-64.so.2");
    let rpath = format!("{}:{}", llvm_lib.display(), libdir.display());
    // patchelf itself is trixie's: start it through trixie's loader.
    let patchelf = || {
        let mut c = Command::new(&ldso);
        c.arg("--library-path")
            .arg(&libdir)
            .arg(prefix.join("usr/bin/patchelf"));
        c
    };
    let mut n = 0;
    for f in elf_files(&ctx.llvm_bin(), false)? {
        output(
            patchelf()
                .arg("--set-interpreter")
                .arg(&ldso)
                .args(["--force-rpath", "--set-rpath", &rpath])
                .arg(&f),
        )?;
        n += 1;
    }
    // libLLVM and libclang-cpp look for their dependencies through their own RUNPATH
    // ($ORIGIN/../lib), which would end in bookworm's libraries: give them the same path.
    for dir in [&libdir, &llvm_lib] {
        for f in elf_files(dir, true)? {
            let rp = output(patchelf().arg("--print-rpath").arg(&f))?;
            if !rp.trim().is_empty() {
                output(
                    patchelf()
                        .args(["--force-rpath", "--set-rpath", &rpath])
                        .arg(&f),
                )?;
                n += 1;
            }
        }
    }
    println!(
        "    patchelf: {n} binaries and libraries now use {} ({:.1}s)",
        ldso.display(),
        start.elapsed().as_secs_f64()
    );

    let bin = ctx.llvm_bin();
    for tool in LLVM_KBUILD_TOOLS {
        output(Command::new(bin.join(tool)).arg("--version"))
            .with_context(|| format!("the unpacked {tool} does not run"))?;
    }
    let clang = bin.join("clang");
    let include = output(Command::new(&clang).arg("-print-file-name=include"))?;
    if !Path::new(include.trim()).join("stddef.h").exists() {
        bail!("clang's resource headers are not where clang looks for them ({include})");
    }
    output(
        Command::new(&clang)
            .args(["-fsyntax-only", "-x", "c"])
            .arg("/dev/null"),
    )?;
    fs::write(ctx.llvm_stamp(), &record)?;
    let v = output(Command::new(&clang).arg("--version"))?;
    println!(
        "    clang: {} ({})",
        v.lines().next().unwrap_or("").trim(),
        bin.display()
    );
    Ok(())
}

/// The ELF files (not links) directly in `dir`; with `libs`, only those named `*.so*`.
fn elf_files(dir: &Path, libs: bool) -> Result<Vec<PathBuf>> {
    let mut v = vec![];
    for e in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let e = e?;
        if !e.file_type()?.is_file() {
            continue;
        }
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !libs || name.contains(".so") {
            let mut magic = [0u8; 4];
            let is_elf = fs::File::open(e.path())
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
                && magic == *b"\x7fELF";
            if is_elf {
                v.push(e.path());
            }
        }
    }
    v.sort();
    Ok(v)
}
