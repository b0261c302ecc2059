"""server/openapi.py: the document lists every header, field and status the server uses, tightly
enough that a client built from it alone can start, step, log, upload and fetch weights."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
from conftest import cartpole_spaces
from openapi_contract import check_answer, request_schema, schema
from server_fixtures import cartpole_checkpoint, cartpole_config, running_server

from server import openapi

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
        rows = {"steps": [{"episode_id": "u", "t": 0, "observation": OBS, "action": 0,
                           "reward": 1.0, "next_observation": OBS, "terminated": True,
                           "truncated": False}]}  # fmt: skip
        uploaded = post("/v1/uploads", "/v1/uploads", rows,
                        **_headers(document, "/v1/uploads", "post"))  # fmt: skip
        assert uploaded.json() == {"duplicate": False, "stored": {"steps": 1}}
        weights = document["paths"]["/v1/weights"]["get"]
        assert [p["name"] for p in weights["parameters"] if p["in"] == "query"] == ["version"]
        cartpole_checkpoint(data / "checkpoints", 4)
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
            for method in rule.methods or () if method in ("GET", "POST")
        }  # fmt: skip
    documented = {(path, method) for path, item in served["paths"].items()
                  for method in item if method in ("get", "post")}  # fmt: skip
    assert routes == documented
    assert served == openapi.document(*cartpole_spaces())
