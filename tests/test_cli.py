"""The ``rlpipe`` command: one entry point, user errors as one line and exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from pipeline.commands.cli import main


def test_help_lists_the_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith("usage: rlpipe")


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_our_warnings_print_as_one_line_like_our_errors(tmp_path: Path) -> None:
    """A warning rlpipe gives (here: actions that look normalized) reads as the command's own
    line, not as Python's file:line report with a source excerpt."""
    observations = [[1.0, 0.0, 0.0]] * 2
    batch = {"type": "SampleBatch", "eps_id": [7, 7], "obs": observations}
    batch |= {"new_obs": observations, "actions": [[0.5], [-0.5]], "rewards": [0.0, 0.0]}
    batch["dones"] = [False, True]
    src = tmp_path / "pendulum.json"
    src.write_text(json.dumps(batch) + "\n")
    argv = ["import", "rllib-json", str(src), str(tmp_path / "ds"), "--env", "Pendulum-v1"]
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], capture_output=True, text=True, check=True
    )
    assert result.stderr == (
        "rlpipe import: warning: actions: all 2 imported actions lie in [-1, 1] while the action "
        "space is Box(-2.0, 2.0, (1,), float32); if the source logged them normalized (RLlib's "
        "actions_in_input_normalized), import with --actions-normalized "
        "(actions_normalized=True) to store them in the space's units\n"
    )
    assert result.stdout.startswith("imported 2 steps in 1 episodes")


@pytest.mark.parametrize("doc", ["README.md", "docs/protocol.md"])
def test_the_documented_spaces_file_is_one_rlpipe_serve_reads(tmp_path: Path, doc: str) -> None:
    """The --spaces example of the README and the protocol, read as ``rlpipe serve`` reads it."""
    from pipeline.commands.cli import build_parser
    from server.command import _config

    text = (Path(__file__).resolve().parents[1] / doc).read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    examples = [block for block in blocks if '"observation_space"' in block]
    assert len(examples) == 1, f"{doc}: expected one spaces file example, found {len(examples)}"
    spaces_file = tmp_path / "spaces.json"
    spaces_file.write_text(textwrap.dedent(examples[0]))
    args = build_parser().parse_args(
        ["serve", "--data", str(tmp_path), "--spaces", str(spaces_file)]
    )
    config = _config(args)
    assert config.observation_space == gym.spaces.Box(0.0, np.inf, (4,), np.float32)
    assert config.action_space == gym.spaces.Discrete(3)
    assert config.env_id == "Crossroads-v0"
