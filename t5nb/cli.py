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
    args = parser.parse_args(argv)

    if getattr(args, "profile", None):
        os.environ["T5NB_PROFILE"] = args.profile  # the notebook kernels inherit it
    if args.command == "course":
        from t5nb.course import run_course

        results = run_course(args.out, args.notebooks, fresh=args.fresh)
        return 0 if all(r["ok"] for r in results.values()) else 1
    import t5nb

    t5nb.report(t5nb.get_profile())
    return 0


if __name__ == "__main__":
    sys.exit(main())
