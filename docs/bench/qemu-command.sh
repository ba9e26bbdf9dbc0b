#!/bin/sh
# The VM command line of `cargo xtask bench --skip-kernel --gpu-mem-mib 65536 --reps 3` (xtask/src/vm.rs
# qemu_args, Mode::Bench), started by hand because another session held /work/cache-bench's lock.
cd /tmp/benchvm
exec timeout 3600 qemu-system-x86_64 -machine q35 -accel tcg,thread=multi -cpu max -smp 2 -m 5376M \
 -global q35-pcihost.pci-hole64-size=129G -no-reboot -nodefaults -display none \
 -kernel bzImage -initrd initramfs.cpio \
 -append "console=ttyS0 panic=-1 printk.devkmsg=on kasan_multi_shot p2pbuf.mode=bench p2pbuf.topology=switch p2pbuf.reps=3" \
 -monitor none -serial stdio -serial file:/tmp/benchvm/results.txt \
 -object memory-backend-file,id=gpumem,size=65536M,mem-path=/tmp/benchvm/gpu-mem.bin,share=on \
 -drive file=/tmp/benchvm/nvme.img,if=none,id=nvme0,format=raw,cache=unsafe \
 -netdev user,id=net0 \
 -device pcie-root-port,id=rp0,chassis=1,slot=0,bus=pcie.0 -device x3130-upstream,id=sw0,bus=rp0 \
 -device xio3130-downstream,id=dp0,bus=sw0,chassis=2,slot=0 -device xio3130-downstream,id=dp1,bus=sw0,chassis=3,slot=0 \
 -device xio3130-downstream,id=dp2,bus=sw0,chassis=4,slot=0 -device xio3130-downstream,id=dp3,bus=sw0,chassis=5,slot=0 \
 -device ivshmem-plain,memdev=gpumem,bus=dp0,id=gpu0 \
 -device nvme,serial=p2pbuf-nvme0,drive=nvme0,cmb_size_mb=64,bus=dp1,id=nvme0 \
 -device edu,dma_mask=0xffffffffffffffff,bus=dp2,id=edu0 \
 -device virtio-net-pci,netdev=net0,bus=dp3,id=nic0
