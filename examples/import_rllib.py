"""Import one of RLlib's recordings into an rlpipe dataset and read it back.

    python examples/import_rllib.py                                   # RLlib's CartPole large.json
    python examples/import_rllib.py SRC --format rllib-parquet --out runs/imported

SRC defaults to ``../shared/anchor-data/rllib-test-data/cartpole/large.json`` (next to the
project); when that folder is absent the example says so and exits cleanly. A dataset already in
the output directory (default ``runs/import-rllib``) is replaced. From the shell the same import
is ``rlpipe import rllib-json SRC DIR --env CartPole-v1 --max-episode-steps 200``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from pipeline import InputReader
from pipeline.format import layout
from pipeline.importers import rllib
from pipeline.importers.transitions import SourceSteps, write_dataset

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = ROOT.parent / "shared" / "anchor-data" / "rllib-test-data"  # beside the project


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", type=Path, default=ANCHOR / "cartpole" / "large.json",
                        help="an RLlib recording (file or directory)")  # fmt: skip
    parser.add_argument("--format", default="rllib-json",
                        choices=["rllib-json", "rllib-jsonl", "rllib-parquet"])  # fmt: skip
    parser.add_argument("--env", default="CartPole-v1", help="the env the data was recorded in")
    # RLlib recorded its CartPole test data under the old 200-step limit: an episode cut there
    # was truncated, not terminated, whatever its `dones` column says.
    parser.add_argument("--max-episode-steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("runs/import-rllib"))
    return parser.parse_args()


def read(src: Path, file_format: str) -> SourceSteps:
    if file_format == "rllib-json":
        return rllib.read_sample_batches(src)  # the old SampleBatch JSON lines
    return rllib.read_ray_data(src, "json" if file_format == "rllib-jsonl" else "parquet")


def main() -> None:
    args = parse_args()
    if not args.src.exists():
        print(f"skipped: no RLlib recording at {args.src} (the anchor data is not here)")
        return
    if (args.out / layout.MANIFEST).exists():
        shutil.rmtree(args.out)  # an import never appends: replace the last run's dataset
    summary = write_dataset(read(args.src, args.format), args.out, env_id=args.env,
                            max_episode_steps=args.max_episode_steps)  # fmt: skip
    print(summary.describe())

    # Read it back the way a trainer does: whole episodes, ordered by t.
    episodes = list(InputReader(args.out, episodes=True))
    steps = sum(len(episode) for episode in episodes)
    mean = sum(float(episode.rewards.sum()) for episode in episodes) / len(episodes)
    print(f"InputReader: {len(episodes)} episodes, {steps} steps, mean return {mean:.2f}")


if __name__ == "__main__":
    main()
