"""``rlpipe train {bc,marwil,cql} --ray [ADDRESS]``: the offline loop as a Ray Train TorchTrainer.

The driver pins one version of the step table (``--data-version``, a resumed run's, else the
latest), and Ray Data reads exactly the files that version's Delta log commits
(``ray.data.read_parquet`` of their paths: the version is the one rlpipe's own reader resolves,
on local disk or object storage alike), with the reader's columns and its ``training_enabled``
filter. ``streaming_split`` hands each worker its own rows (``equal=False``: every row goes to
one worker, none is dropped); for a trainer that needs whole episodes (MARWIL) the rows are
first grouped by episode id, so no episode is split. Each worker then runs
:func:`pipeline.trainers.offline.train_offline`, the loop of ``--workers`` (Ray Train joined its
gloo process group), and rank 0 reports each checkpoint to Ray Train (``ray.train.report``, under
``RUN/ray``) as it writes it to ``RUN/checkpoints``.

A worker that dies fails the run (``FailureConfig(max_failures=0)``): started again with the same
``--run-dir``, it resumes from the saved state, as a run of ``--workers`` does. Ray is the
``rlpipe[ray]`` extra; nothing else in rlpipe imports it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.dataset.batch import Batch
from pipeline.dataset.delta import Table
from pipeline.errors import ConfigError, TrainingError
from pipeline.format import layout

BLOCKS_PER_WORKER = 4
SPLIT = "splits"  # the train_loop_config key of the workers' data iterators


def fit(args: argparse.Namespace, workers: int) -> int:
    """Run the training on ``workers`` Ray Train workers; 0, or a TrainingError."""
    ray = _import_ray()
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    args = _absolute(args)
    started = not ray.is_initialized()
    if started:  # one CPU per worker, and one for Ray Data's read tasks
        address = args.ray or None
        options = {} if address else {"num_cpus": workers + 1, "include_dashboard": False}
        ray.init(address=address, **options)
    try:
        splits, version = _dataset(ray, args, workers)
        trainer = TorchTrainer(
            _worker,
            train_loop_config={"args": args, "version": version, SPLIT: splits},
            scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
            torch_config=TorchConfig(backend="gloo"),
            run_config=RunConfig(
                name="train",
                storage_path=str(args.run_dir / "ray"),
                failure_config=FailureConfig(max_failures=0),
            ),
        )
        try:
            result = trainer.fit()
        except Exception as error:  # Ray's TrainingFailedError and what it wraps
            raise TrainingError(
                f"{_ray_reason(error)}, so the run stopped; start it again with the same "
                "--run-dir to resume from its last saved state"
            ) from None
    finally:
        if started:
            ray.shutdown()
    print(f"trained {args.algorithm} on Ray: {result.metrics}", file=sys.stderr)
    return 0


def _dataset(ray: Any, args: argparse.Namespace, workers: int) -> tuple[list[Any], int]:
    """The workers' data iterators over the pinned version's rows, and that version."""
    from ray.data.expressions import col

    from pipeline.commands.storage_options import storage_options
    from pipeline.dataset.reader import InputReader
    from pipeline.trainers import command, state
    from pipeline.trainers.trainer import RefreshesTargets

    options = storage_options("train", args.storage_option)
    pinned = state.saved_data_version(args.run_dir)
    version = args.data_version if pinned is None else pinned
    reader = InputReader(args.data, version=version, storage_options=options, episodes=True)
    location = reader.location
    table = Table(location, layout.STEPS, reader.version)
    paths = [location.path(layout.STEPS, entry.path) for entry in table.files()]
    if not paths:
        raise ConfigError("train", "data", "a step table with committed rows", args.data)
    columns = list(reader.columns)
    # projection and filter are pushed down into the Parquet reads
    data = ray.data.read_parquet(
        paths, filesystem=location.filesystem, partitioning=None, file_extensions=None
    ).select_columns([*columns, "training_enabled"])
    if not args.include_untrained:  # as the InputReader filters: pushed down to the files
        data = data.filter(expr=col("training_enabled") == True)  # noqa: E712
    data = data.select_columns(columns)
    probe = command.make_trainer(
        args.algorithm, reader.observation_space, reader.action_space, seed=args.seed
    )
    # blocks for the split to balance (it hands each to the worker with the fewest rows so far;
    # a version of one file is one block); by episode id when the trainer needs whole episodes
    keys = ["episode_id"] if isinstance(probe, RefreshesTargets) else None
    data = data.repartition(BLOCKS_PER_WORKER * workers, keys=keys)
    return data.streaming_split(workers, equal=False), int(reader.version or 0)


def _worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: its rows of the pinned version, then the loop of ``--workers``."""
    import ray.train
    import torch

    from pipeline.trainers import command
    from pipeline.trainers.distributed import Group

    torch.set_num_threads(1)
    group = Group.joined()
    args, version = config["args"], config["version"]
    split = config[SPLIT][group.rank]

    def read(_pinned: int | None) -> Any:
        return _rows(args, version, split)

    def report(entry: dict[str, Any], checkpoint: Path | None) -> None:
        metrics = {k: v for k, v in entry.items() if isinstance(v, int | float)}
        if checkpoint is None:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:  # Ray Train copies it into RUN/ray
            shutil.copy2(checkpoint, directory)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    command.train(args, group, read=read, on_publish=report)


def _rows(args: argparse.Namespace, version: int, split: Any) -> Any:
    """This worker's rows from its data iterator, as one Batch grouped by episode."""
    from pipeline.commands.storage_options import storage_options
    from pipeline.dataset.reader import InputReader
    from pipeline.trainers.offline import OfflineData

    options = storage_options("train", args.storage_option)
    reader = InputReader(args.data, version=version, storage_options=options)
    parts = [
        reader.to_batch(table)
        for table in split.iter_batches(batch_format="pyarrow", batch_size=None)
        if table.num_rows
    ]
    rows = Batch.concat(parts) if parts else reader.to_batch(_empty(reader))
    order = np.lexsort((np.asarray(rows.ts), np.asarray(rows.episode_ids).astype(str)))
    files = [
        f"{layout.STEPS}/{entry.path}"
        for entry in Table(reader.location, layout.STEPS, version).files()
    ]
    return OfflineData(rows[order], files, version)


def _empty(reader: Any) -> Any:
    import pyarrow as pa

    return pa.table({name: pa.array([], reader.schema.field(name).type) for name in reader.columns})


def _absolute(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments with local paths made absolute: Ray's workers run in directories of
    their own."""
    copy = argparse.Namespace(**vars(args))
    copy.run_dir = Path(args.run_dir).resolve()
    if "://" not in args.data:
        copy.data = str(Path(args.data).resolve())
    return copy


def _ray_reason(error: BaseException) -> str:
    """Which worker failed and how, from Ray Train's error (a snippet per rank): the rank whose
    process died, as the others' collectives then fail too; else the first rank's last error."""
    parts = re.split(r"\[Rank ([\d,]+) Error Snippet\]:", str(error))
    snippets = list(zip(parts[1::2], parts[2::2], strict=True))
    for ranks, text in snippets:
        if "ActorDiedError" in text or "worker process has died" in text:
            return f"Ray Train worker rank {ranks} died"
    for ranks, text in snippets:
        errors = re.findall(r"^(?:\w+\.)*\w*(?:Error|Exception)\b.*$", text, re.MULTILINE)
        if errors:
            return f"Ray Train worker rank {ranks} failed ({errors[-1].strip()})"
    lines = str(error).strip().splitlines()
    return f"Ray Train failed ({lines[0] if lines else type(error).__name__})"


def _import_ray() -> Any:
    try:
        import ray
        import ray.data
        import ray.train
    except ImportError:
        raise ConfigError(
            "train", "ray", "Ray Train and Ray Data installed (pip install 'rlpipe[ray]')", "--ray"
        ) from None
    return ray
