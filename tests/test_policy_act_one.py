"""NumpyPolicy.act_one (pipeline/policy/network.py): one observation's action and
log-probability, checked against the batch forward pass it must agree with."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from pipeline.policy.checkpoint import Checkpoint, ModelSpec
from pipeline.policy.network import NumpyPolicy

OBSERVATION = gym.spaces.Box(-5.0, 5.0, (3,), np.float32)


def _policy(action_space: gym.Space, distribution: str, out: int) -> NumpyPolicy:  # type: ignore[type-arg]
    rng = np.random.default_rng(0)
    weights = {
        "pi.0.weight": rng.standard_normal((6, 3)).astype(np.float32),
        "pi.0.bias": rng.standard_normal(6).astype(np.float32),
        "pi.1.weight": rng.standard_normal((out, 6)).astype(np.float32),
        "pi.1.bias": np.zeros(out, np.float32),
        "log_std": np.full(out, -0.5, np.float32),
    }
    spec = ModelSpec(OBSERVATION, action_space, (6,), distribution=distribution)
    return NumpyPolicy(Checkpoint(1, spec, weights))


def test_act_one_samples_the_softmax_and_reports_its_log_probability() -> None:
    policy = _policy(gym.spaces.Discrete(3, start=2), "categorical", 3)
    observation = np.array([0.3, -1.0, 2.0], np.float32)
    logits = policy.forward(observation[None])[0].astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum())
    rng = np.random.default_rng(0)
    draws = [policy.act_one(observation, rng) for _ in range(6000)]
    actions = np.array([action for action, _ in draws])
    assert set(actions) <= {2, 3, 4}
    for action, logp in draws[:50]:
        assert abs(logp - log_probs[action - 2]) < 1e-5
    frequencies = np.bincount(actions - 2, minlength=3) / len(actions)
    np.testing.assert_allclose(frequencies, np.exp(log_probs), atol=0.025)
    greedy, logp = policy.act_one(observation.tolist(), rng, explore=False)
    assert greedy == int(np.argmax(logits)) + 2 and abs(logp - log_probs.max()) < 1e-5


def test_act_one_of_a_gaussian_is_act_on_a_batch_of_one() -> None:
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = _policy(box, "gaussian", 2)
    observation = np.array([0.3, -1.0, 2.0], np.float32)
    action, logp = policy.act_one(observation, np.random.default_rng(5), explore=False)
    batch, batch_logp = policy.act(observation[None], np.random.default_rng(5), explore=False)
    np.testing.assert_array_equal(action, batch[0])
    assert logp == float(batch_logp[0]) and action.shape == (2,)
