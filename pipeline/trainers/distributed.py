"""Data-parallel offline training: the ranks of a run, their gradients, and their launcher.

``rlpipe train {bc,marwil,cql} --workers N`` starts N processes (torch.distributed, gloo on CPU,
nccl where there are GPUs); ``torchrun --nproc-per-node N -m pipeline.commands.cli train ...``
starts the same ranks itself (they read ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``), and Ray Train (:mod:`pipeline.trainers.raytrain`) starts them as its workers.
Every rank builds the same trainer from the same seed, reads its own disjoint part of one pinned
table version, and samples its own minibatches from it; after each backward pass the gradients
are averaged across ranks (:func:`average_gradients`, DDP's all-reduce), so every rank makes the
same optimizer step and holds the same weights. Rank 0 alone writes checkpoints, metrics and the
trainer's state; it decides when the run stops and tells the others (:meth:`Group.agree`).

Why not ``DistributedDataParallel`` itself: DDP syncs the gradients of a module's ``forward``
calls, once per backward. The trainers call their networks outside ``forward`` (a policy's
``log_prob_entropy``) and several times per backward (CQL values targets and actions with the
same critics, and the actor's loss runs through the critics), which DDP supports only with
``find_unused_parameters`` and ``static_graph`` caveats; and a wrapped module renames every
weight (``module.``), which the checkpoint layout would have to undo. One coalesced all-reduce of
an optimizer's gradients, where the trainers already take their steps, is the same arithmetic
with none of that (DDP overlaps it with the backward pass; on these small networks there is
nothing to overlap).

``--batch-size`` is rows per rank per update: an update of N ranks learns from N times as many
rows (the effective batch size). The learning rate is not scaled; the run reports both.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.dataset.batch import Batch
from pipeline.errors import ConfigError, RlpipeError, TrainingError

# A collective waits this long for a rank before the run fails: longer than rank 0's slowest
# evaluation, short enough that a rank stuck for good ends the run rather than hanging it.
COLLECTIVE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Group:
    """This process's place in a run: ``rank`` of ``world_size``; one process is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0, which writes checkpoints, metrics and the state, and decides when to stop."""
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> Group:
        """The group torchrun (or ``--workers``) describes in ``RANK`` and ``WORLD_SIZE``,
        joined with the backend that fits (nccl with GPUs, else gloo); one process without them."""
        if "WORLD_SIZE" not in os.environ:
            return cls()
        rank, size = _int_variable("RANK"), _int_variable("WORLD_SIZE")
        if not 0 <= rank < size:
            raise ConfigError("train", "RANK", f"a rank below WORLD_SIZE={size}", rank)
        if size > 1 and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
            dist.init_process_group(backend, rank=rank, world_size=size, timeout=timeout)
        if size > 1:
            torch.set_num_threads(1)  # ranks share the machine's cores: one thread each
        return cls(rank, size)

    @classmethod
    def joined(cls) -> Group:
        """The process group this process is already in (Ray Train's workers)."""
        if not dist.is_initialized():
            return cls()
        return cls(dist.get_rank(), dist.get_world_size())

    def agree(self, decision: bool) -> bool:
        """Rank 0's ``decision``, on every rank: what rank 0 alone knows (its clock, its
        evaluation) decides for all, so every rank leaves the loop at the same update."""
        if self.world_size == 1:
            return decision
        flag = torch.tensor([int(decision)])
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value`` (anything picklable), on every rank."""
        if self.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, by rank (on every rank)."""
        if self.world_size == 1:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values


SINGLE = Group()  # one process: no collectives at all


def average_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Average the gradients of ``optimizer``'s parameters across the ranks, in one all-reduce
    of one flat buffer (DDP's bucket, as one bucket); nothing when there is one rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
    present = [g for g in grads if g is not None]
    if not present:
        return
    flat = torch.cat([g.reshape(-1) for g in present])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in present:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def row_digest(batch: Batch) -> int:
    """A sum, mod 2**64, of one hash per row of (episode_id, t): the digests of disjoint parts add
    up to the whole's, so the read log proves each row was read once across the ranks."""
    if not len(batch):
        return 0
    ids, inverse = np.unique(np.asarray(batch.episode_ids).astype(str), return_inverse=True)
    hashes = np.array([zlib.crc32(name.encode()) for name in ids], np.uint64)
    ts = np.asarray(batch.ts, np.uint64)
    mixed = (hashes[inverse] << np.uint64(32)) ^ (ts * np.uint64(0x9E3779B1))
    return int(np.sum(mixed, dtype=np.uint64))


def launch(
    args: argparse.Namespace, workers: int, target: Callable[[argparse.Namespace], int]
) -> int:
    """Run ``target(args)`` in ``workers`` processes, ranks 0..workers-1 of one group on this
    machine, with one torch thread each; when one fails, the others are stopped and the run fails
    with a message naming it (torch.multiprocessing watches them, never waiting on a dead one)."""
    import torch.multiprocessing as mp

    # the ranks meet at a store this process holds on a port the OS picked, as torchrun's agent
    # does (TORCHELASTIC_USE_AGENT_STORE): no port is probed free, then taken by another process
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    context = mp.start_processes(
        _rank_main,
        args=(workers, store.port, target, args),
        nprocs=workers,
        join=False,
        start_method="spawn",
    )
    try:
        while not context.join():
            pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as error:
        # the rank that died first, not one whose collective failed because it did
        killed = [
            (rank, process.exitcode)
            for rank, process in enumerate(context.processes)
            if process.exitcode is not None
            and process.exitcode < 0
            and process.exitcode != -signal.SIGTERM  # the ones torch ended
        ]
        if killed:
            raise TrainingError(_exit_reason(*killed[0], workers)) from None
        if isinstance(error, mp.ProcessExitedException):
            raise TrainingError(_exit_reason(error.error_index, error.exit_code, workers)) from None
        raise TrainingError(
            f"rank {error.error_index} of {workers} failed, so the run stopped:\n{error}"
        ) from None
    return 0


def _rank_main(
    rank: int,
    workers: int,
    port: int,
    target: Callable[[argparse.Namespace], int],
    args: argparse.Namespace,
) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(workers),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    try:
        code = target(args)
    except RlpipeError as error:  # one line, as the rlpipe command prints it, then exit 2
        print(f"rlpipe {args.command} (rank {rank}): {error}", file=sys.stderr)
        code = 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if code:
        sys.exit(code)


def _exit_reason(rank: int, code: int | None, workers: int) -> str:
    if code is not None and code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code}"
    return (
        f"rank {rank} of {workers} {how}, so the run stopped (the other ranks were ended); "
        "start it again with the same --run-dir to resume from its last saved state"
    )


def _int_variable(name: str) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise ConfigError("train", name, "an integer environment variable", text) from None
