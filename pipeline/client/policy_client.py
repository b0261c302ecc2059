"""PolicyClient: RLlib's client verbs over rlpipe's safe HTTP protocol (``docs/protocol.md``).

Code written against ``ray.rllib.env.policy_client.PolicyClient`` runs with only the import
changed. In ``"remote"`` mode the server picks every action (:mod:`pipeline.client.remote`); in
``"local"`` mode the client acts with the numpy policy it pulls (:mod:`pipeline.client.local`)
and uploads steps from a background thread (:mod:`pipeline.client.spool` says what survives
what).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import requests

from pipeline.client import vector
from pipeline.client.local import LocalInference, RowBuffer
from pipeline.client.remote import RemoteInference
from pipeline.client.servers import Servers, route_headers
from pipeline.client.spool import Spool, Uploader
from pipeline.client.transport import (
    ARROW_TYPE,
    AgentIds,
    Verify,
    jsonable,
    parse_spaces,
)
from pipeline.errors import (
    ConfigError,
    EpisodeError,
    SchemaError,
    ServerUnavailable,
)
from pipeline.format import layout, seeds
from pipeline.policy.checkpoint import load_checkpoint
from pipeline.policy.network import policy_for
from pipeline.recording.episode import Returns, episode_id_of

INFERENCE_MODES = ("local", "remote")
_log = logging.getLogger("rlpipe.client")


class PolicyClient:
    """Connects a simulator to an rlpipe server; RLlib's verbs and meanings.

    Args:
        address: ``"host:port"`` or a URL such as ``"http://host:9900"``; ``"https://..."``
            for a server run with ``--tls-cert``. Several servers of one dataset as a list or a
            comma-separated string: each episode goes to one of them, by its id, and the
            uploads of local mode and the batches of :meth:`step_many` by the client's id
            (:mod:`pipeline.client.servers`; ``docs/deploy.md``).
        inference_mode: ``"local"`` (act here, upload batches) or ``"remote"`` (server acts).
        update_interval: seconds between weight pulls in local mode; None pulls only on
            :meth:`update_policy_weights`.
        session: a ``requests.Session`` to reuse (connection pools, proxies, certificates).
        timeout: seconds for each request; remote calls retry within it while the server does
            not answer (a proxy's 502 or 504 counts as no answer) or answers 503.
        token: the server's bearer token, if it has one; None takes it from the environment
            variable ``RLPIPE_TOKEN`` when set (so it stays out of code and command lines),
            and ``""`` sends none.
        spool_dir: where local mode keeps batches until the server has them; batches a crashed
            client left there are delivered too. The default, a new temporary directory, is
            removed when :meth:`close` has delivered everything, and kept (with a warning that
            names it) when it has not.
        upload_rows: buffered steps that trigger an upload in local mode.
        upload_interval_s: the longest a step waits in memory in local mode.
        seed: seeds local action sampling.
        verify: how an ``https://`` server's certificate is checked, as in requests: True
            (the system's CAs), the path of a PEM CA bundle (that bundle alone), or an
            ``ssl.SSLContext``. A certificate that does not verify raises ServerError at once.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        inference_mode: str = "local",
        update_interval: float | None = 10.0,
        session: requests.Session | None = None,
        timeout: float = 10.0,
        token: str | None = None,
        spool_dir: str | Path | None = None,
        *,
        upload_rows: int = 4096,
        upload_interval_s: float = 0.5,
        seed: int | None = None,
        verify: Verify = True,
    ) -> None:
        if inference_mode not in INFERENCE_MODES:
            raise ConfigError(
                "PolicyClient", "inference_mode", f"one of {INFERENCE_MODES}", inference_mode
            )
        self.inference_mode = inference_mode
        self.update_interval = update_interval
        self.client_id = secrets.token_hex(8)
        self._servers = Servers(address, session, timeout, token, verify)
        self._spaces: tuple[gym.Space[Any], gym.Space[Any], str | None] | None = None
        self._agent_ids: dict[str, AgentIds] = {}  # per multi-agent episode
        self._episode_numbers = itertools.count()
        self._pulled = 0.0
        self._uploader: Uploader | None = None
        self._local: LocalInference | None = None
        self._own_spool: Path | None = None  # a temporary spool of our own, removed when empty
        self.spool_dir: Path | None = None
        self._remote: RemoteInference | None = None
        self._inference: LocalInference | RemoteInference
        if inference_mode == "local":
            self._start_local(spool_dir, upload_rows, upload_interval_s, seed)
        else:
            self._remote = RemoteInference(self._servers, self.client_id, lambda: self._space()[:2])
            self._inference = self._remote

    # --- RLlib's verbs --------------------------------------------------------------------

    def start_episode(
        self,
        episode_id: str | None = None,
        training_enabled: bool = True,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """Open an episode; ``seed`` and reset ``options`` are recorded so it can be replayed."""
        if episode_id is None:
            episode_id = self._new_episode_id()
        episode_id_of(episode_id)  # refused here, in both modes, as the server refuses it
        if not isinstance(training_enabled, bool):
            raise SchemaError.single("training_enabled", "true or false", repr(training_enabled))
        seed = seeds.checked(seed)  # here, not when the episode's summary is stored
        self._check_uploads()
        self._inference.start(episode_id, training_enabled, seed, options)
        return episode_id

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """The action for ``observation`` (a dict keyed by agent id for multi-agent envs; ids
        are strings or integers, and the actions come back keyed by the same ids)."""
        multi = self._multiagent(observation)
        ids = self._ids(episode_id) if multi else None
        if ids is not None:
            observation = ids.encode(observation, "observations")
        self._check_uploads()
        actions = self._inference.step(episode_id, observation, None, multi)
        return actions if ids is None else ids.decode(actions)

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an action the simulator chose itself (off-policy data)."""
        multi = self._multiagent(observation)
        if multi:
            ids = self._ids(episode_id)
            observation = ids.encode(observation, "observations")
            action = ids.encode(action, "actions") if isinstance(action, Mapping) else action
        self._check_uploads()
        self._inference.step(episode_id, observation, action, multi)

    def log_returns(
        self,
        episode_id: str,
        reward: float | Mapping[str, float],
        info: Any = None,
        multiagent_done_dict: Mapping[str, bool] | None = None,
    ) -> None:
        """Add rewards to the current step (they sum until the next action; none means 0.0)."""
        if info is None and multiagent_done_dict is None and type(reward) in _PLAIN_NUMBERS:
            value = float(reward)  # type: ignore[arg-type]  # a number: checked just above
            if not math.isfinite(value):
                raise SchemaError.single("reward", "a finite number", repr(reward))
            self._check_uploads()
            self._inference.add_reward(episode_id, value)
            return
        ids = self._ids(episode_id) if isinstance(reward, Mapping) or multiagent_done_dict else None
        rewards = dict(reward) if isinstance(reward, Mapping) else {_AGENT: reward}
        _check_rewards(rewards, info)
        infos = (
            dict(info)
            if isinstance(reward, Mapping) and isinstance(info, Mapping)
            else ({} if info is None else {_AGENT: info})
        )
        dones = {k: bool(v) for k, v in (multiagent_done_dict or {}).items() if k != "__all__"}
        if ids is not None:
            if isinstance(reward, Mapping):
                rewards, infos = ids.encode(rewards, "reward"), ids.encode(infos, "info")
            dones = ids.encode(dones, "multiagent_done_dict")
        self._check_uploads()
        returns = Returns({k: float(v) for k, v in rewards.items()}, infos, dones)
        self._inference.add_returns(episode_id, returns)

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """End the episode at its last observation (``truncated=True`` for a time limit)."""
        multi = self._multiagent(observation)
        if multi:
            observation = self._ids(episode_id).encode(observation, "observations")
        self._check_uploads()
        self._inference.end(episode_id, observation, truncated, multi)
        self._agent_ids.pop(episode_id, None)

    # many episodes' steps in one request, for vectorized simulators; VectorEpisodes drives a
    # gymnasium vector env with it
    step_many = vector.step_many

    def update_policy_weights(self) -> None:
        """Pull the newest weights now (local mode); 304 when they have not changed."""
        local = self._local
        if local is None:
            return
        version = local.policy.version if local.policy is not None else None
        params = {"version": version} if version is not None else {}
        try:
            response = self._servers.first(self.client_id, "/v1/weights", params)
        except EpisodeError as error:  # 404: nothing published yet, keep acting at random
            if error.status == 404:
                self._pulled = time.monotonic()  # asked: again an interval later
                return
            raise
        self._pulled = time.monotonic()
        if response.status_code == 304:
            return
        new = int(response.headers["X-Rlpipe-Policy-Version"])
        with tempfile.TemporaryDirectory(prefix="rlpipe-weights-") as directory:
            path = Path(directory) / f"policy-{new:08d}.npz"  # the name load_checkpoint reads
            path.write_bytes(response.content)
            checkpoint = load_checkpoint(path)
        local.policy = policy_for(checkpoint, local.observation_space, local.action_space)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Deliver every buffered and spooled step now; True when the server has them all."""
        self._check_uploads()
        return self._uploader.flush(timeout_s) if self._uploader is not None else True

    def close(self, timeout_s: float = 30.0) -> bool:
        """Deliver what can be delivered, then stop; True when every step is on the server.

        Remote mode sends the rewards still held for a next request; local mode closes the
        episodes still open as the server closes abandoned ones, and undelivered batches stay
        in the spool."""
        delivered = self._inference.close_all()
        if self._uploader is not None:
            delivered = self._uploader.close(timeout_s)
        self._servers.close()
        if self._own_spool is not None and delivered:
            shutil.rmtree(self._own_spool, ignore_errors=True)
        elif self._own_spool is not None:  # kept: it holds what the server does not have yet
            _log.warning(
                "undelivered steps are kept in %s: pass it as spool_dir to a new "
                "PolicyClient to deliver them",
                self._own_spool,
            )
        return delivered

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _new_episode_id(self) -> str:
        """Named here, so a retry is idempotent; unique because the client's id is."""
        return f"{self.client_id}{next(self._episode_numbers):08x}"

    def _ids(self, episode_id: str) -> AgentIds:
        return self._agent_ids.setdefault(episode_id, AgentIds())

    # --- local inference -------------------------------------------------------------------

    def _start_local(
        self,
        spool_dir: str | Path | None,
        upload_rows: int,
        upload_interval_s: float,
        seed: int | None,
    ) -> None:
        if spool_dir is None:
            self._own_spool = spool_dir = Path(tempfile.mkdtemp(prefix="rlpipe-spool-"))
        spool = Spool(spool_dir)
        self.spool_dir = spool.directory
        observation_space, action_space, env_id = self._space()
        rows = RowBuffer(
            observation_space, action_space, upload_rows, self._wake, upload_interval_s
        )
        self._inference = self._local = LocalInference(
            observation_space,
            action_space,
            env_id,
            self.client_id,
            np.random.default_rng(seed),
            rows,
        )
        with contextlib.suppress(ServerUnavailable):
            self.update_policy_weights()
        self._uploader = Uploader(
            self.client_id, rows, self._send, spool, upload_interval_s, self._tick
        )

    def _wake(self) -> None:
        if self._uploader is not None:
            self._uploader.wake()

    def _send(self, client_id: str, seq: int, table: str, body: bytes) -> float | None:
        headers = {  # routed by the client's id: the server that stored a batch knows a retry
            **route_headers(client_id),
            "Content-Type": ARROW_TYPE,
            "X-Rlpipe-Client": client_id,
            "X-Rlpipe-Upload": str(seq),
            "X-Rlpipe-Table": table,
        }
        try:
            http = self._servers.pick(client_id)
            http.call("POST", "/v1/uploads", patience_s=0, data=body, headers=headers)
        except ServerUnavailable as error:
            return error.retry_after
        return None

    def _tick(self) -> None:
        if self.update_interval is None or time.monotonic() - self._pulled < self.update_interval:
            return
        try:
            self.update_policy_weights()
        except ServerUnavailable:
            self._pulled = time.monotonic()  # try again an interval later

    def _check_uploads(self) -> None:
        if self._uploader is not None and self._uploader.failure is not None:
            raise self._uploader.failure

    # --- spaces ----------------------------------------------------------------------------

    def _space(self) -> tuple[gym.Space[Any], gym.Space[Any], str | None]:
        """Spaces from the server, else from the spool's copy (a local client may start
        offline); read once."""
        if self._spaces is not None:
            return self._spaces
        cache = None if self.spool_dir is None else self.spool_dir / "spaces.json"
        try:
            doc = self._servers.first(self.client_id, "/v1/spaces").json()
            if cache is not None:
                cache.write_text(json.dumps(doc))
        except ServerUnavailable:
            if cache is None or not cache.exists():
                raise
            doc = json.loads(cache.read_text())
        self._spaces = parse_spaces(doc)
        return self._spaces

    def _multiagent(self, observation: Any) -> bool:
        """A dict is per-agent unless the observation space itself is a Dict with its keys."""
        if type(observation) is np.ndarray or not isinstance(observation, Mapping):  # ABCs are slow
            return False
        space = self._space()[0]
        return not (isinstance(space, gym.spaces.Dict) and set(observation) == set(space.keys()))


_AGENT = layout.DEFAULT_AGENT_ID
# rewards log_returns takes on its short path (exact types, so bool, an int, is not among them)
_PLAIN_NUMBERS = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})


def _check_rewards(rewards: Mapping[str, Any], info: Any) -> None:
    """Refuse at the call what the server would refuse later, when the step is long gone."""
    for agent_id, reward in rewards.items():
        if (
            isinstance(reward, bool)
            or not isinstance(reward, int | float | np.number)
            or (not np.isfinite(reward))
        ):
            name = "reward" if agent_id == _AGENT else f"reward.{agent_id}"
            raise SchemaError.single(name, "a finite number", repr(reward))
    if info is None:
        return
    try:
        json.dumps(jsonable(info), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise SchemaError.single("info", "JSON-serializable data", str(error)) from None
