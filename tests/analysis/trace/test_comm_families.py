"""Communication families: each library's kernels (names as its source writes them, demangled as
profilers show them) are recognised by default and named per call; a multi-rank trace where nothing
was recognised says so in every output format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.collectives import command as collectives
from analysis.measure.collective_calls import find_calls
from analysis.measure.comm_recognition import kernel_family
from analysis.overlap import command as overlap
from analysis.run.loaded_run import load_trace
from analysis.trace.comm_families import CUSTOM, FAMILIES, family_of_kernel
from analysis.trace.patterns import Patterns
from tests.support.synthetic_kineto import BASE_TIME_NS, KinetoWriter

# (kernel name as a profiler shows it, family); names built from each library's source naming
FAMILY_NAMES = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "NCCL"),  # NCCL < 2.12
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "NCCL"),
    ("ncclDevKernel_Generic", "NCCL"),
    ("ncclDevKernel_SendRecv", "NCCL"),
    ("ncclSymkDevKernel_AllReduce_AGxLL_R_f32", "NCCL"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "RCCL"),  # RCCL: unroll factor suffix
    ("ncclDevKernelDebug_Generic_1", "RCCL"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int)", "DeepEP intranode"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*)", "DeepEP intranode"),
    ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(__nv_bfloat16*, float*)", "DeepEP intranode"),
    ("void deep_ep::internode::dispatch<false, 2, 3, 16, 6144, 8>(int4*, float*)", "DeepEP internode"),
    ("void deep_ep::internode::combine<2, 3, 16, int>(int4*, float*)", "DeepEP internode"),
    ("void uccl::ep::internode::dispatch<true, 4>(int4*)", "DeepEP internode"),  # a fork's namespace
    ("void deep_ep::internode_ll::dispatch<false, 3, 10, 7168>(void*, float*)", "DeepEP low-latency"),
    ("void deep_ep::internode_ll::combine<3, 10, 7168, 9>(void*, void*)", "DeepEP low-latency"),
    ("barrier_on_stream_kernel_threadgroup<(threadgroup_t)2>(int, int)", "NVSHMEM"),
    ("nvshmemi_proxy_progress_kernel", "NVSHMEM"),
    ("mscclKernel_Sum_float_LL128", "MSCCL"),
    ("void mscclpp::executionKernel<__half, mscclpp::LL16Packet>(int, __half*, __half*)", "MSCCL++"),
    (
        "void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**)",
        "PyTorch SymmetricMemory",
    ),
    (
        "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<float, 16, 4>(float**)",
        "PyTorch SymmetricMemory",
    ),
    (
        "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)",
        "PyTorch SymmetricMemory",
    ),
    ("void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*)", "PyTorch SymmetricMemory"),
    ("void vllm::cross_device_reduce_1stage<__half, 8>(vllm::RankData*)", "other collective kernels"),
]
COMPUTE_NAMES = [
    "ampere_sgemm_128x64_tn",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::ReduceOp<float>)",
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)",  # DeepEP's layout: compute
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<float>(int)",
]


@pytest.mark.parametrize("name, family", FAMILY_NAMES)
def test_each_library_is_recognised_and_named(name: str, family: str) -> None:
    assert Patterns().regex("comm_kernel").search(name), name
    assert family_of_kernel(name) == family


@pytest.mark.parametrize("name", COMPUTE_NAMES)
def test_compute_kernels_are_not_communication(name: str) -> None:
    assert not Patterns().regex("comm_kernel").search(name)


def test_every_family_of_the_table_is_tested() -> None:
    tested = {f for _, f in FAMILY_NAMES} | {"gloo (host ranges)"}
    assert tested == {f.name for f in FAMILIES}


def test_a_kernel_only_the_user_pattern_names_is_custom() -> None:
    assert family_of_kernel("my_ring_exchange_kernel") == CUSTOM


def test_kernel_family_of_a_demangled_name() -> None:
    assert kernel_family("void deep_ep::internode::dispatch<false, 2>(int4*)") == "deep_ep::internode"
    assert kernel_family("ampere_sgemm_128x64_tn") == "ampere_sgemm_128x64_tn"
    assert kernel_family("void gemm_kernel<float>(float*)") == "gemm_kernel"


def write_rank(path: Path, rank: int, comm_name: str, steps: int = 3) -> Path:
    """One rank of a 2-rank job: per step a ProfilerStep#N range, compute kernels on stream 7 and one
    `comm_name` kernel on stream 20 overlapping the second half of the compute."""
    w = KinetoWriter(path)
    pid = 100 + rank
    w.process(pid)
    t0 = BASE_TIME_NS + 1_000_000
    w.meta_mark(pid, pid, t0, rank=rank, world_size=2, backend="nccl")
    step_ns = 10_000_000
    for s in range(steps):
        begin = t0 + s * step_ns
        w.nvtx(pid, pid, [begin], [begin + step_ns - 100_000], f"ProfilerStep#{s}")
        starts = begin + np.arange(4) * 2_000_000 + 50_000
        w.kernels(pid, pid, rank, 7, starts, starts + 1_500_000, "ampere_sgemm_128x64_tn", launch=starts - 20_000)
        comm = begin + 4_000_000
        w.kernels(pid, pid, rank, 20, [comm], [comm + 3_000_000], comm_name, launch=[comm - 20_000])
    return w.close()


def test_deepep_run_is_measured_and_each_call_named(tmp_path: Path) -> None:
    name = "void deep_ep::internode::dispatch<false, 2, 3, 16, 6144, 8>(int4*, float*)"
    trace = load_trace(write_rank(tmp_path / "r0.json", 0, name))
    calls = find_calls(trace).frame
    assert len(calls) == 3 and set(calls["family"]) == {"DeepEP internode"}
    assert (calls["end_ns"] - calls["start_ns"]).tolist() == [3_000_000] * 3
    result = overlap.main([str(tmp_path / "r0.json"), "--format", "json"])
    assert result == 0


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_unrecognised_communication_is_said_in_every_format(tmp_path: Path, capsys, fmt: str) -> None:
    paths = [str(write_rank(tmp_path / f"r{r}.json", r, "void mylib::moe::token_shuffle<8>(int4*)")) for r in (0, 1)]
    for cli, argv in ((overlap, [paths[0]]), (overlap, [*paths, "--merge"]), (collectives, [paths[0]])):
        assert cli.main([*argv, "--format", fmt]) == 0
        out, err = capsys.readouterr()
        said = out + err
        assert "no communication recognised in a run of 2 ranks" in said, (cli, argv, fmt)
        ms = "18.000" if "--merge" in argv else "9.000"  # 3 steps x 3 ms on each rank in the input
        assert f"mylib::moe ({ms} ms)" in said and "--comm-pattern" in said
        if fmt == "json":
            json.loads(out)
        if fmt == "csv" and cli is overlap:
            assert "comm_note" in out.splitlines()[0]


def test_the_note_goes_once_the_pattern_names_them(tmp_path: Path, capsys) -> None:
    path = str(write_rank(tmp_path / "r0.json", 0, "void mylib::moe::token_shuffle<8>(int4*)"))
    assert overlap.main([path, "--comm-pattern", "token_shuffle", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["traces"][0]["comm_note"] == ""
    assert doc["traces"][0]["ranks"][0]["total"]["comm_ms"] == pytest.approx(9.0)


def test_single_rank_runs_have_no_note(tmp_path: Path) -> None:
    from analysis.measure.comm_recognition import unrecognised_comm_note

    w = KinetoWriter(tmp_path / "one.json")
    w.process(5)
    w.kernels(5, 5, 0, 7, [BASE_TIME_NS + 10], [BASE_TIME_NS + 1000], "gemm", launch=[BASE_TIME_NS])
    assert unrecognised_comm_note(load_trace(w.close()), Patterns(), 1) == ""
