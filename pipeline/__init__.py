"""rlpipe: experience from simulators into reinforcement-learning training, safely, through files.

The names most users need are here; the modules hold the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipeline.errors import (
    ConfigError,
    DamagedFileError,
    DatasetError,
    FormatVersionError,
    RlpipeError,
    SchemaError,
    SpaceError,
    StorageError,
)

if TYPE_CHECKING:
    from pipeline.dataset.batch import Batch
    from pipeline.dataset.reader import InputReader
    from pipeline.dataset.reader_config import ReaderConfig
    from pipeline.dataset.recovery import recover
    from pipeline.dataset.writer import DatasetWriter
    from pipeline.dataset.writer_config import WriterConfig
    from pipeline.format.manifest import Manifest, read_manifest

# imported when first named: a simulator's process (pipeline.client) then loads none of the
# dataset's machinery (deltalake, pyarrow.dataset, the reader, the writer), 29 MB less of it
_LAZY = {
    "Batch": "pipeline.dataset.batch",
    "InputReader": "pipeline.dataset.reader",
    "ReaderConfig": "pipeline.dataset.reader_config",
    "recover": "pipeline.dataset.recovery",
    "DatasetWriter": "pipeline.dataset.writer",
    "WriterConfig": "pipeline.dataset.writer_config",
    "Manifest": "pipeline.format.manifest",
    "read_manifest": "pipeline.format.manifest",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__version__ = "0.1.0"

__all__ = [
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
