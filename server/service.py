"""What the server does, without HTTP: episodes in, durable rows out, actions back.

The handlers (:mod:`server.handlers`, behind the Flask routes and the WSGI fast path) parse
requests into :class:`~server.messages.StepInput` and call
:meth:`Service.step`, which for any number of episodes at once completes their pending steps,
runs one forward pass for every observation that needs an action, makes all rows durable with
one writer append (shared with concurrent requests; what "durable" means follows the writer's
``sync`` mode, see :class:`~server.config.ServerConfig`), and only then advances the episodes.
A request that fails changes nothing. Single-agent get_action and end_episode requests of a Box
observation space, and the batch form's, take the columnar path of :mod:`server.columns`
instead, which does the same to the same episodes with arrays.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import pyarrow as pa

from pipeline.dataset.writer import DatasetWriter
from pipeline.errors import DatasetError, SchemaError
from pipeline.recording.recorder import Episode, Pending, Row
from server import replays
from server.columns import ColumnStepper
from server.combiner import Combiner
from server.config import ServerConfig
from server.episodes import EpisodeBook, ended_message, refuse_repeats
from server.errors import ApiError
from server.inference import PolicyRunner
from server.messages import StepInput
from server.metrics import Metrics
from server.uploads import UploadLedger

_log = logging.getLogger("rlpipe.server")
ACT, LOG, END = "act", "log", "end"


@dataclass
class StepItem:
    """One episode's share of a request: what the client sent and what it asks for."""

    episode: Episode
    step: StepInput
    kind: str  # ACT, LOG or END
    truncated: bool = False
    request: int | None = None  # the client's count of its requests in this episode, for retries


class Service:
    """The server's state: the writer, the open episodes, the policy and the counters."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.writer = DatasetWriter(
            config.data, config.observation_space, config.action_space,
            env_id=config.env_id, config=config.writer,
        )  # fmt: skip
        manifest = self.writer.manifest
        self.observation_space = manifest.observation_space
        self.action_space = manifest.action_space
        self.env_id = manifest.env_id
        self.episodes = EpisodeBook()
        self.metrics = Metrics()
        self.runner = PolicyRunner(
            config.policy_source, self.observation_space, self.action_space,
            config.policy_poll_s, config.seed,
        )  # fmt: skip
        self.uploads = UploadLedger(self.writer)
        box = self.observation_space
        self.columns = (
            ColumnStepper(self)
            if isinstance(box, gym.spaces.Box) and box.dtype.kind == "f"
            else None
        )  # fmt: skip
        self._writes: Combiner[tuple[list[Row], list[Row]], None] = Combiner(
            self._write_many, retry_alone=lambda error: isinstance(error, SchemaError)
        )
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True, name="rlpipe-reaper")
        self._reaper.start()

    def check_backlog(self) -> None:
        """503 with Retry-After when shards pile up: better a client waits than data is dropped."""
        if self.writer.backlog >= self.config.max_backlog:
            raise ApiError(
                503,
                f"the server is {self.writer.backlog} shards behind in writing; retry after "
                f"{self.config.retry_after_s} s",
                retry_after=self.config.retry_after_s,
            )

    def start(self, episode: Episode) -> tuple[Episode, bool]:
        return self.episodes.start(episode)

    def step(self, items: Sequence[StepItem]) -> list[dict[str, Any]]:
        """Complete, act, write, advance: the body of get_action, log_action and end_episode.

        A request whose numbered rows repeat their episodes' last requests gets the answers it
        already got, without a second row: that is what makes retrying a timed-out call safe.
        """
        episodes = {item.episode.episode_id: item.episode for item in items}
        if len(episodes) != len(items):
            refuse_repeats([item.episode.episode_id for item in items], "episodes")
        with ExitStack() as stack:
            for episode_id in sorted(episodes):
                stack.enter_context(episodes[episode_id].lock)
            for item in items:
                if item.episode.ended:
                    raise ApiError(409, ended_message(item.episode.episode_id))
                item.episode.check_form(item.step.multiagent)
            replayed = replays.replayed([item.episode for item in items],
                                        [item.request for item in items])  # fmt: skip
            if replayed is not None:
                return replayed
            results = self._step(items)
            for item, result in zip(items, results, strict=True):
                item.episode.requests += 1
                item.episode.last_request = (item.episode.requests, result)
            for item in items:  # after every answer is kept: see ColumnStepper._answers
                if item.kind == END:
                    self.episodes.finish(item.episode)
            return results

    def _step(self, items: Sequence[StepItem]) -> list[dict[str, Any]]:
        self.check_backlog()
        rows = [_completed_rows(item) for item in items]
        sums = [_unobserved_sums(item) for item in items]  # checked before anything is written
        actions = self._actions(items)
        summaries: list[Row] = []
        for item, item_rows in zip(items, rows, strict=True):
            if item.kind == END:
                reason = "truncated" if item.truncated else "terminated"
                summaries += item.episode.summary_rows(reason, item_rows,
                                                       set(item.step.observations))  # fmt: skip
        self._write([row for item_rows in rows for row in item_rows], summaries)
        results = []
        for item, item_rows, pending, item_sums in zip(items, rows, actions, sums, strict=True):
            item.episode.commit(item_rows, pending)
            item.episode.set_rewards(item_sums)
            item.episode.mark_terminated(item.step.dones)
            results.append(_result(item, pending))
        return results

    def returns(self, episode: Episode, step: StepInput) -> None:
        episode.add_rewards(step.rewards, step.infos, step.dones)

    def close_episode(self, episode: Episode, end_reason: str = "closed") -> None:
        """Write what an abandoned episode holds: its pending steps as truncated, its summary."""
        with episode.lock:
            if episode.ended:
                return
            rows = episode.close_rows({}, truncated=True)
            self._write(rows, episode.summary_rows(end_reason, rows))
            episode.commit(rows, {})
            self.episodes.finish(episode)

    def close(self) -> None:
        """Close every open episode as truncated, then the writer. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._reaper.join()
        for episode in self.episodes.all_open():
            try:
                self.close_episode(episode)
            except Exception:  # keep closing the rest; the writer close below must happen
                _log.exception("closing episode %s failed", episode.episode_id)
        self.writer.close()

    def _actions(self, items: Sequence[StepItem]) -> list[dict[str, Pending]]:
        """New pending steps per item; every ACT observation goes through one forward pass."""
        wanted: list[tuple[int, str, int]] = []  # (item, agent, row in its observation column)
        columns = []
        out: list[dict[str, Pending]] = [{} for _ in items]
        for index, item in enumerate(items):
            if item.kind == END:
                continue
            for row, (agent_id, observation) in enumerate(item.step.observations.items()):
                state = item.episode.agents.get(agent_id)
                if item.step.dones.get(agent_id) or (state is not None and state.terminated):
                    continue
                if item.kind == LOG:
                    action = item.step.actions[agent_id]
                    out[index][agent_id] = Pending(observation, action, None, None)
                else:
                    wanted.append((index, agent_id, row))
            column = item.step.observation_column
            if item.kind == ACT and column is not None:
                mine = [w[2] for w in wanted if w[0] == index]
                if mine:  # none when every agent observed is done: nothing to act for
                    columns.append(column if len(mine) == len(column) else column.take(mine))
        if wanted:
            acted = self.runner.act(pa.concat_arrays(columns))
            for n, (index, agent_id, _) in enumerate(wanted):
                observation = items[index].step.observations[agent_id]
                out[index][agent_id] = Pending(
                    observation, acted.actions[n], acted.action_logp[n], acted.policy_version
                )
        return out

    def _write(self, rows: list[Row], summaries: list[Row]) -> None:
        """Durable before it returns; concurrent requests share one append."""
        if rows or summaries:
            self._writes.submit((rows, summaries))

    def _write_many(self, work: list[tuple[list[Row], list[Row]]]) -> list[None]:
        rows = [row for item, _ in work for row in item]
        summaries = [row for _, item in work for row in item]
        self.write_rows(rows, summaries)
        return [None] * len(work)

    def write_rows(self, rows: list[Row] | dict[str, Any], summaries: list[Row]) -> None:
        """Make step rows (or columns) and episode summaries durable (values validated on the
        way in)."""
        started = time.perf_counter()
        if isinstance(rows, dict):
            count = len(rows["episode_id"])
            if count:
                self.writer.append(rows, validated=True)
        else:
            count = len(rows)
            if count:
                self.writer.append_rows(rows, validated=True)
        if summaries:
            try:
                self.writer.append_episodes(summaries, validated=True)
            except SchemaError as error:  # the steps are written: this must not be retried
                raise DatasetError(f"writing episode summaries failed: {error}") from error
        self.metrics.observe_append(time.perf_counter() - started, count)

    def _reap_loop(self) -> None:
        period = min(self.config.idle_timeout_s / 4, 1.0)
        while not self._stop.wait(period):
            for episode in self.episodes.idle(self.config.idle_timeout_s):
                try:
                    self.close_episode(episode)
                except Exception:
                    _log.exception("closing idle episode %s failed", episode.episode_id)


def _completed_rows(item: StepItem) -> list[Row]:
    step, episode = item.step, item.episode
    if item.kind != END:
        return episode.complete(step.observations, step.rewards, step.infos, step.dones)
    return episode.end_rows(step.observations, step.rewards, step.infos, item.truncated,
                            step.dones)  # fmt: skip


def _unobserved_sums(item: StepItem) -> dict[str, float]:
    """Rewards for agents this request does not observe go to their pending steps (an end
    request writes those steps itself)."""
    if item.kind == END:
        return {}
    step = item.step
    return item.episode.reward_sums(
        {k: v for k, v in step.rewards.items() if k not in step.observations}
    )


def _result(item: StepItem, pending: dict[str, Pending]) -> dict[str, Any]:
    if item.kind == END:
        return {"episode_id": item.episode.episode_id, "ended": True}
    if not item.step.multiagent:
        step = next(iter(pending.values()), None)
        return {
            "episode_id": item.episode.episode_id,
            "action": None if step is None else step.action,
            "action_logp": None if step is None else step.action_logp,
            "policy_version": None if step is None else step.policy_version,
        }
    return {
        "episode_id": item.episode.episode_id,
        "actions": {agent_id: step.action for agent_id, step in pending.items()},
        "action_logp": {agent_id: step.action_logp for agent_id, step in pending.items()},
        "policy_version": next((s.policy_version for s in pending.values()), None),
    }
