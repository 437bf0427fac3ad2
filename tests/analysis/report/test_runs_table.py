"""The report's Runs table: what each trace ran on, its step time, and beside it the memory ddp.meta recorded."""

from __future__ import annotations

import re

import pandas as pd

from analysis.report.html_report import runs_html


def _cells(page: str) -> tuple[list[str], list[list[str]]]:
    head = re.findall(r"<th>(.*?)</th>", page)
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", page) if "<td>" in row]
    rows = [[re.sub(r"<br>", " | ", cell) for cell in row] for row in rows]  # the memory parts: one a line
    rows = [[re.sub(r"<[^>]+>", "", cell) for cell in row] for row in rows]  # the implementation's colour swatch
    return head, rows


def _summary(**memory: list) -> pd.DataFrame:
    base = {
        "implementation": ["overlap", "naive"],
        "label": ["overlap", "naive"],
        "step_ms": [12.345, 20.0],
        "backend": ["gloo", "gloo"],
        "world_size": [2.0, 2.0],
    }
    return pd.DataFrame({**base, **memory})


def test_memory_sits_beside_the_step_time_and_cuda_is_na_off_cuda():
    memory = {
        "mem_parameters_mib": [11.8, 11.8],
        "mem_gradients_mib": [11.768, 11.768],
        "mem_optimizer_state_mib": [11.768, 23.536],
        "mem_gathered_mib": [0.0, 0.0],
        "mem_comm_buffers_mib": [0.001, 11.768],
        "mem_activations_mib": [67.637, 67.637],
        "mem_peak_mib": [114.772, 126.54],
        "cuda_max_allocated_mib": [None, None],
    }
    head, rows = _cells(runs_html(_summary(**memory)))
    assert head == [
        "implementation",
        "step ms",
        "memory peak MiB/rank",
        "its parts MiB (zeros left out)",
        "CUDA max allocated MiB",
        "backend",
        "world size",
    ]
    by_column = [dict(zip(head, row, strict=True)) for row in rows]
    assert [r["step ms"] for r in by_column] == ["12.35", "20.00"]
    assert [r["memory peak MiB/rank"] for r in by_column] == ["114.772", "126.54"]
    # one short line, three figures a part, the zero one (gathered) left out; the exact figures on hover
    assert (
        by_column[1]["its parts MiB (zeros left out)"] == "params 11.8 · grads 11.8 · optim 23.5 · comm 11.8 · act 67.6"
    )
    page = runs_html(_summary(**memory))
    assert (
        'title="parameters 11.8 MiB; gradients 11.768 MiB; optimizer state 23.536 MiB; gathered parameters 0 MiB'
        in page
    )
    assert [r["CUDA max allocated MiB"] for r in by_column] == ["n/a", "n/a"]


def test_traces_without_memory_show_no_memory_columns_and_facts_no_trace_has_are_left_out():
    summary = _summary(mem_peak_mib=[None, None], cuda_max_allocated_mib=[None, None], gpus=[None, None])
    head, rows = _cells(runs_html(summary.assign(driver=[None, "580.1"])))
    assert head == ["implementation", "step ms", "driver", "backend", "world size"]  # no GPU column: no trace has one
    assert rows[0] == ["overlap", "12.35", "-", "gloo", "2"]


def test_a_part_that_could_not_be_counted_and_so_the_peak_read_na_beside_the_recorded_ones():
    # torch_fsdp on a torch whose FSDP2 hides its gathered buffers records gathered and peak as null
    memory = {
        "mem_parameters_mib": [11.8, 5.9],
        "mem_gradients_mib": [11.768, 5.884],
        "mem_optimizer_state_mib": [23.536, 11.768],
        "mem_gathered_mib": [0.0, None],
        "mem_comm_buffers_mib": [0.001, 0.0],
        "mem_activations_mib": [67.637, 67.637],
        "mem_peak_mib": [114.742, None],
        "cuda_max_allocated_mib": [None, None],
    }
    head, rows = _cells(runs_html(_summary(**memory)))
    by_column = [dict(zip(head, row, strict=True)) for row in rows]
    assert [r["memory peak MiB/rank"] for r in by_column] == ["114.742", "n/a"]
    parts = "its parts MiB (zeros left out)"
    assert by_column[1][parts] == "params 5.9 · grads 5.88 · optim 11.8 · gathered n/a · act 67.6"
    assert by_column[0][parts] == "params 11.8 · grads 11.8 · optim 23.5 · comm 0.001 · act 67.6"
