"""Command line: ``python -m icl_lens reproduce fig3 [--quick] [--device auto] [--seeds 0 1 2 3 4] [--out DIR]``."""

import argparse
import sys
import time

from icl_lens.reproduce import EXTRA, FIGURES, STUDIES, reproduce
from icl_lens.results import results_dir


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m icl_lens", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("reproduce", help="regenerate figures of the paper")
    command.add_argument("figures", nargs="+", choices=[*FIGURES, *EXTRA, *STUDIES, "all"], metavar="FIGURE",
                         help=f"one or more of {', '.join(FIGURES + EXTRA + STUDIES)}, or all (all but "
                              f"{', '.join(EXTRA + STUDIES)})")
    command.add_argument("--quick", action="store_true", help="small sizes (tests, CI)")
    command.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    command.add_argument("--seeds", type=int, nargs="+", help="seeds of the training runs (default 0 1 2 3 4)")
    command.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                         help="train through torch.compile (default: on in full mode, off with --quick)")
    command.add_argument("--workers", type=int,
                         help="processes that train the seeds (default 2 in full mode on the CPU, else 1)")
    command.add_argument("--reuse", action="store_true",
                         help="draw from the task_*.json records already in --out instead of training")
    command.add_argument("--out", help="output folder (default results/experiments[-quick])")
    args = parser.parse_args(argv)
    out = args.out or results_dir("experiments-quick" if args.quick else "experiments")
    start = time.perf_counter()
    try:
        written = reproduce(args.figures, out=out, quick=args.quick, device=args.device, seeds=args.seeds,
                            compile=args.compile, reuse=args.reuse, workers=args.workers)
    except ValueError as error:   # bad arguments (an unwritable --out, a missing GPU): a message, no traceback
        parser.error(str(error))
    for name, paths in written.items():
        print(f"{name}: {', '.join(str(p) for p in paths.values())}")
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
