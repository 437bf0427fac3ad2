"""Multi-node `--per-rank` on one machine: two torchrun node agents on 127.0.0.1, one rank each,
each rank under its own nsys, one trace per rank carrying its rank in its ddp.meta mark."""

from __future__ import annotations

import contextlib
import json
import subprocess

from ddp.launch.launcher import free_port
from tests.profiling.test_end_to_end import rows_by_rank
from tests.profiling.test_nsys import REPO
from tests.support import owned
from tests.support.nsys import RECORDS_WITH_NSYS

pytestmark = RECORDS_WITH_NSYS  # two torchrun agents under the real nsys


def node_command(node_rank: int, port: int, out) -> list[str]:
    torchrun = f"--nnodes 2 --node-rank {node_rank} --nproc-per-node 1 --master-addr 127.0.0.1 --master-port {port}"
    return [
        "bash",
        str(REPO / "run_nsys.sh"),
        "flat",
        "--per-rank",
        "--torchrun",
        torchrun,
        "--gpus",
        "0",
        "-o",
        str(out),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch-size",
        "4",
        "--context-length",
        "32",
        "--format",
        "json",
        "--timeout",
        "150",
    ]


def test_two_node_agents_write_one_trace_per_rank(tmp_path):
    port = free_port()
    with contextlib.ExitStack() as stack:  # leaving it ends every process of both nodes, whatever happened
        nodes = [
            stack.enter_context(
                owned.popen(node_command(n, port, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            )
            for n in (0, 1)
        ]
        outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (_out, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    # each agent reports only the rank it ran
    reported = [[row["sqlite"] for row in json.loads(out)] for out, _ in outputs]
    assert reported == [[str(tmp_path / "flat.rank0.sqlite")], [str(tmp_path / "flat.rank1.sqlite")]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "flat.rank0.nsys-rep",
        "flat.rank0.sqlite",
        "flat.rank1.nsys-rep",
        "flat.rank1.sqlite",
    ]
    for rank in (0, 1):
        by_rank = rows_by_rank(tmp_path / f"flat.rank{rank}.sqlite")
        (meta,) = by_rank.pop("meta").values()
        assert (meta["rank"], meta["world_size"], meta["implementation"]) == (rank, 2, "flat")
        names = [name for _, kind, name, *_ in by_rank[rank]]
        assert sorted(n for n in names if n.startswith("step ")) == ["step 1", "step 2"]
        assert sum(n.startswith("comm:all_reduce:") for n in names) == 2  # flat: one all-reduce per step
