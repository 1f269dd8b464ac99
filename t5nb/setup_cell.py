"""The notebooks' setup cell: the profile it chooses, and what the notebook runs here and for how long.

Colab and Kaggle open each notebook in a runtime of its own, which starts with no runs. So the
setup cell's output, a notebook's first, says how long the notebook takes as things are (notebook
02's run found or not, `profiles.course_minutes`) and, for 03-06, what it runs before its lesson:
02's run, or what it uses where there is none (`workflow.instead_of_pretraining`).
"""
import os

import jax

from t5nb import profiles
from t5nb.profiles import Profile, course_minutes, get_profile, said_minutes
from t5nb.system import cpu_description, keep_compiled_programs, record_headline

# The notebooks that fine-tune notebook 02's run (`workflow.pretrained_checkpoint`); 06 does where
# one of its pretrainings is 02's (`capacity.reuses_notebook_02s_run`).
FINE_TUNE_02S_RUN = ("03_finetuning", "04_closed_book_qa", "05_evaluation")
LATER_NOTEBOOKS = (*FINE_TUNE_02S_RUN, "06_knowledge_capacity")


def choose_profile(name: str = "detected", notebook: str | None = None) -> Profile:
    """The setup cell's profile: `detected` keeps `T5NB_PROFILE` or detection; another of
    `PROFILES` is set as `T5NB_PROFILE` for this kernel and what it starts. Keeps the programs
    this kernel compiles for the next (`system.keep_compiled_programs`), and prints what the
    profile runs, how long `notebook` (e.g. "02_pretraining") and the whole course take here
    (`course_minutes`) and, for 03-06, what the notebook runs before its lesson (`before_the_lesson`).
    Under `t5nb course` with the `cpu` profile on a CPU, records the CPU (`system.cpu_description`)
    and its float32 matmul speed in the notebook's headline, for scripts/course_table.py."""
    compiled = keep_compiled_programs()
    name = name.strip().lower()
    if name != "detected":
        get_profile(name)  # an unknown name is refused, naming the choices
        os.environ["T5NB_PROFILE"] = name
    profile = get_profile()
    print(f"Profile {profile.name}: {profile.description}\n"
          f"  {profile.model} ({profile.vocabulary} vocabulary); 02 pretrains on {profile.pretrain_task} for "
          f"{profile.pretrain_steps:,} steps; 03 fine-tunes on {profile.finetune_task}, 04 on {profile.qa_task}, "
          f"{profile.finetune_steps:,} steps each")
    if profile.name == "cpu" and jax.devices()[0].platform == "cpu" and os.environ.get("T5NB_NOTEBOOK"):
        # under `t5nb course`: the CPU its times are kept under (docs/course_times.json), and its matmul speed
        record_headline(cpu=cpu_description(), matmul_gflops=round(profiles.cpu_matmul_flops() / 1e9, 1))
    before = before_the_lesson(profile, notebook) if notebook in LATER_NOTEBOOKS else None
    found = before is not None and before[0]
    minutes = course_minutes(profile.name, with_02s_run=found)
    if minutes is None:
        print(f"  no time measured or estimated for this profile on {jax.devices()[0].device_kind}")
    else:
        per_notebook, source = minutes
        if notebook in per_notebook:
            premise = (" (notebook 02's run found)" if found else " (notebook 02's run not found)") if before else ""
            print(f"  this notebook, {notebook}: {said_minutes(per_notebook[notebook])} on "
                  f"{jax.devices()[0].device_kind}, its first run{premise}")
        course = tuple(sum(ends) for ends in zip(*per_notebook.values()))
        print(f"  the course in {said_minutes(course)} ("
              + ", ".join(f"{key[:2]}: {said_minutes(ends, about='')}" for key, ends in per_notebook.items())
              + f"), {source}")
    if before:
        print(f"  before its lesson: {before[1]}")
    print(f"  compiled programs are kept in {compiled}: the next notebook loads them instead of compiling")
    return profile


def before_the_lesson(profile: Profile, notebook: str) -> tuple[bool, str]:
    """(whether notebook 02's finished run is here, what `notebook` (03-06) runs before its
    lesson, said to a learner)."""
    from t5nb import capacity, workflow  # 03-06 only: they read tasks, which imports TensorFlow (10 s)

    found = workflow.pretraining_finished(profile)
    if notebook not in FINE_TUNE_02S_RUN and not capacity.reuses_notebook_02s_run(profile):
        return found, "nothing: this notebook trains every model it uses"
    if found:
        return found, (f"nothing: notebook 02's pretraining run is in {workflow.pretraining_dir(profile)}, and this "
                       "notebook starts from it")
    return found, workflow.instead_of_pretraining(profile)
