"""Batch: slicing, splitting and joining keep rows, fields and nesting intact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.dataset.batch import Batch


def _batch(rows: int) -> Batch:
    return Batch(
        observations={"pos": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2),
                      "grid": (np.arange(rows), np.arange(rows) * 10)},
        rewards=np.arange(rows, dtype=np.float64),
        episode_ids=np.array([f"e{i // 3}" for i in range(rows)], dtype=object),
        extras={"returns": np.arange(rows) * 2.0},
    )  # fmt: skip


@pytest.mark.parametrize(("rows", "size"), [(10, 4), (12, 4), (3, 5), (1, 1)])
def test_split_cuts_every_field_into_consecutive_views(rows: int, size: int) -> None:
    batch = _batch(rows)
    for source in (batch, batch.to_torch()):
        parts = source.split(size)
        assert [len(part) for part in parts] == [min(size, rows - s) for s in range(0, rows, size)]
        for start, part in zip(range(0, rows, size), parts, strict=True):
            expected = source[start : start + size]
            assert np.array_equal(np.asarray(part.rewards), np.asarray(expected.rewards))
            assert np.array_equal(np.asarray(part.observations["grid"][1]),
                                  np.asarray(expected.observations["grid"][1]))  # fmt: skip
            assert part.episode_ids.tolist() == expected.episode_ids.tolist()
            assert np.array_equal(np.asarray(part.extras["returns"]),
                                  np.asarray(expected.extras["returns"]))  # fmt: skip
            assert part.actions is None and part.ts is None
        # views: writing through a part shows in the source
        parts[-1].rewards[-1] = -1.0
        assert float(source.rewards[-1]) == -1.0


def test_split_of_an_empty_batch_is_empty() -> None:
    assert Batch(rewards=np.zeros(0)).split(8) == []


def test_concat_undoes_split() -> None:
    batch = _batch(11)
    joined = Batch.concat(batch.split(3))
    assert joined.rewards.tolist() == batch.rewards.tolist()
    assert joined.observations["pos"].tolist() == batch.observations["pos"].tolist()
    assert joined.extras["returns"].tolist() == batch.extras["returns"].tolist()
    tensors = Batch.concat(batch.to_torch().split(4))
    assert isinstance(tensors.rewards, torch.Tensor) and tensors.rewards.tolist() == list(range(11))


def test_to_torch_shares_writable_arrays_and_copies_read_only_ones() -> None:
    own = Batch(rewards=np.zeros(3))
    own.to_torch().rewards.add_(2.0)
    assert own.rewards.tolist() == [2.0, 2.0, 2.0]
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    Batch(rewards=frozen).to_torch().rewards.add_(2.0)
    assert frozen.tolist() == [0.0, 0.0, 0.0]
