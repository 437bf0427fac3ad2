"""Collective bytes in torch.profiler traces: from the NCCL kernels' own args (the names PyTorch writes:
"Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size"), and from our recorder's
range payloads (args["ddp.payload"]); each checked against a plain-Python computation from the
numbers written into the trace."""

import pytest

from analysis.collectives.collectives_view import collectives_of
from analysis.run.loaded_run import load_trace
from contract import ALL_GATHER, comm_range, step_range
from tests.support.synthetic import START_END
from tests.support.synthetic_kineto import BASE_TIME_NS, KinetoWriter

T0 = BASE_TIME_NS + 1_000_000_000
ELEMENT = {"BFloat16": 2, "Float": 4}
# (kernel name as Kineto writes it, op, collective, in nelems, out nelems, dtype): one FSDP unit's
# forward all-gather (shard in, gathered out), its reduce-scatter (whole gradient in, shard out) and an
# all-reduce of a replicated parameter
CALLS = [
    (
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "all_gather",
        "_allgather_base",
        512,
        1024,
        "BFloat16",
    ),
    (
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "reduce_scatter",
        "_reduce_scatter_base",
        1024,
        512,
        "Float",
    ),
    (
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "all_reduce",
        "allreduce",
        300,
        300,
        "Float",
    ),
]
LATE = 2_000  # ns rank 1 arrives after rank 0 at every collective


def _nccl_args(collective, n_in, n_out, dtype):
    return {
        "Collective name": collective,
        "In msg nelems": n_in,
        "Out msg nelems": n_out,
        "Group size": 2,
        "dtype": dtype,
        "In split size": "[]",
        "Out split size": "[]",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": "[0, 1]",
    }


def write_gpu_ranks(tmp_path, foreign=True):
    """Two rank files of one GPU step: a compute kernel, then the three NCCL kernels of CALLS, each 10 us
    apart, rank 1 arriving LATE ns after rank 0; all end together. foreign: no ddp.meta (a job of the
    user's own, torch's distributedInfo only)."""
    paths = []
    for rank in (0, 1):
        pid = 4000 + rank
        w = KinetoWriter(tmp_path / f"job.rank{rank}.json")
        w.process(pid)
        w.meta_mark(pid, pid, T0, rank=rank, world_size=2, backend="nccl")
        if foreign:
            del w.top["ddp.meta"]
        w.nvtx(pid, pid, [T0], [T0 + 100_000], step_range(0))
        w.kernels(pid, pid, rank, 7, [T0 + 1_000], [T0 + 5_000], "void gemm_kernel<float>(float*)", launch=[T0 + 500])
        for i, (name, _, collective, n_in, n_out, dtype) in enumerate(CALLS):
            start, end = T0 + 10_000 * (i + 1) + LATE * rank, T0 + 10_000 * (i + 1) + 6_000
            args = _nccl_args(collective, n_in, n_out, dtype)
            w.kernels(pid, pid, rank, 20, [start], [end], name, launch=[T0 + 10_000 * (i + 1) - 500], args=args)
        paths.append(w.close())
    return paths


def test_nccl_kernel_args_give_each_calls_bytes_and_busbw(tmp_path):
    view = collectives_of([load_trace(write_gpu_ranks(tmp_path))])
    calls = view.calls
    assert len(calls) == 2 * len(CALLS) and calls["paired"].all()
    for _, op, _, n_in, n_out, dtype in CALLS:
        mine = calls[calls["op"] == op]
        expected = max(n_in, n_out) * ELEMENT[dtype]  # nccl-tests: gathered output, scattered input, buffer
        assert mine["bytes"].tolist() == [expected, expected], op
        transfer_ns = 6_000 - LATE  # every rank's transfer starts when rank 1 arrives
        factor = 2 * (2 - 1) / 2 if op == "all_reduce" else (2 - 1) / 2
        assert mine["busbw_gbps"].tolist() == pytest.approx([expected / transfer_ns * factor] * 2), op
    assert view.by_size["bytes"].sum() == 2 * sum(max(c[3], c[4]) * ELEMENT[c[5]] for c in CALLS)


def test_the_frame_keeps_the_kernel_bytes_and_none_for_other_kernels(tmp_path):
    ops = load_trace(write_gpu_ranks(tmp_path)).gpu_ops
    nccl = ops["name"].astype(str).str.startswith("ncclDevKernel")
    assert (ops.loc[~nccl, "comm_bytes"] == -1).all()
    assert sorted(ops.loc[nccl, "comm_bytes"]) == sorted(2 * [max(c[3], c[4]) * ELEMENT[c[5]] for c in CALLS])


def test_our_recorders_range_payload_gives_the_bytes_on_cpu(tmp_path):
    """A CPU run recorded by our torch.profiler recorder: no kernels; the async comm ranges carry the
    payload in args["ddp.payload"], and the calls (from the ranges) take it."""
    paths = []
    for rank in (0, 1):
        pid = 5000 + rank
        w = KinetoWriter(tmp_path / f"cpu.rank{rank}.json")
        w.process(pid)
        w.meta_mark(pid, pid, T0, implementation="fsdp", rank=rank, world_size=2, backend="gloo")
        w.nvtx(pid, pid, [T0], [T0 + 100_000], step_range(0))
        starts = [T0 + 10_000, T0 + 30_000]
        names = [comm_range(ALL_GATHER, "blocks.0.attn.wq"), comm_range(ALL_GATHER, "lm_head")]
        w.nvtx(pid, pid, starts, [s + 5_000 for s in starts], names, kind=START_END, payload=[65536, 1310720])
        paths.append(w.close())
    trace = load_trace(paths)
    comm = trace.nvtx[trace.nvtx["text"].str.startswith("comm:")]
    assert sorted(comm["payload"]) == [65536, 65536, 1310720, 1310720]
    calls = collectives_of([trace]).calls.set_index(["rank", "tag"])
    for rank in (0, 1):
        assert calls.loc[(rank, "blocks.0.attn.wq"), "bytes"] == 65536
        assert calls.loc[(rank, "lm_head"), "bytes"] == 1310720
