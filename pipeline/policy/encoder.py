"""The small CNN every policy puts in front of its layers for camera frames, in numpy.

An image space is a ``uint8`` ``Box`` of shape (height, width, channels), at least
:data:`MIN_SIDE` on each side: an 84x84x3 frame. Its policy encodes frames with two
convolutions and ReLUs (the first two layers of the DQN Nature network, Mnih et al. 2015):
16 filters of 8x8 at stride 4, then 32 of 4x4 at stride 2, on values scaled to [0, 1], and
flattens channel-major (C, H, W), as torch does. A checkpoint keeps them as ``enc.{i}.weight``
(out, in, k, k) and ``enc.{i}.bias``. :mod:`pipeline.trainers.networks` trains the same layers
in torch; this runs them where torch is not installed (a client, replay).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LAYERS = ((16, 8, 4), (32, 4, 2))  # (filters, kernel, stride) of each convolution
MIN_SIDE = 20  # the smallest side both convolutions fit


def is_image(space: gym.Space[Any]) -> bool:
    """Whether policies for ``space`` encode it with the CNN."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and min(space.shape[:2]) >= MIN_SIDE
    )


def shapes(space: gym.spaces.Box) -> tuple[dict[str, tuple[int, ...]], int]:
    """The checkpoint arrays' shapes for an image space, and the width of the encoding."""
    height, width, channels = space.shape
    arrays: dict[str, tuple[int, ...]] = {}
    for i, (filters, kernel, stride) in enumerate(LAYERS):
        arrays[f"enc.{i}.weight"] = (filters, channels, kernel, kernel)
        arrays[f"enc.{i}.bias"] = (filters,)
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        channels = filters
    return arrays, channels * height * width


def encode(
    frames: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]], shape: tuple[int, ...]
) -> np.ndarray:
    """Frames (N, H, W, C) of uint8 (or flattened rows of them) as encodings (N, features)."""
    x = np.asarray(frames, np.float32).reshape(-1, *shape).transpose(0, 3, 1, 2) / 255.0
    for (weight, bias), (_, kernel, stride) in zip(layers, LAYERS, strict=True):
        windows = np.lib.stride_tricks.sliding_window_view(x, (kernel, kernel), axis=(2, 3))
        windows = windows[:, :, ::stride, ::stride]  # (N, C, H', W', k, k)
        out = np.tensordot(windows, weight, axes=([1, 4, 5], [1, 2, 3]))  # (N, H', W', O)
        x = np.maximum(out.transpose(0, 3, 1, 2) + bias[None, :, None, None], 0)
    return np.ascontiguousarray(x, np.float32).reshape(len(x), -1)
