"""Replaying a sharded (FSDP) step at another prefetch depth, with reduce-scatters on the all-gathers'
communicator or on their own: when each unit's weights arrive, how long compute waits, when the step ends.

Arrays are shaped (N, R, ...): N rows (rank-steps' steps, or bootstrap rows of them), R ranks, U units
in forward order; times in ns from the phase's start. What the replay does, per phase (forward, then
backward in reverse unit order), the rules of `ddp/strategies/fsdp.py`:

  1. at the phase's start the first `prefetch` units' all-gathers are issued (in backward, `backward_issue`
     after it where given: fsdp issues them from a hook on the output's gradient, after the loss's backward);
  2. a unit needs its weights after the compute before it (`lead` for the first unit, else the previous
     unit's `glue`); it resumes when its all-gather has ended (the wait: resume - need);
  3. its own compute (`own`) ends at its post-hook, which issues, in backward, its reduce-scatter and
     the replicated parameters' all-reduces of its span, then (both phases) the all-gather of the unit
     `prefetch` places further on; in backward the unit's post-hook also waits for the reduce-scatter
     two units back (two flat gradient buffers are shared: a third unit waits for the oldest);
  4. collectives run on communicators (communicator.Communicator: FIFO, `lanes` in flight at most);
     all-gathers and all-reduces share one communicator, reduce-scatters share it too
     (`separate=False`) or have their own;
  5. compute runs `slowdown` ns longer per ns of communication in flight beside it (that communication
     taken as one busy period from the span's start to the latest end queued on any lane);
  6. after backward, the step waits for every collective (the tail); the step is `other` (what the
     replay does not touch: loss, optimizer, the gap between forward and backward) plus the forward,
     backward and tail replayed. Each rank's forward starts at its recorded `offset` after the first
     rank's (the ranks' skew at the step's start, which the first collectives absorb);
  7. where the gathers block compute (`gathers_block`: FSDP2 on CPU gathers synchronously), each unit's
     all-gather is issued when the unit needs its weights and the unit resumes at its end, at any depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.advise.communicator import Communicator

BUFFERS = 2  # fsdp's flat gradient buffers (ddp/sharding/gradient_buffers.py)


@dataclass(frozen=True)
class Setting:
    """A candidate: the prefetch depth (>= 1) and whether reduce-scatters have their own communicator."""

    prefetch: int
    separate: bool

    def __post_init__(self) -> None:
        if not isinstance(self.prefetch, int) or self.prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {self.prefetch!r}")


@dataclass(frozen=True)
class Phase:
    """One phase's compute, units in the order the phase runs them: `lead` (N, R) before the first
    unit needs its weights; per unit (N, R, U) `own` (its weights arrived to its post-hook) and
    `glue` (post-hook to the next unit's need, or to the phase's end)."""

    lead: np.ndarray
    own: np.ndarray
    glue: np.ndarray


@dataclass(frozen=True)
class ShardRun:
    """What the replay needs. Costs (N, U) per row: each unit's all-gather and reduce-scatter, and the
    all-reduces issued in each unit's backward span (0 where none), in forward unit order."""

    forward: Phase
    backward: Phase  # units in backward order (`backward_units`; default the reverse of forward's)
    gap: np.ndarray  # (N, R) forward's end to backward's start
    other: np.ndarray  # (N, R) the rest of the step
    gather_ns: np.ndarray
    scatter_ns: np.ndarray
    reduce_ns: np.ndarray
    slowdown: np.ndarray  # (N,) extra compute ns per ns of communication beside it
    offset: np.ndarray | None = None  # (N, R) when each rank's forward starts (None: all at 0)
    backward_units: np.ndarray | None = None  # the units backward gathers, in its order (None: all, reversed)
    lanes: int = 1
    backward_issue: np.ndarray | None = None  # (N, R) when backward's first gathers are issued after its start
    gathers_block: bool = False  # each gather issued when its unit needs it, compute waiting for its end (7.)


@dataclass(frozen=True)
class Replay:
    """Per row and rank (N, R): the step, forward, backward and tail; per unit (N, R, U), in forward
    unit order, the wait for its weights in forward and in backward."""

    step: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    tail: np.ndarray
    forward_wait: np.ndarray
    backward_wait: np.ndarray


def stretch(base: np.ndarray, start: np.ndarray, busy_until: np.ndarray, slowdown: np.ndarray) -> np.ndarray:
    """Compute of `base` ns starting at `start`, slowed by `slowdown` per ns of communication in flight
    until `busy_until`: base + s * min(length, busy), solved for the length."""
    s = np.clip(slowdown, 0.0, 0.95)[:, None] if slowdown.ndim == 1 else slowdown
    busy = np.maximum(busy_until - start, 0.0)
    return np.where(base >= (1.0 - s) * busy, base + s * busy, base / (1.0 - s))


def _phase(
    run: ShardRun, phase: Phase, start: np.ndarray, order: np.ndarray, setting: Setting, backward: bool,
    comms: tuple[Communicator, Communicator],
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Replay one phase from `start` (N, R): its end and each unit's wait (N, R, U) in `order` positions."""
    gathers, scatters = comms
    units = order.size
    d = setting.prefetch
    arrive = np.full((*start.shape, units), np.nan)
    scattered = np.full((*start.shape, units), -np.inf)
    wait = np.zeros((*start.shape, units))

    def gather(k: int, at: np.ndarray) -> None:
        arrive[:, :, k] = gathers.run(at, run.gather_ns[:, order[k]])[:, None]

    first = start + run.backward_issue if backward and run.backward_issue is not None else start
    ahead = 0 if run.gathers_block else d  # gathers that block are not issued ahead of their need
    for k in range(min(ahead, units)):  # issued at the phase's start (backward: its recorded point), in order
        gather(k, first)
    busy = lambda: np.maximum(gathers.busy_until(), scatters.busy_until())
    t = start + stretch(phase.lead, start, busy(), run.slowdown)
    for k in range(units):  # one pass per unit (not per trace event)
        if run.gathers_block:
            gather(k, t)
        resume = np.maximum(t, arrive[:, :, k])
        wait[:, :, k] = resume - t
        post = resume + stretch(phase.own[:, :, k], resume, busy(), run.slowdown)
        if backward:
            if k >= BUFFERS:  # its gradient needs a buffer: the oldest reduce-scatter must have ended
                post = np.maximum(post, scattered[:, :, k - BUFFERS])
            unit = order[k]
            scattered[:, :, k] = scatters.run(post, run.scatter_ns[:, unit])[:, None]
            if np.any(run.reduce_ns[:, unit] > 0):
                gathers.run(post, run.reduce_ns[:, unit])
        if ahead and k + d < units:
            gather(k + d, post)
        t = post + stretch(phase.glue[:, :, k], post, busy(), run.slowdown)
    out = np.zeros((*start.shape, run.gather_ns.shape[1]))
    out[:, :, order] = wait
    return t, out


def replay(run: ShardRun, setting: Setting) -> Replay:
    """The replayed step (module docstring) of every row at one setting."""
    shape = run.gap.shape
    shared = Communicator(shape, run.lanes)
    comms = (shared, Communicator(shape, run.lanes) if setting.separate else shared)
    units = run.gather_ns.shape[1]
    forward_order = np.arange(units)
    backward_order = forward_order[::-1] if run.backward_units is None else np.asarray(run.backward_units)
    origin = np.zeros(shape) if run.offset is None else run.offset.astype(float)
    f_end, f_wait = _phase(run, run.forward, origin, forward_order, setting, False, comms)
    b_start = f_end + run.gap
    b_end, b_wait = _phase(run, run.backward, b_start, backward_order, setting, True, comms)
    done = np.maximum(comms[0].busy_until(), comms[1].busy_until())
    tail = np.maximum(done - b_end, 0.0)
    return Replay(
        step=run.other + b_end - origin + tail,
        forward=f_end - origin,
        backward=b_end - b_start,
        tail=tail,
        forward_wait=f_wait,
        backward_wait=b_wait,
    )
