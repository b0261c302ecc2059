"""The public surface is chosen, not accidental: adding or removing a name is a decision."""

from __future__ import annotations

import pipeline


def test_exported_names_are_pinned() -> None:
    assert sorted(pipeline.__all__) == [
        "Batch",
        "ConfigError",
        "DamagedFileError",
        "DatasetError",
        "DatasetWriter",
        "FormatVersionError",
        "InputReader",
        "Manifest",
        "ReaderConfig",
        "RlpipeError",
        "SchemaError",
        "SpaceError",
        "StorageError",
        "WriterConfig",
        "__version__",
        "read_manifest",
        "recover",
    ]


def test_every_exported_name_exists() -> None:
    missing = [name for name in pipeline.__all__ if not hasattr(pipeline, name)]
    assert not missing
