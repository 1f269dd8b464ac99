"""Compile seconds of the accelerator course's programs, per notebook, as the notebooks compile them.

    .venv/bin/python bench/compile.py                  # the working tree
    .venv/bin/python bench/compile.py 414b92f HEAD     # those commits, side by side
    .venv/bin/python bench/compile.py --tables         # the tables of bench/results/compile.json
    PYTHONPATH=. python bench/compile.py --accelerator --out compile-gpu.json   # for this machine's GPU or TPU

For each accelerator profile (`accelerator` in bfloat16, `fp32-gpu` in float32) each notebook
runs in a fresh process, as each notebook is a fresh kernel, and builds the programs it builds
through t5nb's own calls, at the profile's real shapes, compiled for this CPU: the Trainer's
init, optimizer init, train and eval steps, checkpoint layout changes, and each decoding the
notebook runs (method, batch, lengths); with --accelerator, for JAX's default backend (a GPU's or
a TPU's compiler, on that machine). A program too large to run here (a train step) is
compiled from abstract inputs; the rest run once on random weights. A program's seconds are
what JAX reports of it: tracing and lowering, which every process does, and XLA's compile, or
its load from the persistent cache; never its run. Where the library keeps compiled programs
(`system.keep_compiled_programs`, what the course's setup cell calls) the notebooks share one
cache folder, in course order, then all run again with the warm cache, as a rerun would. Commits given run the same
programs with their own t5nb (a git worktree of each on PYTHONPATH; from 414b92f on, whose t5nb
has what bench/programs.py builds the trainers from). Not counted: the hand-built
train step of notebook 02's lesson. 06's programs are its models' on the facts world (each width's
pretraining, closed-book fine-tuning and decoding; each grid width's memorising and scoring).

Prints a table per profile; writes bench/results/compile.json (or --out) after each notebook, whose seconds (the last code
measured, its first run) bench/accelerator_estimates.py counts in each chip's course time.
"""
import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

BENCH = pathlib.Path(__file__).resolve().parent
REPO = BENCH.parent
PROFILES = {"accelerator": "bfloat16", "fp32-gpu": "float32"}
NOTEBOOKS = ("02_pretraining", "03_finetuning", "04_closed_book_qa", "05_evaluation", "06_knowledge_capacity")
# 06's models are built from the facts world's tasks, which need TensorFlow: --accelerator on a GPU
# machine without it measures 02-05
NEEDS_TASKS = ("06_knowledge_capacity",)
# what JAX reports of building a program: tracing it and lowering it to XLA (every process), its
# compile (XLA's, or the compiled program loaded from the persistent cache), and of that the load
EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace", "/jax/core/compile/jaxpr_to_mlir_module_duration": "trace",
          "/jax/core/compile/backend_compile_duration": "compile",
          "/jax/compilation_cache/cache_retrieval_time_sec": "load"}


# -- one notebook's programs, in a process of its own ---------------------------------------------
def notebook_programs(profile_name: str, notebook: str) -> dict:
    """{program: {"trace": seconds, "compile": seconds, "load": seconds}} of `notebook`'s
    programs under profile `profile_name`."""
    import jax
    import numpy as np

    from programs import abstract_batch  # bench/programs.py
    from t5nb import adapters, checkpoints, decode
    from t5nb.profiles import get_profile

    seconds, current = {}, [None]

    def listen(event, duration, **_):
        if current[0] and event in EVENTS:
            seconds[current[0]][EVENTS[event]] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)

    def program(name, build):
        current[0], seconds[name] = name, {"trace": 0.0, "compile": 0.0, "load": 0.0}
        result = build()
        jax.block_until_ready(result)
        current[0] = None
        return result

    profile = get_profile(profile_name)

    def length(name, lengths):
        return lengths["targets" if name.startswith("decoder") else "inputs"]

    def tokens(rows, length):
        return np.random.default_rng(0).integers(3, 100, (rows, length)).astype(np.int32)

    def train(trainer, lengths, packed, params=None, label="", batch_size=profile.batch_size):
        """A run's programs: its start (a fresh init, or a checkpoint's parameters given to the
        trainer's layout), optimizer init, train step, a checkpoint of its state, eval step."""
        params = program(f"init{label}", trainer.init_params) if params is None else params
        state = program(f"optimizer init{label}", lambda: trainer.init_state(params))
        program(f"train step{label}",
                lambda: trainer.compile_train_step(trainer.abstract_state(),
                                                   abstract_batch(trainer, batch_size, lengths, packed)))
        program(f"checkpoint layout{label}", lambda: trainer.checkpoint_state(state))
        real = {name: tokens(batch_size, length(name, lengths))
                for name in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")}
        program(f"eval step{label}", lambda: trainer.eval_step(state.params, trainer.shard_batch(real)))
        return state

    def greedy(model, rows, inputs, length, label=""):
        program(f"greedy {rows} x {inputs}->{length}{label}",
                lambda: decode.greedy_decode(model, tokens(rows, inputs), length).sequences)

    trainers = notebook_trainers(profile_name)
    (pretraining, pre), (finetuning, fine) = trainers["pretraining"], trainers["finetuning"]
    if notebook == "02_pretraining":
        state = train(pretraining, pre, packed=True)
        greedy(pretraining.model(state.params), 8, 128, 32)  # the probes: Predictor's defaults
    elif notebook == "03_finetuning":
        # the pretraining run's checkpoint, per layer as restored (its init compiles in 02)
        base = checkpoints.params_of(pretraining.model(pretraining.init_params()))
        state = train(finetuning, fine, packed=False, params=base)
        greedy(finetuning.model(state.params), 64, fine["inputs"], fine["targets"])  # validation, infer_eval
        train(finetuning, fine, packed=False, label=" (from scratch)")
        for method in ("lora", "prompt"):
            adapted, label = trainers[method][0], f" ({method})"
            params = program(f"adapters{label}", lambda: adapters.add_adapters(base, adapted.model_config))
            state = train(adapted, fine, packed=False, params=params, label=label)
            greedy(adapted.model(state.params), 64, fine["inputs"], fine["targets"], label)
    elif notebook == "04_closed_book_qa":
        state = train(finetuning, fine, packed=False, params=pretraining.init_params())
        model = finetuning.model(state.params)
        greedy(model, 64, fine["inputs"], fine["targets"])
        train(finetuning, fine, packed=False, label=" (from scratch)")
        program(f"beam 4 x 4 beams {fine['inputs']}->{fine['targets']}",
                lambda: decode.beam_search(model, tokens(4, fine["inputs"]), fine["targets"], num_decodes=4).sequences)
        greedy(model, 8, fine["inputs"], fine["targets"])  # the ask widget: Predictor's batch
    elif notebook == "05_evaluation":
        state = train(finetuning, fine, packed=False, params=pretraining.init_params())
        model = finetuning.model(state.params)
        greedy(model, 64, fine["inputs"], fine["targets"])  # infer_eval, evaluate_checkpoints
        questions = tokens(3, fine["inputs"])
        for label, method, options in [("greedy", "greedy", {}), ("beam 4", "beam", {"num_decodes": 4}),
                                       ("sample", "sample", {}), ("sample top-k 1", "sample", {"top_k": 1}),
                                       ("beam 1", "beam", {"num_decodes": 1})]:
            program(f"{label} 3 x {fine['inputs']}->8",
                    lambda: decode.generate(model, questions, 8, method=method, **options).sequences)
        span_model, held_out = pretraining.model(pretraining.init_params()), tokens(4, pre["inputs"])
        for label, method, options in [("greedy", "greedy", {}), ("beam 4", "beam", {"num_decodes": 4}),
                                       ("sample", "sample", {})]:
            program(f"span fills: {label} 4 x {pre['inputs']}->{pre['targets']}",
                    lambda: decode.generate(span_model, held_out, pre["targets"], method=method, **options).sequences)
        program("rank_classify", lambda: decode.rank_classify(model, questions[:1], tokens(20, 8)[None])[1])
    elif notebook == "06_knowledge_capacity":
        from t5nb import capacity, workflow
        from t5nb.tasks.offline import PRETRAINING
        from t5nb.trainer import Trainer, TrainConfig

        dtype = finetuning.model_config.dtype
        # each width's pretraining (span corruption with and without SSM share theirs), then its
        # closed-book fine-tuning and decoding of the held-out questions
        for width in sorted({*profile.knowledge_widths, profile.ssm_width}):
            recipe = workflow.pretraining_recipe(profile, profile.knowledge_steps, task=PRETRAINING,
                                                 model=capacity.width_model(width))
            trainer = Trainer(recipe.model_config().replace(dtype=dtype), recipe.optimizer, None)
            state = train(trainer, pre, packed=True, label=f" (width {width})")
            tuner = Trainer(trainer.model_config, TrainConfig(learning_rate=1e-3), None)
            restored = checkpoints.params_of(trainer.model(state.params))  # the checkpoint, per layer as restored
            state = train(tuner, fine, packed=False, params=restored, label=f" (width {width}, QA)")
            greedy(tuner.model(state.params), 64, fine["inputs"], fine["targets"], f" (width {width})")
        # each grid width's memorising (its seeds together; every world the same shapes) and
        # scoring of every fact
        for width in profile.capacity_widths:
            recipe = capacity.memorisation_recipe(profile, profile.capacity_people[0], width)
            trainer = Trainer(recipe.model_config().replace(dtype=dtype), recipe.optimizer, None)
            seeds, rows = range(profile.capacity_seeds), recipe.data.batch_size
            states = program(f"init (memorising, width {width})", lambda: capacity.initial_states(trainer, seeds))
            examples = {key: tokens(rows, length) for key, length in capacity.FACT_LENGTHS.items()}
            batches = capacity.memorisation_batches(examples, capacity.example_orders(
                rows, capacity.MEMORISATION_CHUNK, rows, seeds))
            states = program(f"memorise {len(seeds)} models together (width {width})",
                             lambda: trainer.stacked_train_steps(states, jax.device_put(batches))[0])
            scored = trainer.model(jax.tree.map(lambda leaf: leaf[0], states.params))
            program(f"score 512 facts (width {width})",
                    lambda: decode.score(scored, tokens(512, capacity.FACT_LENGTHS["inputs"]),
                                         tokens(512, capacity.FACT_LENGTHS["targets"])))
    return seconds


def notebook_trainers(profile_name: str) -> dict:
    """{"pretraining", "finetuning", "lora", "prompt": (Trainer, lengths)} in the profile's dtype,
    as bench/programs.py builds them (tests/test_profiles.py holds them equal to what the
    workflow's recipes train)."""
    import jax.numpy as jnp

    from programs import adapted_trainer, course_trainers  # bench/programs.py
    from t5nb.profiles import get_profile

    profile, dtype = get_profile(profile_name), jnp.dtype(PROFILES[profile_name])
    built = course_trainers(profile, dtype, None)
    (pre, pre_lengths, _), (fine, lengths, _) = built["pretrain_step"], built["finetune_step"]
    return {"pretraining": (pre, pre_lengths), "finetuning": (fine, lengths),
            **{method: (adapted_trainer(profile, dtype, None, method), lengths) for method in ("lora", "prompt")}}


def child(profile_name: str, notebook: str) -> None:
    """A notebook's process: the course's setup as on an accelerator's host (its compiled
    programs kept, where the library keeps them), then its programs; prints their seconds as JSON."""
    import jax

    import t5nb
    from t5nb import host, system

    if jax.default_backend() == "cpu":  # compiled for this CPU, as they would be on an accelerator's host
        host.accelerator_host = lambda: True  # where the library asks (tune_host), it is
    t5nb.tune_host()  # as the setup cell does: at 08de568 one malloc arena on every host

    kept = hasattr(system, "keep_compiled_programs")
    if kept:
        system.keep_compiled_programs()
    print(json.dumps({"kept": kept, "device": jax.devices()[0].device_kind,
                      "programs": notebook_programs(profile_name, notebook)}))


# -- the course: each notebook a process, in order ------------------------------------------------
def course(code: pathlib.Path, profile_name: str, runs: pathlib.Path, accelerator: bool, result: dict,
           progress) -> tuple[bool, str]:
    """Fills `result` ({notebook: {program: seconds}}) with t5nb from `code`, the runs (and kept
    programs) in `runs`, compiled for this CPU or (`accelerator`) for JAX's default backend,
    calling `progress()` after each notebook; returns (whether compiled programs were kept, the
    device they were compiled for)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")])),
           "T5NB_RUNS_DIR": str(runs), "JAX_PLATFORMS": "cpu"}
    for variable in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "XLA_FLAGS",
                     *(["JAX_PLATFORMS"] if accelerator else [])):
        env.pop(variable, None)  # the course's own settings, not a test run's
    for notebook in (name for name in NOTEBOOKS if not (accelerator and name in NEEDS_TASKS)):
        run = subprocess.run([sys.executable, __file__, "--child", profile_name, notebook], env=env, cwd=code,
                             capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"{notebook} ({profile_name}, {code}) failed:\n{run.stderr[-3000:]}")
        child_result = json.loads(run.stdout.strip().splitlines()[-1])
        result[notebook], kept = child_result["programs"], child_result["kept"]
        print(f"  {profile_name} {notebook} ({child_result['device']}): {total(result[notebook]):.1f} s "
              f"(XLA {total(result[notebook], 'xla'):.1f})", flush=True)
        progress()
    return kept, child_result["device"]


def measure(code: pathlib.Path, profiles, accelerator: bool = False, progress=lambda out: None) -> dict:
    """Per profile: the course's first run and, where compiled programs are kept, a rerun (the
    same runs folder); where none are, a rerun compiles the first run's programs again.
    `progress(out)` after each notebook, with what is measured so far."""
    out = {}
    for profile_name in profiles:
        with tempfile.TemporaryDirectory(prefix="t5nb-compile-") as runs:
            measured = out[profile_name] = {"first": {}, "rerun": {}, "kept": None, "device": None}
            measured["kept"], measured["device"] = course(code, profile_name, pathlib.Path(runs), accelerator,
                                                          measured["first"], lambda: progress(out))
            if measured["kept"]:
                course(code, profile_name, pathlib.Path(runs), accelerator, measured["rerun"], lambda: progress(out))
            else:
                measured["rerun"] = measured["first"]
    return out


def total(programs: dict, part: str | None = None) -> float:
    """Seconds of `programs`: in all (tracing, lowering, compiling or loading), or one `part`:
    "xla" (XLA's compile, what the cache saves), "load" (from the cache), "trace" (and lowering)."""
    parts = {None: lambda s: s["trace"] + s["compile"], "xla": lambda s: s["compile"] - s["load"],
             "load": lambda s: s["load"], "trace": lambda s: s["trace"]}
    return sum(parts[part](seconds) for seconds in programs.values())


def commit(ref: str = "HEAD") -> str:
    return git("rev-parse", "--short", ref)


def git(*arguments) -> str:
    """git's output in this repository; empty where there is no git or no repository (a copy of
    the working tree on another machine)."""
    try:
        return subprocess.run(["git", *arguments], capture_output=True, text=True, cwd=REPO).stdout.strip()
    except OSError:
        return ""


def measure_commit(ref: str, profiles, accelerator: bool, progress) -> dict:
    """`measure` with t5nb as of commit `ref`, from a worktree of it."""
    with tempfile.TemporaryDirectory(prefix="t5nb-commit-") as tree:
        subprocess.run(["git", "worktree", "add", "--detach", tree, ref], cwd=REPO, check=True, capture_output=True)
        try:
            return measure(pathlib.Path(tree), profiles, accelerator, progress)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, capture_output=True)


def print_tables(results: dict) -> None:
    """Per profile, a row per code measured: seconds per notebook and the course's, in all and
    (in brackets) XLA's compile alone, first and on a rerun."""
    for profile_name in next(iter(results.values())):
        print(f"\n{profile_name} ({PROFILES[profile_name]}): seconds to trace, lower and compile (or load) the "
              "notebooks' programs, each notebook a fresh process; in brackets XLA's compile alone")
        print("| code | " + " | ".join(n[:2] for n in NOTEBOOKS) + " | **course** | rerun |")
        print("|---|" + "---:|" * (len(NOTEBOOKS) + 2))
        for code, result in results.items():
            if profile_name not in result:
                continue
            first, rerun = result[profile_name]["first"], result[profile_name]["rerun"]
            cells = [f"{total(first[n]):.1f} ({total(first[n], 'xla'):.1f})" if n in first else "-" for n in NOTEBOOKS]
            course_s, rerun_s = ([sum(total(programs, part) for programs in run.values()) for part in (None, "xla")]
                                 for run in (first, rerun))
            course_cell, rerun_cell = (f"{s[0]:.1f} ({s[1]:.1f})" if len(run) == len(NOTEBOOKS) else "- (cut short)"
                                       for s, run in ((course_s, first), (rerun_s, rerun)))
            print(f"| {code} | " + " | ".join(cells) + f" | **{course_cell}** | {rerun_cell} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commits", nargs="*", help="commits to measure, each from a worktree of its own, in "
                        "this order (the last is the one the estimates count); none: the working tree")
    parser.add_argument("--profiles", nargs="+", choices=list(PROFILES), default=list(PROFILES))
    parser.add_argument("--accelerator", action="store_true",
                        help="compile for JAX's default backend (this machine's GPU or TPU), not for its CPU")
    parser.add_argument("--out", type=pathlib.Path, default=BENCH / "results" / "compile.json",
                        help="the results file, written after each notebook (default %(default)s)")
    parser.add_argument("--tables", action="store_true", help="print the tables of --out")
    parser.add_argument("--child", nargs=2, metavar=("PROFILE", "NOTEBOOK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    if args.tables:
        return print_tables(json.loads(args.out.read_text())["results"])
    started, results = time.perf_counter(), {}

    def write(label):
        def progress(out):
            results[label] = out
            args.out.write_text(json.dumps({
                "date": datetime.date.today().isoformat(), "compiled_for": "accelerator" if args.accelerator else "cpu",
                "cpu": cpu_name(), "bench_seconds": round(time.perf_counter() - started), "profiles": PROFILES,
                "current": label, "results": results}, indent=2) + "\n")
        return progress

    for ref in args.commits:
        print(f"{ref} ({commit(ref)}):", flush=True)
        results[commit(ref)] = measure_commit(ref, args.profiles, args.accelerator, write(commit(ref)))
    if not args.commits:
        label = (commit() or "working tree") + ("+changes" if git("status", "--porcelain", "t5nb") else "")
        print(f"{label}:", flush=True)
        results[label] = measure(REPO, args.profiles, args.accelerator, write(label))
    print_tables(results)
    print(f"\nwrote {args.out}")


def cpu_name() -> str:
    """This machine's CPU model and core count, as the results record it."""
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return f"{os.cpu_count()} cores"


if __name__ == "__main__":
    main()
