"""The `t5nb` command: the same code the notebooks call, from a shell."""
import argparse
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="t5nb", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    course = commands.add_parser("course", help="execute the notebooks headless into --out")
    course.add_argument("--out", default="runs", help="folder for executed notebooks and logs")
    course.add_argument("--profile", help="ci, cpu or accelerator (default: detected)")
    course.add_argument("--fresh", action="store_true", help="delete the profile's earlier runs in --out first")
    course.add_argument("notebooks", nargs="*", help="only these notebooks (e.g. 00_setup)")
    commands.add_parser("info", help="print versions, devices and the profile")
    evaluation = commands.add_parser("eval", help="decode and score tasks at a run's checkpoints (or a Hugging "
                                     "Face directory), without training; print the results table")
    evaluation.add_argument("--task", action="append", required=True, help="task name (repeat for several)")
    evaluation.add_argument("--step", type=int, action="append", help="only this checkpoint step (default: all)")
    evaluation.add_argument("--split", default="validation")
    evaluation.add_argument("--max-examples", type=int, help="only the first N examples of the split")
    inference = commands.add_parser("infer", help="predict for every input of a file (text lines or JSONL) as JSONL")
    inference.add_argument("--task", required=True, help="the task whose prefix, vocabulary and postprocessor apply")
    inference.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    inference.add_argument("--input", required=True)
    inference.add_argument("--output", required=True)
    for command in (evaluation, inference):
        command.add_argument("model_dir", help="a training run's directory or a Hugging Face model directory")
        command.add_argument("--inputs-length", type=int, default=128)
        command.add_argument("--targets-length", type=int, default=32, help="also the maximum decode length")
        command.add_argument("--batch-size", type=int, default=8)
        command.add_argument("--beams", type=int, default=1, help="beam search with this many beams (1: greedy)")
        command.add_argument("--alpha", type=float, default=0.6, help="beam search length penalty")
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
