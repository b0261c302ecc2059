"""The offline loop behind ``rlpipe train {sac,bc,marwil,cql}``: minibatches from history.

The dataset's rows (of one pinned table version) are read once, as whole episodes, and
minibatches are sampled from them; every ``eval_every`` updates a checkpoint goes to
``RUN/checkpoints`` (never into the dataset, which may be a shipped one) and is evaluated in
gymnasium when the env is known. With several ranks (:mod:`pipeline.trainers.distributed`), each
reads its own episodes and samples its own minibatches, the gradients are averaged, and rank 0
publishes, saves and decides when to stop; Ray Train workers (:mod:`pipeline.trainers.raytrain`)
run this same loop on rows Ray Data read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.dataset.batch import Batch
from pipeline.dataset.reader import InputReader
from pipeline.errors import DatasetError
from pipeline.trainers import distributed
from pipeline.trainers.distributed import SINGLE, Group
from pipeline.trainers.loop import STATE_EVERY_S, LoopSettings, Run, reader_options
from pipeline.trainers.runlog import RunLog
from pipeline.trainers.trainer import RefreshesTargets, Trainer

CLOCK_EVERY = 50  # updates between the ranks' looks at rank 0's clock (--max-seconds)


@dataclass(frozen=True)
class OfflineData:
    """What one rank trains on: its rows of the pinned table version, and what it read."""

    rows: Batch
    shards: list[str]  # paths under the dataset root of the files read
    version: int | None  # the step table's version


def read_offline(settings: LoopSettings, group: Group, pinned: int | None) -> OfflineData:
    """This rank's whole episodes of one table version: ``pinned`` (a resumed run's), else
    ``settings.data_version``, else the latest as rank 0 found it, so every rank reads the same
    version and together they read each of its rows once (InputReader splits by episode id)."""

    def open_reader(version: int | None) -> InputReader:
        return InputReader(
            settings.data,
            episodes=True,
            training_enabled=settings.training_enabled,
            version=version,
            rank=group.rank,
            world_size=group.world_size,
            storage_options=reader_options(settings),
        )

    version = settings.data_version if pinned is None else pinned
    reader = open_reader(version) if group.main or version is not None else None
    version = group.from_main(reader.version if reader is not None else None)
    reader = reader if reader is not None else open_reader(version)
    rows = Batch.concat(reader)
    return OfflineData(rows, sorted(reader.shards_read), reader.version)


def train_offline(
    trainer: Trainer,
    settings: LoopSettings,
    log: RunLog | None,
    group: Group = SINGLE,
    read: Callable[[int | None], OfflineData] | None = None,
    on_publish: Callable[[dict[str, Any], Path | None], None] | None = None,
) -> dict[str, Any]:
    """Minibatches sampled from the rows read; with several ranks (``group``), each samples its
    own rows, the gradients are averaged, and rank 0 (whose ``log`` alone is given) publishes,
    evaluates and decides when to stop. ``read`` gives a rank its rows of a table version (a
    resumed run's, or None: the settings'), by default :func:`read_offline`; ``on_publish``
    is called on every rank at each publication, with rank 0's entry and checkpoint."""
    run = Run(trainer, settings, log, group)
    pinned = run.progress.data_version
    data = read(pinned) if read else read_offline(settings, group, pinned)
    _log_reads(run, data)
    counts = group.gather(len(data.rows))
    if 0 in counts:
        which = "rows" if settings.include_untrained else "training_enabled rows"
        ranks = "" if group.world_size == 1 else f" for one of its {group.world_size} ranks"
        raise DatasetError(f"{settings.data}: no {which} to train on{ranks}")
    run._data_version = data.version  # a resumed run reads this version again
    extra = _scale(trainer, settings, group)
    rows = whole = data.rows
    with run:
        while True:
            if isinstance(trainer, RefreshesTargets) and (
                rows is whole or run.updates % settings.eval_every == 0
            ):  # e.g. MARWIL's returns bootstrap truncations from V: refresh them as V learns
                rows = trainer.with_targets(whole)
            metrics = trainer.update(rows[run.rng.integers(len(rows), size=settings.batch_size)])
            run.updates += 1
            if _due(run, group):
                entry = {"update": run.updates, "version": run.version}
                if group.main:
                    entry = run.publish({"rows": sum(counts), **extra, **metrics})
                if on_publish is not None:
                    on_publish(entry, run.wait_written() if group.main else None)
                if group.agree(run.finished(entry.get("eval_return"))):
                    return entry
            elif group.main and time.monotonic() - run.saved >= STATE_EVERY_S:
                run.save_state()


def _due(run: Run, group: Group) -> bool:
    """Whether to publish (and maybe stop) now, on every rank alike: at each ``eval_every`` and
    the last of ``max_updates``, which every rank counts the same; and when ``max_seconds`` has
    passed on rank 0's clock, which the ranks look at together every CLOCK_EVERY updates (a
    collective each update would cost more than the update's own all-reduce)."""
    s = run.settings
    if run.updates % s.eval_every == 0 or (
        s.max_updates is not None and run.updates >= s.max_updates
    ):
        return True
    if s.max_seconds is None or (group.world_size > 1 and run.updates % CLOCK_EVERY):
        return False
    return group.agree(run.finished(None))


def _log_reads(run: Run, data: OfflineData) -> None:
    """Rank 0 logs what every rank read: its rows, episodes and their digest (the digests of
    the ranks add up to the version's own when each row was read once, by one rank)."""
    if run.group.world_size == 1:
        if run.log is not None:
            run.log.read(data.shards, len(data.rows), data.version)
        return
    episodes = len(np.unique(np.asarray(data.rows.episode_ids))) if len(data.rows) else 0
    counts = (len(data.rows), episodes, distributed.row_digest(data.rows))
    everyone = run.group.gather(counts)
    if run.log is None:
        return
    for rank, (rows, episodes, digest) in enumerate(everyone):
        ranked = {"rank": rank, "episodes": episodes, "row_digest": str(digest)}
        run.log.read(data.shards, rows, data.version, **ranked)


def _scale(trainer: Trainer, settings: LoopSettings, group: Group) -> dict[str, Any]:
    """A data-parallel run's effective batch size and learning rate, for its metrics."""
    if group.world_size == 1:
        return {}
    lr = getattr(getattr(trainer, "config", None), "lr", None)
    return {
        "ranks": group.world_size,
        "effective_batch_size": settings.batch_size * group.world_size,
        "lr": lr,
    }
