"""``rlpipe train {ppo,sac,bc,marwil,cql} --data URI``: train from a dataset, live or historic.

Rows of ``training_enabled=False`` episodes are skipped unless ``--include-untrained`` is given.
torch is imported only when the command runs, so ``rlpipe --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
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
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="offline: train on N data-parallel ranks (torch.distributed; each reads its own "
        "episodes of one table version, --batch-size rows per rank per update); started by "
        "torchrun, the ranks it gives (default: 1, or WORLD_SIZE)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="offline: run the --workers ranks (default 2) as a Ray Train TorchTrainer, Ray "
        "Data reading the table; on the Ray cluster at ADDRESS, else on one started here "
        "(pip install 'rlpipe[ray]')",
    )
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    """Check the arguments, then train here, on ``--workers`` ranks, or on Ray."""
    if args.follow and args.algorithm not in ONLINE:
        raise ConfigError("train", "follow", f"an online algorithm {ONLINE}", args.algorithm)
    if not args.follow and args.algorithm not in OFFLINE:
        raise ConfigError("train", "algorithm", f"--follow, or one of {OFFLINE}", args.algorithm)
    workers = _workers(args)
    if args.run_dir is None:  # named once, here, for every rank
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        args.run_dir = Path("runs") / f"{args.algorithm}-{stamp}"
    if args.ray is not None:
        from pipeline.trainers import raytrain

        return raytrain.fit(args, workers)
    if workers > 1 and "WORLD_SIZE" not in os.environ:
        from pipeline.trainers import distributed

        return distributed.launch(args, workers, train)
    return train(args)


def _workers(args: argparse.Namespace) -> int:
    """The ranks asked for: ``--workers``, else torchrun's WORLD_SIZE, else 2 on Ray, else 1."""
    world = os.environ.get("WORLD_SIZE")
    workers = args.workers
    if workers is None:
        workers = 2 if args.ray is not None else int(world) if world and world.isdigit() else 1
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError("train", "workers", "an integer >= 1", workers)
    if (workers > 1 or args.ray is not None) and args.follow:
        raise ConfigError(
            "train",
            "workers",
            "1 learner with --follow (online training scales by simulators, not learners: "
            "docs/distributed.md)",
            f"{workers}{' on Ray' if args.ray is not None else ''}",
        )
    if world and args.ray is None and workers != int(world):
        raise ConfigError("train", "workers", f"WORLD_SIZE={world}, as torchrun set it", workers)
    return workers


def train(args: argparse.Namespace, group: Any = None, **hooks: Any) -> int:
    """Train in this process: alone, as a rank of torchrun or ``--workers`` (``group`` None:
    from the environment), or as a Ray Train worker (its ``group``, and the loop's ``hooks``)."""
    from pipeline.dataset.location import locate
    from pipeline.format.manifest import read_manifest
    from pipeline.trainers import loop, offline
    from pipeline.trainers.distributed import Group
    from pipeline.trainers.runlog import RunLog

    group = Group.from_environment() if group is None else group
    options = storage_options("train", args.storage_option)
    manifest = read_manifest(locate(args.data, options))
    settings = _settings(args, manifest.env_id, options)
    given = {name: getattr(args, name) for name, _, _ in _HYPERPARAMETERS}
    trainer = make_trainer(
        args.algorithm,
        manifest.observation_space,
        manifest.action_space,
        seed=args.seed,
        **{name: value for name, value in given.items() if value is not None},
    )
    if args.follow:
        online = RunLog(settings.run_dir, f"{args.algorithm} online")
        try:
            last = loop.train_online(trainer, settings, online)
        finally:
            curve = online.close()
        return _done(args, settings, last, curve)
    ranks = f" on {group.world_size} ranks" if group.world_size > 1 else ""
    log = RunLog(settings.run_dir, f"{args.algorithm} offline{ranks}") if group.main else None
    if log is not None and ranks:
        _say_scale(args.algorithm, trainer, settings.batch_size, group.world_size)
    try:
        last = offline.train_offline(trainer, settings, log, group, **hooks)
    finally:
        curve = log.close() if log is not None else None
    return _done(args, settings, last, curve) if group.main else 0


def _settings(args: argparse.Namespace, env_id: str | None, options: Any) -> Any:
    from pipeline.trainers import loop

    default_batch = _BATCH_SIZE.get(args.algorithm, 256)
    return loop.LoopSettings(
        data=args.data if "://" in args.data else Path(args.data),
        data_version=args.data_version,
        storage_options=options,
        run_dir=args.run_dir,
        env_id=args.env or env_id,
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


def _say_scale(algorithm: str, trainer: Any, batch_size: int, ranks: int) -> None:
    lr = getattr(trainer.config, "lr", None)
    print(
        f"{algorithm} on {ranks} ranks: {batch_size} rows per rank per update, effective "
        f"batch size {batch_size * ranks}; lr {lr} (as given: not scaled with the ranks)",
        file=sys.stderr,
    )


def _done(args: argparse.Namespace, settings: Any, last: dict[str, Any], curve: Any) -> int:
    run_dir = settings.run_dir
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
