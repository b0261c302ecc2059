"""``rlpipe compact URI``: merge a dataset's small files, checkpoint its log, vacuum old files.

See :mod:`pipeline.dataset.upkeep`. Safe while servers write and trainers follow: the merged
files are committed as a rearrangement (``dataChange`` false), so followers read no row twice,
and the files it removes stay readable for the retention period.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from pipeline.commands.storage_options import add_storage_options, storage_options


def register(subparsers: argparse._SubParsersAction) -> None:
    from pipeline.dataset.upkeep import DEFAULT_RETENTION_HOURS

    parser = subparsers.add_parser(
        "compact",
        help="merge a dataset's small files, checkpoint its log and vacuum removed files",
        description="Merge a dataset's small files (Delta's OPTIMIZE), checkpoint its log and "
        "delete files removed longer ago than the retention. Safe while servers write and "
        "trainers follow: the merged files are committed as a rearrangement, so followers read "
        "no row twice, and removed files stay readable for the retention period. One upkeep runs "
        "at a time per dataset.",
    )
    parser.add_argument("uri", metavar="URI", help="the dataset: a local path or a URI")
    parser.add_argument(
        "--retention-hours",
        type=int,
        metavar="HOURS",
        default=DEFAULT_RETENTION_HOURS,
        help="vacuum files removed longer ago than this (default: %(default)s, Delta's 7 days); "
        "shorter than the table's own retention needs --force",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="vacuum with a retention shorter than the table's: a follower behind the "
        "compaction, or a reader pinned to an older version, may then find files gone",
    )
    parser.add_argument("--no-vacuum", action="store_true", help="compact and checkpoint only")
    parser.add_argument(
        "--target-mb",
        type=int,
        metavar="MB",
        help="size of the merged files (default: deltalake's, 100 MB)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    add_storage_options(parser)
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    from pipeline.dataset.location import locate
    from pipeline.dataset.upkeep import upkeep
    from pipeline.errors import ConfigError
    from pipeline.format.manifest import read_manifest

    if args.target_mb is not None and args.target_mb < 1:
        raise ConfigError("compact", "target_mb", "an integer >= 1", args.target_mb)
    location = locate(args.uri, storage_options("compact", args.storage_option))
    read_manifest(location)  # not a dataset: say so before touching anything
    done = upkeep(
        location,
        args.retention_hours,
        force=args.force,
        vacuum=not args.no_vacuum,
        target_bytes=None if args.target_mb is None else args.target_mb * 1_000_000,
    )
    if args.json:
        print(json.dumps({"uri": location.uri, "tables": [asdict(entry) for entry in done]}))
    else:
        for entry in done:
            print(entry.describe())
    if not done:
        print(f"{location.uri}: no table has a commit yet; nothing to do", file=sys.stderr)
    return 0
