//! Unit tests of the library's decisions (access flags, classification, fitting).

use super::*;

#[test]
fn access_flags_for_a_dmabuf_registration() {
    let rw =
        acc::IBV_ACCESS_LOCAL_WRITE | acc::IBV_ACCESS_REMOTE_WRITE | acc::IBV_ACCESS_REMOTE_READ;
    assert_eq!(dmabuf_access(rw), rw);
    assert_eq!(
        dmabuf_access(rw | acc::IBV_ACCESS_RELAXED_ORDERING),
        rw | acc::IBV_ACCESS_RELAXED_ORDERING
    );
    // An optional flag REG_DMABUF_MR does not know, and the fork hint, go.
    assert_eq!(dmabuf_access(rw | (1 << 21) | acc::IBV_ACCESS_HUGETLB), rw);
    // What a dma-buf MR cannot be is left for the kernel to refuse.
    assert_eq!(
        dmabuf_access(rw | acc::IBV_ACCESS_ON_DEMAND),
        rw | acc::IBV_ACCESS_ON_DEMAND
    );
    assert_eq!(
        dmabuf_access(acc::IBV_ACCESS_MW_BIND),
        acc::IBV_ACCESS_MW_BIND
    );
}

#[test]
fn a_range_past_a_vmm_mapping_is_refused() {
    const G: u64 = 2 << 20;
    let alloc = cuda::DeviceAlloc {
        ctx: 0,
        buffer_id: 3,
        device: 0,
        base: 0x7f00_0000_0000 + G,
        size: G,
        reservation: Some((0x7f00_0000_0000, 8 * G)),
        block_id: 5,
    };
    assert_eq!(fit(alloc.base, G, &alloc), Fit::Inside);
    assert_eq!(fit(alloc.base + G - 4096, 4096, &alloc), Fit::Inside);
    assert_eq!(fit(alloc.base + G - 4096, 8192, &alloc), Fit::PastMapping);
    assert_eq!(fit(alloc.base, u64::MAX, &alloc), Fit::PastMapping);
    let plain = cuda::DeviceAlloc {
        reservation: None,
        ..alloc
    };
    assert_eq!(fit(plain.base + 1, G, &plain), Fit::PastAllocation);
    let c = Call {
        api: Api::RegMr,
        pd: std::ptr::null_mut(),
        addr: (alloc.base + G - 4096) as *mut c_void,
        len: 8192,
        iova: 0,
        access: 1,
    };
    let Plan::Refuse(e, why) = plan_device(&c, alloc) else {
        panic!("a range over two VMM mappings was not refused")
    };
    assert_eq!(e, libc::EINVAL);
    assert!(why.contains("register each mapping separately"), "{why}");
    assert!(!why.contains('\n'), "{why}");
    assert!(matches!(plan_device(&c, plain), Plan::Pass(_)));
    let inside = Call { len: 4096, ..c };
    assert!(matches!(plan_device(&inside, alloc), Plan::Device(_)));
}

#[test]
fn host_memory_passes_through() {
    let v = vec![0u8; 8192];
    let c = Call {
        api: Api::RegMr,
        pd: std::ptr::null_mut(),
        addr: v.as_ptr() as *mut c_void,
        len: v.len(),
        iova: v.as_ptr() as u64,
        access: 7,
    };
    let Plan::Pass(why) = classify(&c) else {
        panic!("host memory classified as device memory")
    };
    assert!(why.starts_with("host memory (mapping "), "{why}");
    // The mapping is remembered: the next call takes the fast path, and a file mapped
    // anywhere ends that.
    // (Other tests map files in parallel threads, which ends the generation: retried.)
    let fast = (0..1000).any(|_| {
        let _ = classify(&c);
        surely_host(&c)
    });
    assert!(fast, "a registration after a lookup is never the fast path");
    assert!(!surely_host(&Call { len: 0, ..c }));
    let f = std::fs::File::open("/proc/self/exe").expect("open /proc/self/exe");
    // SAFETY: a private read-only mapping of a page of a file, unmapped below.
    let m = unsafe {
        use std::os::fd::AsRawFd;
        hostcache::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    assert!(
        !surely_host(&c),
        "a file mapping must end the fast path's knowledge"
    );
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(m, 4096) };
    assert!(matches!(classify(&c), Plan::Pass(_)));
    let c0 = Call { len: 0, ..c };
    assert!(matches!(classify(&c0), Plan::Pass(_)));
    assert_eq!(
        format!("{c0}"),
        format!(
            "ibv_reg_mr(pd 0x0, addr {:p}, length 0, access LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ)",
            v.as_ptr()
        )
    );
}
