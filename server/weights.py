"""GET /v1/weights: the checkpoint file's own bytes, or 304 when the client already has them."""

from __future__ import annotations

from flask import Response

from server.errors import ApiError, bad_request
from server.inference import PolicyRunner

NPZ_TYPE = "application/x-npz"


def weights_response(runner: PolicyRunner, have: str | None) -> Response:
    """The newest checkpoint (an ``.npz`` read with ``allow_pickle=False``) with its version.

    Args:
        runner: holds the path of the checkpoint in use.
        have: the version the client holds (query ``?version=N``); equal to the current -> 304.
    """
    runner.refresh()
    path, version = runner.checkpoint_path, runner.version
    if path is None or version is None:
        raise ApiError(
            404,
            "no checkpoint has been published yet; act at random until one is "
            "(GET /v1/health says when)",
        )
    if have is not None:
        try:
            held = int(have)
        except ValueError:
            raise bad_request("version", "an integer", repr(have)) from None
        if held == version:
            response = Response(status=304)
            response.headers["X-Rlpipe-Policy-Version"] = str(version)
            return response
    response = Response(path.read_bytes(), mimetype=NPZ_TYPE)
    response.headers["X-Rlpipe-Policy-Version"] = str(version)
    response.headers["Content-Disposition"] = f'attachment; filename="{path.name}"'
    return response
