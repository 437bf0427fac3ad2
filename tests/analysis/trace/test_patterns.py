"""Default name patterns: our runner's names and the common ones from other tools."""

import pytest

from analysis.errors import TraceError
from analysis.trace.patterns import Patterns

P = Patterns()


@pytest.mark.parametrize(
    "name",
    [
        "ncclKernel_AllReduce_RING_LL_Sum_float",
        "ncclDevKernel_Generic",
        "ncclDevKernel_AllGather_RING_LL",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
        "ncclDevKernel_SendRecv",
        "rcclKernel_Generic",
        "cross_device_reduce_1stage",
    ],
)
def test_communication_kernels(name):
    assert P.regex("comm_kernel").search(name)


@pytest.mark.parametrize(
    "name",
    [
        "vectorized_elementwise_kernel",
        "reduce_kernel",
        "ampere_sgemm_128x64_tn",
        "CatArrayBatchedCopy_vectorized",
        "flash_fwd_kernel",
    ],
)
def test_compute_kernels_are_not_communication(name):
    assert not P.regex("comm_kernel").search(name)


@pytest.mark.parametrize(
    "text,number", [("step 0", "0"), ("step 12", "12"), ("ProfilerStep#7", "7"), ("iteration 3", "3")]
)
def test_step_names_and_numbers(text, number):
    found = P.regex("step").search(text)
    assert found and found.group(1) == number


@pytest.mark.parametrize("text", ["backward", "backward pass", "## backward ##", "Backward"])
def test_backward_names(text):
    assert P.regex("backward").search(text)


@pytest.mark.parametrize("text", ["backward_hook", "grad_sync", "aten::backward_something"])
def test_not_backward(text):
    assert not P.regex("backward").search(text)


@pytest.mark.parametrize("text", ["comm:all_reduce:bucket3", "comm:broadcast:params", "ncclAllReduce"])
def test_comm_ranges(text):
    assert P.regex("comm_range").search(text)


def test_bad_pattern_names_the_field_and_value():
    with pytest.raises(TraceError, match=r"step='\(' is not a valid regular expression"):
        Patterns(step="(")
