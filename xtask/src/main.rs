//! `cargo xtask`: the p2pbuf VM lab.
//!
//! Fetches and builds Linux 7.3 with Rust, the project's modules and an initramfs, and runs
//! the whole stack in QEMU. Every step is idempotent; caches live outside the clone.

mod bench;
mod build;
mod judge;
mod series;
mod util;
mod vm;

// The stages' modules keep their own names at the crate root (`crate::kernel`, `crate::qemu`,
// ...): the folders group them by stage, and the files moved without their paths changing.
use build::{fabric, initramfs, kernel, modules, rdma_core, setup, ucx};
use judge::{boots, hostcheck, kcsan, ktap, kunit, suite};
use series::{mail, patches};
use vm::{nodes, qemu, vmrun};

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use qemu::{Mode, Topology, VmConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use util::{Ctx, Flavour};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "The p2pbuf VM lab: build Linux 7.3 + modules, run the stack in QEMU"
)]
struct Cli {
    /// Cache directory (kernel tree, build output, tools, VM files).
    #[arg(long, global = true, env = "P2PBUF_CACHE")]
    cache: Option<PathBuf>,
    /// Print every line of every step.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct BuildOpts {
    /// Build the kernel tree as it is (a developer's branch) instead of applying linux/series.
    #[arg(long, env = "P2PBUF_KEEP_TREE")]
    keep_tree: bool,
    /// Use the kernel already built in the cache, without running make on it (while someone
    /// else is building the tree).
    #[arg(long)]
    skip_kernel: bool,
}

#[derive(Args, Clone)]
struct VmOpts {
    /// Where the devices sit: behind one PCIe switch, or each on its own root port.
    #[arg(long, value_enum, default_value = "switch")]
    topology: Topology,
    /// Add an intel-iommu (DMA remapping: the THRU_HOST_BRIDGE map path).
    #[arg(long)]
    iommu: bool,
    /// QEMU CPU model (EPYC makes the kernel allow P2P through the host bridge).
    #[arg(long, default_value = "max")]
    cpu: String,
    /// Use KVM instead of TCG (nested KVM hangs on this project's build machines).
    #[arg(long)]
    kvm: bool,
    /// Emulated GPU memory (ivshmem BAR2) in MiB: a power of two up to 262144 (256 GiB). The
    /// backing file is sparse; above 1 GiB the guest gets RAM for the BAR's struct pages and
    /// q35's 64-bit PCI hole is widened to hold it.
    #[arg(long, default_value_t = 1024)]
    gpu_mem_mib: u64,
    /// Extra kernel command line words.
    #[arg(long)]
    append: Vec<String>,
}

impl VmOpts {
    fn config(&self, mode: Mode) -> VmConfig {
        VmConfig {
            topology: self.topology,
            iommu: self.iommu,
            kvm: self.kvm,
            cpu: self.cpu.clone(),
            gpu_mem_mib: self.gpu_mem_mib,
            mode,
            append: self.append.clone(),
            ..Default::default()
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing: Debian packages, rust-src, bindgen, libclang, Linux 7.3 source.
    Setup,
    /// Apply linux/series to the pristine tree, configure, build bzImage and modules.
    Kernel(BuildOpts),
    /// Build exporter-kmod/ and p2pbuf-dma/ against the kernel.
    Modules {
        /// Build with CLIPPY=1.
        #[arg(long)]
        clippy: bool,
    },
    /// Build rdma-core (Debian's source + linux/rdma-core patches) for the VM.
    RdmaCore,
    /// Build libfabric 2.1 (Debian's source) against that rdma-core, with fabtests.
    Libfabric,
    /// Stage UCX 1.13.1 (Debian bookworm's binary packages, unpacked) for the VM, and run
    /// ucp-put-get between two processes on this host (UCX_TLS=tcp,self, host memory).
    Ucx,
    /// Build rdma-core again with pyverbs and its tests/ (for the pyverbs boot).
    Pyverbs,
    /// Pack the initramfs: busybox, modules, tests, tools.
    Initramfs,
    /// Boot the VM (builds what is stale first).
    Vm {
        #[command(flatten)]
        build: BuildOpts,
        #[command(flatten)]
        vm: VmOpts,
        /// Drop into an interactive shell in the guest (quit with Ctrl-A X).
        #[arg(long)]
        shell: bool,
    },
    /// Host unit tests, then the in-VM suite; non-zero on any failure, oops, WARN, leak or hang.
    Test(TestArgs),
    /// Run every benchmark in the VM, on the bench kernel (linux/p2pbuf.config without its
    /// debug block, built under build/bench/); Markdown tables and SVG plots under results/.
    Bench(BenchArgs),
    /// Each series of linux/series as format-patch files with a cover letter, signed off by
    /// you, To/Cc from get_maintainer.pl; checkpatch --strict, kernel-doc, rustfmt.
    Patches(PatchesArgs),
    /// The main job: boot the lab and walk through the stack, explaining each step.
    Run {
        #[command(flatten)]
        build: BuildOpts,
        #[command(flatten)]
        vm: VmOpts,
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// 2: two VMs joined by a network, node B RDMA-writing into node A's device memory.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        nodes: u8,
    },
}

// The flags of `test`, `bench` and `patches` (their help is the variant's, in `Cmd`).

#[derive(Args)]
struct TestArgs {
    #[command(flatten)]
    build: BuildOpts,
    #[command(flatten)]
    vm: VmOpts,
    /// Skip the host-side `cargo test`.
    #[arg(long)]
    no_host: bool,
    /// Give up on the VM after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Only run in-VM tests whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Only these boots (repeatable): main, rootports, rootports-zen-iommu, p2pbuf-dma-icount,
    /// large-bar, pyverbs, kcsan (xtask/src/judge/boots.rs), and two-nodes (two VMs on one
    /// link, RDMA between them, last). Default: all of them but pyverbs (rdma-core's own test
    /// suite) and large-bar (a 256 GiB BAR, 10 to 13 min), each by name or by a --filter
    /// of its tests, and kcsan (the race tests on a KCSAN kernel, built under build/kcsan/
    /// for it: by name only), or one boot of the whole suite when --topology/--cpu/--iommu
    /// are given.
    #[arg(long = "boot")]
    boots: Vec<String>,
    /// Prove the harness catches trouble: `fail` adds a failing test, `warn` a kernel WARN.
    #[arg(long, value_parser = ["fail", "warn"])]
    inject: Option<String>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    build: BuildOpts,
    #[command(flatten)]
    vm: VmOpts,
    /// Repetitions per point (passed to each benchmark program as `argv[1]`).
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// VM runs (boots), each measuring every kind side by side: the tables pool their
    /// samples and README.md shows each run's ratio, which differ by more than one run's
    /// spread shows.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100),
          conflicts_with = "from_raw")]
    runs: u32,
    /// Where to write the results.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Give up on the VM after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// Only run benchmark programs whose file name contains this (programs named trace-*
    /// run only when it names them: --filter trace-small).
    #[arg(long)]
    filter: Option<String>,
    /// Boot nothing: write the results from a raw.txt of an earlier run (--reps is ignored).
    #[arg(long)]
    from_raw: Option<PathBuf>,
}

#[derive(Args)]
struct PatchesArgs {
    /// Where to write the series (one directory per series).
    #[arg(long, default_value = "target/patches")]
    out: PathBuf,
    /// First export this kernel-tree branch (commits from p2pbuf-base, e.g. p2pbuf) into
    /// the series directories of linux/series.
    #[arg(long)]
    update_from: Option<String>,
    /// For each series, git am its dependencies, then each of its patches onto a pristine
    /// worktree and build after each one.
    #[arg(long)]
    build_each: bool,
    /// With --build-each: build only this series (e.g. 4-rust-dma-buf; repeatable). The
    /// series it depends on are still applied first; the others are only emitted and checked.
    #[arg(long, value_name = "SERIES", requires = "build_each")]
    only: Vec<String>,
    /// Sign off as `Name <mail>` instead of git config user.name/user.email.
    #[arg(long)]
    signoff: Option<String>,
}

fn main() {
    let cli = Cli::parse();
    let start = Instant::now();
    if let Err(e) = real_main(cli) {
        eprintln!("\x1b[31merror\x1b[0m: {e:#}");
        std::process::exit(1);
    }
    println!("(took {:.0}s)", start.elapsed().as_secs_f64());
}

/// Holds the cache's lock: one `cargo xtask` at a time builds into the cache and boots from it
/// (two runs would boot each other's initramfs). Released when dropped.
fn lock_cache(ctx: &Ctx) -> Result<std::fs::File> {
    let path = ctx.cache.join("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    if f.try_lock().is_err() {
        println!(
            "    waiting for another `cargo xtask` that uses {} ...",
            ctx.cache.display()
        );
        f.lock()?;
    }
    Ok(f)
}

/// The dispatcher: each command to the stage that does it, under the cache's lock.
fn real_main(cli: Cli) -> Result<()> {
    let ctx = Ctx::new(cli.cache, cli.verbose)?;
    // Re-rendering bench results from a raw file touches nothing in the cache.
    let from_raw = matches!(
        &cli.cmd,
        Cmd::Bench(BenchArgs {
            from_raw: Some(_),
            ..
        })
    );
    let mut lock = if from_raw {
        None
    } else {
        Some(lock_cache(&ctx)?)
    };
    match cli.cmd {
        Cmd::Setup => setup::setup(&ctx),
        Cmd::Kernel(b) => kernel::kernel(
            &ctx,
            &kernel::KernelOpts {
                keep_tree: b.keep_tree,
            },
        ),
        Cmd::Modules { clippy } => modules::modules(&ctx, clippy),
        Cmd::RdmaCore => rdma_core::rdma_core(&ctx),
        Cmd::Pyverbs => rdma_core::pyverbs(&ctx),
        Cmd::Libfabric => rdma_core::rdma_core(&ctx).and_then(|()| fabric::libfabric(&ctx)),
        Cmd::Ucx => ucx::ucx(&ctx).and_then(|()| ucx::host_check(&ctx)),
        Cmd::Initramfs => initramfs::initramfs(&ctx).map(|_| ()),
        Cmd::Vm { build, vm, shell } => {
            let files = suite::build_all(&ctx, &build)?;
            let cfg = vm.config(if shell { Mode::Shell } else { Mode::Run });
            vm::lab::interactive(&cfg, &files)
        }
        Cmd::Test(t) => run_test(&ctx, t),
        Cmd::Patches(p) => {
            let opts = patches::PatchOpts {
                out: ctx.in_repo(p.out),
                update_from: p.update_from,
                build_each: p.build_each,
                only: p.only,
                signoff: p.signoff,
            };
            patches::patches(&ctx, &opts, lock.take())
        }
        Cmd::Bench(b) => run_bench(ctx, b),
        Cmd::Run {
            build,
            vm,
            timeout,
            nodes: 2,
        } => {
            let files = suite::build_all(&ctx, &build)?;
            nodes::two_nodes(
                &ctx,
                &vm.config(Mode::Node),
                &files.kernel,
                &files.initrd,
                Duration::from_secs(timeout),
                true,
            )
            .map(drop)
        }
        Cmd::Run {
            build, vm, timeout, ..
        } => {
            let files = suite::build_all(&ctx, &build)?;
            vm::lab::narrate(&ctx, &vm.config(Mode::Run), &files, timeout)
        }
    }
}

/// `cargo xtask test`: the host tests (after what their bindings need), then the in-VM suite.
fn run_test(ctx: &Ctx, t: TestArgs) -> Result<()> {
    if !t.no_host {
        // The userspace crates' bindings come from rdma-core's headers (bindgen,
        // libclang): build those first, as on a fresh machine there are none.
        setup::setup(ctx)?;
        rdma_core::rdma_core(ctx)?;
        fabric::libfabric(ctx)?;
        ucx::ucx(ctx)?;
        suite::host_tests(ctx)?;
    }
    suite::vm_tests(
        ctx,
        &t.build,
        &t.vm,
        &t.boots,
        t.timeout,
        t.filter.as_deref(),
        t.inject.as_deref(),
    )
}

/// `cargo xtask bench`: the bench kernel built and booted (or `--from-raw` written again).
fn run_bench(ctx: Ctx, b: BenchArgs) -> Result<()> {
    let out = ctx.in_repo(b.out);
    if let Some(raw) = b.from_raw {
        return bench::run::from_raw(&raw, &out);
    }
    let opts = bench::run::BenchOpts {
        reps: b.reps,
        runs: b.runs,
        out,
        timeout: Duration::from_secs(b.timeout),
        filter: b.filter,
    };
    opts.check()?;
    // Benchmarks run on their own kernel: the lab's configuration without the debug
    // block (DMA-API debugging, DEBUG_VM, DEBUG_OBJECTS...): they would be measured too.
    let ctx = ctx.with_flavour(Flavour::Bench);
    let files = suite::build_all(&ctx, &b.build)?;
    let kernel = kernel::describe(&ctx, b.build.keep_tree);
    bench::run::bench(&ctx, &files, &kernel, b.vm.config(Mode::Bench), &opts)
}
