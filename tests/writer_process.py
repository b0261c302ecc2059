"""A writer process for the durability tests: appends numbered batches (forever, or ``batches``
of them), printing each acknowledgement after ``append`` returns, until it is killed or done.
The dataset may be a URI (``s3://...``): endpoint and keys then come from the environment
(``AWS_ENDPOINT_URL``, ...) and the log from ``$XDG_STATE_HOME``, as for any rlpipe process.

``form`` "columns" appends columns of up to 3,000 rows (mostly the Arrow log); "rows" appends
rows a few at a time, made columns, with an episode summary each, as the server does (the log's
lines); "packed" the same rows as columns with array observations, as the server's vectorized
path does."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import gymnasium as gym
import numpy as np

from pipeline import DatasetWriter, WriterConfig
from pipeline.format.schema import rows_to_columns


def main(path: str, run: int, batches: int = 1_000_000, sync: str = "always",
         form: str = "columns") -> None:  # fmt: skip
    rng = np.random.default_rng(run)
    config = WriterConfig(max_rows=5_000, max_age_s=0.05, max_pending_shards=2, sync=sync)
    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    with DatasetWriter(path, observation_space, gym.spaces.Discrete(2), config=config) as writer:
        for number in range(batches):
            if form in ("rows", "packed"):
                _append_rows(writer, f"r{run}-b{number}", int(rng.integers(1, 40)), rng, form)
                continue
            rows = int(rng.integers(1, 3_000))
            observations = rng.standard_normal((rows, 4)).astype(np.float32)
            writer.append(
                {
                    "episode_id": np.full(rows, f"r{run}-b{number}"),
                    "t": np.arange(rows),
                    "observation": observations,
                    "action": rng.integers(0, 2, rows),
                    "reward": np.ones(rows),
                    "next_observation": observations,
                    "terminated": np.zeros(rows, bool),
                    "truncated": np.zeros(rows, bool),
                }
            )
            print(f"r{run}-b{number} {rows}", flush=True)


def _append_rows(writer: DatasetWriter, name: str, rows: int, rng: np.random.Generator,
                 form: str) -> None:  # fmt: skip
    observations = rng.standard_normal((rows + 1, 4)).astype(np.float32)
    steps = [{"episode_id": name, "agent_id": "agent0", "t": t, "observation": observations[t],
              "action": t % 2, "reward": 1.0, "next_observation": observations[t + 1],
              "terminated": False, "truncated": False, "action_logp": -0.5, "policy_version": 1,
              "training_enabled": True, "info": None, "client_id": "w"}
             for t in range(rows)]  # fmt: skip
    columns = rows_to_columns(steps)
    if form == "packed":
        columns["observation"] = np.stack(columns["observation"])
    writer.append(columns)
    now = datetime.now(UTC)
    writer.append_episodes(
        {"episode_id": [name], "agent_id": ["agent0"], "client_id": ["w"], "started_at": [now],
         "ended_at": [now], "length": [rows], "return": [float(rows)],
         "end_reason": ["terminated"], "training_enabled": [True]}
    )  # fmt: skip
    print(f"{name} {rows}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
