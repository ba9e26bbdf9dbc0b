//! rdma-core for the VM: Debian's source (pinned), with the provider patches of
//! `linux/rdma-core/` applied, built with cmake/ninja and installed into a staging root that
//! `initramfs` copies into the guest.

use crate::util::{hash_files, heading, run_step, Ctx, Stamp};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const RDMA_CORE_VERSION: &str = "65.0";

/// cmake's arguments for both builds (the main one, and pyverbs'): Ninja, release, no man
/// pages nor static libraries, Debian's layout under /usr.
const CMAKE_ARGS: &[&str] = &[
    "-GNinja",
    "-DNO_MAN_PAGES=1",
    "-DENABLE_STATIC=0",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_INSTALL_PREFIX=/usr",
    "-DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu",
    "-DCMAKE_INSTALL_SYSCONFDIR=/etc",
    "-DCMAKE_INSTALL_RUNDIR=/run",
];

pub fn staging(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("build/rdma-root")
}

fn patch_files(ctx: &Ctx) -> Result<Vec<PathBuf>> {
    let dir = ctx.root.join("linux/rdma-core");
    let mut v: Vec<PathBuf> = match fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "patch"))
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    Ok(v)
}

fn tarball(ctx: &Ctx) -> Result<PathBuf> {
    crate::setup::debian_orig_tarball(
        ctx,
        "rdma-core",
        &format!("{RDMA_CORE_VERSION}-1.1"),
        &format!("rdma-core_{RDMA_CORE_VERSION}.orig.tar.gz"),
    )
}

/// Unpacks the tarball into `src` (emptied first) and applies `patches` in order.
fn unpack_patched(ctx: &Ctx, tb: &Path, src: &Path, patches: &[PathBuf], log: &str) -> Result<()> {
    let _ = fs::remove_dir_all(src);
    fs::create_dir_all(src)?;
    run_step(
        ctx,
        "unpack rdma-core",
        log,
        Command::new("tar")
            .arg("xzf")
            .arg(tb)
            .arg("--strip-components=1")
            .arg("-C")
            .arg(src),
    )?;
    for p in patches {
        let name = crate::util::file_name(p);
        run_step(
            ctx,
            &format!("patch rdma-core: {name}"),
            log,
            Command::new("patch")
                .args(["-p1", "--forward", "-i"])
                .arg(p)
                .current_dir(src),
        )
        .with_context(|| format!("{name} does not apply to rdma-core {RDMA_CORE_VERSION}"))?;
    }
    Ok(())
}

pub fn rdma_core(ctx: &Ctx) -> Result<()> {
    heading(&format!(
        "rdma-core {RDMA_CORE_VERSION} + linux/rdma-core patches"
    ));
    let patches = patch_files(ctx)?;
    let hash = hash_files(&patches, &[RDMA_CORE_VERSION])?;
    let stamp = Stamp(ctx.cache.join("build/rdma-core.sha256"));
    let root = staging(ctx);
    if stamp.fresh(&hash) && root.join("usr/bin/ibv_devinfo").exists() {
        println!("    rdma-core: up to date ({} patches)", patches.len());
        return Ok(());
    }
    let tb = tarball(ctx)?;
    let src = ctx.cache.join("build/rdma-core-src");
    let bld = ctx.cache.join("build/rdma-core");
    let _ = fs::remove_dir_all(&root);
    unpack_patched(ctx, &tb, &src, &patches, "rdma-core")?;
    fs::create_dir_all(&bld)?;
    run_step(
        ctx,
        "cmake rdma-core",
        "rdma-core",
        Command::new("cmake")
            .current_dir(&bld)
            .args(CMAKE_ARGS)
            .arg("-DNO_PYVERBS=1")
            .arg(&src),
    )?;
    run_step(
        ctx,
        "ninja rdma-core (about 1 min)",
        "rdma-core",
        Command::new("ninja").current_dir(&bld),
    )?;
    run_step(
        ctx,
        "ninja install (staging)",
        "rdma-core",
        Command::new("ninja")
            .current_dir(&bld)
            .arg("install")
            .env("DESTDIR", &root),
    )?;
    stamp.set(&hash)?;
    Ok(())
}

/// The guest's Python: Debian 12's, the interpreter of the build machine, copied into the
/// pyverbs overlay. pyverbs is compiled for it (its headers from `libpython3.11-dev`).
pub const PYTHON: &str = "/usr/bin/python3.11";
const PYTHON_VERSION: &str = "3.11";

/// Debian packages pyverbs is built with, fetched with the system's apt (Debian 12, the
/// release of the machine's Python) and unpacked into the cache, not installed: Cython and
/// Python's development headers.
const PYVERBS_DEBS: &[&str] = &["cython3", "libpython3.11-dev"];

/// Where `pyverbs` installs: rdma-core with pyverbs and its tests (`usr/share/doc/rdma-core/tests`).
pub fn pyverbs_staging(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("build/pyverbs-root")
}

/// Cython and the Python headers, unpacked into `tools/pyverbs` (`dpkg -x`).
fn pyverbs_deps(ctx: &Ctx) -> Result<PathBuf> {
    let dir = ctx.cache.join("tools/pyverbs");
    let marker = dir.join(".p2pbuf-pyverbs-deps");
    let want = PYVERBS_DEBS.join(" ");
    if fs::read_to_string(&marker).is_ok_and(|s| s.trim() == want) {
        return Ok(dir);
    }
    let dl = ctx.cache.join("dl/pyverbs");
    let _ = fs::remove_dir_all(&dl);
    fs::create_dir_all(&dl)?;
    let download = |ctx: &Ctx| {
        run_step(
            ctx,
            &format!("apt-get download {want}"),
            "pyverbs",
            Command::new("apt-get")
                .arg("download")
                .args(PYVERBS_DEBS)
                .current_dir(&dl),
        )
    };
    if download(ctx).is_err() {
        // A fresh machine's apt lists may be missing or stale.
        run_step(
            ctx,
            "apt-get update",
            "pyverbs",
            Command::new("apt-get").args(["update", "-q"]),
        )
        .context("apt-get update failed (needs root and deb.debian.org)")?;
        download(ctx).with_context(|| {
            format!(
                "could not download the Debian packages {want} (the system's apt, Debian 12): \
                 see the log; pyverbs needs them"
            )
        })?;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    for e in fs::read_dir(&dl)? {
        let deb = e?.path();
        if deb.extension().is_some_and(|x| x == "deb") {
            run_step(
                ctx,
                &format!(
                    "dpkg -x {}",
                    deb.file_name().unwrap_or_default().to_string_lossy()
                ),
                "pyverbs",
                Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir),
            )?;
        }
    }
    for need in [
        "usr/lib/python3/dist-packages/Cython/Compiler/Main.py".to_string(),
        format!("usr/include/python{PYTHON_VERSION}/Python.h"),
    ] {
        if !dir.join(&need).exists() {
            bail!("{} has no {need} after unpacking {want}", dir.display());
        }
    }
    fs::write(&marker, &want)?;
    Ok(dir)
}

/// rdma-core again, with pyverbs (Cython) and its test suite, for the `pyverbs` boot: the same
/// tarball and `linux/rdma-core/` patches as [`rdma_core`], its own source, build and staging
/// directories, so that the main build and the initramfs of the other boots stay as they are.
pub fn pyverbs(ctx: &Ctx) -> Result<()> {
    heading(&format!(
        "pyverbs: rdma-core {RDMA_CORE_VERSION} + linux/rdma-core patches, with pyverbs and tests/"
    ));
    if !Path::new(PYTHON).exists() {
        bail!("{PYTHON} is missing: pyverbs is built for Debian 12's Python {PYTHON_VERSION} (package python{PYTHON_VERSION}), which also runs in the guest");
    }
    let patches = patch_files(ctx)?;
    let uapi = ctx.root.join("include/uapi");
    let mut inputs = patches.clone();
    inputs.push(uapi.join("linux/p2pbuf.h"));
    let hash = hash_files(
        &inputs,
        &[
            RDMA_CORE_VERSION,
            PYTHON,
            &PYVERBS_DEBS.join(" "),
            "pyverbs-1",
        ],
    )?;
    let stamp = Stamp(ctx.cache.join("build/pyverbs.sha256"));
    let root = pyverbs_staging(ctx);
    if stamp.fresh(&hash) && root.join(PYVERBS_TESTS).join("run_tests.py").exists() {
        println!("    pyverbs: up to date ({} patches)", patches.len());
        return Ok(());
    }
    let deps = pyverbs_deps(ctx)?;
    let tb = tarball(ctx)?;
    let src = ctx.cache.join("build/pyverbs-src");
    let bld = ctx.cache.join("build/pyverbs");
    let _ = fs::remove_dir_all(&root);
    let _ = fs::remove_dir_all(&bld);
    unpack_patched(ctx, &tb, &src, &patches, "pyverbs")?;
    fs::create_dir_all(&bld)?;
    let pythonpath = deps.join("usr/lib/python3/dist-packages");
    let cflags = format!(
        "-I{} -I{}",
        deps.join("usr/include").display(),
        uapi.display()
    );
    run_step(
        ctx,
        "cmake rdma-core (pyverbs)",
        "pyverbs",
        Command::new("cmake")
            .current_dir(&bld)
            .env("PYTHONPATH", &pythonpath)
            .args(CMAKE_ARGS)
            .args([
                "-DCMAKE_INSTALL_PYTHON_ARCH_LIB=/usr/lib/python3/dist-packages",
                &format!("-DPYTHON_EXECUTABLE={PYTHON}"),
                &format!(
                    "-DPython_INCLUDE_DIR={}",
                    deps.join(format!("usr/include/python{PYTHON_VERSION}"))
                        .display()
                ),
                &format!(
                    "-DPython_LIBRARY=/usr/lib/x86_64-linux-gnu/libpython{PYTHON_VERSION}.so.1"
                ),
                &format!("-DCMAKE_C_FLAGS={cflags}"),
            ])
            .arg(&src),
    )?;
    // rdma-core's Findcython writes this script when Cython imports under PYTHON.
    if !bld.join("python/cython").exists() {
        bail!(
            "cmake did not find Cython for {PYTHON} (PYTHONPATH {}): see {}",
            pythonpath.display(),
            ctx.log_path("pyverbs").display()
        );
    }
    run_step(
        ctx,
        "ninja rdma-core + pyverbs (several minutes)",
        "pyverbs",
        Command::new("ninja")
            .current_dir(&bld)
            .args(["-j", "2"])
            .env("PYTHONPATH", &pythonpath),
    )?;
    run_step(
        ctx,
        "ninja install (pyverbs staging)",
        "pyverbs",
        Command::new("ninja")
            .current_dir(&bld)
            .arg("install")
            .env("PYTHONPATH", &pythonpath)
            .env("DESTDIR", &root),
    )?;
    if !root.join(PYVERBS_TESTS).join("run_tests.py").exists() {
        bail!(
            "the pyverbs build installed no {}/run_tests.py",
            root.join(PYVERBS_TESTS).display()
        );
    }
    stamp.set(&hash)?;
    Ok(())
}

/// Where rdma-core installs its Python test suite (`rdma_python_test` in its cmake files).
pub const PYVERBS_TESTS: &str = "usr/share/doc/rdma-core/tests";

#[cfg(test)]
mod patch_file_tests {
    use std::fs;
    use std::path::Path;

    /// As for the kernel series (series.rs): the rdma-core patches store no sign-off and no
    /// made-up identity; whoever sends one as a pull request signs it off.
    #[test]
    fn rdma_core_patches_carry_no_made_up_identity_or_sign_off() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../linux/rdma-core");
        let mut n = 0;
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_none_or(|x| x != "patch") {
                continue;
            }
            n += 1;
            let t = fs::read_to_string(&p).unwrap();
            let msg = t.split("\n---\n").next().unwrap();
            assert!(!msg.contains("Signed-off-by:"), "{}", p.display());
            assert!(!t.contains("p2pbuf.invalid"), "{}", p.display());
        }
        assert!(n > 0, "no patches in {}", dir.display());
    }
}
