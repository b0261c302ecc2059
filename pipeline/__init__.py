"""rlpipe: experience from simulators into reinforcement-learning training, safely, through files.

The names most users need are here; the modules hold the rest.
"""

from pipeline.dataset.batch import Batch
from pipeline.dataset.reader import InputReader
from pipeline.dataset.reader_config import ReaderConfig
from pipeline.dataset.recovery import recover
from pipeline.dataset.writer import DatasetWriter
from pipeline.dataset.writer_config import WriterConfig
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
from pipeline.format.manifest import Manifest, read_manifest

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
