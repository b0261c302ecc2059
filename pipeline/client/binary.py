"""Step bodies in the server's binary form: one Arrow IPC stream whose columns are the JSON
body's fields (``docs/protocol.md``, "Binary bodies"; the server reads them in
:mod:`server.binary`).

:class:`~pipeline.client.PolicyClient` sends a step as Arrow when its observation is an array of
at least :data:`BINARY_MIN_BYTES`, and as JSON otherwise: a few numbers print and parse faster
than Arrow's stream framing is built and read. Values this module cannot encode go as JSON, so
that the server names the problem (a 400) as it names a JSON body's.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from pipeline.errors import SchemaError
from pipeline.format import codec

ARROW_TYPE = "application/vnd.apache.arrow.stream"
BINARY_MIN_BYTES = 2048
"""Observations of at least this many bytes travel as Arrow. Measured on the benchmark machine
(the client's encoding and the server's reading of one step, in one process): CartPole's 16
bytes cost 32 us as JSON and 250 us as Arrow; the two cost the same at about 1 KB (a uint8 Box
of 1,024 values: 223 against 228 us) to 2 KB (a float32 Box of 512: 399 against 253 us); an
84x84x3 uint8 frame costs 19.9 ms as JSON and 0.44 ms as Arrow. So CartPole stays JSON."""

_TYPES = {
    "reward": pa.float64(),
    "rewards": pa.float64(),
    "request": pa.int64(),
    "requests": pa.int64(),
    "terminated": pa.bool_(),
    "truncated": pa.bool_(),
    "episode_ids": pa.string(),
}
_TEXT = ("info", "infos", "starts")  # any JSON value, sent as JSON text


def large(observations: Any, rows: int = 1) -> bool:
    """Whether ``observations`` (one, or ``rows`` stacked) are arrays worth sending as Arrow."""
    return type(observations) is np.ndarray and observations.nbytes >= rows * BINARY_MIN_BYTES


def step_body(
    observation_space: gym.Space[Any], action_space: gym.Space[Any], fields: Mapping[str, Any]
) -> bytes | None:
    """A one-episode step (``observation``, and ``reward``, ``request``, ``info``, ``action``,
    ``truncated`` as given) as one Arrow row; None when a value does not encode."""
    columns = {}
    try:
        for name, value in fields.items():
            if name in ("observation", "action"):
                space = observation_space if name == "observation" else action_space
                columns[name] = codec.to_arrow_rows(space, [value], field=name)
            else:
                columns[name] = _column(name, [value])
    except (SchemaError, TypeError, ValueError, pa.ArrowException):
        return None
    return _stream(columns)


def batch_body(observation_space: gym.Space[Any], fields: Mapping[str, Any]) -> bytes | None:
    """The batch form's columns (``observations`` a batch, the others one entry per episode)
    as Arrow; None when a value does not encode."""
    columns = {}
    try:
        for name, values in fields.items():
            if name == "observations":
                columns[name] = codec.to_arrow(observation_space, values, field=name)
            else:
                columns[name] = _column(name, list(values))
    except (SchemaError, TypeError, ValueError, pa.ArrowException):
        return None
    return _stream(columns)


def _column(name: str, values: list[Any]) -> pa.Array:
    if name in _TEXT:
        texts = [None if v is None else json.dumps(v, allow_nan=False) for v in values]
        return pa.array(texts, pa.string())
    return pa.array(values, _TYPES[name])


def _stream(columns: dict[str, pa.Array]) -> bytes:
    batch = pa.record_batch(list(columns.values()), names=list(columns))
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()
