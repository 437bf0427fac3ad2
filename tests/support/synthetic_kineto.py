"""Write Kineto (torch.profiler Chrome-trace JSON) files for tests and benchmarks, no torch needed.

`KinetoWriter` has the same verbs as `synthetic.NsysWriter` (process, kernels, memcpy, nvtx,
meta_mark) and writes what torch.profiler writes for them, laid out as Kineto's own writer does
(one key group per line): GPU events on pid = device and tid = stream with `args.device/stream/
correlation`, the `cudaLaunchKernel` runtime event on the launching thread with the same
correlation, `ac2g` flow events between the two, `user_annotation` events for ranges (a start/end
range gets `args["ddp.kind"] = "start_end"`, a payload `args["ddp.payload"]`, as
profiling.torch_profile writes them), and
`distributedInfo` plus our runner's `ddp.meta` at the top level. Timestamps are microseconds (3
decimals) after `baseTimeNanoseconds`; input times are ns on that clock.

`write_kineto_ddp_trace(stem, n_kernels, n_ranks)` writes the DDP-shaped run of synthetic_ddp
(same steps, kernels and ranges) as one file per rank: `<stem>.rank<N>.json[.gz]`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from contract import ASYNC_KIND, ASYNC_KIND_KEY, META_KEY, PAYLOAD_KEY, PROFILE
from tests.support.synthetic import CUDA_LAUNCH_KERNEL, MARK, PUSH_POP, START_END
from tests.support.synthetic_ddp import LAUNCH_LEAD, DdpShape, _write_step

BASE_TIME_NS = 1_779_782_330_000_000_000


def _us(ns: ArrayLike) -> list[str]:
    """ns integers as Kineto's microsecond numbers with 3 decimals (exact, no float rounding)."""
    ns = np.asarray(ns, dtype=np.int64).reshape(-1)
    return [f"{q}.{r:03d}" for q, r in zip((ns // 1000).tolist(), (ns % 1000).tolist(), strict=True)]


def _broadcast(value: object, n: int) -> list:
    return np.broadcast_to(np.asarray(value, dtype=object), (n,)).tolist()


class KinetoWriter:
    """Buffers events (lines of JSON) and writes the trace on `close()`; `.gz` paths are gzipped."""

    def __init__(self, path: str | Path, base_time_ns: int = BASE_TIME_NS, flows: bool = True):
        self.path, self.base, self.flows = Path(path), base_time_ns, flows
        self.lines: list[str] = []
        self.top: dict = {"schemaVersion": 1, "deviceProperties": []}
        self._next_corr = 1

    def _t(self, ns: ArrayLike) -> list[str]:
        return _us(np.asarray(ns, dtype=np.int64) - self.base)

    def process(self, pid: int, name: str = "python3", threads: dict[int, str] | None = None) -> None:
        self.lines.append(
            f'{{"name": "process_name", "ph": "M", "ts": 0, "pid": {pid}, "tid": 0, '
            f'"args": {{"name": {json.dumps(name)}}}}}'
        )
        for tid, thread in (threads or {}).items():
            self.lines.append(
                f'{{"name": "thread_name", "ph": "M", "ts": 0, "pid": {pid}, "tid": {tid}, '
                f'"args": {{"name": {json.dumps(f"thread {tid} ({thread})")}}}}}'
            )

    def _gpu(
        self,
        cat: str,
        pid: int,
        tid: ArrayLike,
        device: ArrayLike,
        stream: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        name: object,
        launch: ArrayLike | None,
        api: str,
        args: dict | None = None,
    ) -> np.ndarray:
        n = int(np.size(start))
        more = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in (args or {}).items())
        corr = np.arange(self._next_corr, self._next_corr + n)
        self._next_corr += n
        start, end = np.broadcast_to(start, (n,)), np.broadcast_to(end, (n,))
        ts, dur = self._t(start), _us(end - start)
        names = [json.dumps(str(x)) for x in _broadcast(name, n)]
        devices, streams = _broadcast(device, n), _broadcast(stream, n)
        self.lines += [
            f'{{\n    "ph": "X", "cat": "{cat}", "name": {nm}, "pid": {d}, "tid": {s},\n    "ts": {t}, "dur": {du},\n'
            f'    "args": {{\n      "External id": {c}, "queued": 0, "device": {d}, "context": 1,\n'
            f'      "stream": {s}, "correlation": {c},\n'
            f'      "registers per thread": 32, "grid": [1, 1, 1]{more}\n    }}\n  }}'
            for nm, d, s, t, du, c in zip(names, devices, streams, ts, dur, corr.tolist(), strict=True)
        ]
        if launch is not None:
            launch = np.broadcast_to(np.asarray(launch, dtype=np.int64), (n,))
            has = launch >= 0
            tids, lts = _broadcast(tid, n), self._t(launch)
            rows = np.flatnonzero(has).tolist()
            self.lines += [
                f'{{\n    "ph": "X", "cat": "cuda_runtime", "name": "{api}", "pid": {pid}, "tid": {tids[i]},\n'
                f'    "ts": {lts[i]}, "dur": 2.000,\n    "args": {{\n      "External id": {corr[i]}, "cbid": 211, '
                f'"correlation": {corr[i]}\n    }}\n  }}'
                for i in rows
            ]
            if self.flows:
                self.lines += [
                    f'{{"ph": "s", "id": {corr[i]}, "pid": {pid}, "tid": {tids[i]}, "ts": {lts[i]}, '
                    f'"cat": "ac2g", "name": "ac2g"}}'
                    for i in rows
                ]
                self.lines += [
                    f'{{"ph": "f", "id": {corr[i]}, "pid": {devices[i]}, "tid": {streams[i]}, '
                    f'"ts": {ts[i]}, "cat": "ac2g", "name": "ac2g", "bp": "e"}}'
                    for i in rows
                ]
        return corr

    def kernels(
        self,
        pid: int,
        tid: ArrayLike,
        device: ArrayLike,
        stream: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        name: object,
        launch: ArrayLike | None = None,
        launch_api: str = CUDA_LAUNCH_KERNEL,
        args: dict | None = None,
    ) -> np.ndarray:
        """Kernel events (with `args` added to each one's args: e.g. the NCCL metadata PyTorch puts on
        collective kernels, "Collective name", "In msg nelems", ...) and their launches."""
        return self._gpu("kernel", pid, tid, device, stream, start, end, name, launch, launch_api, args)

    def memcpy(
        self,
        pid: int,
        tid: ArrayLike,
        device: ArrayLike,
        stream: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        copy_kind: str = "DtoD",
        launch: ArrayLike | None = None,
    ) -> np.ndarray:
        name = f"Memcpy {copy_kind} (Device -> Device)"
        return self._gpu("gpu_memcpy", pid, tid, device, stream, start, end, name, launch, "cudaMemcpyAsync")

    def memset(
        self,
        pid: int,
        tid: ArrayLike,
        device: ArrayLike,
        stream: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        launch: ArrayLike | None = None,
    ) -> np.ndarray:
        return self._gpu(
            "gpu_memset", pid, tid, device, stream, start, end, "Memset (Device)", launch, "cudaMemsetAsync"
        )

    def nvtx(
        self,
        pid: int,
        tid: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        text: object,
        kind: int = PUSH_POP,
        end_tid: ArrayLike | None = None,
        payload: ArrayLike | None = None,
        **_: object,
    ) -> None:
        """Ranges as user_annotation events (what record_function writes), an integer payload in
        args[PAYLOAD_KEY] as profiling.torch_profile writes it; marks are not recorded."""
        if kind == MARK:
            return
        n = int(np.size(start))
        start = np.broadcast_to(np.asarray(start, dtype=np.int64), (n,))
        end = np.broadcast_to(np.asarray(end, dtype=np.int64), (n,))
        extra = f', "{ASYNC_KIND_KEY}": "{ASYNC_KIND}"' if kind == START_END else ""
        payloads = _broadcast(-1 if payload is None else payload, n)
        self.lines += [
            f'{{\n    "ph": "X", "cat": "user_annotation", "name": {json.dumps(str(x))}, "pid": {pid}, "tid": {t},\n'
            f'    "ts": {ts}, "dur": {du},\n    "args": {{\n      "External id": 0{extra}'
            + (f', "{PAYLOAD_KEY}": {int(b)}' if int(b) >= 0 else "")
            + "\n    }\n  }"
            for x, t, ts, du, b in zip(
                _broadcast(text, n), _broadcast(tid, n), self._t(start), _us(end - start), payloads, strict=True
            )
        ]

    def cpu_op(self, pid: int, tid: int, start: int, end: int, name: str, args: dict | None = None) -> None:
        self.lines.append(
            json.dumps(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": float(self._t(start)[0]),
                    "dur": (end - start) / 1000,
                    "args": args or {},
                }
            )
        )

    def meta_mark(self, pid: int, tid: int, t: int, **meta: object) -> None:
        """Our runner's metadata (top-level `ddp.meta`) and torch's `distributedInfo`."""
        self.top[META_KEY] = meta
        if "rank" in meta:
            self.top["distributedInfo"] = {
                "backend": meta.get("backend", "nccl"),
                "rank": meta["rank"],
                "world_size": meta.get("world_size", 1),
            }

    def close(self) -> Path:
        """Write the trace (an existing file at path is replaced)."""
        head = ",\n".join(f'  "{k}": {json.dumps(v)}' for k, v in self.top.items())
        text = (
            f'{{\n{head},\n  "traceEvents": [\n  '
            + ",\n  ".join(self.lines)
            + f'\n  ],\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {self.base}\n}}\n'
        )
        data = text.encode()
        if self.path.suffix == ".gz":
            data = gzip.compress(data, compresslevel=1)
        self.path.write_bytes(data)
        return self.path


def write_kineto_ddp_trace(
    stem: str | Path,
    n_kernels: int = 1_000_000,
    n_ranks: int = 1,
    n_steps: int = 0,
    comm_per_step: int = 25,
    gz: bool = False,
    seed: int = 0,
) -> list[Path]:
    """The DDP-shaped run of synthetic_ddp as one Kineto file per rank; returns the paths."""
    shape = DdpShape(n_kernels, n_ranks, n_steps, comm_per_step)
    rng = np.random.default_rng(seed)
    paths = []
    for rank in range(n_ranks):
        pid = 1000 + 10 * rank
        w = KinetoWriter(f"{stem}.rank{rank}.json{'.gz' if gz else ''}")
        w.process(pid, threads={pid: "pt_main_thread", pid + 1: "pt_autograd_0"})
        t = BASE_TIME_NS + 1_000_000_000 + int(rng.integers(0, 100_000))
        w.meta_mark(pid, pid, t, implementation="synthetic", rank=rank, world_size=n_ranks, backend="nccl")
        first = t
        for step in range(shape.steps):
            t = _write_step(w, rng, pid, rank, step, t, shape)
        w.nvtx(pid, pid, [first - 2 * LAUNCH_LEAD + 100], [t], PROFILE)
        paths.append(w.close())
    return paths
