"""What a collective of n bytes costs: latency + n / bandwidth, fitted from a trace's own calls.

The calls of one run queue on their rank's communicator (GPU: one NCCL stream; CPU: gloo's worker threads,
`lanes` collectives at once), so a call's service time is measured from its *effective* start, the later of
its arrival and the end of the call `lanes` places before it on the same communicator, to its end, minus the
time it waited for the last rank to arrive (call_groups.pair). Calls of one rank in transfer at once share
its communication (gloo's threads share the host's cores and memory; separate communicators share the link),
so each call counts its share of that time (shared_transfer): alone, its whole transfer; beside one other,
half of the overlap. Counted whole, a 256 KiB gather of a CPU fsdp run took 1.2-2.2 ms (median) at prefetch
1s-3s against 0.85 ms at 1, and those recordings predicted prefetch 1 +8 to +29 % slower where it measured
-4 to +8 %; shared out, those gathers cost 0.8-1.4 ms (docs/measurements/2026-11-29-advise-crossval-cpu-4.md). The
transfer times are fitted by least squares, one line per message-size range (the distinct sizes, smallest
first, grouped greedily into ranges at most RANGE_FACTOR wide; a range gets a line when its sizes span at
least MIN_SPREAD), and one line over all calls.
A size inside a range's sizes takes that range's line; above every range, the largest range's line if that
range holds the largest recorded size (large messages are bandwidth-bound there too); below every range, the
smallest's if it holds the smallest recorded size; anywhere else (between ranges, or beyond a range past
recorded sizes that made no line of their own), the overall line. Latency and per-byte time are clamped at
zero: a line that would need a negative latency goes through the origin. So do calls that cannot tell a latency
from a per-byte time (one size, the larger no slower, or, from three sizes on, a fitted latency within 1.96
standard errors of zero, the error from the fit's residuals): their time is taken as per-byte, so a
candidate's smaller calls cost what their bytes cost rather than each what a recorded call took. A latency
alone had made every smaller call as slow as the recorded ones: recorded at 100 MiB on CPU, 5 MiB buckets
predicted +672 % of the step, measured -4 % (docs/measurements/2026-11-28-advise-crossval-cpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.advise.uncertainty import Z95
from analysis.measure import intervals as iv
from analysis.measure.call_groups import pair

RANGE_FACTOR = 16.0  # each message-size range spans this factor of sizes
MIN_SPREAD = 1.5  # a range's distinct sizes must span this factor for a line of its own


@dataclass(frozen=True)
class Line:
    """latency_ns + bytes * ns_per_byte, fitted over sizes [lo_bytes, hi_bytes] from `calls` calls."""

    lo_bytes: float
    hi_bytes: float
    latency_ns: float
    ns_per_byte: float
    calls: int
    sizes: int = 0  # distinct message sizes it was fitted on
    latency_not_fitted: str | None = None  # why the calls could not tell a latency apart (fit_line)

    @property
    def bandwidth_gbps(self) -> float:
        """Bytes per second / 1e9 (inf when the per-byte time is zero)."""
        return float("inf") if self.ns_per_byte <= 0 else 1.0 / self.ns_per_byte

    def predict_ns(self, nbytes: ArrayLike) -> np.ndarray:
        return self.latency_ns + np.asarray(nbytes, dtype=float) * self.ns_per_byte

    def unfitted(self) -> str | None:
        """Why the bandwidth could not be fitted (None when it was): the calls' times did not grow with their size
        at all (a line exactly flat, or calls that took no time), so the line is a latency alone."""
        return "the calls' times did not grow with their size" if np.isinf(self.bandwidth_gbps) else None


@dataclass(frozen=True)
class CommCost:
    """The fitted cost: one line per message-size range that has enough calls, and one over all calls."""

    ranges: tuple[Line, ...]
    overall: Line

    def predict_ns(self, nbytes: ArrayLike) -> np.ndarray:
        """Each size's cost from its range's line (module docstring), else from the overall line."""
        n = np.asarray(nbytes, dtype=float)
        out = self.overall.predict_ns(n)
        if not self.ranges:
            return out
        lowest, highest = self.ranges[0], self.ranges[-1]
        # beyond the ranges, a range's line extends only past the recorded sizes it holds itself: sizes
        # recorded outside every range (too few to make a line) are known to the overall line alone
        if lowest.lo_bytes <= self.overall.lo_bytes:
            out = np.where(n < lowest.lo_bytes, lowest.predict_ns(n), out)
        if highest.hi_bytes >= self.overall.hi_bytes:
            out = np.where(n > highest.hi_bytes, highest.predict_ns(n), out)
        for line in self.ranges:
            inside = (n >= line.lo_bytes) & (n <= line.hi_bytes)
            out = np.where(inside, line.predict_ns(n), out)
        return out


def fit_line(nbytes: ArrayLike, ns: ArrayLike, *, test_latency: bool = False) -> tuple[float, float, str | None]:
    """Least-squares (latency_ns, ns_per_byte, why) of ns ~ latency + bytes * per_byte, both >= 0; `why` says
    why the latency is zero when the calls could not tell it from the per-byte time (module docstring), else None.
    test_latency: also when the fitted latency's 95 % interval reaches zero (three or more sizes).

    Each distinct size counts once, at the median of its calls, so a size called often does not
    outweigh the others and one slow call does not move the line."""
    frame = pd.DataFrame({"b": np.asarray(nbytes, dtype=float), "t": np.asarray(ns, dtype=float)}).dropna()
    if frame.empty:
        raise ValueError("no calls to fit a communication cost from")
    per_size = frame.groupby("b")["t"].median()
    b, t = per_size.index.to_numpy(dtype=float), per_size.to_numpy(dtype=float)
    through_origin = float(max(np.dot(b, t) / np.dot(b, b), 0.0)) if np.dot(b, b) > 0 else 0.0
    if b.size == 1:
        return 0.0, through_origin, "one call size only: latency and bandwidth cannot be told apart"
    slope, intercept = np.polyfit(b, t, 1)
    if slope < 0:
        return 0.0, through_origin, f"{b.size} distinct call sizes, the larger no slower"
    if intercept < 0:
        return 0.0, through_origin, None
    err = Z95 * intercept_se(b, t, slope, intercept) if test_latency and b.size > 2 else 0.0
    if 0 < intercept <= err:
        return (
            0.0,
            through_origin,
            f"{intercept / 1e6:.3g} ± {err / 1e6:.3g} ms over {b.size} call sizes, not told from zero",
        )
    return float(intercept), float(slope), None


def intercept_se(b: np.ndarray, t: np.ndarray, slope: float, intercept: float) -> float:
    """The standard error of a least-squares line's intercept, from its residuals (b: three or more sizes)."""
    residual = t - (intercept + slope * b)
    variance = float(residual @ residual) / (b.size - 2)
    spread = float(((b - b.mean()) ** 2).sum())
    return float(np.sqrt(variance * (1.0 / b.size + b.mean() ** 2 / spread)))


def fit_cost(nbytes: ArrayLike, ns: ArrayLike) -> CommCost:
    """The overall line and one line per message-size range with enough distinct sizes (module docstring)."""
    b, t = np.asarray(nbytes, dtype=float), np.asarray(ns, dtype=float)
    keep = ~(np.isnan(b) | np.isnan(t)) & (b > 0)
    b, t = b[keep], t[keep]
    latency, per_byte, why = fit_line(b, t, test_latency=True)
    overall = Line(float(b.min()), float(b.max()), latency, per_byte, int(b.size), int(np.unique(b).size), why)
    lines = []
    for sizes in size_ranges(np.unique(b)):
        if sizes.max() / sizes.min() >= MIN_SPREAD:
            inside = (b >= sizes.min()) & (b <= sizes.max())
            lat, pb, why = fit_line(b[inside], t[inside], test_latency=True)
            lines.append(Line(float(sizes.min()), float(sizes.max()), lat, pb, int(inside.sum()), int(sizes.size), why))
    return CommCost(tuple(lines), overall)


def size_ranges(sizes: np.ndarray) -> list[np.ndarray]:
    """Sorted distinct sizes cut into runs: a run ends before the first size over RANGE_FACTOR x its smallest."""
    runs, first = [], 0
    # one pass over the distinct message sizes (a handful to a few hundred), not over calls
    for i in range(1, sizes.size + 1):
        if i == sizes.size or sizes[i] > sizes[first] * RANGE_FACTOR:
            runs.append(sizes[first:i])
            first = i
    return runs


def serial_starts(calls: pd.DataFrame, lanes: int = 1, channel: str | None = None) -> np.ndarray:
    """Each call's effective start on its rank's communicator: max(own start, the end of the call `lanes`
    places before it), per rank (and per `channel` column, one communicator each, when given)."""
    keys = ["rank"] if channel is None else ["rank", channel]
    order = calls.sort_values([*keys, "start_ns"], kind="stable")
    prev_end = order.groupby(keys, sort=False)["end_ns"].shift(lanes)
    prev_end = prev_end.groupby([order[k] for k in keys], sort=False).cummax()  # a call waits for all earlier ones
    start = np.maximum(order["start_ns"].to_numpy(dtype=float), prev_end.fillna(-np.inf).to_numpy())
    return pd.Series(start.astype(np.int64), index=order.index).reindex(calls.index).to_numpy()


def transfer_times(calls: pd.DataFrame, world: int, lanes: int = 1, channel: str | None = None) -> pd.DataFrame:
    """rank, step, op, tag, bytes, start_ns (effective start), end_ns, wait_ns (for the last rank) and
    transfer_ns of every paired call with known bytes (serial_starts, call_groups.pair, then shared_transfer)."""
    served = calls.assign(start_ns=serial_starts(calls, lanes, channel))
    paired = pair(served if channel is None else served.drop(columns=channel), world)
    paired["transfer_ns"] = shared_transfer(paired)
    ok = paired["paired"].to_numpy() & paired["bytes"].notna().to_numpy()
    cols = ["rank", "step", "op", "tag", "bytes", "start_ns", "end_ns", "wait_ns", "transfer_ns"]
    return paired.loc[ok, [c for c in cols if c in paired.columns]].reset_index(drop=True)


def shared_transfer(paired: pd.DataFrame) -> np.ndarray:
    """Each paired call's transfer (its last `transfer_ns` before `end_ns`) as its share of the rank's
    communication: the integral over it of 1 / the rank's calls in transfer then (intervals.shared_lengths,
    over every communicator of the rank). Calls that never overlap keep their length; NaN stays NaN."""
    out = paired["transfer_ns"].to_numpy(dtype=float).copy()
    end, rank = paired["end_ns"].to_numpy(dtype=float), paired["rank"].to_numpy()
    known = ~np.isnan(out)
    for r in np.unique(rank[known]):  # one pass per rank (a handful)
        mine = known & (rank == r)
        out[mine] = iv.shared_lengths(end[mine] - out[mine], end[mine])
    return out


def line_json(line: Line) -> dict:
    """A cost line as the JSON of `analysis.advise` gives it: latency in us, bandwidth in GB/s (None: not
    fitted, and `bandwidth_not_fitted` says why), its calls and distinct call sizes, and `latency_not_fitted`
    when the calls could not tell a latency apart (the time is then per-byte alone)."""
    why = line.unfitted()
    return {
        "latency_us": round(line.latency_ns / 1e3, 3),
        "bandwidth_gb_s": None if why else round(line.bandwidth_gbps, 4),
        "calls": line.calls,
        "call_sizes": line.sizes,
        **({"bandwidth_not_fitted": why} if why else {}),
        **({"latency_not_fitted": line.latency_not_fitted} if line.latency_not_fitted else {}),
    }


def line_text(line: dict) -> str:
    """A line of line_json as text: 'latency us + bandwidth GB/s', saying why a part was not fitted."""
    if line["bandwidth_gb_s"] is None:
        why = line.get("bandwidth_not_fitted") or "no bandwidth fitted"
        return f"{line['latency_us']:.1f} us per call, whatever its size (bandwidth not fitted: {why})"
    if line.get("latency_not_fitted"):
        return f"{line['bandwidth_gb_s']:.3f} GB/s, no latency (not fitted: {line['latency_not_fitted']})"
    return f"{line['latency_us']:.1f} us + {line['bandwidth_gb_s']:.3f} GB/s"
