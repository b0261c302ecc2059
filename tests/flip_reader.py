"""Reads a dataset once per flipped bit of one of its files, for the damage tests: prints a line
per flip, ``<offset> <bit> <outcome>``, where the outcome is ``same`` (every row read as before),
``named`` (DamagedFileError), ``wrong`` (other rows) or the name of any other exception. A flip
that ends the process is the one after the last line printed.

Usage: ``flip_reader.py DATASET FILE OFFSET:BIT ...``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import DamagedFileError, InputReader


def rows(path: Path) -> dict[str, np.ndarray]:
    """Every column of every stored step, in reading order."""
    parts: dict[str, list[Any]] = {}
    for batch in InputReader(path, batch_size=1000):
        for name, values in vars(batch).items():
            if isinstance(values, np.ndarray):
                parts.setdefault(name, []).append(values)
    return {name: np.concatenate(values) for name, values in parts.items()}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind in "fc")
        for k in a
    )


def main() -> None:
    path, file = Path(sys.argv[1]), Path(sys.argv[2])
    before, data = rows(path), file.read_bytes()
    for probe in sys.argv[3:]:
        offset, bit = map(int, probe.split(":"))
        flipped = bytearray(data)
        flipped[offset] ^= bit
        file.write_bytes(bytes(flipped))
        try:
            outcome = "same" if same(rows(path), before) else "wrong"
        except DamagedFileError:
            outcome = "named"
        except Exception as error:  # any other: the test names it
            outcome = type(error).__name__
        print(offset, bit, outcome, flush=True)
        file.write_bytes(data)


if __name__ == "__main__":
    main()
