"""Check every chosen implementation against single-process training on the same global batches.

    python -m ddp.verify --impl all --world-size 2 [--model toy|tiny] [--steps N] [--optimizer sgd|adamw]
        [--collective torch|ring|reduce_broadcast] [--shard-optimizer] [--compute-dtype fp16|bf16]
        [--prefetch N] [--separate-reduce-scatter]

Each rank starts from a different random initialisation (seed + rank), so a pass also shows that
construction broadcast rank 0's state. With --shard-optimizer each rank keeps and steps the optimizer
state of its share of the parameters only (ddp.ShardedOptimizer); the same run with the plain
optimizer must then give bit-identical parameters (torch.equal: sharded_equals_unsharded), besides
the check against one process. Prints, per implementation, how it was compared, the largest |difference| of any
parameter from the single-process run, how many elements fall outside --rtol/--atol (default:
torch.allclose's 1e-5/1e-8), the largest difference between ranks, and PASS when no element is out
of tolerance and the ranks agree within 1e-6. Exit status 1 on any FAIL, 2 on bad input.

AdamW divides by sqrt(v) + 1e-8, so on the Transformer a few gradients near 1e-8 turn float32
rounding (ranks sum half-batches, one process sums the whole) into update differences up to the
learning rate: expect a handful of elements out of millions outside the default tolerances there.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ddp import cli
from ddp.launch.launcher import DistContext, launch
from ddp.strategies import registry
from ddp.training.config import SHARDED_ONLY, RunConfig
from ddp.training.data import global_batch
from ddp.training.loop import build_wrapped, loss_fn, make_optimizer, run_optimizer, step_batch, train_step
from ddp.training.models import build_model
from ddp.training.reference import cpu_copies, deterministic, summation_groups, train_rank_slices
from ddp.training.slow_rank import stall_of
from ddp.verify_table import verify_table

RANK_TOLERANCE = 1e-6  # ranks hold the same all-reduced values; allow only rounding noise
CAST_TOLERANCE = 1e-4  # fp16/bf16 compute: every parameter after every step this close to the cast reference
COLUMNS = [
    "implementation",
    "compared",
    "max_abs_diff_vs_single",
    "elements_not_close",
    "steps_bit_identical",
    "max_abs_diff_between_ranks",
    "sharded_equals_unsharded",
    "result",
]


def bit_identity_skipped(cfg: RunConfig, backend: str, devices: Sequence[str]) -> str | None:
    """Why a sharded fp32 run cannot be required to equal the rank-slice reference bit for bit (None: it is).

    On 2 ranks every gradient element is one sum a + b, the same whichever rank's term the backend (gloo or
    NCCL) adds first, and the reference runs on rank 0's device with the same kernels: the bits can match.
    So can hsdp's on 2 x 2 (or 2 x 1): a sum of two within the shard group, then of two across replicas,
    which the reference adds in the same tree (ddp.training.reference.summation_groups).
    """
    if cfg.impl in registry.HYBRID:
        shard = cfg.resolved_shard_size
        if shard > 2 or cfg.world_size > 2 * shard:
            return f"shard groups of {shard} ranks, {cfg.world_size // shard} replicas: sums of more than 2 terms"
    elif cfg.world_size != 2:
        return f"{cfg.world_size} ranks: {backend} may add the {cfg.world_size} gradients in another order"
    if len(set(devices)) > 1:
        return f"ranks on different devices ({', '.join(sorted(set(devices)))}): kernels may round differently"
    return None


def how_compared(cfg: RunConfig, rtol: float, atol: float, device: str = "cpu", skipped: str | None = None) -> str:
    """What a row's checks were: against whom (run on `device`), with which optimizer, how close; `skipped`:
    why bit-identity was reported but not required."""
    slices = f"each step vs 1 process on {device} adding the {cfg.world_size} rank slices' gradients"
    if cfg.impl in registry.HYBRID:
        slices += f" within shard groups of {cfg.resolved_shard_size}, then across them"
    strict = "deterministic, warnings as errors"
    if cfg.compute_dtype is not None:
        text = f"{slices}, cast to {cfg.compute_dtype} alike (|diff| <= {CAST_TOLERANCE:g}; {strict})"
    else:
        text = f"vs 1 process on {device}, {cfg.optimizer} (allclose rtol {rtol:g} atol {atol:g})"
        if cfg.impl in registry.SHARDED:
            only = "" if skipped is None else f"; bit-identity skipped: {skipped}, allclose decides"
            text += f"; {slices} (torch.equal{only}; {strict})"
    if cfg.prefetch is not None:
        text += f"; prefetch {cfg.prefetch}"
    if cfg.separate_reduce_scatter:
        text += "; reduce-scatters on their own process group"
    if cfg.shard_optimizer and cfg.impl in registry.SHARDED:
        text += "; optimizer state sharded by the strategy itself: the same run twice (torch.equal)"
    elif cfg.shard_optimizer:
        text += f"; {cfg.optimizer} state sharded over {cfg.world_size} ranks vs unsharded (torch.equal)"
    return text


def train_single_process(cfg: RunConfig, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Plain training of the unwrapped model on each whole global batch, on `device`: the reference (on the CPU)."""
    model = build_model(cfg.model, cfg.context_length, cfg.seed).to(device)
    optimizer = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    for step in range(cfg.steps):
        inputs, targets = global_batch(cfg.model, step, cfg.batch_size, cfg.context_length, cfg.seed)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs.to(device)), targets.to(device)).backward()
        optimizer.step()
    return cpu_copies(model)


def train_data_parallel(ctx: DistContext, cfg: RunConfig) -> dict:
    """Train `cfg` on this rank's shards from a rank-specific init; rank 0's params and the rank spread.

    A sharded strategy runs with deterministic algorithms and warnings raised as errors, and its parameters
    are kept after every step (`history`), for the bit-for-bit check."""
    sharded = cfg.impl in registry.SHARDED
    with warnings.catch_warnings(), deterministic(sharded):
        if sharded:
            warnings.simplefilter("error")
        model = build_wrapped(ctx, cfg, seed=cfg.seed + ctx.rank)  # differs per rank until broadcast
        optimizer = run_optimizer(cfg, model.module.parameters())
        history = []
        stall = stall_of(cfg.slow_rank, ctx.rank)
        for step in range(cfg.steps):
            train_step(model, optimizer, step_batch(ctx, cfg, step, stall), step, stall)
            if sharded:
                history.append({k: v.cpu() for k, v in model.gather_full_params().items()})
        params = {k: v.cpu() for k, v in model.gather_full_params().items()}  # sharded strategies gather theirs
    flat = torch.cat([v.reshape(-1) for v in params.values()])
    if ctx.backend == "nccl":  # NCCL gathers device tensors only
        flat = flat.to(ctx.device)
    everyone = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, flat)
    spread = max(float((other - flat).abs().max()) for other in everyone) if flat.numel() else 0.0
    return {"params": params, "rank_spread": spread, "history": history, "threads": torch.get_num_threads()}


def device_name(device: torch.device) -> str:
    """The kind of device a rank computes on: its GPU's model, or `cpu`."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def references(configs: list[RunConfig], device: torch.device) -> dict:
    """The references of a verify run, trained on `device` (where the ranks trained) with this process's
    intra-op threads: `single` (whole batches; None with a compute dtype) and `slices` (the rank-slice run,
    None without a sharded strategy). Every config of a run shares the settings they depend on."""
    first = configs[0]
    slices: dict = {}  # one rank-slice run per way of grouping the sums (reference.summation_groups)
    for cfg in configs:
        key = str(summation_groups(cfg))
        if cfg.impl in registry.SHARDED and key not in slices:
            slices[key] = train_rank_slices(cfg, torch.get_num_threads(), device)
    return {"single": train_single_process(first, device) if first.compute_dtype is None else None, "slices": slices}


def verify_worker(ctx: DistContext, configs: list[RunConfig]) -> list[dict] | None:
    """Every config in turn on this rank; then rank 0 trains the references on its device and returns the
    outcomes (each with `reference`, the same for all, and the ranks' `devices`), other ranks None."""
    results = []
    for cfg in configs:
        if ctx.is_main:
            sharded = f", {cfg.optimizer} state sharded and unsharded" if cfg.shard_optimizer else ""
            cli.progress(f"[verify] {cfg.impl}: {cfg.steps} steps of {cfg.model} on {ctx.world_size} ranks{sharded}")
        outcome = train_data_parallel(ctx, cfg)
        if cfg.shard_optimizer:  # the same run with the plain optimizer: sharding must change no bit
            outcome["unsharded"] = train_data_parallel(ctx, replace(cfg, shard_optimizer=False))["params"]
        results.append(outcome)
    devices: list = [None] * ctx.world_size
    dist.all_gather_object(devices, device_name(ctx.device))
    if not ctx.is_main:
        return None
    cli.progress(f"[verify] references: 1 process on {ctx.device}")
    shared = references(configs, ctx.device)
    for outcome in results:
        outcome.update(reference=shared, devices=devices, device=str(ctx.device), backend=ctx.backend)
    return results


@dataclass
class StepComparison:
    """A sharded run's parameters after each step against the rank-slice reference's."""

    equal_steps: int  # steps after which every parameter is torch.equal to the reference's
    max_abs_diff: float  # over all steps and parameters
    elements_over: int  # elements beyond CAST_TOLERANCE, summed over steps (cast runs' criterion)


def compare_steps(
    reference: list[dict[str, torch.Tensor]], history: list[dict[str, torch.Tensor]], exact: bool
) -> StepComparison:
    """Step by step: torch.equal for fp32 runs, |difference| <= CAST_TOLERANCE for cast runs."""
    equal, worst, over = 0, 0.0, 0
    for want, got in zip(reference, history, strict=True):
        equal += all(torch.equal(got[k], v) for k, v in want.items())
        worst = max([worst, *(float((got[k] - v).abs().max()) for k, v in want.items() if v.numel())])
        over += sum(int(((got[k] - v).abs() > CAST_TOLERANCE).sum()) for k, v in want.items())
    return StepComparison(equal, worst, 0 if exact else over)


def compare(
    reference: dict[str, torch.Tensor], params: dict[str, torch.Tensor], rtol: float = 1e-5, atol: float = 1e-8
) -> tuple[float, int]:
    """Largest |difference| over all parameters, and how many elements are not allclose."""
    diffs = [float((params[k] - ref).abs().max()) for k, ref in reference.items()]
    not_close = sum(int((~torch.isclose(params[k], ref, rtol=rtol, atol=atol)).sum()) for k, ref in reference.items())
    return max(diffs, default=0.0), not_close


def hybrid_settings(impl: str, shard_size: int | None, impls: list[str]) -> dict:
    """`shard_size` for the strategies that take it (hsdp, torch_hsdp); under `all` nothing for the others (named
    on their own, they refuse it)."""
    return {"shard_size": shard_size} if impl in registry.HYBRID or "all" not in impls else {}


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m ddp.verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_settings(
        parser,
        skip={"warmup"},  # every step is compared
        defaults={
            "impl": ["all"],
            "model": "toy",
            "world_size": None,
            "steps": 5,
            "batch_size": None,
            "context_length": 32,
        },
        many={"impl"},
        extra_choices={"impl": ["all"]},
        notes={
            "impl": "default: all; with a collective other than torch, all leaves out torch, which runs only its own",
            "world_size": "default: 2, or torchrun's WORLD_SIZE",
            "batch_size": "default: 4 per rank",
        },
    )
    cli.add_output_arguments(parser)
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (torch.allclose default)")
    parser.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (torch.allclose default)")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="the table with every column in full (default: within 120 columns, each way of comparing written "
        "once under it; csv and json always carry every column)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = cli.given_settings(args)
    impls = settings.pop("impl")
    world = cli.resolve_world_size(settings.pop("world_size"))
    if settings["batch_size"] is None:
        settings["batch_size"] = 4 * world
    sharded_only = any(settings[name] not in (None, False) for name in SHARDED_ONLY)  # all: fsdp and torch_fsdp
    shard_size = settings.pop("shard_size")  # hsdp's and torch_hsdp's only: the others run without it
    configs = [
        RunConfig(impl=name, world_size=world, warmup=0, **settings, **hybrid_settings(name, shard_size, impls))
        for name in registry.resolve(impls)
        if not (name == "torch" and settings["collective"] != "torch" and "all" in impls)
        and not (name not in registry.SHARDED and sharded_only and "all" in impls)
    ]
    outcomes = launch(verify_worker, world, configs, backend=args.backend, share_gpus=args.share_gpus)
    if outcomes is None:  # a non-zero rank under torchrun: rank 0 reports
        return cli.EXIT_OK
    records = []
    for cfg, outcome in zip(configs, outcomes, strict=True):
        reference, skipped = outcome["reference"], None
        if reference["single"] is not None:
            diff, not_close = compare(reference["single"], outcome["params"], args.rtol, args.atol)
        else:  # cast runs are compared with the cast reference only
            diff, not_close = 0.0, 0
        exact = None
        if cfg.impl in registry.SHARDED:
            slices = reference["slices"][str(summation_groups(cfg))]
            steps = compare_steps(slices, outcome["history"], cfg.compute_dtype is None)
            exact = f"{steps.equal_steps}/{cfg.steps}" if cfg.compute_dtype is None else None
            if cfg.compute_dtype is not None:
                diff, not_close = steps.max_abs_diff, steps.elements_over
            else:
                skipped = bit_identity_skipped(cfg, outcome["backend"], outcome["devices"])
                if skipped is None and steps.equal_steps != cfg.steps:
                    not_close += 1  # bit-identity is required where the sum over ranks cannot depend on order
        same_ranks = outcome["rank_spread"] <= RANK_TOLERANCE
        unsharded = outcome.get("unsharded")
        as_unsharded = unsharded is None or all(torch.equal(v, unsharded[k]) for k, v in outcome["params"].items())
        records.append(
            {
                "implementation": cfg.impl,
                "compared": how_compared(cfg, args.rtol, args.atol, outcome["device"], skipped),
                "max_abs_diff_vs_single": diff,
                "elements_not_close": not_close,
                "steps_bit_identical": exact,
                "max_abs_diff_between_ranks": outcome["rank_spread"],
                "sharded_equals_unsharded": None if unsharded is None else as_unsharded,
                "result": "PASS" if not_close == 0 and same_ranks and as_unsharded else "FAIL",
            }
        )
    if args.format == "table":
        print(verify_table(records, COLUMNS, wide=args.wide))
    else:
        print(cli.format_records(records, args.format, COLUMNS, float_digits=3))
    return cli.EXIT_OK if all(r["result"] == "PASS" for r in records) else cli.EXIT_CHECK_FAILED


if __name__ == "__main__":
    cli.run_main(main)
