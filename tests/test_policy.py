"""Checkpoints are safe to load and the numpy policy computes what torch computes."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.errors import ConfigError, DatasetError
from pipeline.format import flattening, samples
from pipeline.policy.checkpoint import (
    Checkpoint,
    ModelSpec,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from pipeline.policy.network import NumpyPolicy, policy_for

OBSERVATION = gym.spaces.Dict(
    {"position": gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "mode": gym.spaces.Discrete(3)}
)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


def _network(spec: ModelSpec, out: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    sizes = [flattening.flatdim(spec.observation_space), *spec.hidden]
    layers: list[torch.nn.Module] = []
    for width_in, width_out in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(width_in, width_out), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], out))


def _checkpoint(spec: ModelSpec, network: torch.nn.Sequential, version: int = 1) -> Checkpoint:
    linears = [m for m in network if isinstance(m, torch.nn.Linear)]
    weights = {}
    for i, layer in enumerate(linears):
        weights[f"pi.{i}.weight"] = layer.weight.detach().numpy()
        weights[f"pi.{i}.bias"] = layer.bias.detach().numpy()
    return Checkpoint(version, spec, weights)


def _observations(n: int) -> tuple[dict[str, np.ndarray], torch.Tensor]:
    batch = samples.sample_batch(OBSERVATION, n, seed=1)
    return batch, torch.as_tensor(flattening.flatten_batch(OBSERVATION, batch))


def test_categorical_matches_torch() -> None:
    spec = ModelSpec(OBSERVATION, gym.spaces.Discrete(4, start=1), (16, 16))
    network = _network(spec, 4)
    policy = NumpyPolicy(_checkpoint(spec, network))
    batch, flat = _observations(64)
    actions, logp = policy.act(batch, np.random.default_rng(0))
    expected = torch.log_softmax(network(flat), dim=1).detach().numpy()
    assert actions.min() >= 1 and actions.max() <= 4  # Discrete(start=1)
    np.testing.assert_allclose(logp, expected[np.arange(64), actions - 1], rtol=1e-5, atol=1e-6)
    greedy, _ = policy.act(batch, np.random.default_rng(0), explore=False)
    assert np.array_equal(greedy, expected.argmax(axis=1) + 1)


def test_squashed_gaussian_matches_torch() -> None:
    spec = ModelSpec(OBSERVATION, BOX, (16,), distribution="squashed_gaussian")
    network = _network(spec, 4)
    policy = NumpyPolicy(_checkpoint(spec, network))
    batch, flat = _observations(256)
    actions, logp = policy.act(batch, np.random.default_rng(0))
    assert actions.shape == (256, 2) and actions.dtype == np.float32
    assert np.all(actions >= BOX.low) and np.all(actions <= BOX.high)
    mean, log_std = network(flat).detach().chunk(2, dim=1)
    base = torch.distributions.Normal(mean, log_std.clamp(-20, 2).exp())
    squashed = torch.distributions.TransformedDistribution(
        base, [torch.distributions.transforms.TanhTransform()]
    )
    unit = torch.as_tensor((actions - BOX.low) / (BOX.high - BOX.low) * 2 - 1, dtype=torch.float64)
    unit = unit.clamp(-1 + 1e-6, 1 - 1e-6).float()
    expected = squashed.log_prob(unit).sum(dim=1).numpy()
    np.testing.assert_allclose(logp, expected, rtol=1e-3, atol=1e-2)


def test_gaussian_uses_log_std_and_clips_to_bounds() -> None:
    spec = ModelSpec(OBSERVATION, BOX, (8,), activation="tanh", distribution="gaussian")
    network = _network(spec, 2)
    checkpoint = _checkpoint(spec, network)
    checkpoint.weights["log_std"] = np.array([-1.0, 0.5], np.float32)
    batch, flat = _observations(32)
    mean = network(flat).detach().numpy()
    actions, _ = NumpyPolicy(checkpoint).act(batch, np.random.default_rng(0), explore=False)
    np.testing.assert_allclose(actions, np.clip(mean, BOX.low, BOX.high), rtol=1e-5)


def test_round_trip_and_newest_wins(tmp_path: Path) -> None:
    spec = ModelSpec(OBSERVATION, gym.spaces.Discrete(4), (8,), activation="relu")
    network = _network(spec, 4)
    assert latest_checkpoint(tmp_path) is None
    for version in (2, 10, 3):
        save_checkpoint(tmp_path / "checkpoints", _checkpoint(spec, network, version))
    newest = latest_checkpoint(tmp_path)
    assert newest is not None and newest.name == "policy-00000010.npz"
    assert latest_checkpoint(tmp_path / "checkpoints") == newest
    assert latest_checkpoint(newest) == newest
    loaded = load_checkpoint(newest)
    assert loaded.version == 10 and loaded.spec == spec
    for name, array in _checkpoint(spec, network).weights.items():
        assert np.array_equal(loaded.weights[name], array)
    assert not list((tmp_path / "checkpoints").glob(".*")), "no temporary file is left behind"


def test_pickled_arrays_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy-00000001.npz"
    np.savez(path, __spec__=np.frombuffer(b"{}", np.uint8), evil=np.array([object()], dtype=object))
    with pytest.raises(DatasetError, match="unreadable checkpoint"):
        load_checkpoint(path)
    with pytest.raises(DatasetError, match=re.escape("expected a name like policy-00000001.npz")):
        load_checkpoint(tmp_path / "weights.npz")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden": (0,)}, "ModelSpec.hidden: expected a tuple of positive integers, got (0,)"),
        ({"activation": "gelu"}, "ModelSpec.activation: expected one of ('tanh', 'relu')"),
        ({"distribution": "gaussian"}, "ModelSpec.distribution: expected 'categorical' for a"),
    ],
)
def test_spec_is_validated(changes: dict[str, object], message: str) -> None:
    options = {"observation_space": OBSERVATION, "action_space": gym.spaces.Discrete(2)} | changes
    with pytest.raises(ConfigError, match=re.escape(message)):
        ModelSpec(**options)  # type: ignore[arg-type]


def test_weights_that_do_not_fit_the_spec_are_refused_when_loaded() -> None:
    spec = ModelSpec(OBSERVATION, BOX, (8,), distribution="gaussian")
    good = _checkpoint(spec, _network(spec, 2))
    good.weights["log_std"] = np.zeros(2, np.float32)
    NumpyPolicy(good)
    cases = [
        ("pi.0.weight", np.zeros((8, 5), np.float32), "array 'pi.0.weight': expected shape "
         "(8, 6), got (8, 5)"),
        ("pi.1.bias", np.zeros(3, np.float32), "array 'pi.1.bias': expected shape (2,), got (3,)"),
        ("log_std", None, "no array 'log_std'"),
    ]  # fmt: skip
    for name, array, message in cases:
        weights = {k: v for k, v in good.weights.items() if k != name}
        if array is not None:
            weights[name] = array
        with pytest.raises(DatasetError, match=re.escape(f"checkpoint version 1: {message}")):
            NumpyPolicy(Checkpoint(1, spec, weights))


def test_a_policy_for_other_spaces_is_refused() -> None:
    spec = ModelSpec(OBSERVATION, gym.spaces.Discrete(4), (8,))
    checkpoint = _checkpoint(spec, _network(spec, 4))
    assert policy_for(checkpoint, OBSERVATION, gym.spaces.Discrete(4)).version == 1
    same_width = gym.spaces.Box(-5.0, 5.0, (6,), np.float32)  # 3 + one-hot of 3, flattened
    assert policy_for(checkpoint, same_width, gym.spaces.Discrete(4)).version == 1
    with pytest.raises(DatasetError, match="observation_space: expected 4 values per flattened "
                       "observation, got 6"):  # fmt: skip
        policy_for(checkpoint, gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(4))
    with pytest.raises(
        DatasetError,
        match=re.escape(
            "checkpoint version 1: action_space: expected Discrete(2), got Discrete(4)"
        ),
    ):
        policy_for(checkpoint, OBSERVATION, gym.spaces.Discrete(2))
