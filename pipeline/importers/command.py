"""``rlpipe import FORMAT SRC DIR [--env ENV_ID]``: a recording from elsewhere, as a new dataset."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline.commands.storage_options import add_storage_options, storage_options
from pipeline.errors import ConfigError, RlpipeWarning

if TYPE_CHECKING:
    from pipeline.importers.transitions import SourceSteps

FORMATS = ("rllib-json", "rllib-jsonl", "rllib-parquet", "minari", "d4rl", "table", "rlpipe-v1")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import",
        help="import RLlib, Minari, D4RL, table or rlpipe format-1 data into a new dataset",
        description=(
            "Import a recording into a new rlpipe dataset. Integers (episode keys, seeds up to "
            "2**64 - 1) are kept exact, never passed through float64. FORMAT is one of: minari (a "
            "Minari dataset directory, its data/ or its main_data.hdf5: Minari 0.5's hdf5, arrow "
            "and parquet backends, and older hdf5 datasets; Box, Discrete, MultiDiscrete, "
            "MultiBinary, Dict and Tuple spaces at any depth; the env id, spaces and time limit "
            "from Minari's metadata, each episode's seed and reset options, and step infos; Text "
            "spaces are refused); rllib-json (old SampleBatch JSON lines; a file, a directory, a "
            "glob pattern such as 'DIR/*.json' as RLlib's JsonReader takes, or a zip; multi-agent "
            "batches are refused), rllib-jsonl and rllib-parquet (Ray Data output directories), "
            "d4rl (an HDF5 file with observations, actions, rewards, terminals, timeouts), table "
            "(CSV or Parquet with the step table's column names, plus seed, reset_options and "
            "info; a float seed column is refused), rlpipe-v1 (an rlpipe dataset of format version"
            " 1, converted into today's format with its rows, spaces and checkpoints). Every file "
            "of a source must hold the same columns. Without --env, spaces come from the source "
            "(Minari's metadata) or are inferred from the data."
        ),
    )
    parser.add_argument("format", choices=FORMATS, metavar="FORMAT", help=", ".join(FORMATS))
    parser.add_argument(
        "src",
        metavar="SRC",
        nargs="+",  # so a pattern the shell expanded gets a word on quoting, not a usage error
        help="the file, directory or glob pattern to import (rllib-*, table; quote a pattern, "
        "'DIR/*.json', so the shell leaves it to rlpipe)",
    )
    parser.add_argument("dir", metavar="DIR", help="the new dataset: a local path or a URI")
    parser.add_argument(
        "--env",
        dest="env_id",
        default=None,
        help="gymnasium env id: gives the spaces, the time limit, and lets replay rebuild the env "
        "(for minari: overrides the env the dataset names)",
    )
    parser.add_argument(
        "--max-episode-steps",
        type=int,
        default=None,
        help="the time limit the data was recorded under, when it is not the env's registered one "
        "(an episode ending with `done` at this length is truncated, not terminated)",
    )
    parser.add_argument(
        "--actions-normalized",
        action="store_true",
        help="the source logged Box actions scaled to [-1, 1] (RLlib's "
        "actions_in_input_normalized, as in its recorded Pendulum data): store them in the "
        "action space's units",
    )
    add_storage_options(parser)
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    from pipeline.dataset.location import locate
    from pipeline.importers.transitions import write_dataset

    options = storage_options("import", args.storage_option)
    destination = locate(args.dir, options)
    if args.max_episode_steps is not None and args.max_episode_steps < 1:
        raise ConfigError("import", "max_episode_steps", "an integer >= 1", args.max_episode_steps)
    if len(args.src) > 1:
        shown = " ".join(args.src[:3]) + (" ..." if len(args.src) > 3 else "")
        expected = "one file, directory or glob pattern (quote a pattern, 'DIR/*.json', or the "
        raise ConfigError("import", "src", expected + "shell expands it)", shown)
    if args.format == "rlpipe-v1":
        from pipeline.importers.rlpipe_v1 import convert

        print(convert(args.src[0], args.dir, options).describe())
        return 0
    if args.format == "minari":
        steps, env_id, limit, spaces = _minari(args)
    else:
        steps = _readers()[args.format](args.src[0])
        env_id, limit, spaces = args.env_id, args.max_episode_steps, (None, None)
    summary = write_dataset(
        steps,
        destination,
        env_id=env_id,
        max_episode_steps=limit,
        observation_space=spaces[0],
        action_space=spaces[1],
        actions_normalized=args.actions_normalized,
    )
    print(summary.describe())
    return 0


def _minari(args: argparse.Namespace) -> tuple[SourceSteps, str | None, int | None, Any]:
    """Minari's metadata gives the env id, spaces and time limit; ``--env`` and
    ``--max-episode-steps`` override them."""
    from pipeline.importers.minari import read_minari
    from pipeline.importers.transitions import infer_spaces

    source = read_minari(args.src[0])
    if source.env_kwargs and args.env_id is None:
        warnings.warn(
            f"the dataset's env {source.env_id} was made with {source.env_kwargs}, which an "
            "rlpipe dataset does not keep: rlpipe replay makes the env with its registered "
            "defaults, and may diverge",
            RlpipeWarning,
            stacklevel=2,
        )
    spaces: Any = (None, None)
    if args.env_id is None:  # an env the dataset names may not be installed here: keep its id
        spaces = (source.observation_space, source.action_space)
        if spaces[0] is None or spaces[1] is None:
            spaces = infer_spaces(source.steps)
    limit = args.max_episode_steps or source.max_episode_steps
    return source.steps, args.env_id or source.env_id, limit, spaces


def _readers() -> dict[str, Callable[[str], SourceSteps]]:
    from pipeline.importers import d4rl, rllib, table

    return {
        "rllib-json": rllib.read_sample_batches,
        "rllib-jsonl": lambda src: rllib.read_ray_data(src, "json"),
        "rllib-parquet": lambda src: rllib.read_ray_data(src, "parquet"),
        "d4rl": d4rl.read_d4rl,
        "table": table.read_table,
    }
