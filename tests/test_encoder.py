"""The CNN policies use for image spaces: torch (trainers) and numpy (clients) agree."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.dataset.batch import Batch
from pipeline.errors import DatasetError
from pipeline.policy import encoder
from pipeline.policy.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from pipeline.policy.network import NumpyPolicy
from pipeline.trainers.bc import BC

FRAME = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)


def test_image_spaces_are_uint8_frames_both_convolutions_fit() -> None:
    assert encoder.is_image(FRAME)
    assert encoder.is_image(gym.spaces.Box(0, 255, (20, 20, 1), np.uint8))
    assert not encoder.is_image(gym.spaces.Box(0, 255, (19, 84, 3), np.uint8))
    assert not encoder.is_image(gym.spaces.Box(0, 1, (84, 84, 3), np.float32))
    assert encoder.shapes(FRAME)[1] == 32 * 9 * 9


def test_a_bc_policy_on_frames_is_a_cnn_the_numpy_policy_runs_alike(tmp_path: Path) -> None:
    torch.manual_seed(0)
    frames = np.random.default_rng(0).integers(0, 256, (6, *FRAME.shape), np.uint8)
    trainer = BC(FRAME, gym.spaces.Discrete(2))
    actions = np.array([0, 1, 0, 1, 0, 1])
    batch = Batch(observations=frames, actions=actions)
    losses = [trainer.update(batch)["loss"] for _ in range(15)]
    assert losses[-1] < losses[0]  # it learns from frames
    checkpoint = load_checkpoint(save_checkpoint(tmp_path, trainer.checkpoint(1)))
    assert checkpoint.spec.encoder == "cnn" and "enc.1.weight" in checkpoint.weights
    policy = NumpyPolicy(checkpoint)
    with torch.no_grad():
        expected = trainer.policy(torch.as_tensor(frames.reshape(6, -1), dtype=torch.float32))
    np.testing.assert_allclose(policy.forward(frames), expected.numpy(), rtol=1e-4, atol=1e-5)
    action, _ = policy.act_one(frames[0], np.random.default_rng(0), explore=False)
    assert action == int(np.argmax(expected.numpy()[0]))


def test_a_cnn_checkpoint_for_a_space_that_is_no_image_is_refused() -> None:
    checkpoint = BC(FRAME, gym.spaces.Discrete(2)).checkpoint(1)
    spec = checkpoint.spec
    flat = gym.spaces.Box(0, 255, (84, 84 * 3), np.uint8)
    wrong = type(spec)(flat, spec.action_space, spec.hidden, encoder="cnn")
    with pytest.raises(DatasetError, match="encoder: 'cnn' needs a uint8 Box"):
        NumpyPolicy(Checkpoint(1, wrong, checkpoint.weights))
