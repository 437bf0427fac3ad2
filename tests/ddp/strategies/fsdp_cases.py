"""Models, a reference trainer and rank workers for the sharded strategies' tests (module level: spawned
ranks import them)."""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ddp.comm import nvtx_ranges
from ddp.launch.launcher import DistContext
from ddp.sharding.unit_state import casting
from ddp.strategies import registry
from ddp.training.data import shard

VOCAB, DIM, HIDDEN, TOKENS = 40, 16, 24, 5
LR = {"sgd": 0.5, "adamw": 0.01}


class Mixed(nn.Module):
    """Every feature the sharded strategies must get right: an Embedding, a LayerNorm, a Linear whose bias
    is frozen, a frozen Linear, a Linear registered twice and applied twice, a head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.fc1.bias.requires_grad_(False)
        self.frozen = nn.Linear(HIDDEN, HIDDEN).requires_grad_(False)
        self.mid = nn.Linear(HIDDEN, HIDDEN)
        self.mid_again = self.mid
        self.fc2 = nn.Linear(HIDDEN, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(self.norm(self.emb(tokens))))
        h = F.relu(self.mid_again(F.relu(self.mid(self.frozen(h)))))
        return self.head(self.fc2(h))


class Odd(nn.Module):
    """Parameters whose sizes no world size divides: every unit is padded."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 7)
        self.fc = nn.Linear(7, 5)
        self.head = nn.Linear(5, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.fc(self.emb(tokens))))


class Stack(nn.Module):
    """Six units in a row (an Embedding, four Linears between LayerNorms, a head): prefetching shows."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(4))
        self.norms = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(4))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for layer, norm in zip(self.layers, self.norms, strict=True):
            h = h + F.relu(layer(norm(h)))
        return self.head(h)


class Dangling(nn.Module):
    """A unit run last in forward on a detached input and left out of the loss: backward prefetches its
    all-gather (it is among the last units) and never runs it, so the step ends with that gather pending."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.fc = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.side = nn.Linear(DIM, DIM)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(self.emb(tokens)))
        self.side(h.detach())  # gathered in forward, no part of the loss
        return self.head(h)


MODELS = {"mixed": Mixed, "odd": Odd, "stack": Stack, "dangling": Dangling}


def build(model: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[model]()


def batch(step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, TOKENS + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))


def optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR["sgd"])
    return torch.optim.AdamW(params, lr=LR["adamw"], weight_decay=0.01)


def train_reference(
    model: str,
    opt_name: str,
    steps: int,
    batch_size: int,
    world: int,
    dtype: torch.dtype | None = None,
    threads: int = 1,
    groups: list[list[int]] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Single-process training on whole global batches, the parameters after every step. Each step's
    gradient is each rank's slice's gradient, summed in rank order, divided by the world size: the same
    arithmetic as the ranks'. With `dtype`, every parameter and floating input is cast as FSDP casts.
    `threads`: the ranks' intra-op threads (LayerNorm's backward sums per thread: its bits depend on it).
    `groups`: sum within each group of ranks in rank order first, then the groups' sums in order (hsdp's shard
    groups); default one group of every rank."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train_reference(model, opt_name, steps, batch_size, world, dtype, groups or [list(range(world))])
    finally:
        torch.set_num_threads(before)


def _train_reference(
    model: str,
    opt_name: str,
    steps: int,
    batch_size: int,
    world: int,
    dtype: torch.dtype | None,
    groups: list[list[int]],
) -> list[dict[str, torch.Tensor]]:
    net = build(model, seed=0)
    opt = optimizer(opt_name, net.parameters())
    history = []
    for step in range(steps):
        total: dict[str, torch.Tensor] = {}
        for group in groups:
            partial: dict[str, torch.Tensor] = {}
            for r in group:
                net.zero_grad(set_to_none=True)
                x, y = shard(batch(step, batch_size), r, world)
                with casting(net, dtype):
                    loss_of(net(x), y).backward()
                for n, p in net.named_parameters():
                    if p.grad is not None:
                        partial[n] = partial[n] + p.grad if n in partial else p.grad.clone()
            for n, g in partial.items():
                total[n] = total[n] + g if n in total else g
        for n, p in net.named_parameters():
            p.grad = total[n] / world if n in total else None
        opt.step()
        history.append({k: v.detach().clone() for k, v in net.named_parameters()})
    return history


def run_sharded(ctx: DistContext, case: dict) -> dict:
    """Train one case with warnings as errors and deterministic algorithms; full parameters after each step, and
    with `ranges` in the case the names of the comm ranges its steps opened."""
    if not case.get("ranges"):
        return _run_sharded(ctx, case)
    from tests.ddp.comm.test_nvtx_ranges import Recorder

    rec, saved = Recorder(), (nvtx_ranges.range, nvtx_ranges.start, nvtx_ranges.end)
    nvtx_ranges.range, nvtx_ranges.start, nvtx_ranges.end = rec.range, rec.start, rec.end  # this process only
    try:
        outcome = _run_sharded(ctx, case)
    finally:
        nvtx_ranges.range, nvtx_ranges.start, nvtx_ranges.end = saved
    return {**outcome, "ranges": sorted({name for name, _ in rec.payloads if name.startswith("comm:")})}


def _run_sharded(ctx: DistContext, case: dict) -> dict:
    warnings.simplefilter("error")
    # FSDP2's advice when a unit returns a view (a Linear on 3-D input does): these models change none in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    torch.use_deterministic_algorithms(True)
    module = build(case["model"], seed=ctx.rank)  # differs per rank until the wrapper broadcasts rank 0's
    wrapper = registry.get(case["impl"])(module, **case.get("kwargs", {}))
    opt = optimizer(case["optimizer"], wrapper.parameters())
    history, layouts = [], []
    for step in range(case["steps"]):
        x, y = shard(batch(step, case["batch_size"]), ctx.rank, ctx.world_size)
        opt.zero_grad(set_to_none=True)
        loss_of(wrapper(x), y).backward()
        wrapper.finish_gradient_synchronization()
        opt.step()
        wrapper.reset_comm_stats()
        history.append(wrapper.gather_full_params())
    shards = {
        n: (tuple(p.shape), p.dtype, None if p.grad is None else (tuple(p.grad.shape), p.grad.dtype))
        for n, p in wrapper.module.named_parameters()
    }
    layouts.append(getattr(wrapper, "sharded_layout", list)())
    return {
        "history": history,
        "shards": shards,
        "layout": layouts[0],
        "rank": ctx.rank,
        "threads": torch.get_num_threads(),
    }


def sharded_worker(ctx: DistContext, cases: list[dict]) -> list[dict]:
    return [run_sharded(ctx, case) for case in cases]


def every_rank_worker(ctx: DistContext, cases: list[dict]) -> list[list[dict]] | None:
    """`sharded_worker`'s outcomes of every rank, gathered on rank 0 (others return None)."""
    import torch.distributed as dist

    mine = sharded_worker(ctx, cases)
    everyone: list = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    return everyone if ctx.rank == 0 else None


class EventLog:
    """Stands in for NVTX (ddp.comm.nvtx_ranges' range/start/end) and logs, in order, each comm range's start
    (name, payload) and end, and each unit's forward start and end."""

    def __init__(self):
        self.events: list[tuple[str, str, int | None]] = []  # (kind, name, payload)
        self._names: dict[int, str] = {}

    def range(self, name, cache=True, payload=None):
        return contextlib.nullcontext()

    def start(self, name, payload=None):
        rid = len(self._names) + 1
        self._names[rid] = name
        self.events.append(("start", name, payload))
        return rid

    def end(self, rid):
        self.events.append(("end", self._names[rid], None))

    def mark(self, text):
        pass

    def watch(self, module: nn.Module, name: str) -> None:
        """Log `module`'s forward start and end (hooks registered before the wrapper's run before them)."""
        module.register_forward_pre_hook(lambda *_: self.events.append(("forward_start", name, None)))
        module.register_forward_hook(lambda *_: self.events.append(("forward_end", name, None)))


def log_steps(ctx: DistContext, case: dict) -> dict:
    """Two steps of `case` with every comm range and unit forward logged; the second step's log, the
    wrapper's memory parts and sharded layout after it, and whether every range ended."""
    from ddp.comm import nvtx_ranges

    log = EventLog()
    module = build(case["model"], seed=0)
    units = [n for n, m in module.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
    for name in units:
        log.watch(module.get_submodule(name), name)
    wrapper = registry.get(case["impl"])(module, **case.get("kwargs", {}))
    opt = optimizer(case["optimizer"], wrapper.parameters())
    saved = {name: getattr(nvtx_ranges, name) for name in ("range", "start", "end")}
    for name in saved:  # in place of NVTX, payloads included
        setattr(nvtx_ranges, name, getattr(log, name))
    try:
        for step in range(2):
            del log.events[:]
            x, y = shard(batch(step, case["batch_size"]), ctx.rank, ctx.world_size)
            opt.zero_grad(set_to_none=True)
            loss_of(wrapper(x), y).backward()
            wrapper.finish_gradient_synchronization()
            opt.step()
            stats = wrapper.reset_comm_stats()
    finally:
        for name, function in saved.items():
            setattr(nvtx_ranges, name, function)
    return {
        "events": list(log.events),
        "memory": wrapper.memory_parts().as_bytes(),
        "layout": wrapper.sharded_layout(),
        "ops": stats.num_ops,
        "bytes": stats.bytes,
        "replicated_bytes": sum(p.numel() * 4 for p in wrapper.params),
        "buffers": sum(b.numel() * b.element_size() for b in module.buffers()),
    }


def log_worker(ctx: DistContext, cases: list[dict]) -> list[dict]:
    return [log_steps(ctx, case) for case in cases]


def behaviours(ctx: DistContext) -> dict:
    """What FSDP does around plain training: a forward without grad (eval), and a second backward before
    finish_gradient_synchronization (refused)."""
    from ddp.grads.grad_flags import ACCUMULATION_ERROR

    module = build("stack", seed=0)
    wrapper = registry.get("fsdp")(module)
    x, y = shard(batch(0, 8), ctx.rank, ctx.world_size)
    with torch.no_grad():
        before = wrapper(x)
    free_after_eval = all(s.full.untyped_storage().nbytes() == 0 for s in wrapper.states)
    params_after_eval = {n: tuple(p.shape) for n, p in wrapper.module.named_parameters()}
    loss_of(wrapper(x), y).backward()
    try:
        loss_of(wrapper(x), y).backward()
        refused = ""
    except RuntimeError as err:
        refused = str(err)
    return {
        "eval_logits_shape": tuple(before.shape),
        "free_after_eval": free_after_eval,
        "params_after_eval": params_after_eval,
        "refused": refused == ACCUMULATION_ERROR,
    }
