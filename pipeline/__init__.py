"""rlpipe: experience from simulators into reinforcement-learning training, safely, through files.

The names most users need are here; the modules hold the rest.
"""

from pipeline.batch import Batch
from pipeline.errors import (
    ConfigError,
    DatasetError,
    FormatVersionError,
    RlpipeError,
    SchemaError,
    SpaceError,
)
from pipeline.manifest import Manifest, read_manifest
from pipeline.reader import InputReader, ReaderConfig
from pipeline.recovery import recover
from pipeline.writer import DatasetWriter, WriterConfig

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "ConfigError",
    "DatasetError",
    "DatasetWriter",
    "FormatVersionError",
    "InputReader",
    "Manifest",
    "ReaderConfig",
    "RlpipeError",
    "SchemaError",
    "SpaceError",
    "WriterConfig",
    "__version__",
    "read_manifest",
    "recover",
]
