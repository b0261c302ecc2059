"""``rlpipe export minari DIR OUT [--dataset-id NAME] [--format hdf5|arrow|parquet]``."""

from __future__ import annotations

import argparse

from pipeline.commands.storage_options import add_storage_options, storage_options

TARGETS = ("minari",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a dataset in another tool's format (minari)",
        description=(
            "Write the dataset at DIR as a Minari dataset under OUT, a Minari datasets root (what "
            "MINARI_DATASETS_PATH names): OUT/<dataset id>/data/..., readable by "
            "minari.load_dataset(ID) with MINARI_DATASETS_PATH=OUT, and so by d3rlpy and TorchRL. "
            "Every episode's steps, seed and reset options are written; step infos are not "
            "(Minari wants the reset's info, which rlpipe does not keep), and a dataset with "
            "several agents is refused. Needs Minari (pip install minari)."
        ),
    )
    parser.add_argument("target", choices=TARGETS, metavar="TARGET", help=", ".join(TARGETS))
    parser.add_argument("dir", metavar="DIR", help="the rlpipe dataset: a local path or a URI")
    parser.add_argument("out", metavar="OUT", help="the Minari datasets root to write into")
    parser.add_argument(
        "--dataset-id",
        default=None,
        help="Minari's id, (namespace/)(env_name/)name-vN (default: rlpipe/<DIR's name>-v0)",
    )
    parser.add_argument(
        "--format",
        dest="data_format",
        choices=("hdf5", "arrow", "parquet"),
        default="hdf5",
        help="Minari's storage backend (default hdf5)",
    )
    add_storage_options(parser)
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    from pipeline.dataset.location import locate
    from pipeline.exporters.minari import export_minari

    source = locate(args.dir, storage_options("export", args.storage_option))
    print(export_minari(source, args.out, args.dataset_id, args.data_format).describe())
    return 0
