"""The "had a gradient" flags: how every rank learns which parameters no rank had a gradient for.

A parameter without a local gradient is sent as zeros, so that every rank issues the same
collectives in the same order. Its flag (1 or 0) travels in one of the step's own collectives,
appended to the gradients: after the sum, a flag of 0 means no rank had a gradient, and the
parameter goes back to `grad=None`, exactly as in single-process training. A parameter that some
ranks had keeps the mean with zeros from the others.

Nothing of this costs anything in a step where every parameter has its gradient: the flags are a
view into a buffer allocated once, written by a scalar fill (per-element writes only when a
gradient is missing), and read back to the host only when some parameter had no local gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Hook-driven wrappers send a gradient as soon as backward produces it; a second backward would add
# into a tensor that is already on the wire.
ACCUMULATION_ERROR = (
    "a parameter's gradient arrived twice before finish_gradient_synchronization(): "
    "call it after every backward (gradient accumulation is not supported)"
)


class GradFlags:
    """One flag per parameter, stored in `flags` (a view into the buffer of the collective carrying it)."""

    def __init__(self, params: Sequence[torch.Tensor], flags: torch.Tensor):
        if flags.numel() != len(params):
            raise ValueError(
                f"GradFlags needs one flag per parameter: {flags.numel()} flags for {len(params)} parameters"
            )
        self.params, self.flags = params, flags
        self.had = [False] * len(params)  # per parameter: a local gradient this step

    @classmethod
    def appended(cls, numel: int, params: Sequence[torch.Tensor], like: torch.Tensor) -> tuple[torch.Tensor, GradFlags]:
        """A zeroed buffer of `numel` elements followed by the flags of `params` (dtype and device
        of `like`), and those flags."""
        buffer = torch.zeros(numel + len(params), dtype=like.dtype, device=like.device)
        return buffer, cls(params, buffer[numel:])

    def note_present(self) -> None:
        """Record which parameters hold a gradient now (before any zeros are given out)."""
        for k, p in enumerate(self.params):
            self.had[k] = p.grad is not None

    def write_present(self) -> None:
        """Flag the parameters that hold a gradient now: `note_present()` then `write()`."""
        self.note_present()
        self.write()

    def mark(self, k: int) -> None:
        """Parameter `k` has a local gradient this step."""
        self.had[k] = True

    def grad_or_zeros(self, k: int) -> torch.Tensor:
        """Parameter `k`'s gradient, after giving it a zero one if it has none (its flag is unchanged)."""
        p = self.params[k]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        return p.grad

    def write(self) -> None:
        """1.0 per parameter with a local gradient, 0.0 otherwise, written in place on the device."""
        self.flags.fill_(1.0)
        if not all(self.had):
            for k, had in enumerate(self.had):
                if not had:
                    self.flags[k] = 0.0

    def drop_unused(self) -> None:
        """After the sum over ranks: back to grad=None for each parameter no rank had a gradient for."""
        if all(self.had):
            return  # every count is >= 1: nothing to read, so no device-to-host copy
        for p, had, count in zip(self.params, self.had, self.flags.tolist(), strict=True):
            if not had and count == 0:
                p.grad = None

    def clear(self) -> None:
        """Forget this step's flags (the next step starts with none)."""
        for k in range(len(self.had)):
            self.had[k] = False


def carrier_last_order(params: Sequence[torch.Tensor]) -> list[int]:
    """Per-parameter issue order: reverse registration, with the smallest parameter moved last."""
    order = list(range(len(params)))[::-1]
    if order:
        carrier = min(order, key=lambda i: params[i].numel())
        order.remove(carrier)
        order.append(carrier)
    return order


class FlagCarrier:
    """Per-parameter collectives (one per parameter, in `order`) whose last one, the smallest
    parameter's, carries every parameter's flags appended to its gradient, in a buffer kept from
    step to step: the count of collectives stays one per parameter."""

    def __init__(self, params: Sequence[torch.Tensor]):
        if not params:
            raise ValueError("FlagCarrier needs at least one parameter")
        self.params = params
        self.order = carrier_last_order(params)
        self.index = self.order[-1]
        like = params[self.index]
        self.numel = like.numel()
        self.buffer, self.flags = GradFlags.appended(self.numel, params, like)

    def pack(self) -> torch.Tensor:
        """The carrier's gradient (zeros if it has none) copied in front of the flags: the buffer to sum."""
        grad = self.flags.grad_or_zeros(self.index)
        self.buffer[: self.numel].copy_(grad.reshape(-1))
        return self.buffer

    def unpack(self) -> torch.Tensor:
        """After the sum: the carrier's summed gradient copied back into its .grad, which is returned."""
        grad = self.flags.grad_or_zeros(self.index)  # the one `pack` sent
        return grad.copy_(self.buffer[: self.numel].view_as(grad))

    def layout(self, names: list[str]) -> list[dict]:
        """One entry per collective, in issue order: {name: its tag, params: [name], bytes: its payload}."""

        def payload(i: int) -> int:
            tensor = self.buffer if i == self.index else self.params[i]
            return tensor.numel() * tensor.element_size()

        return [{"name": names[i], "params": [names[i]], "bytes": payload(i)} for i in self.order]
