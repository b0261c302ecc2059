"""server/openapi.py: the document lists every header, field and status the server uses, tightly
enough that a client built from it alone can start, step, log, upload and fetch weights."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import jsonschema
import numpy as np
import pytest
import requests
from conftest import cartpole_spaces
from hypothesis import given, settings
from openapi_contract import check_answer, request_schema, schema, values
from server_fixtures import cartpole_checkpoint, cartpole_config, running_server, wait_for

from pipeline.format import codec
from server import openapi, schemas

OBS = [0.01, -0.02, 0.03, 0.04]


def _headers(document: dict[str, Any], template: str, method: str) -> dict[str, str]:
    """Every required header the document names for an operation, with a value of its type."""
    values = {"string": "client-from-document", "integer": "0"}
    return {
        parameter["name"]: values[parameter["schema"]["type"]]
        for parameter in document["paths"][template][method].get("parameters", [])
        if parameter["in"] == "header" and parameter["required"]
    }


def test_a_client_built_from_the_document_gets_only_documented_answers(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data, policy_poll_s=0.05)) as server:
        session = requests.Session()
        document = session.get(server.url + "/v1/openapi.json", timeout=5).json()

        def post(template: str, path: str, body: Any, **headers: str) -> requests.Response:
            jsonschema.validate(body, request_schema(document, template))
            answer = session.post(server.url + path, json=body, headers=headers, timeout=10)
            check_answer(document, template, "post", answer)
            return answer

        start = {"episode_id": "e", "client_id": "c", "seed": 3}
        assert post("/v1/episodes", "/v1/episodes", start).status_code == 201
        assert post("/v1/episodes", "/v1/episodes", start).status_code == 200  # a retried start
        logged = {"observation": OBS, "action": 1, "reward": 0.5}
        with pytest.raises(jsonschema.ValidationError, match="is not valid under any"):
            jsonschema.validate({"observation": OBS}, schema(document, "LoggedStep"))
        template = "/v1/episodes/{episode_id}/"
        post(template + "logged-actions", "/v1/episodes/e/logged-actions", logged)
        post(template + "end", "/v1/episodes/e/end", {"observation": OBS, "truncated": True})
        rows = {
            "steps": [
                {
                    "episode_id": "u",
                    "t": 0,
                    "observation": OBS,
                    "action": 0,
                    "reward": 1.0,
                    "next_observation": OBS,
                    "terminated": True,
                    "truncated": False,
                }
            ]
        }
        uploaded = post(
            "/v1/uploads", "/v1/uploads", rows, **_headers(document, "/v1/uploads", "post")
        )
        assert uploaded.json() == {"duplicate": False, "stored": {"steps": 1}}
        weights = document["paths"]["/v1/weights"]["get"]
        assert [p["name"] for p in weights["parameters"] if p["in"] == "query"] == ["version"]
        cartpole_checkpoint(data / "checkpoints", 4)
        wait_for(  # the server looks for a newer checkpoint every 50 ms at most
            lambda: session.get(server.url + "/v1/weights", timeout=5).status_code != 404,
            5.0,
            "the checkpoint to be served",
        )
        for query, status in (("", 200), ("?version=4", 304), ("?version=x", 400)):
            answer = session.get(server.url + "/v1/weights" + query, timeout=5)
            assert answer.status_code == status
            check_answer(document, "/v1/weights", "get", answer)
        wrong = session.get(server.url + "/v1/episodes", timeout=5)
        assert (wrong.status_code, wrong.headers["Allow"]) == (405, "OPTIONS, POST")
        assert wrong.json()["error"]["status"] == 405


def test_openapi_documents_every_route(tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        served = requests.get(server.url + "/v1/openapi.json", timeout=5).json()
        routes = {
            (re.sub(r"<(?:path:)?([a-z_]+)>", r"{\1}", rule.rule), method.lower())
            for rule in server.app.url_map.iter_rules()
            for method in rule.methods or ()
            if method in ("GET", "POST")
        }
    documented = {
        (path, method)
        for path, item in served["paths"].items()
        for method in item
        if method in ("get", "post")
    }
    assert routes == documented
    assert served == openapi.document(*cartpole_spaces(), token=False)


def test_openapi_asks_for_a_token_only_where_the_server_does(tmp_path: Path) -> None:
    """A client generated from the document sends a token only to a server that wants one:
    without a token no operation needs one or answers 401; with one, all but the public do."""
    for token in (None, "s3cret"):
        with running_server(cartpole_config(tmp_path / str(token), token=token)) as server:
            served = requests.get(server.url + "/v1/openapi.json", timeout=5).json()
        operations = [op for item in served["paths"].values() for op in item.values()]
        operations = [op for op in operations if isinstance(op, dict)]
        answers_401 = {"401" in op["responses"] for op in operations}
        public = {op.get("security") == [] for op in operations}
        if token is None:
            assert ("security" in served, answers_401, public) == (False, {False}, {False})
        else:
            assert served["security"] == [{"bearer": []}]
            assert served["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
            assert answers_401 == {True, False} and public == {True, False}


_SPACES = [
    gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    gym.spaces.Box(0, 255, (2,), np.uint8),
    gym.spaces.Discrete(3, start=-1),
    gym.spaces.MultiDiscrete([2, 5]),
    gym.spaces.MultiBinary(3),
    gym.spaces.Dict({"x": gym.spaces.Discrete(2), "y": gym.spaces.Box(-1, 1, (2,))}),
    gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiBinary(2))),
]


@pytest.mark.parametrize("space", _SPACES, ids=lambda space: type(space).__name__)
def test_the_schema_of_every_space_takes_its_samples_and_makes_values_the_server_takes(
    space: gym.Space[Any],
) -> None:
    described = schemas.space_schema(space)
    for seed in range(5):
        space.seed(seed)
        sample = json.loads(json.dumps(space.sample(), default=lambda array: array.tolist()))
        jsonschema.validate(sample, described)

    @settings(max_examples=15, deadline=None)
    @given(value=values(described))
    def taken(value: Any) -> None:
        codec.to_arrow_rows(space, [value], field="value")  # raises SchemaError if refused

    taken()


@pytest.mark.parametrize(
    ("space", "token"), [*((space, True) for space in _SPACES), (_SPACES[0], False)]
)
def test_the_document_is_valid_openapi_for_every_space(space: gym.Space[Any], token: bool) -> None:
    """openapi-spec-validator, the reference validator of OpenAPI 3.1 documents, takes the
    document of a server of each space (one without a token too)."""
    from openapi_spec_validator import validate

    validate(json.loads(json.dumps(openapi.document(space, space, token=token))))  # as sent


def test_what_schemathesis_found_is_answered_as_documented(tmp_path: Path) -> None:
    """Values tests/test_schemathesis.py found answered otherwise than the document says: a
    ``?version`` beyond 64 bits (was 200), an X-Rlpipe-Table naming no table on a JSON upload
    (was ignored), and a start's null episode_id and seed and a request number of null, which
    the document now lists."""
    with running_server(cartpole_config(tmp_path / "ds", policy_poll_s=0.05)) as server:
        cartpole_checkpoint(tmp_path / "ds" / "checkpoints", 1)
        document = requests.get(server.url + "/v1/openapi.json", timeout=5).json()
        weights = server.url + "/v1/weights?version="
        wait_for(lambda: requests.get(weights + "1", timeout=5).status_code == 304, 10, "policy")
        for version in (str(2**63), str(-(2**63) - 1), "1.0"):
            answer = requests.get(weights + version, timeout=5)
            assert answer.status_code == 400, version
            assert "field 'version': expected a 64-bit integer" in answer.json()["error"]["message"]
        headers = {"X-Rlpipe-Client": "c", "X-Rlpipe-Upload": "0", "X-Rlpipe-Table": "{}"}
        upload = requests.post(server.url + "/v1/uploads", json={}, headers=headers, timeout=5)
        assert upload.status_code == 400 and "X-Rlpipe-Table" in upload.json()["error"]["message"]
        start = {"episode_id": None, "seed": None}
        jsonschema.validate(start, request_schema(document, "/v1/episodes"))
        started = requests.post(server.url + "/v1/episodes", json=start, timeout=5)
        assert started.status_code == 201
        step = {"observation": [0.0] * 4, "request": None}
        jsonschema.validate(step, request_schema(document, "/v1/episodes/{episode_id}/actions"))
        episode = started.json()["episode_id"]
        acted = requests.post(f"{server.url}/v1/episodes/{episode}/actions", json=step, timeout=5)
        assert acted.status_code == 200
