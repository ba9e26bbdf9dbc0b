//! The CLI's failure modes on a host without GPU or dma-buf exporters.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn p2pbuf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_p2pbuf"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `o` exited 69 (EX_UNAVAILABLE) and its stderr says `says`.
fn assert_unavailable(o: &std::process::Output, says: &str) {
    assert_eq!(o.status.code(), Some(69), "{}", stderr(o));
    assert!(stderr(o).contains(says), "{}", stderr(o));
}

#[test]
fn info_rejects_a_device_node() {
    let o = p2pbuf(&["info", "/dev/null"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not a dma-buf"), "{}", stderr(&o));
}

#[test]
fn info_of_a_closed_fd_says_ebadf() {
    let o = p2pbuf(&["info", "987"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("errno 9"), "{}", stderr(&o));
}

#[test]
fn info_json_error() {
    let o = p2pbuf(&["--json", "info", "/proc/self/fdinfo/0"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("no exp_name"), "{v}");
    assert_eq!(v["unavailable"], false);
}

#[test]
fn info_without_target_needs_the_exporter() {
    if std::path::Path::new("/dev/p2pbuf").exists() {
        return;
    }
    assert_unavailable(&p2pbuf(&["info"]), "/dev/p2pbuf");
}

#[test]
fn send_without_receiver() {
    // Target check comes first: stdin (null) is not a dma-buf.
    let o = p2pbuf(&["send", "/nonexistent/sock", "0", "--wait", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not a dma-buf"), "{}", stderr(&o));
}

#[test]
fn cuda_without_gpu_or_feature_is_unavailable() {
    let o = p2pbuf(&["cuda", "probe"]);
    if o.status.success() {
        return; // a GPU machine with the feature on
    }
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

#[test]
fn recv_refuses_a_memfd_and_tells_the_sender() {
    let dir = std::env::temp_dir().join(format!("p2pbuf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s");
    let child = Command::new(env!("CARGO_BIN_EXE_p2pbuf"))
        .args(["recv", sock.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        match UnixStream::connect(&sock) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("receiver never listened: {e}"),
        }
    };
    let memfd = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let h = p2pbuf::fdpass::Header {
        size: 4096,
        exporter: "fake".into(),
    };
    p2pbuf::fdpass::send_fds(&s, h.encode().as_bytes(), &[memfd.as_fd()]).unwrap();
    let e = p2pbuf::fdpass::recv_ack(&s).unwrap_err();
    assert!(e.to_string().contains("not a dma-buf"), "{e}");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not a dma-buf"), "{}", stderr(&o));
    assert!(!sock.exists(), "socket file left behind");
    std::fs::remove_dir_all(dir).unwrap();
}

fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn rdma_serve_without_a_device_says_how_to_get_one() {
    if has_rdma_device() {
        return;
    }
    let o = p2pbuf(&["rdma", "serve", "--size", "1M", "--timeout", "1"]);
    assert_unavailable(&o, "rdma link add rxe0");
    let o = p2pbuf(&["--json", "rdma", "reg", "--mem", "host", "--size", "4096"]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["unavailable"], true, "{v}");
}

#[test]
fn rdma_usage_errors() {
    let o = p2pbuf(&["rdma", "write", "--server", "127.0.0.1", "--size", "4096"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--pattern"), "{}", stderr(&o));
    let o = p2pbuf(&["rdma", "reg", "--mem", "fd-from"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("needs a path"), "{}", stderr(&o));
    let o = p2pbuf(&["rdma", "reg", "--mem", "host", "--access", "bogus"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn alloc_from_a_missing_exporter_is_unavailable() {
    if std::path::Path::new("/dev/p2pbuf").exists() {
        return;
    }
    let o = p2pbuf(&["alloc", "--mem", "p2pbuf", "--size", "4096"]);
    assert_unavailable(&o, "/dev/p2pbuf");
}

#[test]
fn nvme_without_the_drive_is_unavailable() {
    let o = p2pbuf(&[
        "nvme",
        "read",
        "--dev",
        "/nonexistent/nvme0n1",
        "--len",
        "4k",
    ]);
    assert_unavailable(&o, "does not exist");
}

#[test]
fn nvme_zero_length_is_refused() {
    let o = p2pbuf(&["nvme", "write", "--dev", "/dev/null", "--len", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--len"), "{}", stderr(&o));
}

#[test]
fn dma_copy_checks_length_then_the_engine() {
    let o = p2pbuf(&["dma", "copy", "--len", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("at least 1 byte"), "{}", stderr(&o));
    let o = p2pbuf(&[
        "--json",
        "dma",
        "copy",
        "--len",
        "4k",
        "--device",
        "/nonexistent/p2pbuf-dma",
    ]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("p2pbuf_dma"), "{v}");
    assert_eq!(v["unavailable"], true);
}

#[test]
fn alloc_surface_is_validated_before_any_device() {
    // Each is refused with exit 2 and says why, whatever exporter the machine has.
    // (The words of each command line after `alloc`, and what the refusal says.)
    for (args, says) in [
        (
            "--surface 1920x1080 --format NV21 --stride 100",
            "stride 100 is less than a row's 1920 bytes",
        ),
        (
            "--surface 1920x1080 --size 100",
            "the surface needs 8294400 bytes",
        ),
        ("--surface 0x1080", "width 0 is out of range"),
        ("--surface 1921x1080 --format NV12", "width divisible by 2"),
        (
            "--surface 64x64 --modifier 0x0300000000000001",
            "vendor-private",
        ),
        (
            "--surface 64x64 --modifier I915_Y_TILED --stride 300",
            "not a multiple of the 128-byte tile width",
        ),
        ("--surface 64x64 --format ZZZZ", "not a DRM fourcc"),
        ("--surface 64", "expected WIDTHxHEIGHT"),
        ("--format XR24 --size 4096", "--surface"),
    ] {
        let mut a = vec!["alloc"];
        a.extend(args.split_whitespace());
        let o = p2pbuf(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
    let o = p2pbuf(&["--json", "alloc", "--surface", "16x16", "--size", "1"]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("needs 1024 bytes"),
        "{v}"
    );
}

#[test]
fn alloc_surface_reaches_the_exporter() {
    // A valid surface gets as far as the exporter: on a host without /dev/udmabuf that is
    // the "unavailable" exit, not a validation error.
    if std::path::Path::new("/dev/udmabuf").exists() {
        return;
    }
    let o = p2pbuf(&[
        "alloc",
        "--mem",
        "udmabuf",
        "--surface",
        "1920x1080",
        "--format",
        "NV12",
    ]);
    assert_unavailable(&o, "/dev/udmabuf");
}
