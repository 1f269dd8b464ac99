"""The `t5nb` command: the same code the notebooks call, from a shell.

`train` runs a recipe file (`t5nb.recipe`), on one host or, started on each, on several.
`eval` and `infer` run built-in tasks, tasks a module of yours registers (`--task-module`) or
a task from a data file described in flags (`--task-file`, `--task-fields`, ...).

A mistake in what it is given (an argument, file, directory, task or checkpoint) is answered
in one line, exit status 2 for arguments and 1 for the rest; `--debug` (or `T5NB_DEBUG=1`)
shows the traceback instead. Any other exception is a bug and shows its traceback.
"""
import argparse
import importlib
import importlib.util
import logging
import math
import os
import pathlib
import sys
import warnings

import t5nb
from t5nb.host import tune_host

# what a person causes by what they give t5nb (t5nb's own errors, TaskNameError, TaskDataError,
# CheckpointError, are ValueErrors), and what the machine does to a run: a full disk, a file it
# may not write (OSError; checkpoints.SaveFailed says which checkpoint and what is kept)
EXPECTED_ERRORS = (ValueError, OSError, FloatingPointError)


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
# what `--task-file` passes on to `t5nb.tasks.register_task`, without the `task_`
TASK_FILE_OPTIONS = ("task_fields", "task_metric", "task_vocabulary", "task_prefix", "task_split_ratio")


def _fields(text: str) -> dict:
    """An argparse `type`: `inputs=question,targets=answer` -> `{"inputs": "question", "targets": "answer"}`."""
    pairs = [pair.partition("=") for pair in text.split(",")]
    if not all(feature.strip() and equals and column for feature, equals, column in pairs):
        raise argparse.ArgumentTypeError(f"must be FEATURE=COLUMN pairs joined by commas, e.g. "
                                         f"inputs=question,targets=answer; got {text!r}")
    return {feature.strip(): column for feature, _, column in pairs}


def add_task_options(command) -> None:
    """`--task-module` and `--task-file` (with the options that describe its task) on `command`."""
    own = command.add_argument_group(
        "tasks of your own", "register tasks before running: import a module of yours, or describe the --task "
        "in a data file (t5nb.tasks.register_task)")
    own.add_argument("--task-module", action="append", metavar="MODULE",
                     help="import MODULE, which registers tasks: a .py file or a dotted module name (found in the "
                          "current directory or on PYTHONPATH), as T5X's --gin.MIXTURE_OR_TASK_MODULE; repeatable")
    own.add_argument("--task-file", metavar="PATH",
                     help="register the --task (with several, the last) from this TSV, CSV, JSON (an array of "
                          "objects), JSONL or text file; eval reads the whole file as its --split unless "
                          "--task-split-ratio carves train and validation out of it. Several accepted answers: a "
                          "JSON list of strings as the target (in CSV/TSV, a cell holding one)")
    own.add_argument("--task-fields", type=_fields, metavar="FEATURE=COLUMN,...",
                     help="the file's column or JSON key of each feature: inputs=...,targets=...[,answers=...] "
                          "(not for text files)")
    own.add_argument("--task-metric", metavar="METRIC",
                     help="squad (EM/F1 over every accepted answer), accuracy or bleu (default: none)")
    own.add_argument("--task-vocabulary", metavar="VOCABULARY",
                     help="facts (default), byte, t5 or a SentencePiece model path")
    own.add_argument("--task-prefix", metavar="TEXT", help='text put before every input, e.g. "question: "')
    own.add_argument("--task-split-ratio", type=FINITE, metavar="SHARE",
                     help="the share of the file's examples for train (e.g. 0.9), the rest validation")
    command.set_defaults(command_parser=command)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="t5nb", description=__doc__.splitlines()[0])
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", help="show the traceback of an error (or T5NB_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", required=True)
    course = commands.add_parser("course", parents=[debug], help="execute the notebooks headless into --out")
    course.add_argument("--out", default="runs", help="folder for executed notebooks and logs")
    course.add_argument("--profile", help="ci, cpu, accelerator, fp32-gpu or rehearsal (default: detected)")
    course.add_argument("--fresh", action="store_true", help="delete the profile's earlier runs in --out first")
    course.add_argument("notebooks", nargs="*", help="only these notebooks (e.g. 00_setup)")
    commands.add_parser("info", parents=[debug], help="print versions, devices and the profile")
    training = commands.add_parser(
        "train", parents=[debug], help="train as a recipe file says (TOML, see t5nb.recipe and recipes/), resuming "
        "its run directory; the resolved recipe is printed and written there as recipe.toml")
    training.add_argument("recipe", help="a recipe file, e.g. recipes/course/pretraining.toml or a run's recipe.toml")
    training.add_argument("--set", action="append", default=[], dest="overrides", metavar="SECTION.KEY=VALUE",
                          help="change one key, e.g. --set run.steps=2000 --set model.remat_policy=full "
                               "(a TOML value; a bare word is a string, none unsets); repeatable")
    training.add_argument("--dry-run", action="store_true", help="print the resolved recipe, train nothing")
    training.add_argument("--task-module", action="append", metavar="MODULE",
                          help="import MODULE first, which registers the recipe's task: a .py file or a dotted "
                               "module name; repeatable")
    hosts = training.add_argument_group(
        "several hosts", "run the same command on every host (jax.distributed): each process trains on its rows of "
        "every global batch, process 0 writes the logs and the recipe, all write the checkpoints together")
    hosts.add_argument("--distributed", action="store_true",
                       help="join a multi-host job that JAX detects (TPU pod slices, SLURM, Open MPI, Kubernetes)")
    hosts.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address, elsewhere; with "
                       "--num-processes and --process-id")
    hosts.add_argument("--num-processes", type=POSITIVE, metavar="N")
    hosts.add_argument("--process-id", type=STEP, metavar="I", help="this process's index, 0 to N-1")
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
        add_task_options(command)
    return parser


def check_task_options(args) -> None:
    """An argument error for the options that describe a --task-file's task without one."""
    given = [option for option in TASK_FILE_OPTIONS if getattr(args, option, None) is not None]
    if given and not args.task_file:
        flags = ", ".join("--" + option.replace("_", "-") for option in given)
        args.command_parser.error(f"{flags}: only with --task-file, whose task they describe")


def import_task_module(module: str) -> None:
    """Import a module that registers tasks: a `.py` file, or a dotted name found in the current
    directory or on the Python path."""
    path = pathlib.Path(module)
    if path.suffix == ".py":
        if not path.is_file():
            raise FileNotFoundError(f"--task-module {module}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
        return
    if os.getcwd() not in sys.path:  # the `t5nb` script's sys.path starts at its own folder
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or not f"{module}.".startswith(f"{error.name}."):
            raise  # the module itself imports something missing: its traceback says what
        raise FileNotFoundError(f"--task-module {module}: no module named {error.name!r} in the current "
                                "directory or on PYTHONPATH (or give a .py file)") from None


def register_command_line_tasks(args) -> None:
    """Import every --task-module, register the --task-file's task (named by the last --task),
    then, if a --task names it, the task the run trained on from its recipe's data files."""
    from t5nb.recipe import register_run_task  # the command loads JAX and TensorFlow only for the handler it runs
    from t5nb.tasks import register_task

    for module in args.task_module or ():
        import_task_module(module)
    names = args.task if isinstance(args.task, list) else [args.task]
    if args.task_file:
        options = {option.removeprefix("task_"): getattr(args, option) for option in TASK_FILE_OPTIONS
                   if getattr(args, option) is not None}
        split = getattr(args, "split", None)  # eval's: the file is that split unless a ratio carves two
        files = args.task_file if split is None or args.task_split_ratio is not None else {split: args.task_file}
        register_task(names[-1], files, **options)
    register_run_task(args.model_dir, names)


def run_eval_or_infer(args) -> int:
    """`t5nb eval` (checkpoints scored on a task's split) and `t5nb infer` (a file's inputs answered)."""
    from t5nb import evaluate  # the command loads JAX and TensorFlow only for the handler it runs
    from t5nb.checkpoints import checkpoint_config
    from t5nb.restore import load_model
    from t5nb.tasks import check_vocabulary

    register_command_line_tasks(args)
    decoding = dict(method="beam", num_decodes=args.beams, alpha=args.alpha) if args.beams > 1 else {}
    if args.command == "eval":
        table = evaluate.evaluate_checkpoints(
            args.model_dir, args.task, steps=args.step, split=args.split, max_examples=args.max_examples,
            feature_lengths={"inputs": args.inputs_length, "targets": args.targets_length},
            batch_size=args.batch_size, **decoding)
        print(table.to_string())
        return 0
    check_vocabulary(checkpoint_config(args.model_dir).vocab_size, args.task)
    texts = evaluate.read_inputs(args.input)  # a bad model directory, task or input file fails before loading
    model, step = load_model(args.model_dir, args.step)
    rows = evaluate.infer_file(model, args.task, texts, args.output, input_length=args.inputs_length,
                               max_decode_length=args.targets_length, batch_size=args.batch_size, **decoding)
    print(f"{len(rows)} predictions of step {step} written to {args.output}")
    return 0


def start_distributed(args) -> None:
    """Join the multi-host job the arguments describe (before JAX starts), if any."""
    given = [args.coordinator, args.num_processes, args.process_id]
    if any(value is None for value in given) and not all(value is None for value in given):
        raise ValueError("--coordinator, --num-processes and --process-id go together")
    if args.process_id is not None and args.process_id >= args.num_processes:
        raise ValueError(f"--process-id {args.process_id}: must be below --num-processes {args.num_processes}")
    from t5nb.mesh import initialize_distributed  # the command loads JAX and TensorFlow only for the handler it runs

    initialize_distributed(args.coordinator, args.num_processes, args.process_id, detect=args.distributed)


def run_train(args) -> int:
    """`t5nb train`: the recipe file with its --set changes, resolved, printed, then run."""
    start_distributed(args)
    import jax  # the command loads JAX and TensorFlow only for the handler it runs

    from t5nb.recipe import load_recipe  # the command loads JAX and TensorFlow only for the handler it runs
    from t5nb.mesh import describe_mesh
    from t5nb.train import run_recipe

    for module in args.task_module or ():
        import_task_module(module)
    recipe = load_recipe(args.recipe).with_overrides(args.overrides).resolved()
    if jax.process_index() == 0:
        print(recipe.to_toml(), flush=True)
        print(f"# {describe_mesh(recipe.make_mesh())}", flush=True)  # a comment: the output stays TOML
    if args.dry_run:
        return 0
    _, result = run_recipe(recipe)
    last = result.history[-1] if result.history else {}
    if jax.process_index() == 0:
        print(f"{result.model_dir}: step {recipe.run.steps}" +
              (f", loss {last['loss']:.4f}, accuracy {last['accuracy']:.4f}" if last else ""))
    return 0


def run(args) -> int:
    """Run the parsed command; its exit status."""
    if getattr(args, "profile", None):
        os.environ["T5NB_PROFILE"] = args.profile  # the notebook kernels inherit it
    if args.command == "course":
        from t5nb.course import run_course  # the command loads JAX and TensorFlow only for the handler it runs

        results = run_course(args.out, args.notebooks, fresh=args.fresh)
        return 0 if all(r["ok"] for r in results.values()) else 1
    if args.command in ("eval", "infer"):
        return run_eval_or_infer(args)
    if args.command == "train":
        return run_train(args)
    t5nb.report(t5nb.get_profile())
    return 0


def _without_closed_event_loops(unraisablehook):
    def hook(unraisable):
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            unraisablehook(unraisable)

    return hook


def main(argv=None) -> int:
    tune_host()  # first, before JAX starts its threads (see t5nb.host)
    try:
        args = build_parser().parse_args(argv)
        check_task_options(args)
    except SystemExit as exit:  # --help, or an argument error, already printed
        return exit.code
    from t5nb.system import keep_compiled_programs  # JAX, loaded once the arguments are read

    keep_compiled_programs()  # a later command, or a notebook, loads what this one compiles
    prog = f"t5nb {args.command}"
    if args.debug or os.environ.get("T5NB_DEBUG", "") not in ("", "0"):
        return run(args)
    # orbax logs a failed save's traceback from its threads, and its event loops, closed by then,
    # print one for each write still pending: checkpoints.SaveFailed says what happened, in a line
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    sys.unraisablehook = _without_closed_event_loops(sys.unraisablehook)
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_: print(f"{prog}: warning: {message}", file=sys.stderr)
        try:
            return run(args)
        except EXPECTED_ERRORS as error:
            print(f"{prog}: error: {' '.join(str(error).split()) or type(error).__name__}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
