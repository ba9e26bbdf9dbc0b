//! `cargo xtask initramfs`: busybox, the modules, the in-VM suite (scripts and kselftests
//! built against the kernel tree's harness), and real Debian tools with their shared
//! libraries (the `ldd` closure), the project's own userspace binaries, packed as a newc cpio.

use crate::modules::module_files;
use crate::util::{heading, output, run_step, Ctx};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian tools the guest uses, each with its shared-library closure.
const TOOLS: &[&str] = &[
    "/usr/bin/lspci",
    "/usr/sbin/nvme",
    "/usr/bin/rdma",
    "/usr/sbin/ip",
    "/bin/ip",
    "/usr/bin/ib_write_bw",
    "/usr/bin/ib_write_lat",
    "/usr/bin/ib_read_bw",
    "/usr/bin/ib_send_bw",
    // The in-VM CLI tests parse --json output with it.
    "/usr/bin/jq",
];

/// Utilities from the project's rdma-core build.
const RDMA_TOOLS: &[&str] = &[
    "ibv_devinfo",
    "ibv_devices",
    "ibv_rc_pingpong",
    // two-nodes.sh: plain UD between the nodes (under UCX's UD wire-up).
    "ibv_ud_pingpong",
    "rping",
    "rdma_server",
    "rdma_client",
    "udaddy",
];

/// The project's userspace binaries, as (package, binary): built with `cargo build --release`
/// and put into /p2pbuf/bin (on the guest's PATH) with their shared-library closure.
const USERSPACE_BINS: &[(&str, &str)] = &[
    ("p2pbuf-cli", "p2pbuf"),
    // libfabric RMA with FI_MR_DMABUF (loads libfabric.so.1 at run time).
    ("p2pbuf-fabric", "p2pbuf-fabric"),
];

/// The project's shared libraries, as (package, file): built with the binaries and put into
/// /p2pbuf/lib (the preload library: `LD_PRELOAD=/p2pbuf/lib/libp2pbuf_peermem.so`).
const USERSPACE_LIBS: &[(&str, &str)] = &[("p2pbuf-peermem", "libp2pbuf_peermem.so")];

/// Verbs programs in C, built against the rdma-core of `cargo xtask rdma-core` (dynamically:
/// libibverbs is what the preload library interposes) and put into /p2pbuf/bin, as (source,
/// program).
const VERBS_PROGRAMS: &[(&str, &str)] = &[(
    "userspace/p2pbuf-peermem/c/verbs_rdma_write.c",
    "verbs-rdma-write",
)];

fn userspace_bins(ctx: &Ctx, root: &Path, seen: &mut BTreeSet<PathBuf>) -> Result<()> {
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo.current_dir(&ctx.root).args(["build", "--release"]);
    for (pkg, _) in USERSPACE_BINS.iter().chain(USERSPACE_LIBS) {
        cargo.args(["-p", pkg]);
    }
    // The CUDA path too: libcuda is loaded at run time, so the guest (no GPU, no driver)
    // exercises the "no NVIDIA driver" answer of `p2pbuf cuda`, not a build without it.
    cargo.args(["--features", "p2pbuf-cli/cuda"]);
    ctx.cargo_env(&mut cargo);
    run_step(
        ctx,
        "cargo build --release (userspace)",
        "userspace",
        &mut cargo,
    )?;
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => ctx.root.join(d),
        None => ctx.root.join("target"),
    };
    let stage = crate::rdma_core::staging(ctx);
    let stage_libs = stage.join("usr/lib/x86_64-linux-gnu");
    let out = target.join("verbs-programs");
    fs::create_dir_all(&out)?;
    let ldlibs = ["-libverbs".to_string()];
    for (src, name) in VERBS_PROGRAMS {
        let mut cc = c_program_cc(
            &[],
            &stage,
            &stage_libs,
            &ctx.root.join(src),
            &out.join(name),
            &ldlibs,
        );
        run_step(ctx, &format!("cc {src}"), "initramfs", &mut cc)?;
    }
    let release = target.join("release");
    let files = (USERSPACE_BINS
        .iter()
        .map(|(_, b)| (release.join(b), "p2pbuf/bin", b)))
    .chain(
        USERSPACE_LIBS
            .iter()
            .map(|(_, l)| (release.join(l), "p2pbuf/lib", l)),
    )
    .chain(
        VERBS_PROGRAMS
            .iter()
            .map(|(_, n)| (out.join(n), "p2pbuf/bin", n)),
    );
    for (file, dir, name) in files {
        let dest = Path::new(dir).join(name);
        copy_with_libs(root, &file, Some(&dest), Some(&stage_libs), seen)?;
    }
    overlay_ucx(ctx, root, &out, seen)
}

/// Copies the trees `from` of the staging root `stage` into `to` of the initramfs `root`
/// (`cp -a`, over what is there), for each (from, to).
fn copy_trees(
    ctx: &Ctx,
    what: &str,
    stage: &Path,
    root: &Path,
    trees: &[(&str, &str)],
) -> Result<()> {
    for (from, to) in trees {
        run_step(
            ctx,
            &format!("copy {what} {from}"),
            "initramfs",
            Command::new("cp")
                .args(["-a", "--remove-destination"])
                .arg(stage.join(from))
                .arg(root.join(to)),
        )?;
    }
    Ok(())
}

/// rdma-core from `cargo xtask rdma-core` (libibverbs, librdmacm, providers, their config,
/// utilities) over whatever Debian copies the ldd closures brought.
fn overlay_rdma_core(ctx: &Ctx, root: &Path, seen: &mut BTreeSet<PathBuf>) -> Result<()> {
    let stage = crate::rdma_core::staging(ctx);
    if !stage.join("usr/bin/ibv_devinfo").exists() {
        bail!("rdma-core is not built: run `cargo xtask rdma-core`");
    }
    for t in RDMA_TOOLS {
        let bin = stage.join("usr/bin").join(t);
        if bin.exists() {
            copy_with_libs(
                root,
                &bin,
                Some(&Path::new("usr/bin").join(t)),
                Some(&stage.join("usr/lib/x86_64-linux-gnu")),
                seen,
            )?;
        }
    }
    copy_trees(
        ctx,
        "rdma-core",
        &stage,
        root,
        &[("usr/lib", "usr"), ("etc", ".")],
    )
}

/// libfabric from `cargo xtask libfabric`: the library (its verbs, rxm and tcp providers are
/// built in), `fi_info` and friends, the fabtests programs.
fn overlay_libfabric(ctx: &Ctx, root: &Path, seen: &mut BTreeSet<PathBuf>) -> Result<()> {
    let stage = crate::fabric::staging(ctx);
    if !stage.join("usr/bin/fi_info").exists() {
        bail!("libfabric is not built: run `cargo xtask libfabric`");
    }
    let lf_lib = stage.join("usr/lib/x86_64-linux-gnu");
    let rdma_lib = crate::rdma_core::staging(ctx).join("usr/lib/x86_64-linux-gnu");
    let tools = crate::fabric::FI_TOOLS.iter().copied().chain(
        crate::fabric::FABTESTS
            .iter()
            .map(|t| t.rsplit_once('/').map_or(*t, |(_, n)| n)),
    );
    for t in tools {
        copy_with_staged_libs(
            root,
            &stage.join("usr/bin").join(t),
            Some(&Path::new("usr/bin").join(t)),
            &[&lf_lib, &rdma_lib],
            seen,
        )?;
    }
    let dest = root.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&dest)?;
    run_step(
        ctx,
        "copy libfabric",
        "initramfs",
        Command::new("sh").arg("-c").arg(format!(
            "cp -a --remove-destination '{}'/libfabric.so* '{}'/",
            lf_lib.display(),
            dest.display()
        )),
    )?;
    Ok(())
}

/// UCX from `cargo xtask ucx` (Debian bookworm's binaries): libucp, libuct, libucs, libucm and
/// the transport modules (`ucx/libuct_ib.so`, ...) into /usr/lib/x86_64-linux-gnu, where UCX
/// looks for its modules (beside libucs); `ucx_info`; the libraries they need that are not
/// UCX's or rdma-core's (libnuma); and ucp-put-get, built against libucx-dev, into /p2pbuf/bin.
fn overlay_ucx(ctx: &Ctx, root: &Path, out: &Path, seen: &mut BTreeSet<PathBuf>) -> Result<()> {
    let ucx_lib = crate::ucx::lib_dir(ctx);
    if !ucx_lib.join("ucx/libuct_ib.so.0").exists() {
        bail!("UCX is not staged: run `cargo xtask ucx`");
    }
    let modules = ucx_lib.join("ucx");
    let rdma_lib = crate::rdma_core::staging(ctx).join("usr/lib/x86_64-linux-gnu");
    let staged: [&Path; 3] = [&ucx_lib, &modules, &rdma_lib];
    let dest = root.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(dest.join("ucx"))?;
    run_step(
        ctx,
        "copy UCX",
        "initramfs",
        Command::new("sh").arg("-c").arg(format!(
            "cp -a --remove-destination '{l}'/libuc*.so* '{d}'/ && cp -a --remove-destination '{l}'/ucx/*.so* '{d}'/ucx/",
            l = ucx_lib.display(),
            d = dest.display()
        )),
    )?;
    // The libraries and modules are dlopen()ed or linked by name: their own closures.
    for dir in [&ucx_lib, &modules] {
        for e in fs::read_dir(dir)? {
            let p = e?.path();
            if p.is_file() && !p.is_symlink() && p.to_string_lossy().contains(".so.") {
                copy_deps(root, &p, &staged, seen)?;
            }
        }
    }
    let info = crate::ucx::staging(ctx).join("usr/bin/ucx_info");
    copy_with_staged_libs(
        root,
        &info,
        Some(Path::new("usr/bin/ucx_info")),
        &staged,
        seen,
    )?;
    let prog = out.join(crate::ucx::PROGRAM);
    run_step(
        ctx,
        &format!("cc {}", crate::ucx::PROGRAM_SRC),
        "initramfs",
        &mut crate::ucx::program_cc(ctx, &prog),
    )?;
    let rel = Path::new("p2pbuf/bin").join(crate::ucx::PROGRAM);
    copy_with_staged_libs(root, &prog, Some(&rel), &staged, seen)
}

/// The packed initramfs of the context's kernel flavour (it carries that kernel's modules).
pub fn initramfs_path(ctx: &Ctx) -> PathBuf {
    ctx.flavour_build().join("initramfs.cpio")
}

/// Library paths in `ldd` output.
pub fn parse_ldd(text: &str) -> Vec<PathBuf> {
    // Dependency lines are indented; others are warnings about the binary itself.
    text.lines()
        .filter(|l| l.starts_with('\t'))
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rhs)) => rhs.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn copy_into(root: &Path, src: &Path, dest_rel: Option<&Path>) -> Result<()> {
    let rel = dest_rel.unwrap_or_else(|| src.strip_prefix("/").unwrap_or(src));
    let dest = root.join(rel);
    if let Some(d) = dest.parent() {
        fs::create_dir_all(d)?;
    }
    fs::copy(src, &dest)
        .with_context(|| format!("cannot copy {} into the initramfs", src.display()))?;
    Ok(())
}

/// Copies a binary and every library it needs.
fn copy_with_libs(
    root: &Path,
    bin: &Path,
    dest_rel: Option<&Path>,
    stage_libs: Option<&Path>,
    seen: &mut BTreeSet<PathBuf>,
) -> Result<()> {
    copy_with_staged_libs(root, bin, dest_rel, stage_libs.as_slice(), seen)
}

/// [`copy_with_libs`] with several staging roots' library directories (libfabric's, then
/// rdma-core's).
fn copy_with_staged_libs(
    root: &Path,
    bin: &Path,
    dest_rel: Option<&Path>,
    stage_libs: &[&Path],
    seen: &mut BTreeSet<PathBuf>,
) -> Result<()> {
    copy_into(root, bin, dest_rel)?;
    copy_deps(root, bin, stage_libs, seen)
}

/// Copies every library `bin` needs (its `ldd` closure) into `root`, but those of the staging
/// roots' library directories `stage_libs` (copied as whole trees).
fn copy_deps(
    root: &Path,
    bin: &Path,
    stage_libs: &[&Path],
    seen: &mut BTreeSet<PathBuf>,
) -> Result<()> {
    let mut ldd = Command::new("ldd");
    ldd.arg(bin);
    if !stage_libs.is_empty() {
        ldd.env("LD_LIBRARY_PATH", std::env::join_paths(stage_libs)?);
    }
    let out = ldd.output()?;
    for lib in parse_ldd(&String::from_utf8_lossy(&out.stdout)) {
        // Libraries of the staged builds are copied as whole trees.
        if stage_libs.iter().any(|d| lib.starts_with(d)) {
            continue;
        }
        if seen.insert(lib.clone()) {
            let real = fs::canonicalize(&lib).unwrap_or(lib.clone());
            copy_into(root, &real, Some(lib.strip_prefix("/").unwrap_or(&lib)))?;
        }
    }
    Ok(())
}

fn write_exec(path: &Path, src: &Path) -> Result<()> {
    fs::copy(src, path).with_context(|| format!("cannot copy {}", src.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The libraries a selftest links besides libc and libpthread, as it declares them in a line
/// `// LDLIBS: -libverbs -lrdmacm` (the variable a kselftest Makefile would set): the
/// `-l` words of every such line, in order.
fn declared_ldlibs(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("// LDLIBS:"))
        .flat_map(|l| l.split_whitespace())
        .filter(|w| w.starts_with("-l"))
        .map(str::to_string)
        .collect()
}

/// Whether a selftest that links `ldlibs` ([`declared_ldlibs`]) is built dynamically: when
/// one of them has no `lib*.a` in rdma-core's staging root (`stage_libs`).
fn links_dynamically(stage_libs: &Path, ldlibs: &[String]) -> bool {
    ldlibs
        .iter()
        .any(|l| !stage_libs.join(format!("lib{}.a", &l[2..])).exists())
}

/// The compiler's command for one C program of the suite (`-O2 -Wall -Wextra -Werror` and
/// `flags`: a selftest's are `-D_GNU_SOURCE` and the include directories of the kernel's
/// selftest harness, its uAPI headers and the exporter's), static and with libpthread. One
/// that links `ldlibs` ([`declared_ldlibs`]) is built against rdma-core's staging root
/// (`stage`: its headers and `stage_libs`), statically unless [`links_dynamically`].
fn c_program_cc(
    flags: &[String],
    stage: &Path,
    stage_libs: &Path,
    src: &Path,
    out: &Path,
    ldlibs: &[String],
) -> Command {
    let mut cc = Command::new("gcc");
    if !links_dynamically(stage_libs, ldlibs) {
        cc.arg("-static");
    }
    cc.args(["-O2", "-g0", "-Wall", "-Wextra", "-Werror"])
        .args(flags);
    if !ldlibs.is_empty() {
        cc.arg(format!("-I{}", stage.join("usr/include").display()));
    }
    cc.arg("-o").arg(out).arg(src);
    if !ldlibs.is_empty() {
        cc.arg(format!("-L{}", stage_libs.display()))
            .arg(format!("-Wl,-rpath-link,{}", stage_libs.display()))
            .args(ldlibs);
    }
    cc.arg("-lpthread");
    cc
}

/// Builds the kselftest programs in `src_dir/*.c` into `dest` (below the initramfs `root`)
/// against the tree's harness; a dynamic one brings its libraries along.
fn build_selftests(
    ctx: &Ctx,
    src_dir: &str,
    dest: &Path,
    root: &Path,
    seen: &mut BTreeSet<PathBuf>,
) -> Result<Vec<String>> {
    let dir = ctx.root.join(src_dir);
    let mut names = vec![];
    let Ok(rd) = fs::read_dir(&dir) else {
        return Ok(names);
    };
    let mut srcs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    srcs.sort();
    let ksrc = ctx.ksrc()?;
    let mut flags = vec!["-D_GNU_SOURCE".to_string()];
    for inc in [
        ksrc.join("tools/testing/selftests"),
        ksrc.join("usr/include"),
        ctx.kbuild().join("usr/include"),
        ctx.root.join("include"),
    ] {
        flags.push(format!("-I{}", inc.display()));
    }
    let stage = crate::rdma_core::staging(ctx);
    let stage_libs = stage.join("usr/lib/x86_64-linux-gnu");
    for src in srcs {
        let name = crate::util::file_stem(&src);
        let ldlibs = declared_ldlibs(&fs::read_to_string(&src)?);
        // A dynamic program is built outside the initramfs and copied in with its libraries.
        let dynamic = links_dynamically(&stage_libs, &ldlibs);
        let out = if dynamic {
            let d = ctx.flavour_build().join("selftests-dynamic");
            fs::create_dir_all(&d)?;
            d.join(&name)
        } else {
            dest.join(&name)
        };
        let mut cc = c_program_cc(&flags, &stage, &stage_libs, &src, &out, &ldlibs);
        run_step(ctx, &format!("cc {src_dir}/{name}.c"), "initramfs", &mut cc)?;
        if dynamic {
            let into = dest.join(&name);
            let rel = into.strip_prefix(root).unwrap_or(&into).to_path_buf();
            copy_with_libs(root, &out, Some(&rel), Some(&stage_libs), seen)?;
        }
        names.push(name);
    }
    Ok(names)
}

// Over 100 lines on purpose: the list of what goes into the guest (directories, busybox, the
// suite, the benchmarks, the modules, the tools and their libraries), each a few lines, in the
// order the image is laid out.
pub fn initramfs(ctx: &Ctx) -> Result<PathBuf> {
    heading(&format!(
        "initramfs: busybox, modules, tests, tools, p2pbuf binaries{}",
        ctx.flavour.note()
    ));
    let root = ctx.flavour_build().join("initramfs");
    let _ = fs::remove_dir_all(&root);
    for d in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "etc",
        "root",
        "run",
        "usr/bin",
        "usr/lib/modules/p2pbuf",
        "usr/lib64",
        "p2pbuf/tests",
        "p2pbuf/bin",
        "usr/share/misc",
    ] {
        fs::create_dir_all(root.join(d))?;
    }
    // Merged /usr, as on the host: libraries that ldd finds under /lib land in /usr/lib,
    // where the project's own rdma-core build then replaces Debian's copies.
    std::os::unix::fs::symlink("usr/lib", root.join("lib"))?;
    std::os::unix::fs::symlink("usr/lib64", root.join("lib64"))?;
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .context("busybox is missing: run `cargo xtask setup` (Debian package busybox-static)")?;
    if !output(Command::new("file").arg(busybox))
        .map(|s| s.contains("static"))
        .unwrap_or(true)
    {
        bail!(
            "{} is not statically linked: install busybox-static",
            busybox.display()
        );
    }
    write_exec(&root.join("bin/busybox"), busybox)?;
    write_exec(&root.join("init"), &ctx.root.join("tests/vm/init"))?;
    // The in-VM suite: shell tests and the runner.
    for e in fs::read_dir(ctx.root.join("tests/vm"))? {
        let p = e?.path();
        let name = crate::util::file_name(&p);
        if name.ends_with(".sh") {
            write_exec(&root.join("p2pbuf").join(&name), &p)?;
        }
    }
    let tests_dir = ctx.root.join("tests/vm/tests");
    if let Ok(rd) = fs::read_dir(&tests_dir) {
        for e in rd {
            let p = e?.path();
            write_exec(
                &root
                    .join("p2pbuf/tests")
                    .join(p.file_name().unwrap_or_default()),
                &p,
            )?;
        }
    }
    let mut seen = BTreeSet::new();
    let tests = root.join("p2pbuf/tests");
    build_selftests(ctx, "tests/selftests", &tests, &root, &mut seen)?;
    fs::create_dir_all(root.join("p2pbuf/bench"))?;
    let bench = root.join("p2pbuf/bench");
    build_selftests(ctx, "tests/bench", &bench, &root, &mut seen)?;
    // Shell-script benchmarks (e.g. around the CLI) run next to the compiled ones.
    if let Ok(rd) = fs::read_dir(ctx.root.join("tests/bench")) {
        for e in rd {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "sh") {
                write_exec(
                    &root
                        .join("p2pbuf/bench")
                        .join(p.file_name().unwrap_or_default()),
                    &p,
                )?;
            }
        }
    }
    for ko in module_files(ctx) {
        if !ko.exists() {
            bail!("{} is not built: run `cargo xtask modules` (an in-tree module: `cargo xtask kernel`)", ko.display());
        }
        copy_into(
            &root,
            &ko,
            Some(&Path::new("lib/modules/p2pbuf").join(ko.file_name().unwrap_or_default())),
        )?;
    }
    for t in TOOLS.iter().map(Path::new).filter(|p| p.exists()) {
        copy_with_libs(&root, t, None, None, &mut seen)?;
    }
    overlay_libfabric(ctx, &root, &mut seen)?;
    overlay_rdma_core(ctx, &root, &mut seen)?;
    userspace_bins(ctx, &root, &mut seen)?;
    if Path::new("/usr/share/misc/pci.ids").exists() {
        copy_into(&root, Path::new("/usr/share/misc/pci.ids"), None)?;
    }
    let out = initramfs_path(ctx);
    run_step(
        ctx,
        "pack cpio",
        "initramfs",
        Command::new("sh").current_dir(&root).arg("-c").arg(format!(
            "find . -print0 | sort -z | cpio --null -o -H newc --quiet -R 0:0 > '{}'",
            out.display()
        )),
    )?;
    let size = fs::metadata(&out)?.len();
    println!(
        "    initramfs: {} ({:.1} MiB)",
        out.display(),
        size as f64 / 1048576.0
    );
    Ok(out)
}

/// Parts of Python's standard library the guest does not need (tests, GUI, the static
/// library and build configuration, 2to3, ensurepip's wheels...).
const PYTHON_STDLIB_SKIP: &[&str] = &[
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "pydoc_data",
    "config-3.11-x86_64-linux-gnu",
    "site-packages",
    "dist-packages",
];

/// The `pyverbs` boot's initramfs: the lab's (`main`, as built for this run) with a second
/// cpio archive appended (the kernel unpacks both, the second over the first): Debian's
/// Python 3.11 (interpreter, standard library, the libraries of its extension modules),
/// rdma-core from `cargo xtask`'s pyverbs build (its libibverbs, providers and librdmacm
/// replace the main build's, so pyverbs and the utilities use one library), pyverbs, and
/// rdma-core's tests/ at /usr/share/doc/rdma-core/tests. Only that boot carries them: the
/// other boots' initramfs does not grow. Returns the combined archive.
pub fn pyverbs_initramfs(ctx: &Ctx, main: &Path) -> Result<PathBuf> {
    heading("initramfs: + Python 3.11, pyverbs, rdma-core tests/ (pyverbs boot)");
    let stage = crate::rdma_core::pyverbs_staging(ctx);
    if !stage.join(crate::rdma_core::PYVERBS_TESTS).exists() {
        bail!("pyverbs is not built: run `cargo xtask test --boot pyverbs`");
    }
    let root = ctx.flavour_build().join("initramfs-pyverbs");
    let _ = fs::remove_dir_all(&root);
    for d in ["usr/bin", "usr/lib", "usr/lib64"] {
        fs::create_dir_all(root.join(d))?;
    }
    // The lab's merged /usr, again: a real lib/ directory in this archive would replace the
    // lab's lib -> usr/lib link when the kernel unpacks it (and hide /lib/modules).
    std::os::unix::fs::symlink("usr/lib", root.join("lib"))?;
    std::os::unix::fs::symlink("usr/lib64", root.join("lib64"))?;
    let python = Path::new(crate::rdma_core::PYTHON);
    let stage_libs = stage.join("usr/lib/x86_64-linux-gnu");
    let mut seen = BTreeSet::new();
    copy_with_libs(&root, python, None, None, &mut seen)?;
    std::os::unix::fs::symlink("python3.11", root.join("usr/bin/python3"))?;
    let stdlib = Path::new("/usr/lib/python3.11");
    run_step(
        ctx,
        "copy Python's standard library",
        "initramfs",
        Command::new("cp")
            .arg("-a")
            .arg(stdlib)
            .arg(root.join("usr/lib/")),
    )?;
    for d in PYTHON_STDLIB_SKIP {
        let _ = fs::remove_dir_all(root.join("usr/lib/python3.11").join(d));
    }
    // Extension modules: the standard library's and pyverbs' (with the staged libibverbs).
    let mut exts = vec![];
    for dir in [
        stdlib.join("lib-dynload"),
        stage.join("usr/lib/python3/dist-packages/pyverbs"),
        stage.join("usr/lib/python3/dist-packages/pyverbs/providers/mlx5"),
        stage.join("usr/lib/python3/dist-packages/pyverbs/providers/efa"),
    ] {
        if let Ok(rd) = fs::read_dir(&dir) {
            exts.extend(
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "so")),
            );
        }
    }
    for so in &exts {
        let out = Command::new("ldd")
            .arg(so)
            .env("LD_LIBRARY_PATH", &stage_libs)
            .output()?;
        for lib in parse_ldd(&String::from_utf8_lossy(&out.stdout)) {
            if lib.starts_with(&stage_libs) || !seen.insert(lib.clone()) {
                continue;
            }
            let real = fs::canonicalize(&lib).unwrap_or(lib.clone());
            copy_into(&root, &real, Some(lib.strip_prefix("/").unwrap_or(&lib)))?;
        }
    }
    let trees = [("usr/lib", "usr"), ("etc", "."), ("usr/share", "usr")];
    copy_trees(ctx, "pyverbs build", &stage, &root, &trees)?;
    // The converter from unittest's results to KTAP (tests/vm/tests/pyverbs_tests.sh runs it).
    fs::create_dir_all(root.join("p2pbuf"))?;
    write_exec(
        &root.join("p2pbuf/pyverbs_ktap.py"),
        &ctx.root.join("tests/vm/pyverbs_ktap.py"),
    )?;
    let overlay = ctx.flavour_build().join("initramfs-pyverbs-overlay.cpio");
    run_step(
        ctx,
        "pack cpio (pyverbs overlay)",
        "initramfs",
        Command::new("sh").current_dir(&root).arg("-c").arg(format!(
            "find . -print0 | sort -z | cpio --null -o -H newc --quiet -R 0:0 > '{}'",
            overlay.display()
        )),
    )?;
    let out = ctx.flavour_build().join("initramfs-pyverbs.cpio");
    let mut combined = fs::read(main).with_context(|| format!("reading {}", main.display()))?;
    combined.extend(fs::read(&overlay)?);
    fs::write(&out, &combined)?;
    let mib = |p: &Path| {
        fs::metadata(p)
            .map(|m| m.len() as f64 / 1048576.0)
            .unwrap_or(0.0)
    };
    println!(
        "    initramfs: {} ({:.1} MiB: the lab's {:.1} MiB + the overlay's {:.1} MiB)",
        out.display(),
        mib(&out),
        mib(main),
        mib(&overlay)
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_is_parsed() {
        let t = "/x/bin: /lib/libibverbs.so.1: version `IBVERBS_1.18' not found\n\tlinux-vdso.so.1 (0x00007ffd)\n\tlibpci.so.3 => /lib/x86_64-linux-gnu/libpci.so.3 (0x7f)\n\t/lib64/ld-linux-x86-64.so.2 (0x7f)\n\tlibfoo.so => not found\n";
        assert_eq!(
            parse_ldd(t),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libpci.so.3"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }

    /// A selftest declares what it links in `// LDLIBS:` lines; without one it is built as
    /// before (static, libpthread only: a selftest could not link libibverbs at all).
    #[test]
    fn selftests_link_the_libraries_they_declare() {
        let src = "#include <infiniband/verbs.h>\n// LDLIBS: -libverbs -lrdmacm\n  // LDLIBS: -lm\nint x; // LDLIBS: -lnot\n";
        let libs = declared_ldlibs(src);
        assert_eq!(libs, ["-libverbs", "-lrdmacm", "-lm"]);
        let dir = std::env::temp_dir().join(format!("p2pbuf-ldlibs-{}", std::process::id()));
        let stage_libs = dir.join("usr/lib/x86_64-linux-gnu");
        fs::create_dir_all(&stage_libs).unwrap();
        let args = |libs: &[String]| -> Vec<String> {
            let cc = c_program_cc(
                &[],
                &dir,
                &stage_libs,
                Path::new("t.c"),
                Path::new("t"),
                libs,
            );
            cc.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        // Shared libraries only (rdma-core's usual build): dynamic, against the staging root.
        let dynamic = args(&libs[..1]);
        assert!(!dynamic.contains(&"-static".to_string()), "{dynamic:?}");
        for want in [
            format!("-I{}", dir.join("usr/include").display()),
            format!("-L{}", stage_libs.display()),
            "-libverbs".to_string(),
            "-lpthread".to_string(),
        ] {
            assert!(dynamic.contains(&want), "{want} not in {dynamic:?}");
        }
        // A static archive of each: static.
        fs::write(stage_libs.join("libibverbs.a"), "").unwrap();
        let st = args(&libs[..1]);
        assert!(st.contains(&"-static".to_string()), "{st:?}");
        assert!(st.contains(&"-libverbs".to_string()), "{st:?}");
        // No declaration: the old command.
        let plain = args(&[]);
        assert_eq!(plain.first().map(String::as_str), Some("-static"));
        assert!(!plain.iter().any(|a| a.starts_with("-L")), "{plain:?}");
        assert_eq!(plain.last().map(String::as_str), Some("-lpthread"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
