"""Writer benchmark: acknowledged durable CartPole steps per second, and bytes per step on disk.

Baseline, measured in the same run on the same rows: ``pyarrow.parquet.write_table`` with pyarrow's
defaults (no validation, no durability, one file). Run: ``python bench/writer.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cartpole_columns, cartpole_spaces, report

from pipeline import DatasetWriter
from pipeline.format.schema import step_schema, steps_from_columns


def durable_rate(
    columns: dict, total: int, per_append: int, root: Path
) -> tuple[float, float, int]:
    """(acknowledged, committed steps/s, bytes on disk) for appends of ``per_append`` rows."""
    rows = len(columns["t"])
    batches = [
        {key: value[start : start + per_append] for key, value in columns.items()}
        for start in range(0, rows, per_append)
    ]
    writer = DatasetWriter(root, *cartpole_spaces(), env_id="CartPole-v1")
    started = time.perf_counter()
    for index in range(total // per_append):
        writer.append(batches[index % len(batches)])
    acknowledged = time.perf_counter() - started
    writer.close()
    committed = time.perf_counter() - started
    size = sum(p.stat().st_size for p in root.glob("steps/date=*/*.parquet"))
    return total / acknowledged, total / committed, size


def baseline(columns: dict, total: int, root: Path) -> tuple[float, int]:
    """pyarrow defaults: steps/s and bytes for the same rows, written once as one file."""
    observation_space, action_space = cartpole_spaces()
    schema = step_schema(observation_space, action_space)
    batch = steps_from_columns(schema, columns, observation_space, action_space)
    table = pa.Table.from_batches([batch] * (total // batch.num_rows))
    started = time.perf_counter()
    pq.write_table(table, root / "baseline.parquet")
    elapsed = time.perf_counter() - started
    return total / elapsed, (root / "baseline.parquet").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2_000_000)
    args = parser.parse_args()
    columns = cartpole_columns(200_000)
    total = args.steps
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        base_rate, base_bytes = baseline(columns, total, Path(tmp))
        ack_10k, commit_10k, size = durable_rate(columns, total, 10_000, Path(tmp) / "w10k")
        ack_1k, commit_1k, _ = durable_rate(columns, total // 4, 1_000, Path(tmp) / "w1k")
    bytes_per_step = size / total
    print(f"baseline pyarrow write_table, defaults, not durable: {base_rate:,.0f} steps/s, "
          f"{base_bytes / total:.1f} bytes/step")  # fmt: skip
    for label, ack, commit in (("10k", ack_10k, commit_10k), ("1k", ack_1k, commit_1k)):
        print(f"{label}-step appends: {ack:,.0f} acknowledged durable steps/s "
              f"({ack / base_rate:.2f}x baseline); {commit:,.0f} steps/s committed")  # fmt: skip
    ratio = bytes_per_step / (base_bytes / total)
    print(f"on disk: {bytes_per_step:.1f} bytes/step ({ratio:.2f}x baseline)")
    report(
        {
            "durable_steps_per_s_10k": ack_10k,
            "durable_steps_per_s_1k": ack_1k,
            "committed_steps_per_s_10k": commit_10k,
            "committed_steps_per_s_1k": commit_1k,
            "bytes_per_step": bytes_per_step,
            "baseline_steps_per_s": base_rate,
            "baseline_bytes_per_step": base_bytes / total,
            "durable_10k_vs_baseline": ack_10k / base_rate,
        }
    )


if __name__ == "__main__":
    main()
