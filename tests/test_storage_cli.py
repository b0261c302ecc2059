"""The commands on a dataset in a bucket: ``--storage-option KEY=VALUE`` against moto's S3
endpoint (``s3_fixtures``), and the errors of a bad option, which name the flag and never a
secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from s3_fixtures import SECRET, Bucket
from test_upkeep import write_commits

from pipeline.commands.cli import main
from pipeline.dataset.location import locate


def flags(options: dict[str, str]) -> list[str]:
    return [f"--storage-option={key}={value}" for key, value in options.items()]


def test_inspect_and_train_a_dataset_in_a_bucket(
    bucket: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = locate(bucket.uri(), bucket.options, bucket.state_dir)
    write_commits(location, 3)
    assert main(["inspect", bucket.uri(), "--json", *flags(bucket.options)]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)
    assert report["rows"] == 600 and report["shards"]["steps"] == 3
    assert not report["health"]["uncommitted"] and SECRET not in out
    run_dir = tmp_path / "run"
    args = [
        "train",
        "bc",
        "--data",
        bucket.uri(),
        "--run-dir",
        str(run_dir),
        "--max-updates",
        "3",
        "--eval-every",
        "3",
        "--hidden",
        "8,8",
        "--batch-size",
        "32",
    ]
    assert main([*args, "--data-version", "1", *flags(bucket.options)]) == 0
    (line,) = [json.loads(text) for text in (run_dir / "reads.jsonl").read_text().splitlines()]
    assert (line["data_version"], line["rows"]) == (1, 400)
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err


@pytest.mark.parametrize(
    ("word", "shown"),
    [
        ("AWS_ENDPOINT_URL=localhost:5000", "an endpoint URL"),
        ("AWS_ALLOW_HTTP=maybe", "AWS_ALLOW_HTTP=true or AWS_ALLOW_HTTP=false"),
        (f"AWS_SECRET_ACCESS_KEY{SECRET}", "KEY=VALUE"),
        ("=value", "KEY=VALUE"),
    ],
)
@pytest.mark.parametrize("command", ["inspect", "compact", "replay", "train"])
def test_a_bad_option_names_the_flag(
    command: str, word: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = locate(tmp_path / "ds")
    write_commits(location, 1)
    args = {
        "train": ["train", "bc", "--data", location.uri],
        "replay": ["replay", location.uri, "--episode", "s0-0"],
    }.get(command, [command, location.uri])
    assert main([*args, "--storage-option", word]) == 2
    err = capsys.readouterr().err
    assert "--storage-option" in err and shown in err and SECRET not in err
    assert f"{command}.storage_option" in err


def test_serve_a_dataset_in_a_bucket(
    bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rlpipe serve --data s3://...`` writes every step a client plays into the bucket (its
    write-ahead log in the local state directory), acting with checkpoints from --policy."""
    from conftest import play_client
    from server_fixtures import free_port, kill, start_serve_process

    from pipeline import InputReader
    from pipeline.client import PolicyClient

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the server's log
    port = free_port()
    (tmp_path / "policies").mkdir()
    server = start_serve_process(
        bucket.uri(),
        port,
        "--policy",
        str(tmp_path / "policies"),
        "--commit-age",
        "0.1",
        "--compact-every",
        "0.5",
        *flags(bucket.options),
    )
    try:
        client = PolicyClient(f"127.0.0.1:{port}", "local", update_interval=None)
        lengths = play_client(client, 4, seed=0)
        client.close()
    finally:
        kill(server, 15)
    reader = InputReader(bucket.uri(), storage_options=bucket.options, batch_size=100_000)
    rows = sum(len(batch) for batch in reader)
    assert rows == sum(lengths)
    assert list((tmp_path / "state" / "rlpipe").iterdir())  # the log was local, not in $HOME


def test_import_into_a_bucket(
    bucket: Bucket,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rlpipe import table SRC s3://...`` writes a new dataset into the bucket; a second
    import into the same prefix is refused, naming the URI."""
    from test_importers_table import frame, rollouts

    from pipeline import InputReader

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    episodes = rollouts()
    frame(episodes).to_parquet(tmp_path / "steps.parquet")
    argv = [
        "import",
        "table",
        str(tmp_path / "steps.parquet"),
        bucket.uri(),
        "--env",
        "CartPole-v1",
        *flags(bucket.options),
    ]
    assert main(argv) == 0
    rows = sum(len(batch) for batch in InputReader(bucket.uri(), storage_options=bucket.options))
    assert rows == sum(len(episode["act"]) for episode in episodes)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{bucket.uri()}: already holds a dataset" in err and SECRET not in err
