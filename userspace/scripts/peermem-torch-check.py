#!/usr/bin/env python3
"""PyTorch as the client of libp2pbuf_peermem.so: plain ibv_reg_mr() on tensors.

Registers PyTorch tensors (whole tensors of many sizes, views at offsets, tensors freed and
reallocated at the same address, host tensors) through plain ibv_reg_mr, with the library
preloaded, into the stand-in provider (libstandin-provider.so, built by
userspace/scripts/peermem-gpu-bundle.sh from userspace/p2pbuf-peermem/c/standin_provider.c:
there is no RDMA device on the GPU machine). Each check compares what reached the provider (the
dma-buf's size, the offset in it, the length and iova) with what CUDA says about the pointer
(cuMemGetAddressRange, through ctypes on libcuda): the dma-buf must be exactly the allocation
(cudaMalloc'd segment) or, with expandable segments, the CUDA VMM mapping that holds the tensor,
at the tensor's offset in it; a tensor over two VMM mappings must be refused (EINVAL) without
reaching the provider.

Usage (from the bundle directory, whose lib/ has libibverbs):
  LD_LIBRARY_PATH=lib LD_PRELOAD=./libp2pbuf_peermem.so \\
      [PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True] python3 peermem-torch-check.py [BUNDLE]
Prints PASS/FAIL lines and a total; exits 0 if every check passed.
"""

import ctypes
import os
import random
import sys

BUNDLE = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__))
ACCESS = 1 | 2 | 4  # LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
PAGE = os.sysconf("SC_PAGE_SIZE")
EINVAL = 22


class Record(ctypes.Structure):
    """struct standin_record (standin_provider.h)."""

    _fields_ = [
        ("reg_mr_calls", ctypes.c_uint64),
        ("dmabuf_calls", ctypes.c_uint64),
        ("addr", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("iova", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("fd", ctypes.c_int64),
        ("is_dmabuf", ctypes.c_uint64),
        ("dmabuf_size", ctypes.c_uint64),
        ("exp_name", ctypes.c_char * 64),
        ("access", ctypes.c_uint64),
    ]


class IbvMr(ctypes.Structure):
    """The start of struct ibv_mr (verbs.h)."""

    _fields_ = [
        ("context", ctypes.c_void_p),
        ("pd", ctypes.c_void_p),
        ("addr", ctypes.c_void_p),
        ("length", ctypes.c_size_t),
        ("handle", ctypes.c_uint32),
        ("lkey", ctypes.c_uint32),
        ("rkey", ctypes.c_uint32),
    ]


class Verbs:
    """libibverbs (global: the preloaded library finds the real functions after itself), the
    stand-in provider, and ibv_reg_mr as the program sees it (the global lookup: the preloaded
    library's, when there is one)."""

    def __init__(self):
        self.ib = ctypes.CDLL("libibverbs.so.1", mode=ctypes.RTLD_GLOBAL, use_errno=True)
        self.standin = ctypes.CDLL(os.path.join(BUNDLE, "libstandin-provider.so"), use_errno=True)
        glob = ctypes.CDLL(None, use_errno=True)
        self.reg_mr = glob.ibv_reg_mr
        self.reg_mr.restype = ctypes.POINTER(IbvMr)
        self.reg_mr.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.dereg_mr = glob.ibv_dereg_mr
        self.dereg_mr.argtypes = [ctypes.POINTER(IbvMr)]
        self.preloaded = ctypes.cast(self.reg_mr, ctypes.c_void_p).value != ctypes.cast(
            self.ib.ibv_reg_mr, ctypes.c_void_p
        ).value
        self.ib.ibv_get_device_list.restype = ctypes.c_void_p
        self.ib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
        self.ib.ibv_free_device_list.argtypes = [ctypes.c_void_p]
        self.ib.ibv_alloc_pd.restype = ctypes.c_void_p
        self.ib.ibv_alloc_pd.argtypes = [ctypes.c_void_p]
        self.standin.standin_open.restype = ctypes.c_void_p
        self.standin.standin_last.argtypes = [ctypes.POINTER(Record)]
        self.pd = None

    def devices(self):
        n = ctypes.c_int(-1)
        lst = self.ib.ibv_get_device_list(ctypes.byref(n))
        if lst:
            self.ib.ibv_free_device_list(lst)
        return n.value

    def open(self):
        ctx = self.standin.standin_open()
        if not ctx:
            raise OSError(ctypes.get_errno(), "standin_open failed (verbs_init_and_alloc_context)")
        self.pd = self.ib.ibv_alloc_pd(ctx)
        if not self.pd:
            raise OSError(ctypes.get_errno(), "ibv_alloc_pd on the stand-in context failed")

    def register(self, addr, length):
        """(mr or None, errno, what the provider recorded)."""
        self.standin.standin_reset()
        ctypes.set_errno(0)
        mr = self.reg_mr(self.pd, addr, length, ACCESS)
        err = ctypes.get_errno()
        rec = Record()
        self.standin.standin_last(ctypes.byref(rec))
        return (mr if mr else None), err, rec

    def deregister(self, mr):
        rc = self.dereg_mr(mr)
        if rc:
            raise OSError(rc, "ibv_dereg_mr failed")


class Cuda:
    """cuMemGetAddressRange on libcuda (loaded by PyTorch already)."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.cu.cuMemGetAddressRange_v2.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]

    def address_range(self, ptr):
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        r = self.cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr)
        if r:
            raise RuntimeError(f"cuMemGetAddressRange({ptr:#x}) failed: CUDA error {r}")
        return base.value, size.value


class Checks:
    def __init__(self, verbs, cuda):
        self.v, self.c = verbs, cuda
        self.passed = self.failed = 0
        self.exported = self.refused = 0

    def result(self, ok, what):
        print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def device(self, ptr, length, what):
        """Registers [ptr, ptr + length) of device memory and compares with CUDA's range."""
        base, size = self.c.address_range(ptr)
        whole = -(-(base + size) // PAGE) * PAGE - (base & ~(PAGE - 1))
        inside = ptr + length <= base + size
        mr, err, rec = self.v.register(ptr, length)
        if not inside:
            ok = mr is None and err == EINVAL and rec.dmabuf_calls == 0 and rec.reg_mr_calls == 0
            self.result(
                ok,
                f"{what}: [{ptr:#x}, +{length}) runs past CUDA's range {base:#x}+{size}: "
                f"{'refused with EINVAL' if ok else f'mr {bool(mr)}, errno {err}, reg_dmabuf_mr {rec.dmabuf_calls}, reg_mr {rec.reg_mr_calls}'}",
            )
            self.refused += ok
            if mr:
                self.v.deregister(mr)
            return None
        ok = (
            mr is not None
            and rec.dmabuf_calls == 1
            and rec.reg_mr_calls == 0
            and rec.is_dmabuf
            and rec.dmabuf_size == whole
            and rec.offset == ptr - (base & ~(PAGE - 1))
            and rec.length == length
            and rec.iova == ptr
            and mr.contents.addr == ptr
        )
        self.exported += ok
        self.result(
            ok,
            f"{what}: [{ptr:#x}, +{length}) -> reg_dmabuf_mr {rec.dmabuf_calls}, reg_mr {rec.reg_mr_calls}, "
            f"{rec.exp_name.decode() or '?'} dma-buf of {rec.dmabuf_size} bytes at offset {rec.offset:#x}; "
            f"CUDA's range {base:#x}+{size} (offset {ptr - base:#x}) (errno {err})",
        )
        return mr

    def host(self, ptr, length, what):
        mr, err, rec = self.v.register(ptr, length)
        ok = mr is not None and rec.reg_mr_calls == 1 and rec.dmabuf_calls == 0 and rec.addr == ptr
        self.result(ok, f"{what}: [{ptr:#x}, +{length}) -> reg_mr {rec.reg_mr_calls}, reg_dmabuf_mr {rec.dmabuf_calls} (errno {err})")
        if mr:
            self.v.deregister(mr)


def open_fds():
    """{fd: what it refers to} for this process."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the directory's own fd, closed by now
    return fds


def dmabuf_fds(fds):
    return {fd: what for fd, what in fds.items() if what.startswith(("/dmabuf:", "anon_inode:dmabuf"))}


def run(torch, ch):
    rnd = random.Random(29)
    dev = torch.device("cuda")
    # Many tensors of many sizes, all registered at once, then deregistered.
    tensors = [
        torch.empty(rnd.choice([256, 4096, 65536, 1 << 20, 3 << 20, 17 << 20, 64 << 20]) + rnd.randrange(0, 4096, 256),
                    dtype=torch.uint8, device=dev)
        for _ in range(200)
    ]
    mrs = [ch.device(t.data_ptr(), t.numel(), f"tensor {i} of {t.numel()} bytes") for i, t in enumerate(tensors)]
    for mr in mrs:
        if mr:
            ch.v.deregister(mr)
    # Views at offsets: tensor[k:].
    big = torch.empty(48 << 20, dtype=torch.uint8, device=dev)
    for k in [0, 1, 255, 4096, 4097, (2 << 20) - 1, 2 << 20, (20 << 20) + 12345, (48 << 20) - 4096]:
        v = big[k:]
        mr = ch.device(v.data_ptr(), min(v.numel(), 1 << 20), f"view big[{k}:] (first MiB at most)")
        if mr:
            ch.v.deregister(mr)
    del tensors, mrs, big, v
    # Freed and reallocated at the same address: by the caching allocator (same segment), and
    # after empty_cache() (the segment goes back to CUDA; a new one may take its address).
    for size, again, flush in [(1 << 20, 1 << 20, False), (8 << 20, 2 << 20, True), (32 << 20, 64 << 20, True)]:
        a = torch.empty(size, dtype=torch.uint8, device=dev)
        pa = a.data_ptr()
        mr = ch.device(pa, size, f"tensor of {size} bytes before it is freed")
        if mr:
            ch.v.deregister(mr)
        del a
        if flush:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        b = torch.empty(again, dtype=torch.uint8, device=dev)
        pb = b.data_ptr()
        same = "the same address" if pb == pa else "another address"
        mr = ch.device(pb, again, f"tensor of {again} bytes allocated after it{' and empty_cache()' if flush else ''}, at {same}")
        if mr:
            ch.v.deregister(mr)
        del b
    # Host tensors pass through.
    cpu = torch.empty(1 << 20, dtype=torch.uint8)
    ch.host(cpu.data_ptr(), cpu.numel(), "CPU tensor")
    pinned = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    ch.host(pinned.data_ptr(), pinned.numel(), "pinned CPU tensor (pin_memory=True)")


def main():
    import torch

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "(default)"
    print(f"# PyTorch {torch.__version__}, {torch.cuda.get_device_name(0)}, PYTORCH_CUDA_ALLOC_CONF={conf}")
    torch.empty(1, device="cuda")  # CUDA initialised, the primary context current
    verbs, cuda = Verbs(), Cuda()
    print(f"# RDMA devices: {verbs.devices()}; ibv_reg_mr is {'the preloaded library' if verbs.preloaded else 'libibverbs'}'s")
    verbs.open()
    ch = Checks(verbs, cuda)
    ch.result(verbs.preloaded, "libp2pbuf_peermem.so is preloaded (ibv_reg_mr is not libibverbs')")
    before = open_fds()
    run(torch, ch)
    torch.cuda.synchronize()
    after = open_fds()
    left = dmabuf_fds(after).keys() - dmabuf_fds(before).keys()
    others = {fd: after[fd] for fd in after.keys() - before.keys() if fd not in left}
    ch.result(not left, f"no dma-buf fd left behind after the deregistrations ({len(left)} left: {sorted(left)}; "
              f"new fds that are not dma-bufs: {others or 'none'}; /proc/PID/maps is the library's own, kept open for its lookups)")
    print(f"# total: {ch.passed} passed, {ch.failed} failed ({conf}); {ch.exported} registrations exported exactly as CUDA's range, {ch.refused} refused over two VMM mappings")
    return 1 if ch.failed else 0


if __name__ == "__main__":
    sys.exit(main())
