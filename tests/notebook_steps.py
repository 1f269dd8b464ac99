"""Each notebook, run alone in a runs folder of its own, trains no more steps than the estimate counts.

    python tests/notebook_steps.py RUNS PROFILE [NOTEBOOK ...]

RUNS holds one folder per notebook (`RUNS/03_finetuning`, ...), each the runs folder of that
notebook run alone, as Colab and Kaggle open it (the rehearsal, `tests/rehearse.sh`). A run's
steps are its last checkpoint's (every run of 03-06 starts at step 0 and keeps its last); the
notebook's sum is held to `accelerator_estimates.course(profile)`'s count of its train steps, the
same count the estimate's tables and its 15-minute bars read. Prints a line per notebook; exits 1 if a
notebook trained more.
"""
import json
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
LATER = ("03_finetuning", "04_closed_book_qa", "05_evaluation", "06_knowledge_capacity")


def trained_steps(runs: pathlib.Path) -> dict:
    """{run folder: its last checkpoint step} of every run under `runs` (a folder with a
    recipe.toml), and of each of 06's memorisations (a width's seeds trained together, one step
    of them all as the estimate counts it) the steps its `knowledge_bits.json` records."""
    from t5nb.checkpoints import checkpoint_steps  # after the caller's environment is set

    steps = {}
    for recipe in sorted(runs.rglob("recipe.toml")):
        kept = checkpoint_steps(recipe.parent)
        steps[str(recipe.parent.relative_to(runs))] = kept[-1] if kept else 0
    for memorised in sorted(runs.rglob("knowledge_bits.json")):
        steps[str(memorised.parent.relative_to(runs))] = json.loads(memorised.read_text())["row"]["steps"]
    return steps


def main(runs: pathlib.Path, profile_name: str, notebooks) -> int:
    sys.path.insert(0, str(BENCH))
    import accelerator_estimates  # bench/

    from t5nb.profiles import get_profile

    counted = accelerator_estimates.course(get_profile(profile_name))
    over = False
    for notebook in notebooks:
        steps = trained_steps(runs / notebook)
        limit = accelerator_estimates.train_steps(counted[notebook]["counts"])
        over |= sum(steps.values()) > limit
        print(f"{notebook} alone: trained {sum(steps.values())} steps in {len(steps)} runs "
              f"({', '.join(f'{name} {n}' for name, n in steps.items()) or 'none'}); the estimate counts {limit}"
              + ("  <- more than counted" if sum(steps.values()) > limit else ""))
    return int(over)


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:] or LATER))
