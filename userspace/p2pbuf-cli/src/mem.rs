//! `--mem`: the one spelling of where a command's memory comes from.
//!
//! Every command that gets memory takes `--mem SOURCE` (`dma copy`, which has two
//! buffers, `--src-mem` and `--dst-mem`, beside its `--src-offset`/`--dst-offset`), parsed by
//! clap through [`parse`] into a [`Source`]: `p2pbuf`, `udmabuf`, `heap`, `host`, `cuda` or
//! `fd-from:SOCKET`, and the same default ([`Source::DEFAULT`]) everywhere. `rdma reg` and
//! `rdma serve` take `file:PATH` too ([`MemSpec`]).

use std::path::PathBuf;
use std::str::FromStr;

use p2pbuf::memory::Source;
use p2pbuf::Error;

/// The help of every `--mem` option.
pub const HELP: &str = "Where the memory comes from: p2pbuf (device memory from \
    /dev/p2pbuf), udmabuf (system memory as a dma-buf), heap (the system dma-buf heap), host \
    (memory of this process, no dma-buf), cuda (CUDA device memory), fd-from:SOCKET (a \
    dma-buf received from `p2pbuf alloc --send` or `p2pbuf send`). Every command defaults to \
    p2pbuf";

/// clap's parser for a [`Source`].
pub fn parse(s: &str) -> Result<Source, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

/// `--mem` of `rdma reg`/`rdma serve`: memory from [`p2pbuf::memory`], or any file's fd
/// (`file:PATH`, to see it refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemSpec {
    Memory(Source),
    File(PathBuf),
}

impl FromStr for MemSpec {
    type Err = String;

    /// A [`Source`], or `file:PATH`.
    fn from_str(s: &str) -> Result<MemSpec, String> {
        match s.split_once(':') {
            Some(("file", p)) if !p.is_empty() => Ok(MemSpec::File(p.into())),
            None if s == "file" => Err("file needs a path: file:PATH".into()),
            _ => parse(s).map(MemSpec::Memory),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_names_every_source() {
        for s in Source::SPELLINGS.split(", ") {
            assert!(HELP.contains(s), "{s} is missing from the --mem help");
        }
    }

    #[test]
    fn mem_specs() {
        let p = |s: &str| s.parse::<MemSpec>();
        assert_eq!(p("host").unwrap(), MemSpec::Memory(Source::Host));
        assert_eq!(p("heap").unwrap(), MemSpec::Memory(Source::Heap));
        assert_eq!(
            p("fd-from:/tmp/s").unwrap(),
            MemSpec::Memory(Source::FdFrom("/tmp/s".into()))
        );
        assert_eq!(p("file:/tmp/f").unwrap(), MemSpec::File("/tmp/f".into()));
        assert!(p("file").is_err());
        assert!(p("fd-from").unwrap_err().contains("needs a path"));
        assert!(p("host:/x").is_err());
        assert!(p("gpu").is_err());
    }
}
