"""Reader benchmark: CartPole transitions per second into torch batches, against a raw scan.

Baseline, measured in the same run on the same files: a raw ``pyarrow.dataset`` scan of the same
columns (Hive partitioning, default readahead), each record batch touched but not converted. The
reader does more than that: it yields every batch as a ``Batch`` of torch tensors
(``device="cpu"``), (shuffled) permutes rows through a buffer, and verifies every page's CRC-32
and every footer; the raw scan verifies nothing, so the ratios include the checksums' cost.
Run: ``python bench/reader.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cartpole_columns, cartpole_spaces, report

from pipeline import DatasetWriter, InputReader, WriterConfig
from pipeline.dataset.reader import DEFAULT_COLUMNS

BATCH_SIZE = 1024
ROUNDS = 5  # interleaved, best of each: noise from other processes hits all three alike


def write_dataset(root: Path, total: int) -> None:
    columns = cartpole_columns(100_000)
    config = WriterConfig(max_rows=250_000)
    with DatasetWriter(root, *cartpole_spaces(), env_id="CartPole-v1", config=config) as writer:
        for _ in range(total // 100_000):
            writer.append(columns)


def raw_scan(root: Path) -> float:
    """Seconds for pyarrow.dataset to scan the reader's default columns once."""
    dataset = ds.dataset(root / "steps", format="parquet", partitioning="hive")
    started = time.perf_counter()
    rows = 0
    for batch in dataset.to_batches(columns=list(DEFAULT_COLUMNS)):
        rows += batch.num_rows
    return time.perf_counter() - started


def reader_pass(root: Path, shuffle: bool) -> tuple[float, int]:
    """Seconds and rows for one epoch of torch batches."""
    reader = InputReader(root, batch_size=BATCH_SIZE, shuffle=shuffle, seed=0, device="cpu")
    started = time.perf_counter()
    rows = 0
    for batch in reader:
        rows += len(batch.observations)
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        root = Path(tmp) / "ds"
        write_dataset(root, args.steps)
        rounds = [
            (raw_scan(root), reader_pass(root, shuffle=False), reader_pass(root, shuffle=True))
            for _ in range(ROUNDS)
        ]
        raw = min(r[0] for r in rounds)
        sequential = min(r[1] for r in rounds)
        shuffled = min(r[2] for r in rounds)
    total = sequential[1]
    if total != shuffled[1] or total != args.steps // 100_000 * 100_000:
        raise SystemExit(f"reader lost rows: {sequential[1]} sequential, {shuffled[1]} shuffled")
    raw_rate, seq_rate, shuf_rate = total / raw, total / sequential[0], total / shuffled[0]
    print(f"raw pyarrow.dataset scan, {len(DEFAULT_COLUMNS)} columns: {raw_rate:,.0f} rows/s")
    print(f"InputReader sequential -> torch, batch {BATCH_SIZE}: {seq_rate:,.0f} transitions/s "
          f"({seq_rate / raw_rate:.2f}x raw scan)")  # fmt: skip
    print(f"InputReader shuffled -> torch, batch {BATCH_SIZE}: {shuf_rate:,.0f} transitions/s "
          f"({shuf_rate / raw_rate:.2f}x raw scan)")  # fmt: skip
    report(
        {
            "raw_scan_rows_per_s": raw_rate,
            "reader_sequential_per_s": seq_rate,
            "reader_shuffled_per_s": shuf_rate,
            "reader_vs_raw_sequential": seq_rate / raw_rate,
            "reader_vs_raw_shuffled": shuf_rate / raw_rate,
        }
    )


if __name__ == "__main__":
    main()
