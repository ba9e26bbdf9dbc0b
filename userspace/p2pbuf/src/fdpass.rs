//! Passing dma-buf fds between processes: `SCM_RIGHTS` over a Unix socket,
//! and `pidfd_open` + `pidfd_getfd` to take one from a process directly.
//!
//! The socket protocol is one message per buffer: a text header line
//! `p2pbuf-dmabuf 1 size=<bytes> exporter=<name>\n` carrying the fd as
//! `SCM_RIGHTS`, answered by one ack line from the receiver
//! (`ok <free text>\n` or `err <free text>\n`). The receiver checks the fd
//! itself; the header only lets it notice a mismatch.

use std::io::IoSlice;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags};
use serde::Serialize;

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result};

/// Most fds accepted in one message by [`recv_fds`] callers in this crate.
pub const MAX_FDS: usize = 8;

const MAGIC: &str = "p2pbuf-dmabuf";
const VERSION: u32 = 1;
const MAX_MSG: usize = 4096;

/// Send `payload` with `fds` attached as `SCM_RIGHTS`.
pub fn send_fds(sock: impl AsFd, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    if payload.is_empty() {
        return Err(Error::protocol(
            "sending fds",
            "payload must not be empty (a zero-byte message does not carry SCM_RIGHTS on stream sockets)",
        ));
    }
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Error::protocol("sending fds", "control buffer too small"));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| {
        Error::os_check(
            format!("sendmsg with {} fd(s)", fds.len()),
            e,
            "is the receiver still connected?",
        )
    })?;
    if n != payload.len() {
        return Err(Error::protocol(
            "sending fds",
            format!("short send: {n} of {} bytes", payload.len()),
        ));
    }
    Ok(())
}

/// Receive one message into `buf`, with room for at least `max_fds` fds
/// (the control buffer is rounded up to its alignment). Returns the byte
/// count and the fds (close-on-exec set). Fails if the kernel had to drop
/// fds (`MSG_CTRUNC`).
pub fn recv_fds(sock: impl AsFd, buf: &mut [u8], max_fds: usize) -> Result<(usize, Vec<OwnedFd>)> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| Error::os("recvmsg", e))?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(Error::protocol(
            "receiving fds",
            format!(
                "control message truncated (MSG_CTRUNC): the sender attached more than {max_fds} fd(s), or this process hit RLIMIT_NOFILE"
            ),
        ));
    }
    Ok((msg.bytes, fds))
}

/// The header that travels with a dma-buf fd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Header {
    /// Size the sender saw.
    pub size: u64,
    /// Exporter the sender saw.
    pub exporter: String,
}

impl Header {
    /// The wire form, one line.
    pub fn encode(&self) -> String {
        format!(
            "{MAGIC} {VERSION} size={} exporter={}\n",
            self.size,
            self.exporter.replace(char::is_whitespace, "_")
        )
    }

    /// Parse the wire form.
    pub fn decode(text: &str) -> Result<Self> {
        let bad = |d: String| Error::protocol("reading the dma-buf header", d);
        let line = text
            .strip_suffix('\n')
            .ok_or_else(|| bad(format!("no newline in {text:?}")))?;
        let mut words = line.split(' ');
        if words.next() != Some(MAGIC) {
            return Err(bad(format!(
                "expected {MAGIC:?} at the start, got {line:?}: is the peer `p2pbuf send`?"
            )));
        }
        let v = words.next().unwrap_or("");
        if v != VERSION.to_string() {
            return Err(bad(format!(
                "protocol version {v:?}, this side speaks {VERSION}"
            )));
        }
        let (mut size, mut exporter) = (None, None);
        for w in words {
            match w.split_once('=') {
                Some(("size", v)) => {
                    size = Some(
                        v.parse::<u64>()
                            .map_err(|e| bad(format!("size={v:?}: {e}")))?,
                    )
                }
                Some(("exporter", v)) => exporter = Some(v.to_string()),
                _ => {} // unknown fields are for later versions
            }
        }
        Ok(Header {
            size: size.ok_or_else(|| bad("no size=".into()))?,
            exporter: exporter.ok_or_else(|| bad("no exporter=".into()))?,
        })
    }
}

/// Send `buf` over a connected Unix stream socket.
pub fn send_dmabuf(sock: impl AsFd, buf: &DmaBuf) -> Result<()> {
    let h = Header {
        size: buf.size(),
        exporter: buf.exporter().to_string(),
    };
    send_fds(sock, h.encode().as_bytes(), &[buf.as_fd()])
}

/// A dma-buf received from a peer.
#[derive(Debug)]
pub struct Received {
    /// The buffer, checked locally (its fdinfo is this process's view).
    pub buf: DmaBuf,
    /// What the sender said about it.
    pub header: Header,
    /// The sender's pid, from `SO_PEERCRED`, when available.
    pub peer_pid: Option<i32>,
}

/// Receive one dma-buf sent with [`send_dmabuf`].
pub fn recv_dmabuf(sock: impl AsFd) -> Result<Received> {
    let sock = sock.as_fd();
    let mut data = [0u8; MAX_MSG];
    let (n, mut fds) = recv_fds(sock, &mut data, MAX_FDS)?;
    if n == 0 {
        return Err(Error::protocol(
            "receiving a dma-buf",
            "the peer closed the connection without sending anything",
        ));
    }
    let text = std::str::from_utf8(&data[..n])
        .map_err(|e| Error::protocol("receiving a dma-buf", format!("header is not UTF-8: {e}")))?;
    let header = Header::decode(text)?;
    if fds.len() != 1 {
        return Err(Error::protocol(
            "receiving a dma-buf",
            format!("expected 1 fd with the header, got {}", fds.len()),
        ));
    }
    let buf = DmaBuf::from_fd(fds.pop().expect("one fd"))?;
    let peer_pid = rustix::net::sockopt::socket_peercred(sock)
        .ok()
        .map(|c| c.pid.as_raw_nonzero().get());
    Ok(Received {
        buf,
        header,
        peer_pid,
    })
}

/// Send the receiver's one-line answer (`ok ...` or `err ...`).
pub fn send_ack(sock: impl AsFd, ok: bool, text: &str) -> Result<()> {
    let line = format!(
        "{} {}\n",
        if ok { "ok" } else { "err" },
        text.replace('\n', " ")
    );
    let n = rustix::net::send(sock, line.as_bytes(), SendFlags::NOSIGNAL)
        .map_err(|e| Error::os("sending the ack", e))?;
    if n != line.len() {
        return Err(Error::protocol("sending the ack", "short send"));
    }
    Ok(())
}

/// Wait for the receiver's answer. `Ok(text)` for `ok`, an error carrying
/// the text for `err`.
pub fn recv_ack(sock: impl AsFd) -> Result<String> {
    let sock = sock.as_fd();
    let mut data = Vec::new();
    let mut chunk = [0u8; 512];
    while !data.contains(&b'\n') && data.len() < MAX_MSG {
        let n = rustix::net::recv(sock, &mut chunk, RecvFlags::empty())
            .map_err(|e| Error::os("waiting for the receiver's ack", e))?
            .0;
        if n == 0 {
            break;
        }
        data.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&data);
    let line = text.lines().next().unwrap_or("");
    match line.split_once(' ').unwrap_or((line, "")) {
        ("ok", rest) => Ok(rest.to_string()),
        ("err", rest) => Err(Error::protocol("the receiver", rest.to_string())),
        _ if data.is_empty() => Err(Error::protocol(
            "waiting for the receiver's ack",
            "the receiver closed the connection without answering",
        )),
        _ => Err(Error::protocol(
            "waiting for the receiver's ack",
            format!("unexpected answer {line:?}"),
        )),
    }
}

/// Connect to a receiver's Unix socket, retrying for `wait` seconds while it does not exist
/// yet or nobody listens on it.
pub fn connect(socket: &Path, wait: u64) -> Result<UnixStream> {
    let deadline = Instant::now() + Duration::from_secs(wait);
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e)
                if Instant::now() < deadline
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                return Err(Error::Io {
                    what: format!("connecting to the receiver (waited {wait} s)"),
                    path: socket.to_path_buf(),
                    source: e,
                    check: Some("is `p2pbuf recv SOCKET` running?".into()),
                })
            }
        }
    }
}

/// Send `buf` to the receiver on `socket` (waiting `wait` seconds for it) and return its
/// answer.
pub fn send_to(socket: &Path, buf: &DmaBuf, wait: u64) -> Result<String> {
    let s = connect(socket, wait)?;
    send_dmabuf(&s, buf)?;
    recv_ack(&s)
}

/// Listen on a Unix socket at `socket`. A socket file nobody listens on is left over from a
/// previous run and is removed; anything else at the path is refused.
pub fn listen(socket: &Path) -> Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(md) = std::fs::symlink_metadata(socket) {
        let stale = md.file_type().is_socket() && UnixStream::connect(socket).is_err();
        if !stale {
            return Err(Error::Unavailable {
                what: format!("listening on {}", socket.display()),
                detail: "the path exists and is not a stale socket".into(),
                check: Some("another `p2pbuf recv` on it, or choose another path".into()),
            });
        }
        let _ = std::fs::remove_file(socket);
    }
    UnixListener::bind(socket).map_err(|e| Error::Io {
        what: "listening on a Unix socket".into(),
        path: socket.to_path_buf(),
        source: e,
        check: Some("does the directory exist and is it writable?".into()),
    })
}

/// Listen on `socket`, wait up to `wait` seconds for one sender (`p2pbuf alloc --send`,
/// `p2pbuf send`), receive its dma-buf and answer `ok <ack>`; the socket file is removed.
pub fn receive_one(socket: &Path, wait: u64, ack: &str) -> Result<DmaBuf> {
    let l = listen(socket)?;
    l.set_nonblocking(true).ok();
    let deadline = Instant::now() + Duration::from_secs(wait);
    let conn = loop {
        match l.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => {
                let _ = std::fs::remove_file(socket);
                return Err(Error::Io {
                    what: format!("waiting {wait} s for a dma-buf"),
                    path: socket.to_path_buf(),
                    source: e,
                    check: Some(
                        "start `p2pbuf alloc --mem udmabuf --size S --send SOCKET` (or `p2pbuf send SOCKET FD`)"
                            .into(),
                    ),
                });
            }
        }
    };
    let _ = std::fs::remove_file(socket);
    conn.set_nonblocking(false).ok();
    match recv_dmabuf(&conn) {
        Ok(got) => {
            send_ack(&conn, true, ack)?;
            Ok(got.buf)
        }
        Err(e) => {
            let _ = send_ack(&conn, false, &e.to_string());
            Err(e)
        }
    }
}

/// A pidfd: a handle on a process that cannot be confused with a later one
/// reusing its pid.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: i32,
}

impl Pidfd {
    /// `pidfd_open(pid, 0)`.
    pub fn open(pid: i32) -> Result<Self> {
        let p = if pid > 0 { Pid::from_raw(pid) } else { None }
            .ok_or_else(|| Error::protocol("pidfd_open", format!("{pid} is not a valid pid")))?;
        let fd = rustix::process::pidfd_open(p, PidfdFlags::empty())
            .map_err(|e| Error::os_check(format!("pidfd_open({pid})"), e, pidfd_check(e)))?;
        Ok(Pidfd { fd, pid })
    }

    /// The pid it was opened for.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// `pidfd_getfd(pidfd, target, 0)`: a copy of fd `target` of that
    /// process, close-on-exec set.
    pub fn get_fd(&self, target: RawFd) -> Result<OwnedFd> {
        rustix::process::pidfd_getfd(&self.fd, target, PidfdGetfdFlags::empty()).map_err(|e| {
            Error::os_check(
                format!("pidfd_getfd(pid {}, fd {target})", self.pid),
                e,
                pidfd_check(e),
            )
        })
    }

    /// [`get_fd`](Self::get_fd), checked to be a dma-buf.
    pub fn get_dmabuf(&self, target: RawFd) -> Result<DmaBuf> {
        DmaBuf::from_fd(self.get_fd(target)?)
            .map_err(|e| e.with_what(format!("checking fd {target} of pid {}", self.pid)))
    }
}

owns_fd!(Pidfd, fd);

fn pidfd_check(e: rustix::io::Errno) -> String {
    use rustix::io::Errno;
    match e {
        Errno::SRCH => "no such process (has it exited?)".into(),
        Errno::PERM | Errno::ACCESS => "pidfd_getfd needs ptrace access to the target: the same uid with kernel.yama.ptrace_scope=0, or CAP_SYS_PTRACE".into(),
        Errno::BADF => "is that fd open in the target process (ls -l /proc/<pid>/fd)?".into(),
        Errno::NOSYS => "needs Linux 5.6 or newer, and a seccomp policy that allows pidfd_open/pidfd_getfd".into(),
        _ => "see pidfd_getfd(2)".into(),
    }
}

impl DmaBuf {
    /// Take a copy of fd `fd` of process `pid` with `pidfd_getfd`.
    pub fn from_process(pid: i32, fd: RawFd) -> Result<Self> {
        Pidfd::open(pid)?.get_dmabuf(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn memfd_with(text: &[u8]) -> std::fs::File {
        let fd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(text).unwrap();
        f
    }

    #[test]
    fn header_round_trip() {
        let h = Header {
            size: 2 << 20,
            exporter: "nv_dmabuf".into(),
        };
        let wire = h.encode();
        assert_eq!(wire, "p2pbuf-dmabuf 1 size=2097152 exporter=nv_dmabuf\n");
        assert_eq!(Header::decode(&wire).unwrap(), h);
    }

    #[test]
    fn header_errors() {
        for (text, needle) in [
            ("hello\n", "is the peer"),
            ("p2pbuf-dmabuf 2 size=1 exporter=x\n", "version"),
            ("p2pbuf-dmabuf 1 exporter=x\n", "no size"),
            ("p2pbuf-dmabuf 1 size=1\n", "no exporter"),
            ("p2pbuf-dmabuf 1 size=-1 exporter=x\n", "size="),
            ("p2pbuf-dmabuf 1 size=1 exporter=x", "no newline"),
        ] {
            let e = Header::decode(text).unwrap_err();
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
        // Unknown fields are ignored.
        assert!(Header::decode("p2pbuf-dmabuf 1 size=1 exporter=x later=y\n").is_ok());
    }

    #[test]
    fn fds_travel_over_scm_rights() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = memfd_with(b"hello through SCM_RIGHTS");
        send_fds(&a, b"x", &[f.as_fd()]).unwrap();
        drop(f);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_fds(&b, &mut buf, MAX_FDS).unwrap();
        assert_eq!(&buf[..n], b"x");
        assert_eq!(fds.len(), 1);
        let mut g = std::fs::File::from(fds.into_iter().next().unwrap());
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello through SCM_RIGHTS");
    }

    #[test]
    fn too_many_fds_is_ctrunc() {
        let (a, b) = UnixStream::pair().unwrap();
        // Room for one fd is rounded up for alignment (rustix leaves room
        // for up to four on x86-64), so send ten.
        let f: Vec<_> = (0..10).map(|_| memfd_with(b"1")).collect();
        let fds: Vec<_> = f.iter().map(|f| f.as_fd()).collect();
        send_fds(&a, b"x", &fds).unwrap();
        let mut buf = [0u8; 16];
        let e = recv_fds(&b, &mut buf, 1).unwrap_err();
        assert!(e.to_string().contains("MSG_CTRUNC"), "{e}");
    }

    #[test]
    fn empty_payload_is_refused() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(send_fds(&a, b"", &[]).is_err());
    }

    #[test]
    fn recv_dmabuf_rejects_a_memfd() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = memfd_with(b"not a dma-buf");
        let h = Header {
            size: 13,
            exporter: "fake".into(),
        };
        send_fds(&a, h.encode().as_bytes(), &[f.as_fd()]).unwrap();
        let e = recv_dmabuf(&b).unwrap_err();
        assert!(matches!(e, Error::NotDmaBuf { .. }), "{e:?}");
    }

    #[test]
    fn recv_dmabuf_without_fd() {
        let (a, b) = UnixStream::pair().unwrap();
        let h = Header {
            size: 1,
            exporter: "x".into(),
        };
        send_fds(&a, h.encode().as_bytes(), &[]).unwrap();
        let e = recv_dmabuf(&b).unwrap_err();
        assert!(e.to_string().contains("expected 1 fd"), "{e}");
    }

    #[test]
    fn recv_dmabuf_from_closed_peer() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let e = recv_dmabuf(&b).unwrap_err();
        assert!(e.to_string().contains("closed the connection"), "{e}");
    }

    #[test]
    fn acks() {
        let (a, b) = UnixStream::pair().unwrap();
        send_ack(&a, true, "exp_name nv_dmabuf\nsize 2").unwrap();
        assert_eq!(recv_ack(&b).unwrap(), "exp_name nv_dmabuf size 2");
        send_ack(&a, false, "mmap failed").unwrap();
        let e = recv_ack(&b).unwrap_err();
        assert!(e.to_string().contains("mmap failed"), "{e}");
        drop(a);
        let e = recv_ack(&b).unwrap_err();
        assert!(e.to_string().contains("without answering"), "{e}");
    }

    #[test]
    fn pidfd_getfd_on_self() {
        let f = memfd_with(b"via pidfd_getfd");
        let me = std::process::id() as i32;
        let pidfd = match Pidfd::open(me) {
            Ok(p) => p,
            Err(e) if matches!(e.errno(), Some(38) | Some(1)) => {
                eprintln!("skipping: pidfd_open unavailable here: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let got = match pidfd.get_fd(f.as_raw_fd()) {
            Ok(g) => g,
            Err(e) if matches!(e.errno(), Some(38) | Some(1)) => {
                eprintln!("skipping: pidfd_getfd unavailable here: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut g = std::fs::File::from(got);
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "via pidfd_getfd");
        // Not a dma-buf: the checked variant refuses it.
        let e = pidfd.get_dmabuf(f.as_raw_fd()).unwrap_err();
        assert!(matches!(e, Error::NotDmaBuf { .. }), "{e:?}");
    }

    #[test]
    fn pidfd_errors_say_what_to_check() {
        let e = Pidfd::open(-5).unwrap_err();
        assert!(e.to_string().contains("not a valid pid"), "{e}");
        if let Ok(p) = Pidfd::open(std::process::id() as i32) {
            let e = p.get_fd(987_654).unwrap_err();
            if e.errno() == Some(9) {
                assert!(e.check().unwrap().contains("fd open"), "{e}");
            }
        }
    }
}
