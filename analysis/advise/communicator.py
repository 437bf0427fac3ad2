"""Collectives queued on a communicator, as the replays run them: FIFO in issue order, `lanes` in flight at
most on each rank (NCCL: one stream; gloo: its worker threads); a collective starts once every rank has
issued it and has a lane free, and lasts its cost. Arrays are (N, R): N replayed rows, R ranks."""

from __future__ import annotations

import numpy as np


class Communicator:
    """FIFO collectives with `lanes` in flight at most, on every rank of every row at once."""

    def __init__(self, shape: tuple[int, int], lanes: int, opens: float = 0.0):
        self.free = np.full((*shape, lanes), opens)  # when each lane is next free (`opens`: nothing starts before)
        self.last_start = np.full(shape, opens)  # FIFO: no collective starts before an earlier one

    def run(self, issue: np.ndarray, cost: np.ndarray) -> np.ndarray:
        """Queue one collective issued at `issue` (N, R) lasting `cost` (N,): its end (N,), the same on
        every rank (it starts once every rank has issued it and has a lane free)."""
        lane = self.free.argmin(axis=2)
        ready = np.maximum(np.maximum(issue, self.free.min(axis=2)), self.last_start)
        start = ready.max(axis=1)  # every rank must be there
        end = start + cost
        np.put_along_axis(self.free, lane[:, :, None], np.broadcast_to(end[:, None, None], (*lane.shape, 1)), axis=2)
        self.last_start = np.broadcast_to(start[:, None], issue.shape).copy()
        return end

    def busy_until(self) -> np.ndarray:
        """(N, R) the latest end of anything queued."""
        return self.free.max(axis=2)


def serial_collectives(launch: np.ndarray, cost_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end), each (N, K), of K collectives on one lane: collective k starts once every rank
    launched it (launch: N, R, K) and collective k-1 ended, and lasts cost_ns[k] (or cost_ns[n, k])."""
    n, ranks, calls = launch.shape
    cost_ns = np.broadcast_to(np.asarray(cost_ns, dtype=float), (n, calls))
    comm = Communicator((n, ranks), 1, opens=-np.inf)  # times on the trace's clock: any value
    start, end = np.zeros((n, calls)), np.zeros((n, calls))
    for k in range(calls):  # one pass per bucket
        end[:, k] = comm.run(launch[:, :, k], cost_ns[:, k])
        start[:, k] = comm.last_start[:, 0]
    return start, end
