"""analysis.overlap's notes: the memory ddp.meta recorded, in one line."""

from __future__ import annotations

from analysis.overlap.command import memory_line


def test_the_overlap_cli_says_the_memory_in_one_line():
    row = {
        "mem_parameters_mib": 11.799,
        "mem_gradients_mib": 11.768,
        "mem_optimizer_state_mib": 23.536,
        "mem_gathered_mib": 0.0,
        "mem_comm_buffers_mib": 0.001,
        "mem_activations_mib": 67.668,
        "mem_peak_mib": 114.772,
        "cuda_max_allocated_mib": float("nan"),
    }
    assert memory_line(row) == (
        "memory per rank (MiB, largest rank): peak 114.772 = parameters 11.799 + gradients 11.768 + "
        "optimizer_state 23.536 + gathered 0 + comm_buffers 0.001 + activations 67.668; "
        "CUDA max allocated n/a (not CUDA)"
    )
    assert memory_line({**row, "cuda_max_allocated_mib": 120.5}).endswith("CUDA max allocated 120.5")
    assert memory_line({"mem_peak_mib": None}) == ""
    # torch_fsdp where FSDP2 hides its parameters: gathered not counted, so no accounted peak
    unknown = memory_line({**row, "mem_gathered_mib": None, "mem_peak_mib": float("nan")})
    assert unknown.startswith("memory per rank (MiB, largest rank): peak n/a = parameters 11.799 + ")
    assert "+ gathered n/a + comm_buffers 0.001 +" in unknown
