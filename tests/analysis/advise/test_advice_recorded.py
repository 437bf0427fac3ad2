"""analysis.advise on real CPU recordings (the session's: tests/support/recordings.py, 1 MiB buckets): the
layout rules rebuild the strategies' own buckets, and the fitted cost is the least-squares line of the recorded
calls. Apart from test_advice.py's synthetic runs, so that those need not wait for the recordings."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.advise.advice import advise

COMM_ROWS = """
SELECT (e.globalTid >> 24) & 16777215 AS pid, COALESCE(e.text, s.value) AS name, e.start, e."end",
       e.int64Value AS bytes
FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
WHERE e.eventType IN (59, 60) AND COALESCE(e.text, s.value) LIKE 'comm:all_reduce:%'
ORDER BY e.start
"""


@pytest.fixture(scope="module")
def recorded(nsys_recordings):
    return nsys_recordings("overlap", "overlap_bucket", "torch")  # 1 MiB buckets (tests/support/recordings.py)


@pytest.mark.nsys
@pytest.mark.parametrize("impl, rule", [("overlap_bucket", "before"), ("torch", "after")])
def test_the_layout_rules_rebuild_the_strategies_own_buckets(recorded, impl, rule):
    from analysis.run.loaded_run import load_trace
    from contract.buckets import FIRST_BUCKET_MB, MIB, plan_buckets

    meta = next(iter(load_trace(recorded / f"{impl}.sqlite").meta.values()))
    layout = meta["buckets"]
    order = [name for b in layout for name in b["params"]]  # the first step's arrival order
    sizes = [meta["param_bytes"][name] for name in order]
    cap = meta["bucket_mb"]
    planned = [[order[i] for i in b] for b in plan_buckets(sizes, cap * MIB, min(FIRST_BUCKET_MB, cap) * MIB, rule)]
    assert planned == [b["params"] for b in layout]
    assert len(layout) > 3  # 1 MiB buckets of the tiny model: the rules really split it


@pytest.mark.nsys
def test_the_fitted_cost_is_the_least_squares_line_of_the_recorded_calls(recorded):
    import sqlite3

    path = recorded / "overlap.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(COMM_ROWS).fetchall()
    con.close()
    by_pid: dict[int, list] = {}
    for pid, _, start, end, nbytes in rows:
        by_pid.setdefault(pid, []).append((start, end, nbytes))
    # independent of the analysis: per rank, a call starts at max(issue, previous end); the k-th calls of
    # the ranks are one collective, moving data from its last rank's start; the rank's end minus that
    served = {}
    for calls in by_pid.values():
        free, out = 0, []
        for start, end, nbytes in sorted(calls):
            out.append((max(start, free), end, nbytes))
            free = max(free, end)
        served[len(served)] = out
    transfers: dict[int, list] = {}
    for k in range(min(map(len, served.values()))):
        last = max(served[r][k][0] for r in served)
        for r in served:
            start, end, nbytes = served[r][k]
            # a call that ended before the rank's previous one did (gloo runs small ones beside it) moved nothing
            # the stream had to wait for: its transfer is 0, not negative
            transfers.setdefault(nbytes, []).append(max(min(end - last, end - start), 0))
    sizes = np.array(sorted(transfers), dtype=float)
    medians = np.array([np.median(transfers[int(b)]) for b in sizes])
    (result,) = advise([path], [1.0])
    assert len(sizes) >= 3
    # every line is the least-squares line of its sizes' medians, under the documented clamps (latency and
    # per-byte time >= 0), computed here independently: exact, however noisy the machine made the calls
    lines = [(result.cost.overall, np.ones(len(sizes), bool))]
    lines += [(line, (sizes >= line.lo_bytes) & (sizes <= line.hi_bytes)) for line in result.cost.ranges]
    for line, inside in lines:
        latency, per_byte = least_squares(sizes[inside], medians[inside])
        assert line.latency_ns == pytest.approx(latency, rel=1e-6, abs=1.0)
        assert line.ns_per_byte == pytest.approx(per_byte, rel=1e-6, abs=1e-12)
        # and no allowed line nearby describes those medians better (the fit is the optimum, not a guess)
        sse = lambda lat, pb, b=sizes[inside], t=medians[inside]: float(np.sum((lat + pb * b - t) ** 2))
        best = sse(line.latency_ns, line.ns_per_byte)
        for f_lat, f_pb in ((1.05, 1), (0.95, 1), (1, 1.05), (1, 0.95), (1.05, 0.95), (0.95, 1.05)):
            lat, pb = line.latency_ns * f_lat, line.ns_per_byte * f_pb
            assert best <= sse(lat, pb) * (1 + 1e-9) or (lat == line.latency_ns and pb == line.ns_per_byte)
    errors = np.abs(result.cost.overall.predict_ns(sizes) - medians) / np.maximum(medians, 1)
    print(
        f"overall {result.cost.overall.latency_ns / 1e3:.1f} us + {result.cost.overall.bandwidth_gbps:.3f} GB/s; "
        f"median error {np.median(errors):.2f} (as the machine allowed: not a pass/fail figure)"
    )


def least_squares(b: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(latency, per-byte) of t ~ latency + per_byte * b by least squares; a negative latency, a negative
    slope (the larger no slower) or, from three sizes, a latency within 1.96 standard errors of zero (numpy's
    own covariance of the fit) refitted through the origin (the rules comm_cost documents)."""
    if len(b) == 1:
        return 0.0, float(t[0] / b[0])
    (slope, intercept), cov = np.polyfit(b, t, 1, cov=True) if len(b) > 2 else (np.polyfit(b, t, 1), None)
    untold = cov is not None and intercept <= 1.96 * np.sqrt(cov[1, 1])
    if intercept < 0 or slope < 0 or untold:
        return 0.0, max(float(np.dot(b, t) / np.dot(b, b)), 0.0)
    return float(intercept), float(slope)


@pytest.mark.nsys
def test_a_change_within_its_interval_or_the_mean_steps_noise_is_said_to_be_within_the_noise(recorded):
    from analysis.advise.command import render_table

    (result,) = advise([recorded / "torch.sqlite"])
    run = result.to_json()
    spread, noise = run["step_spread_ms"], run["step_noise_ms"]
    assert 0 < noise < spread  # the mean of several steps is known better than one step
    told = {}
    for c in run["candidates"]:
        change, err = c["predicted_change_ms"], c["predicted_change_ms_err"]
        told[c["bucket_mb"]] = abs(change) > err and abs(change) > noise  # the interval leaves out 0, past the noise
        assert c["change_beyond_noise"] == told[c["bucket_mb"]]
    rows = [
        line.split() for line in render_table([run]).splitlines() if line.split()[:1] and line.split()[0][0].isdigit()
    ]
    for row in rows:  # one row per layout, led by its sizes ('1-2' for a group)
        first = float(row[0].split("-")[0])
        recorded_row = "recorded" in " ".join(row)
        assert ("within the noise" in " ".join(row)) == (not recorded_row and not told[first]), row
    print(f"spread {spread:.1f} ms, noise {noise:.1f} ms; told apart: {sorted(mb for mb, t in told.items() if t)}")
