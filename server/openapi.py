"""The OpenAPI 3.1 document of ``/v1``: the contract a client can be generated from.

Its step and upload paths are those of the route table (:data:`server.routes.ROUTES`), its schemas
those of :mod:`server.schemas`. A test walks every route of the app and checks it appears here, and
a fuzz test (``tests/test_openapi_fuzz.py``) sends bodies made from these schemas, and mutations
of them, and checks that every answer is a status listed here with a body that matches its schema.
Schemathesis holds the server to it too (``tests/test_schemathesis.py``), and a client that
openapi-python-client generates from it plays an episode (``tests/test_generated_client.py``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from server import routes, stats
from server.messages import MAX_DEPTH
from server.schemas import ID, INT64, named_schemas, object_schema, ref

_JSON = "application/json"
_ARROW = "application/vnd.apache.arrow.stream"
_NPZ = "application/x-npz"


_ANSWERS = {
    "200": "the episode was open already (a retried start of the same client)",
    "304": "not modified: version N is still the newest",
    "400": "bad input: the message names the field, what was expected and what came",
    "401": "missing or wrong token",
    "404": "not found: an unknown episode, or no checkpoint published yet",
    "409": "ended episode, an episode open for another client, or a request number out of turn",
    "413": "body larger than the server's limit",
    "415": "a content type the resource does not take",
    "503": "not stored: writing has fallen behind, or the dataset's disk refuses writes (full); "
    "the message says which. Nothing of the request was done: send it again after the "
    "Retry-After header's seconds",
}
_VERSION_HEADER = {
    "X-Rlpipe-Policy-Version": {
        "schema": {"type": "integer"},
        "description": "the checkpoint's version",
    }
}
_TEXT = {"schema": {"type": "string"}}
_BINARY = {"type": "string", "format": "binary"}
_ID_TEXT = {"type": "string", "minLength": 1}


def _parameter(
    name: str, schema: Any, description: str, required: bool = True, place: str = "header"
) -> dict[str, Any]:
    where = {"name": name, "in": place, "required": required}
    return {**where, "schema": schema, "description": description}


_ROUTE = _parameter(
    "X-Rlpipe-Route",
    {"type": "string"},
    "the route key an HTTP load balancer hashes to keep an episode on one of "
    "several servers of a dataset (docs/deploy.md); the server does not read it. An "
    "episode's key (its percent-encoded episode_id, or the client's id for the episodes of "
    "a vector client's batches) on its start and every request of it; the client's id on "
    "uploads (X-Rlpipe-Client: the server that stored an upload recognises its retry)",
    required=False,
)
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}


# endpoint of server.routes.ROUTES: summary, request body, answer, and the answers beside 400
# and 401 (and 413 and 415, as every one takes a body), the first one the success
_STEPS = ("200", "404", "409", "503")
_OPERATIONS = {
    "start_episode": (
        "Start an episode (idempotent for a client-named episode_id).",
        ref("Start"),
        ref("Started"),
        ("201", "200", "409"),
    ),
    "get_action": (
        "Remote inference: the action for an observation (the reward was earned by the "
        "previous action).",
        ref("Step"),
        ref("Acted"),
        _STEPS,
    ),
    "log_action": (
        "Record an action the client chose ('action', or 'actions' keyed by agent id).",
        ref("LoggedStep"),
        ref("Acted"),
        _STEPS,
    ),
    "end_episode": (
        "End the episode with its last observation ('truncated': true for a time limit).",
        ref("EndStep"),
        ref("Ended"),
        _STEPS,
    ),
    "log_returns": (
        "Add rewards to the pending step.",
        ref("Returns"),
        ref("ReturnsTaken"),
        ("200", "404", "409"),
    ),
    "get_actions": (
        "Batch form: many episodes' steps in one request, columnar or one entry per episode. "
        "An entry with a start opens its episode; one with terminated or truncated ends it. "
        "A batch sent again whole is answered again.",
        {"oneOf": [ref("BatchColumns"), ref("BatchEpisodes")]},
        {"oneOf": [ref("BatchColumnsActed"), ref("BatchEpisodesActed")]},
        _STEPS,
    ),
    "upload": (
        "Local inference: store a batch of finished rows (one Arrow IPC stream of the table "
        "X-Rlpipe-Table, or JSON rows of both tables), once per (X-Rlpipe-Client, "
        "X-Rlpipe-Upload).",
        ref("UploadRows"),
        ref("Uploaded"),
        ("200", "503"),
    ),
}

_STEP_ARROW = (
    "One Arrow IPC stream of one record batch of one row, its columns named as the JSON "
    "fields: observation (the space's Arrow type, docs/format.md section 6: a Box is a "
    "fixed_size_list of its dtype, flattened in C order), reward (double), request (int64), "
    "info (utf8, JSON text){more}. A null is a field left out. docs/protocol.md, "
    "'Binary bodies'."
)
_BINARY_FORMS = {
    "get_action": _STEP_ARROW.format(more=""),
    "log_action": _STEP_ARROW.format(more=", action (the action space's Arrow type)"),
    "end_episode": _STEP_ARROW.format(more=", truncated (bool)"),
    "get_actions": "The columnar form as one Arrow IPC stream of one record batch, a row per "
    "episode: episode_ids (utf8), observations (the space's Arrow type), rewards (double), "
    "terminated and truncated (bool), starts and infos (utf8, JSON text), requests (int64). "
    "A null is an entry left out. docs/protocol.md, 'Binary bodies'.",
}


def _json(schema: Any) -> dict[str, Any]:
    return {_JSON: {"schema": schema}}


def _op(
    summary: str, body: Any = None, answer: Any = None, statuses: tuple[str, ...] = ("200",)
) -> dict[str, Any]:
    """An operation answered with ``statuses`` (the first is the success, every 2xx carries
    ``answer``), 400 and 401, and with 413 and 415 when it takes a ``body``."""
    responses: dict[str, Any] = {statuses[0]: {"description": "success"}}
    with_body = ("413", "415") if body is not None else ()
    for status in sorted({"400", "401", *with_body, *statuses[1:]}):
        responses[status] = {"description": _ANSWERS[status]}
        if int(status) >= 400:
            responses[status]["content"] = _json(ref("Error"))
        if status == "503":
            responses[status]["headers"] = _RETRY_AFTER
    for status, response in responses.items():
        if answer is not None and int(status) < 300:
            response["content"] = answer
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    return op


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    per_episode = []  # the verbs of a started episode, which its start links to
    for route in routes.ROUTES:  # the routes both front ends answer
        summary, body, answer, statuses = _OPERATIONS[route.endpoint]
        path = routes.template(route.rule)
        op = _op(summary, _json(body), _json(answer), statuses)
        paths[path] = {"post": {"operationId": route.endpoint, **op, "parameters": [_ROUTE]}}
        if "{episode_id}" in path:
            paths[path]["parameters"] = [
                {"name": "episode_id", "in": "path", "required": True, "schema": ID}
            ]
            per_episode.append(route.endpoint)
    started = paths[routes.template(routes.by_endpoint("start_episode").rule)]["post"]
    for status in ("200", "201"):
        started["responses"][status]["links"] = _episode_links(per_episode)
    for endpoint, form in _BINARY_FORMS.items():
        path = routes.template(routes.by_endpoint(endpoint).rule)
        paths[path]["post"]["requestBody"]["content"][_ARROW] = {
            "schema": {**_BINARY, "description": form}
        }
    upload = paths["/v1/uploads"]["post"]
    upload["requestBody"]["content"][_ARROW] = {"schema": _BINARY}
    upload["parameters"] = [*_upload_headers(), _ROUTE]
    return {
        **paths,
        "/v1/weights": {"get": _weights()},
        "/v1/spaces": {
            "get": _op(
                "Observation and action spaces as JSON.",
                answer=_json(
                    object_schema(
                        observation_space={"type": "object"},
                        action_space={"type": "object"},
                        env_id={"type": ["string", "null"]},
                    )
                ),
            )
        },
        "/v1/health": {
            "get": {
                **_op(
                    "Liveness; says when acting at random, and when the dataset's disk refuses "
                    "writes ('degraded').",
                    answer=_json(_health()),
                ),
                "security": [],
            }
        },
        "/v1/metrics": {
            "get": _op(
                "Counters, gauges and the request and append latency histograms (docs/protocol.md "
                "names them), in Prometheus' text format 0.0.4, or OpenMetrics when Accept asks.",
                answer={"text/plain": _TEXT, "application/openmetrics-text": _TEXT},
            )
        },
        "/v1/stats": {
            "get": _op(
                "What the live page at / shows: totals, open episodes and clients by inference "
                "mode, the policy served, lag, the writer's backlog, recent refusals and "
                "episodes. Polled every second by the page; costs the step path nothing.",
                answer=_json(stats.schema()),
            )
        },
        "/": {
            "get": {
                "summary": "The live page (HTML, script and styles inline; it reads /v1/stats). "
                "Public: it holds no data, and asks for the token when the server has one.",
                "responses": {"200": {"description": "success", "content": {"text/html": _TEXT}}},
                "security": [],
            }
        },
        "/v1/openapi.json": {
            "get": {**_op("This document.", answer=_json({"type": "object"})), "security": []}
        },
    }


def _episode_links(verbs: list[str]) -> dict[str, Any]:
    """A started episode's id goes on in the path of each of its ``verbs`` (OpenAPI links: a
    generated client or a stateful fuzzer follows them)."""
    return {
        verb: {"operationId": verb, "parameters": {"episode_id": "$response.body#/episode_id"}}
        for verb in verbs
    }


def _upload_headers() -> list[dict[str, Any]]:
    return [
        _parameter(
            "X-Rlpipe-Client", _ID_TEXT, "the client's stable id, stored as every row's client_id"
        ),
        _parameter(
            "X-Rlpipe-Upload",
            {"type": "integer", "minimum": 0},
            "the upload's number: one already stored is not stored again",
        ),
        _parameter(
            "X-Rlpipe-Table",
            {"enum": ["steps", "episodes"], "default": "steps"},
            "which table an Arrow body holds (JSON bodies name their tables)",
            required=False,
        ),
    ]


def _weights() -> dict[str, Any]:
    op = _op(
        "The newest checkpoint as .npz bytes (numpy arrays, read with allow_pickle=False).",
        answer={_NPZ: {"schema": _BINARY}},
        statuses=("200", "304", "404"),
    )
    holds = "the version the client holds: answered 304 while it is the newest"
    op["parameters"] = [_parameter("version", INT64, holds, required=False, place="query")]
    op["responses"]["200"]["headers"] = _VERSION_HEADER
    op["responses"]["304"]["headers"] = _VERSION_HEADER
    return op


def _health() -> dict[str, Any]:
    return object_schema(
        status={"enum": ["ok", "degraded"]},
        policy_version={"type": ["integer", "null"]},
        acting_at_random={"type": "boolean"},
        refused_checkpoint={"type": ["string", "null"]},
        open_episodes={"type": "integer"},
        queue_depth={"type": "integer"},
        storage_error={
            "oneOf": [
                {"type": "null"},
                object_schema(
                    ["message", "since"],
                    message={"type": "string"},
                    since={"type": "string", "format": "date-time"},
                ),
            ],
            "description": "why the dataset's disk refuses writes, and since when (status "
            "is then 'degraded'); null while it takes them",
        },
    )


def document(
    observation_space: gym.Space[Any], action_space: gym.Space[Any], token: bool = True
) -> dict[str, Any]:
    """The document served at ``GET /v1/openapi.json`` by a server of these spaces; ``token``:
    whether it asks for one (without, no operation answers 401, and none needs a header)."""
    paths = _paths()
    if not token:
        for item in paths.values():
            for op in item.values():
                if isinstance(op, dict):
                    op.get("responses", {}).pop("401", None)
                    op.pop("security", None)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "rlpipe policy server",
            "version": "1",
            "description": "docs/protocol.md tells the rules. Every error is JSON (the Error "
            f"schema). Bodies may nest arrays and objects at most {MAX_DEPTH} deep, and every "
            "string must be valid UTF-8 (no lone surrogates). An integer is written without a "
            "fraction (36, not 36.0) but in a space's value, which numpy reads (true is 1). A "
            "method a path does not take is answered 405, with an Allow header listing those it "
            "does.",
        },
        "components": {"schemas": named_schemas(observation_space, action_space)},
        "paths": paths,
    }
    if token:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
