"""What ``rlpipe train`` needs of a trainer: small Protocols, no base class.

Every trainer meets :class:`Trainer` with its own methods; none inherits from another or from
this module (CORL's learner surface). The loops of :mod:`pipeline.trainers.loop` choose how to feed
a trainer by the narrower protocols it meets (:class:`OnPolicy`, :class:`RefreshesTargets`), never
by an algorithm's name. This module imports neither torch nor any trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from pipeline.dataset.batch import Batch
from pipeline.policy.checkpoint import Checkpoint


@runtime_checkable
class Trainer(Protocol):
    """One training step at a time, a policy to publish, and a state to resume from."""

    def update(self, batch: Batch) -> dict[str, float]:
        """One update on ``batch``; its metrics (losses and the like) by name."""
        ...

    def checkpoint(self, version: int) -> Checkpoint:
        """The policy as checkpoint ``version``, for clients, the server and evaluation."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume (weights, optimizer moments, counters), pickle-free."""
        ...

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue from what :meth:`state_dict` returned."""
        ...


@runtime_checkable
class OnPolicy(Trainer, Protocol):
    """A trainer that learns from the rows its own recent versions acted (PPO): online, the loop
    hands it the newest rows as they are committed instead of a replay buffer."""

    def fresh(self, batch: Batch) -> np.ndarray:
        """A boolean mask of the rows recent enough to enter the policy loss."""
        ...


@runtime_checkable
class RefreshesTargets(Trainer, Protocol):
    """A trainer whose targets come from its own networks over whole episodes (MARWIL): offline,
    the loop has it recompute them over the dataset every ``eval_every`` updates."""

    def with_targets(self, batch: Batch) -> Batch:
        """``batch`` (rows of whole episodes, in ``t`` order) with targets from the networks as
        they are now, in ``batch.extras``."""
        ...


if TYPE_CHECKING:  # mypy proves every trainer meets the protocols; nothing runs here
    from pipeline.trainers.bc import BC
    from pipeline.trainers.cql import CQL
    from pipeline.trainers.marwil import MARWIL
    from pipeline.trainers.ppo import PPO
    from pipeline.trainers.sac import SAC

    def _conforms(
        ppo: PPO, sac: SAC, bc: BC, marwil: MARWIL, cql: CQL
    ) -> tuple[list[Trainer], OnPolicy, RefreshesTargets]:
        return [ppo, sac, bc, marwil, cql], ppo, marwil
