"""Hand-made nsys exports whose metrics are computed by hand in the tests (times in ns).

Rank "A" (pid 100, GPU 0, ddp.meta rank 1), one step [0, 1000):
  forward [10, 200), backward [200, 600), optimizer [700, 900) on thread 100; kernels:
    k1 gemm   launched 50  (t100) -> [100, 300)  stream 7   compute, forward
    k2 gemm   launched 250 (t101) -> [300, 500)  stream 7   compute, backward
    k3 relu   launched 300 (t101) -> [450, 650)  stream 8   compute, backward (overlaps k2)
    k4 adam   launched 750 (t100) -> [900, 1000) stream 7   compute
    c1 ncclKernel_AllReduce_RING_LL_Sum_float launched 400 (t101) -> [400, 700) stream 20  comm
    c2 ncclDevKernel_Generic  launched 650 (t100) -> [950, 1100) stream 20  comm
    m1 memcpy DtoH launched 660 (t102, inside async comm range) -> [1100, 1150)  comm (a copy)
    k5 relu   launched 670 (t101, inside the async range: not claimed) -> [1150, 1200) compute
    k6 copy_kernel launched 950 (t100, inside blocking comm:broadcast range) -> [1200, 1300) comm
    s1 memset launched 20 -> [20, 40): neither
  async range comm:all_reduce:b0 [640, 690) opened on t101, closed on t100;
  blocking comm:broadcast:params [920, 990) on t100.
  compute = [100,650) [900,1000) [1150,1200) = 700; comm = [400,700) [950,1150) [1200,1300) = 600
  overlap = [400,650) [950,1000) = 300; backward compute = [300,650): span 350, overlap 250.
Rank "B" (pid 200, GPU 1, ddp.meta rank 0), steps [0, 500) and [500, 1000), backward [100, 400), [600, 900):
    b1 launched 150 -> [200, 400); b2 launched 650 -> [700, 900); compute, backward
    n1 ncclDevKernel_AllReduce_Sum_f32_RING_LL launched 300 -> [350, 750): comm of step 0
  step 0: compute 200, comm 400, overlap 100 (also with step 1's b2); step 1: compute 200, comm 0.
"""

from __future__ import annotations

import numpy as np

from tests.support.synthetic import MARK, START_END, NsysWriter

A = dict(pid=100, device=0, rank=1)
B = dict(pid=200, device=1, rank=0)


def _kernels(w: NsysWriter, pid: int, device: int, rows: list[tuple]) -> None:
    """rows: (name, launch, tid, start, end, stream)."""
    for name, launch, tid, start, end, stream in rows:
        w.kernels(pid, tid, device, stream, np.array([start]), np.array([end]), name, launch=np.array([launch]))


def write_two_ranks(path, flavour: str = "2026", shuffle: bool = True, registered: bool = False):
    w = NsysWriter(path, flavour=flavour, shuffle=shuffle, seed=3)
    text = dict(registered=registered)
    # rank A
    w.process(100, threads={100: "python3", 101: "pt_autograd_0", 102: "gloo"})
    w.meta_mark(100, 100, 5, implementation="fixture", rank=1, world_size=2)
    w.nvtx(
        100,
        100,
        np.array([0, 10, 200, 700]),
        np.array([1000, 200, 600, 900]),
        np.array(["step 0", "forward", "backward", "optimizer"], dtype=object),
        **text,
    )
    w.nvtx(100, 101, np.array([640]), np.array([690]), "comm:all_reduce:b0", kind=START_END, end_tid=100, **text)
    w.nvtx(100, 100, np.array([920]), np.array([990]), "comm:broadcast:params", domain_id=1, **text)
    _kernels(
        w,
        100,
        0,
        [
            ("gemm", 50, 100, 100, 300, 7),
            ("gemm", 250, 101, 300, 500, 7),
            ("relu", 300, 101, 450, 650, 8),
            ("adam", 750, 100, 900, 1000, 7),
            ("ncclKernel_AllReduce_RING_LL_Sum_float", 400, 101, 400, 700, 20),
            ("ncclDevKernel_Generic", 650, 100, 950, 1100, 20),
            ("relu", 670, 101, 1150, 1200, 7),
            ("copy_kernel", 950, 100, 1200, 1300, 7),
        ],
    )
    w.memcpy(100, 102, 0, 21, np.array([1100]), np.array([1150]), copy_kind=2, launch=np.array([660]))
    w.memset(100, 100, 0, 7, np.array([20]), np.array([40]), launch=np.array([20]))
    # rank B
    w.process(200)
    w.meta_mark(200, 200, 5, implementation="fixture", rank=0, world_size=2)
    w.nvtx(
        200,
        200,
        np.array([0, 500, 100, 600]),
        np.array([500, 1000, 400, 900]),
        np.array(["step 0", "step 1", "backward", "backward"], dtype=object),
        **text,
    )
    _kernels(
        w,
        200,
        1,
        [
            ("gemm", 150, 200, 200, 400, 7),
            ("gemm", 650, 200, 700, 900, 7),
            ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 200, 350, 750, 20),
        ],
    )
    # a range that never ended and a domain: the loader must cope
    w.nvtx(200, 200, np.array([950]), np.array([-1]), "never closed")
    w.domain(200, 200, 1, "NCCL", 1)
    w.nvtx(200, 200, np.array([360]), np.array([370]), "ncclAllReduce", domain_id=1)
    return w.close()


def write_cpu_only(path, flavour: str = "2022"):
    """One CPU rank (pid 300), NVTX only, like a 2022.4 export of a gloo run:
    step 0 [0, 1000): forward [0, 300), backward [300, 800), grad_sync [800, 850), optimizer [850, 950);
    async comm ranges [400, 700) (t301 -> t300) and [750, 900); blocking comm [800, 850) on t300.
    comm = [400,700) [750,900) = 450; compute = [0,800) [850,950) = 900 (blocking comm cut out)
    overlap = [400,700) [750,800) [850,900) = 400; backward overlap = 350; backward span 500.
    """
    w = NsysWriter(path, flavour=flavour, cupti=False, shuffle=True, seed=5)
    w.process(300)
    w.meta_mark(300, 300, 1, implementation="cpu_fixture", rank=0, world_size=1)
    w.nvtx(
        300,
        300,
        np.array([0, 0, 300, 800, 850]),
        np.array([1000, 300, 800, 850, 950]),
        np.array(["step 0", "forward", "backward", "grad_sync", "optimizer"], dtype=object),
        registered=True,
    )
    w.nvtx(
        300,
        301,
        np.array([400, 750]),
        np.array([700, 900]),
        np.array(["comm:all_reduce:bucket0", "comm:all_reduce:bucket1"], dtype=object),
        kind=START_END,
        end_tid=300,
        registered=True,
    )
    w.nvtx(300, 300, np.array([800]), np.array([850]), "comm:all_reduce:final", registered=True)
    w.nvtx(300, 300, np.array([1]), None, "a mark", kind=MARK)
    return w.close()


def write_cpu_ddp_wait(path):
    """One CPU rank (pid 400) shaped like PyTorch DDP, which waits for its buckets inside backward:
    step 0 [0, 1000): forward [0, 300), backward [300, 900), optimizer [900, 1000) on t400;
    async comm:all_reduce:bucket0 [500, 850) (t400 -> t401); start/end grad_sync [700, 850) inside backward.
    compute = [0,700) [850,1000) = 850 (the wait cut out); comm = 350; overlap = [500,700) = 200 = backward
    overlap; exposed 150. Counting the wait as backward would claim all 350 hidden.
    """
    w = NsysWriter(path, flavour="2022", cupti=False, shuffle=True, seed=7)
    w.process(400)
    w.meta_mark(400, 400, 1, implementation="torch", rank=0, world_size=1)
    w.nvtx(
        400,
        400,
        np.array([0, 0, 300, 900]),
        np.array([1000, 300, 900, 1000]),
        np.array(["step 0", "forward", "backward", "optimizer"], dtype=object),
    )
    w.nvtx(
        400,
        400,
        np.array([500, 700]),
        np.array([850, 850]),
        np.array(["comm:all_reduce:bucket0", "grad_sync"], dtype=object),
        kind=START_END,
        end_tid=401,
    )
    return w.close()
