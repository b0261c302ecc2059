"""Assembling whole episodes from step rows that arrive in any order, across any number of shards.

An episode (one agent's, in multi-agent logs) is complete when its last row (terminated or
truncated) has arrived and so have all the rows before it: ``t`` runs 0..T without gaps. The format
guarantees every episode ends on such a row: the server writes the last step of an episode it closes
as truncated. Episodes still incomplete when the data ends (a dataset cut mid-episode) come out
last.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class _Partial:
    pieces: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    last_t: int | None = None  # t of the terminal row, once seen


class EpisodeAssembler:
    """Feed it record batches; it hands back each episode as a table sorted by ``t``, once."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], _Partial] = {}

    def add(self, batch: pa.RecordBatch) -> Iterator[pa.Table]:
        table = pa.Table.from_batches([batch])
        episode = table.column("episode_id").to_numpy(zero_copy_only=False)
        agent = table.column("agent_id").to_numpy(zero_copy_only=False)
        keys, inverse = np.unique(
            np.stack([episode, agent], axis=1).astype(str), axis=0, return_inverse=True
        )
        order = np.argsort(inverse.ravel(), kind="stable")
        bounds = np.searchsorted(inverse.ravel()[order], np.arange(len(keys) + 1))
        ends = pc.or_(table.column("terminated"), table.column("truncated")).to_numpy(
            zero_copy_only=False
        )
        ts = table.column("t").to_numpy()
        for index, (episode_id, agent_id) in enumerate(keys):
            rows = order[bounds[index] : bounds[index + 1]]
            partial = self._open.setdefault((str(episode_id), str(agent_id)), _Partial())
            partial.pieces.append(table.take(rows))
            partial.rows += len(rows)
            terminal = ts[rows][ends[rows]]
            if len(terminal):
                partial.last_t = int(terminal.max())
            if partial.last_t is not None and partial.rows >= partial.last_t + 1:
                del self._open[(str(episode_id), str(agent_id))]
                yield _sorted(partial)

    def remaining(self) -> Iterator[pa.Table]:
        """Episodes that never completed, in first-seen order; the assembler is empty afterwards."""
        partials, self._open = self._open, {}
        for partial in partials.values():
            yield _sorted(partial)


def _sorted(partial: _Partial) -> pa.Table:
    table = pa.concat_tables(partial.pieces)
    return table.sort_by("t")
