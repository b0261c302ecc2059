"""Data-parallel training benchmark: BC updates and samples per second on 1 and 2 gloo ranks
(one torch thread each) and on 2 Ray Train workers, through ``rlpipe train`` itself.

Each configuration trains BC on ``datasets/cartpole-expert`` (25,000 rows; 4,096 rows per rank
per update) for ``3 * --updates`` updates, publishing and evaluating every ``--updates``; the
rate is taken between publications (rank 0's ``metrics.jsonl``), the best of the two intervals,
so process start-up, Ray's scheduling and the data read are left out, and each interval holds one
checkpoint, one state save and one evaluation episode. Samples per second are updates per second
times the effective batch size (rows per rank times ranks).

Keys: ``ddp2_vs_1_samples_per_s`` (bar >= 1.4: two ranks on two cores against one) and
``ray2_vs_ddp2_samples_per_s`` (bar >= 0.7: Ray's overhead against plain DDP). On a machine shared
with other work the figures are noisy; ``machine_speed_s`` says how loaded it was, and
``parallel_headroom_before``/``_after`` how much two processes could gain over one at all (2.0
on two idle cores), measured before and after the runs.
Run: ``python bench/distributed.py [--updates N] [--no-ray]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_speed, report

from pipeline.commands.cli import main as rlpipe

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one torch thread per rank, the single one too
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "datasets" / "cartpole-expert"
# rows per rank per update (--batch-size): data parallelism pays where a rank's compute outweighs
# the all-reduce that joins every step. BC's network has 4,610 gradients; at 256 rows an update
# is ~1 ms and two ranks spend it waiting on each other (0.72x on two idle cores), at 4,096 rows
# they gain 1.47x (docs/distributed.md, "Figures")
BATCH = 4096


def rate(
    run_dir: Path, workers: int, updates: int, batch: int, ray: bool = False
) -> tuple[float, float]:
    """Updates and samples per second of one configuration."""
    argv = ["train", "bc", "--data", str(DATA), "--run-dir", str(run_dir), "--batch-size",
            str(batch), "--max-updates", str(3 * updates), "--eval-every", str(updates),
            "--eval-episodes", "1", "--workers", str(workers)]  # fmt: skip
    if rlpipe([*argv, "--ray"] if ray else argv) != 0:
        raise SystemExit(f"rlpipe train failed: {argv}")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seconds = min(b["seconds"] - a["seconds"] for a, b in itertools.pairwise(lines))
    per_s = updates / seconds
    return per_s, per_s * batch * workers


def _probe(out: Any) -> None:
    out.put(machine_speed())


def parallel_headroom() -> float:
    """How much faster two processes get work done than one, right now: 2 x the probe's time
    alone over its time with two running at once. 2.0 on two idle cores; on a machine whose other
    jobs hold a core, near 1.0, and no count of ranks can beat it."""
    context = multiprocessing.get_context("spawn")
    out = context.SimpleQueue()
    alone = machine_speed()
    probes = [context.Process(target=_probe, args=(out,)) for _ in range(2)]
    for probe in probes:
        probe.start()
    for probe in probes:
        probe.join()
    together = max(out.get() for _ in probes)
    return 2 * alone / together


def start_ray() -> object:
    import ray
    import ray.data

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="ray.data.context")
        ray.data.DataContext.get_current()
    return ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=300, help="updates per measured interval")
    parser.add_argument("--batch-size", type=int, default=BATCH, help="rows per rank per update")
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray workers")
    args = parser.parse_args()
    speed = machine_speed()
    figures: dict[str, float | None] = {"machine_speed_s": speed}
    figures["parallel_headroom_before"] = parallel_headroom()
    with tempfile.TemporaryDirectory() as tmp:
        for name, workers in (("ddp1", 1), ("ddp2", 2)):
            updates, samples = rate(Path(tmp) / name, workers, args.updates, args.batch_size)
            figures |= {f"{name}_updates_per_s": updates, f"{name}_samples_per_s": samples}
        if not args.no_ray:
            ray = start_ray()
            try:
                updates, samples = rate(
                    Path(tmp) / "ray2", 2, args.updates, args.batch_size, ray=True
                )
            finally:
                ray.shutdown()  # type: ignore[attr-defined]
            figures |= {"ray2_updates_per_s": updates, "ray2_samples_per_s": samples}
    figures["parallel_headroom_after"] = parallel_headroom()
    figures["ddp2_vs_1_samples_per_s"] = (
        figures["ddp2_samples_per_s"] / figures["ddp1_samples_per_s"]
    )  # type: ignore[operator]
    ray2 = figures.get("ray2_samples_per_s")
    figures["ray2_vs_ddp2_samples_per_s"] = (
        None if ray2 is None else ray2 / figures["ddp2_samples_per_s"]
    )  # type: ignore[operator]
    for key, value in figures.items():
        print(f"{key}: {value if value is None else f'{value:,.3f}'}", file=sys.stderr)
    report(figures)


if __name__ == "__main__":
    main()
