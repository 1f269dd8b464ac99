"""The `t5nb` command: the same code the notebooks call, from a shell.

A mistake in what it is given (an argument, file, directory, task or checkpoint) is answered
in one line, exit status 2 for arguments and 1 for the rest; `--debug` (or `T5NB_DEBUG=1`)
shows the traceback instead. Any other exception is a bug and shows its traceback.
"""
import argparse
import math
import os
import sys
import warnings

# what a person causes by what they give t5nb; t5nb's own errors (TaskNameError, TaskDataError,
# CheckpointError) are ValueErrors
EXPECTED_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FloatingPointError)


class _Parser(argparse.ArgumentParser):
    """argparse, with an argument error in one line (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind, least, expected: str):
    """An argparse `type`: a finite `kind` (int or float) of at least `least`."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < least:
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value

    return parse


POSITIVE = _number(int, 1, "a positive whole number")
STEP = _number(int, 0, "a checkpoint step (0 or more)")
FINITE = _number(float, -math.inf, "a finite number")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="t5nb", description=__doc__.splitlines()[0])
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", help="show the traceback of an error (or T5NB_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", required=True)
    course = commands.add_parser("course", parents=[debug], help="execute the notebooks headless into --out")
    course.add_argument("--out", default="runs", help="folder for executed notebooks and logs")
    course.add_argument("--profile", help="ci, cpu or accelerator (default: detected)")
    course.add_argument("--fresh", action="store_true", help="delete the profile's earlier runs in --out first")
    course.add_argument("notebooks", nargs="*", help="only these notebooks (e.g. 00_setup)")
    commands.add_parser("info", parents=[debug], help="print versions, devices and the profile")
    evaluation = commands.add_parser("eval", parents=[debug], help="decode and score tasks at a run's checkpoints "
                                     "(or a Hugging Face directory), without training; print the results table")
    evaluation.add_argument("--task", action="append", required=True, help="task name (repeat for several)")
    evaluation.add_argument("--step", type=STEP, action="append", help="only this checkpoint step (default: all)")
    evaluation.add_argument("--split", default="validation")
    evaluation.add_argument("--max-examples", type=POSITIVE, help="only the first N examples of the split")
    inference = commands.add_parser("infer", parents=[debug],
                                    help="predict for every input of a file (text lines or JSONL) as JSONL")
    inference.add_argument("--task", required=True, help="the task whose prefix, vocabulary and postprocessor apply")
    inference.add_argument("--step", type=STEP, help="checkpoint step (default: the latest)")
    inference.add_argument("--input", required=True)
    inference.add_argument("--output", required=True)
    for command in (evaluation, inference):
        command.add_argument("model_dir", help="a training run's directory or a Hugging Face model directory")
        command.add_argument("--inputs-length", type=POSITIVE, default=128)
        command.add_argument("--targets-length", type=POSITIVE, default=32, help="also the maximum decode length")
        command.add_argument("--batch-size", type=POSITIVE, default=8)
        command.add_argument("--beams", type=POSITIVE, default=1, help="beam search with this many beams (1: greedy)")
        command.add_argument("--alpha", type=FINITE, default=0.6, help="beam search length penalty")
    return parser


def run(args) -> int:
    """Run the parsed command; its exit status."""
    if getattr(args, "profile", None):
        os.environ["T5NB_PROFILE"] = args.profile  # the notebook kernels inherit it
    if args.command == "course":
        from t5nb.course import run_course

        results = run_course(args.out, args.notebooks, fresh=args.fresh)
        return 0 if all(r["ok"] for r in results.values()) else 1
    if args.command in ("eval", "infer"):
        from t5nb.evaluate import run_command

        return run_command(args)
    import t5nb

    t5nb.report(t5nb.get_profile())
    return 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit:  # --help, or an argument error, already printed
        return exit.code
    prog = f"t5nb {args.command}"
    if args.debug or os.environ.get("T5NB_DEBUG", "") not in ("", "0"):
        return run(args)
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_: print(f"{prog}: warning: {message}", file=sys.stderr)
        try:
            return run(args)
        except EXPECTED_ERRORS as error:
            print(f"{prog}: error: {' '.join(str(error).split()) or type(error).__name__}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
