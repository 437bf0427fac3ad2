"""Check every chosen implementation against single-process training on the same global batches.

    python -m ddp.verify --impl all --world-size 2 [--model toy|tiny] [--steps N] [--optimizer sgd|adamw]
        [--collective torch|ring|reduce_broadcast]

Each rank starts from a different random initialisation (seed + rank), so a pass also shows that
construction broadcast rank 0's state. Prints, per implementation, the largest |difference| of any
parameter from the single-process run, how many elements fall outside --rtol/--atol (default:
torch.allclose's 1e-5/1e-8), the largest difference between ranks, and PASS when no element is out
of tolerance and the ranks agree within 1e-6. Exit status 1 on any FAIL, 2 on bad input.

AdamW divides by sqrt(v) + 1e-8, so on the Transformer a few gradients near 1e-8 turn float32
rounding (ranks sum half-batches, one process sums the whole) into update differences up to the
learning rate: expect a handful of elements out of millions outside the default tolerances there.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ddp import cli
from ddp.launch.launcher import DistContext, launch
from ddp.strategies import registry
from ddp.training.data import global_batch, rank_batch
from ddp.training.loop import RunConfig, build_wrapped, loss_fn, make_optimizer, train_step
from ddp.training.models import build_model

RANK_TOLERANCE = 1e-6  # ranks hold the same all-reduced values; allow only rounding noise
COLUMNS = ["implementation", "max_abs_diff_vs_single", "elements_not_close", "max_abs_diff_between_ranks", "result"]


def train_single_process(cfg: RunConfig) -> dict[str, torch.Tensor]:
    """Plain training of the unwrapped model on each whole global batch: the reference."""
    model = build_model(cfg.model, cfg.context_length, cfg.seed)
    optimizer = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    for step in range(cfg.steps):
        inputs, targets = global_batch(cfg.model, step, cfg.batch_size, cfg.context_length, cfg.seed)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def train_data_parallel(ctx: DistContext, cfg: RunConfig) -> dict:
    """Train `cfg` on this rank's shards from a rank-specific init; rank 0's params and the rank spread."""
    model = build_wrapped(ctx, cfg, seed=cfg.seed + ctx.rank)  # differs per rank until broadcast
    optimizer = make_optimizer(cfg.optimizer, model.module.parameters(), cfg.lr)
    for step in range(cfg.steps):
        batch = rank_batch(
            cfg.model, step, cfg.batch_size, cfg.context_length, ctx.rank, ctx.world_size, cfg.seed, ctx.device
        )
        train_step(model, optimizer, batch, step)
    params = {k: v.detach().cpu().clone() for k, v in model.module.named_parameters()}
    flat = torch.cat([v.reshape(-1) for v in params.values()])
    if ctx.backend == "nccl":  # NCCL gathers device tensors only
        flat = flat.to(ctx.device)
    everyone = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, flat)
    spread = max(float((other - flat).abs().max()) for other in everyone) if flat.numel() else 0.0
    return {"params": params, "rank_spread": spread}


def verify_worker(ctx: DistContext, configs: list[RunConfig]) -> list[dict] | None:
    """Every config in turn on this rank; rank 0 returns the outcomes, other ranks None."""
    results = []
    for cfg in configs:
        if ctx.is_main:
            cli.progress(f"[verify] {cfg.impl}: {cfg.steps} steps of {cfg.model} on {ctx.world_size} ranks")
        results.append(train_data_parallel(ctx, cfg))
    return results if ctx.is_main else None


def compare(
    reference: dict[str, torch.Tensor], params: dict[str, torch.Tensor], rtol: float = 1e-5, atol: float = 1e-8
) -> tuple[float, int]:
    """Largest |difference| over all parameters, and how many elements are not allclose."""
    diffs = [float((params[k] - ref).abs().max()) for k, ref in reference.items()]
    not_close = sum(int((~torch.isclose(params[k], ref, rtol=rtol, atol=atol)).sum()) for k, ref in reference.items())
    return max(diffs, default=0.0), not_close


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.Parser(
        prog="python -m ddp.verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_run_arguments(parser, model_default="toy")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch (default 4 per rank)")
    parser.add_argument("--context-length", type=int, default=32, help="tokens per sample for LMs (default 32)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="bucket size for overlap_bucket and torch")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (torch.allclose default)")
    parser.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (torch.allclose default)")
    parser.add_argument(
        "--collective",
        choices=cli.collective_choices(),
        default="torch",
        help="the wrappers' all-reduce collective (default torch); with --impl all, "
        "the torch implementation is left out of any other, as it only runs its own",
    )
    args = parser.parse_args(argv)
    world = cli.resolve_world_size(args.world_size)
    batch = args.batch_size if args.batch_size is not None else 4 * world
    configs = [
        RunConfig(
            impl=name,
            model=args.model,
            world_size=world,
            batch_size=batch,
            context_length=args.context_length,
            steps=args.steps,
            warmup=0,
            bucket_mb=args.bucket_mb,
            optimizer=args.optimizer,
            lr=args.lr,
            seed=args.seed,
            backend=args.backend,
            collective=args.collective,
        )
        for name in registry.resolve(args.impl)
        if not (name == "torch" and args.collective != "torch" and "all" in args.impl)
    ]
    outcomes = launch(verify_worker, world, configs, backend=args.backend, share_gpus=args.share_gpus)
    if outcomes is None:  # a non-zero rank under torchrun: rank 0 reports
        return cli.EXIT_OK
    reference = train_single_process(configs[0])
    records = []
    for cfg, outcome in zip(configs, outcomes, strict=True):
        diff, not_close = compare(reference, outcome["params"], args.rtol, args.atol)
        same_ranks = outcome["rank_spread"] <= RANK_TOLERANCE
        records.append(
            {
                "implementation": cfg.impl,
                "max_abs_diff_vs_single": diff,
                "elements_not_close": not_close,
                "max_abs_diff_between_ranks": outcome["rank_spread"],
                "result": "PASS" if not_close == 0 and same_ranks else "FAIL",
            }
        )
    print(cli.format_records(records, args.format, COLUMNS, float_digits=3))
    return cli.EXIT_OK if all(r["result"] == "PASS" for r in records) else cli.EXIT_CHECK_FAILED


if __name__ == "__main__":
    cli.run_main(main)
