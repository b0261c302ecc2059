"""``rlpipe train {ppo,sac,bc,marwil,cql} --data URI``: train from a dataset, live or historic.

Rows of ``training_enabled=False`` episodes are skipped unless ``--include-untrained`` is given.
torch is imported only when the command runs, so ``rlpipe --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.commands.storage_options import add_storage_options, storage_options
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.trainers.trainer import Trainer


# Each trainer is pipeline.trainers.NAME.{NAME.upper()}, its config that name + "Config".
ALGORITHMS = ("ppo", "sac", "bc", "marwil", "cql")
# PPO is on-policy: it learns only from its own versions, so online only, and from larger batches.
# MARWIL's returns need whole episodes, not a replay buffer of live rows: offline only.
ONLINE = ("ppo", "sac", "bc", "cql")
OFFLINE = ("sac", "bc", "marwil", "cql")
_BATCH_SIZE = {"ppo": 2048}  # rows per update by default; 256 for the others


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a policy from a dataset (online with --follow, else offline)",
        description=__doc__,
    )
    parser.add_argument("algorithm", choices=ALGORITHMS)
    parser.add_argument(
        "--data", required=True, help="the dataset: a directory or a URI (s3://bucket/prefix)"
    )
    parser.add_argument(
        "--data-version",
        type=int,
        metavar="N",
        help="train on the step table as it was at this Delta version (with --follow: start "
        "there, then follow); the version read goes to RUN/reads.jsonl either way",
    )
    add_storage_options(parser)
    parser.add_argument(
        "--follow",
        action="store_true",
        help="train from the live dataset and publish checkpoints into it (into RUN/checkpoints "
        "for a dataset on object storage: serve it with --policy RUN/checkpoints)",
    )
    parser.add_argument("--env", help="gymnasium id for evaluation (default: the manifest's)")
    parser.add_argument("--stop-return", type=float, help="stop at this mean return")
    parser.add_argument("--max-seconds", type=float, help="stop after this wall time")
    parser.add_argument("--max-updates", type=int, help="stop after this many updates")
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="metrics, curve, state and offline checkpoints (default: runs/ALGO-TIME); a run "
        "started again with the same one resumes from its state and read position",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        help="rows per update (default: 256; PPO online: 2048, the least number of new rows "
        "an update waits for)",
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=500,
        help="updates between evaluations (default: 500); offline and online SAC, BC and CQL "
        "also publish a checkpoint only then, online PPO after every update",
    )
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument(
        "--include-untrained",
        action="store_true",
        help="train on rows of training_enabled=False episodes too (default: skip them, as "
        "RLlib does; they are still stored, and inspect and replay see them)",
    )
    for name, kind, text in _HYPERPARAMETERS:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, help=f"{text} (default: the algorithm's)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="online: stop after this many seconds without new rows",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    from pipeline.dataset.location import locate
    from pipeline.format.manifest import read_manifest
    from pipeline.trainers import loop
    from pipeline.trainers.runlog import RunLog

    if args.follow and args.algorithm not in ONLINE:
        raise ConfigError("train", "follow", f"an online algorithm {ONLINE}", args.algorithm)
    if not args.follow and args.algorithm not in OFFLINE:
        raise ConfigError("train", "algorithm", f"--follow, or one of {OFFLINE}", args.algorithm)
    options = storage_options("train", args.storage_option)
    manifest = read_manifest(locate(args.data, options))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = args.run_dir or Path("runs") / f"{args.algorithm}-{stamp}"
    default_batch = _BATCH_SIZE.get(args.algorithm, 256)
    settings = loop.LoopSettings(
        data=args.data if "://" in args.data else Path(args.data),
        data_version=args.data_version,
        storage_options=options,
        run_dir=run_dir,
        env_id=args.env or manifest.env_id,
        follow=args.follow,
        stop_return=args.stop_return,
        max_seconds=args.max_seconds,
        max_updates=args.max_updates,
        batch_size=default_batch if args.batch_size is None else args.batch_size,
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        timeout_s=args.timeout,
        seed=args.seed,
        include_untrained=args.include_untrained,
    )
    given = {name: getattr(args, name) for name, _, _ in _HYPERPARAMETERS}
    trainer = make_trainer(
        args.algorithm,
        manifest.observation_space,
        manifest.action_space,
        seed=args.seed,
        **{name: value for name, value in given.items() if value is not None},
    )
    log = RunLog(run_dir, f"{args.algorithm} {'online' if args.follow else 'offline'}")
    try:
        train = loop.train_online if args.follow else loop.train_offline
        last = train(trainer, settings, log)
    finally:
        curve = log.close()
    where = Path(settings.data) if args.follow and "://" not in args.data else run_dir
    print(
        f"trained {args.algorithm}: version {last['version']} in {where / 'checkpoints'}; "
        f"metrics in {run_dir / 'metrics.jsonl'}" + (f"; curve {curve}" if curve else ""),
        file=sys.stderr,
    )
    return 0


def make_trainer(
    algorithm: str, observation_space: Any, action_space: Any, *, seed: int = 0, **options: Any
) -> Trainer:
    """A trainer with its algorithm's default config, but for the ``options`` given (config
    field names, such as ``lr`` or ``gae_lambda``)."""
    import dataclasses
    import importlib

    module = importlib.import_module(f"pipeline.trainers.{algorithm}")
    name = algorithm.upper()
    config_type = getattr(module, f"{name}Config")
    fields = {field.name for field in dataclasses.fields(config_type)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ConfigError(
            "train",
            unknown[0],
            f"an option of {config_type.__name__}",
            f"--{unknown[0].replace('_', '-')} given to {algorithm}",
        )
    trainer: Trainer = getattr(module, name)(
        observation_space, action_space, config_type(seed=seed, **options)
    )
    return trainer


def _widths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected widths like 64,64, got {text!r}") from None


# Hyperparameters some algorithms have: config fields, each given as --NAME-WITH-DASHES.
_HYPERPARAMETERS = (
    ("hidden", _widths, "hidden layer widths, e.g. 64,64"),
    ("lr", float, "learning rate"),
    ("gamma", float, "discount"),
    ("gae_lambda", float, "PPO: GAE's lambda"),
    ("update_epochs", int, "PPO: passes over each batch"),
    ("num_minibatches", int, "PPO: minibatches per pass"),
    ("anneal_updates", int, "PPO: lr and clip fall linearly to 0 over this many updates"),
)
