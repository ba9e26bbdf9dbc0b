//! UCX for the VM: Debian bookworm's binary packages of UCX 1.13.1 (`libucx0`, `ucx-utils`,
//! `libucx-dev`; the source tarballs of newer Debian UCX are 404 on the project's mirror, and
//! sid's binaries need a newer glibc than the guest's), fetched with `apt-get download` into
//! the cache's `dl/` and unpacked (`dpkg-deb -x`) into their own staging root. Their libuct_ib
//! links libibverbs dynamically, so in the guest it loads the project's rdma-core (and its
//! rxe provider), which `initramfs` puts over Debian's; UCX finds its transport modules in
//! `ucx/` beside libucs (`/usr/lib/x86_64-linux-gnu/ucx`, its built-in `UCX_MODULE_DIR` too).
//!
//! `ucp-put-get` (`userspace/p2pbuf-peermem/c/ucp_put_get.c`, a program written against UCP
//! alone) is built against libucx-dev's headers; [`host_check`] runs it on this host's
//! loopback (`UCX_TLS=tcp,self`, host memory), tests/vm/two-nodes.sh between the two lab VMs
//! over rxe, on p2pbuf device memory with and without `libp2pbuf_peermem.so`.

use crate::util::{heading, run_step, Ctx, Stamp};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Debian bookworm's UCX.
pub const DEBIAN_VERSION: &str = "1.13.1-1";
/// The packages unpacked into the staging root.
const PACKAGES: &[&str] = &["libucx0", "ucx-utils", "libucx-dev"];
/// The program's source, and its name in the guest (/p2pbuf/bin).
pub const PROGRAM_SRC: &str = "userspace/p2pbuf-peermem/c/ucp_put_get.c";
pub const PROGRAM: &str = "ucp-put-get";

pub fn staging(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("build/ucx-root")
}

/// The staging root's library directory (libucp, libuct, libucs, libucm; `ucx/` the modules).
pub fn lib_dir(ctx: &Ctx) -> PathBuf {
    staging(ctx).join("usr/lib/x86_64-linux-gnu")
}

fn deb_name(pkg: &str) -> String {
    format!("{pkg}_{DEBIAN_VERSION}_amd64.deb")
}

/// Stages UCX (quiet when it is there: one line).
pub fn ucx(ctx: &Ctx) -> Result<()> {
    heading(&format!(
        "UCX {DEBIAN_VERSION} (Debian bookworm's binary packages)"
    ));
    let dl = ctx.cache.join("dl");
    fs::create_dir_all(&dl)?;
    let missing: Vec<String> = PACKAGES
        .iter()
        .filter(|p| !dl.join(deb_name(p)).exists())
        .map(|p| format!("{p}={DEBIAN_VERSION}"))
        .collect();
    if !missing.is_empty() {
        run_step(
            ctx,
            &format!("apt-get download {}", missing.join(" ")),
            "ucx",
            Command::new("apt-get")
                .arg("-oAPT::Sandbox::User=root")
                .arg("download")
                .args(&missing)
                .current_dir(&dl),
        )
        .context(
            "could not download Debian bookworm's UCX packages (is this host's apt on bookworm?)",
        )?;
    }
    let mut h = Sha256::new();
    h.update(DEBIAN_VERSION.as_bytes());
    for p in PACKAGES {
        let deb = dl.join(deb_name(p));
        h.update(Sha256::digest(
            fs::read(&deb).with_context(|| format!("reading {}", deb.display()))?,
        ));
    }
    let hash: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let stamp = Stamp(ctx.cache.join("build/ucx.sha256"));
    let root = staging(ctx);
    let built = root.join("usr/bin/ucx_info").exists()
        && lib_dir(ctx).join("ucx/libuct_ib.so.0").exists()
        && root.join("usr/include/ucp/api/ucp.h").exists();
    if stamp.fresh(&hash) && built {
        println!("    UCX: up to date");
        return Ok(());
    }
    stamp.clear();
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root)?;
    for p in PACKAGES {
        run_step(
            ctx,
            &format!("dpkg-deb -x {}", deb_name(p)),
            "ucx",
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(dl.join(deb_name(p)))
                .arg(&root),
        )?;
    }
    stamp.set(&hash)?;
    Ok(())
}

/// The compiler's command for ucp-put-get into `out`: libucx-dev's headers, the p2pbuf uAPI
/// and the selftests' helpers (p2pbuf_test.h, p2pbuf_pattern.h), linked with libucp and libucs
/// of the staging root (found at run time in the system's library directory).
pub fn program_cc(ctx: &Ctx, out: &Path) -> Command {
    let lib = lib_dir(ctx);
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-g0", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}", staging(ctx).join("usr/include").display()))
        .arg(format!("-I{}", ctx.root.join("include").display()))
        .arg(format!("-I{}", ctx.root.join("tests/selftests").display()))
        .arg("-o")
        .arg(out)
        .arg(ctx.root.join(PROGRAM_SRC))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath-link,{}", lib.display()))
        .args(["-lucp", "-lucs"]);
    cc
}

/// What a run of ucp-put-get printed, and how it ended.
struct Ran {
    out: String,
    ok: bool,
}

fn wait_within(mut child: std::process::Child, what: &str, limit: Duration) -> Result<Ran> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            let mut out = String::new();
            if let Some(mut o) = child.stdout.take() {
                std::io::Read::read_to_string(&mut o, &mut out)?;
            }
            return Ok(Ran {
                out,
                ok: st.success(),
            });
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not end within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The lines of ucp-put-get's output that a good host run must have: (server, client).
fn host_check_verdict(server: &str, client: &str) -> Result<()> {
    let want_server = [
        "ucp_mem_map(address ",
        "UCP's memory type: host",
        "client: 1048576 bytes at offset 0 (seed 71): verified through the mapping",
        "client: 2097152 bytes at offset 3145728 (seed 72): verified through the mapping",
        "client: 1048576 bytes at offset 0 (seed 72): MISMATCH at offset 0",
        "done: 2 verified, 1 not",
    ];
    let want_client = [
        "ucp_get_nbx of 2097152 bytes at offset 3145728: the pattern of seed 72",
        "seed 72 at offset 0: not the pattern from its first byte, here and on the server",
        "\nOK\n",
    ];
    for (who, text, want) in [
        ("server", server, &want_server[..]),
        ("client", client, &want_client[..]),
    ] {
        if let Some(w) = want.iter().find(|w| !text.contains(*w)) {
            bail!("ucp-put-get {who}: no {w:?} in its output:\n{text}");
        }
    }
    Ok(())
}

/// ucp-put-get on this host: a server of host memory and a client on the loopback through
/// UCX's tcp transport (no RDMA device, no preload library), 3 MiB put, verified by the
/// server, read back; the wrong-seed checks must fail. A fraction of a second.
pub fn host_check(ctx: &Ctx) -> Result<()> {
    heading("host: ucp-put-get between two processes (UCX_TLS=tcp,self, host memory)");
    let dir = ctx.cache.join("build/ucx-check");
    fs::create_dir_all(&dir)?;
    let prog = dir.join(PROGRAM);
    run_step(
        ctx,
        &format!("cc {PROGRAM_SRC}"),
        "ucx",
        &mut program_cc(ctx, &prog),
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let run = |args: &[&str]| -> Result<std::process::Child> {
        Command::new(&prog)
            .args(args)
            .env("LD_LIBRARY_PATH", lib_dir(ctx))
            .env("UCX_TLS", "tcp,self")
            .env("UCX_NET_DEVICES", "lo")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("running {}", prog.display()))
    };
    let port_s = port.to_string();
    let server = run(&[
        "serve",
        "--port",
        &port_s,
        "--size",
        "8M",
        "--host-mem",
        "--timeout",
        "30",
    ])?;
    let client = run(&[
        "client",
        "--server",
        &format!("127.0.0.1:{port}"),
        "--timeout",
        "30",
        "1M:0:71",
        "2M:3M:72",
    ])?;
    let limit = Duration::from_secs(60);
    let c = wait_within(client, "ucp-put-get client", limit)?;
    let s = wait_within(server, "ucp-put-get server", limit)?;
    if !s.ok || !c.ok {
        bail!(
            "ucp-put-get on the loopback failed (server ok: {}, client ok: {}):\n{}\n{}",
            s.ok,
            c.ok,
            s.out,
            c.out
        );
    }
    host_check_verdict(&s.out, &c.out)?;
    println!("    ucp-put-get: 2 puts verified by the server, read back; the wrong seed refused on both ends");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_wants_every_line() {
        let server = "ucp_mem_map(address 0x1, length 8388608): OK, UCP's memory type: host\n\
            client: 1048576 bytes at offset 0 (seed 71): verified through the mapping\n\
            client: 2097152 bytes at offset 3145728 (seed 72): verified through the mapping\n\
            client: 1048576 bytes at offset 0 (seed 72): MISMATCH at offset 0\n\
            done: 2 verified, 1 not\n";
        let client = "ucp_get_nbx of 2097152 bytes at offset 3145728: the pattern of seed 72, 1.0 MiB/s\n\
            seed 72 at offset 0: not the pattern from its first byte, here and on the server, as it must be\n\
            OK\n";
        host_check_verdict(server, client).unwrap();
        let e = host_check_verdict(&server.replace("MISMATCH", "verified"), client)
            .unwrap_err()
            .to_string();
        assert!(e.contains("MISMATCH at offset 0"), "{e}");
        let e = host_check_verdict(server, &client.replace("OK\n", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("client"), "{e}");
    }

    #[test]
    fn the_program_is_built_against_the_staging_root() {
        let ctx = Ctx {
            root: "/r".into(),
            cache: "/c".into(),
            verbose: false,
            flavour: crate::util::Flavour::Debug,
        };
        let a: Vec<String> = program_cc(&ctx, Path::new("/o/p"))
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let inc = format!("-I{}", staging(&ctx).join("usr/include").display());
        for w in [inc.as_str(), "-Werror", "-lucp", "-lucs"] {
            assert!(a.iter().any(|x| x == w), "{w} not in {a:?}");
        }
        assert!(a.iter().any(|x| x.ends_with(PROGRAM_SRC)), "{a:?}");
    }
}
