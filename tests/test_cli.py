"""The ``rlpipe`` command: one entry point, user errors as one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

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
