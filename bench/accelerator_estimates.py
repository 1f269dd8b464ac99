"""The course's estimated wall time and memory, each notebook (00-06), on every chip a learner gets.

    .venv/bin/python bench/accelerator_estimates.py --recount   # times again, from the kept programs' memory
    PYTHONPATH=/tmp/libtpu .venv/bin/python bench/accelerator_estimates.py   # compiled for a TPU v5e

Each setup (a chip of `profiles.CHIPS`, and how many: Colab's v5e-1 and T4, Kaggle's v5e-8 and
2 x T4, ...) gets the profile and dtype that detection gives it (`profiles.profile_name_for`,
`profiles.compute_dtype`). `course` says how often each notebook runs each program under that
profile; `course_work` traces each program (nothing compiled) and counts its matmul FLOPs, bytes
and operations; bench/step_cost.py turns those into seconds on the chip at rates measured on
an H200: one figure, whose error the H200's programs measured (`step_cost.calibrate`, each
left out of the rates it is estimated with). A train step takes at least its input pipeline's
batch on a 2-core host (bench/pipeline.py's measurements). Several chips split each batch (data
parallel, as t5nb's mesh does): each runs its rows with every weight and the whole optimizer
update, then sums the gradients over their link (`all_reduce_seconds`); the memory shown is
one chip running the whole batch, an upper bound. Each notebook opens in a runtime of its own:
it runs the setup cell (bench/setup_cell.py's seconds) and compiles every program it runs
(bench/compile.py's seconds on a 2-core CPU, `fresh_runtime_compile_seconds`), times how much
longer the chip's host compiles them (measured: an H200's host; XLA's TPU compiler).

Memory comes from compiling the course's programs with abstract inputs (nothing allocated): with
libtpu importable (`pip install --no-deps --target /tmp/libtpu "libtpu==<the version jax[tpu]
pins>"`) XLA's TPU compiler compiles them ahead of time for a v5e chip, none needed; otherwise
XLA:CPU does, whose memory figures are far larger (no TPU fusion and scheduling). Its memory
analysis gives the bytes a program needs (arguments + outputs - donated + temporaries).
`--recount` keeps those programs and counts the times again, refusing where a profile's shapes
changed. Prints docs/accelerators.md's table (scripts/estimates_table.py); writes
bench/results/accelerator_estimates.json.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this only compiles; a TPU target needs no TPU

import t5nb  # noqa: E402

t5nb.tune_host()  # first: its malloc setting must precede any other thread's first allocation

import collections  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import step_cost  # noqa: E402  (bench/step_cost.py)
from t5nb import capacity, decode, workflow  # noqa: E402
from t5nb import mesh as mesh_lib  # noqa: E402
from t5nb.model import Transformer  # noqa: E402
from t5nb.profiles import CHIPS, compute_dtype, get_profile, profile_name_for  # noqa: E402
from t5nb.tasks import world  # noqa: E402
from t5nb.tasks.offline import PRETRAINING  # noqa: E402
from t5nb.trainer import Trainer, TrainConfig  # noqa: E402
from programs import abstract_batch, course_trainers  # noqa: E402  (bench/programs.py)

RESULTS = step_cost.RESULTS
# Compiling: bench/compile.py's seconds per notebook on this CPU (the course in order, compiled
# programs kept), times how much slower a chip's host compiles them, measured: for a TPU, XLA's
# TPU compiler against XLA:CPU on the same programs in this run (with libtpu; else 1, unmeasured);
# for a GPU, the accelerator course's seconds with `bench/compile.py --accelerator` on an H200
# (its host's 16 cores) over this CPU's, the same programs (a T4's host has 2 vCPUs: unmeasured).
COMPILE_RESULTS, GPU_COMPILE_RESULTS = step_cost.COMPILE_RESULTS, step_cost.GPU_COMPILE_RESULTS
EVAL_BATCH = 64  # workflow.finetune_and_evaluate and 05_evaluation decode in batches of 64
SCORE_BATCH = 512  # capacity.fact_losses scores the facts of a world in batches of 512
FACTS_QA_VALIDATION = 2000  # data/facts_qa_validation.jsonl: the held-out people's questions 06 decodes
FACT_RELATIONS = len(world.RELATIONS)  # the facts a person of the facts world has
# Validation examples of the profile's tasks (the course decodes split="validation"):
# WMT14 en-de validation is newstest2013; NQ-open dev; TriviaQA unfiltered.nocontext validation.
VALIDATION_EXAMPLES = {"wmt14_ende": {"wmt14_ende": 3000},
                       "closed_book_qa": {"nq_open": 3610, "triviaqa_nocontext": 11313}}


# (what docs/accelerators.md calls it, the chip in profiles.CHIPS, how many): the free ones first
SETUPS = [("Colab TPU v5e-1", "v5e", 1), ("Kaggle TPU v5e-8", "v5e", 8), ("Colab T4", "t4", 1),
          ("Kaggle 2 x T4", "t4", 2), ("Kaggle P100", "p100", 1), ("Colab Pro L4", "l4", 1),
          ("Colab Pro A100", "a100", 1), ("H100", "h100", 1)]


def compile_target() -> jax.sharding.Mesh:
    """A one-chip mesh to compile for: a TPU v5e when libtpu is importable (XLA's TPU compiler
    runs ahead of time without a TPU), else this CPU."""
    if importlib.util.find_spec("libtpu") is None:
        return mesh_lib.make_mesh(devices=jax.devices()[:1])
    topology = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                            chips_per_host_bounds=(1, 1, 1), num_slices=1)
    return mesh_lib.make_mesh(devices=topology.devices)


def compiled_cost(jitted, *args) -> dict:
    """Memory (arguments + outputs - donated + temporaries) and compile seconds of `jitted`
    compiled for `args`."""
    return cost_of(lambda: jitted.lower(*args).compile())


def cost_of(compile) -> dict:
    """`compiled_cost` of the program `compile()` returns, its compile time included."""
    start = time.perf_counter()
    compiled = compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    return {"compile_s": round(seconds, 1), "memory": memory.argument_size_in_bytes + memory.output_size_in_bytes
            - memory.alias_size_in_bytes + memory.temp_size_in_bytes}


def train_step(trainer: Trainer, batch: dict) -> dict:
    """`trainer`'s own train step (`Trainer.compile_train_step`), for its abstract state."""
    return cost_of(lambda: trainer.compile_train_step(trainer.abstract_state(), batch))


def eval_step(trainer: Trainer, batch: dict) -> dict:
    """`trainer`'s teacher-forced eval step, as `Trainer.eval_step` jits it."""
    with mesh_lib.activation_sharding(trainer.mesh, trainer.rules):
        return compiled_cost(jax.jit(lambda p, b: trainer._sums(p, trainer.frozen, b, None)[1]),
                             trainer.abstract_state().params, batch)


def greedy_decoding(config, mesh, batch_size: int, lengths: dict) -> dict:
    """`compiled_cost` of one batch of `decode.greedy_decode`, `lengths["targets"]` steps: its
    start (encoding, the cache) and its whole loop, each compiled as decoding compiles them."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    on_mesh = NamedSharding(mesh, PartitionSpec())
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_mesh), state)
    tokens = jax.ShapeDtypeStruct((batch_size, lengths["inputs"]), jnp.int32, sharding=on_mesh)
    steps = lengths["targets"]
    start = compiled_cost(jax.jit(lambda s, t: decode._start(nnx.merge(graphdef, s), t, steps)), state, tokens)
    whole = compiled_cost(jax.jit(lambda s, t: decode._sample(
        nnx.merge(graphdef, s), t, jax.random.key(0), 0.0, 0, 1.0, batch_size, steps, max_decode_length=steps,
        greedy=True, filtered=False)),
        state, tokens)
    return {"memory": whole["memory"], "compile_s": start["compile_s"] + whole["compile_s"]}


def programs_in(dtype, mesh, profile) -> dict:
    """Every program of the course, computing in `dtype`, compiled for `mesh`'s chip."""
    costs = {}
    for name, (trainer, lengths, packed) in course_trainers(profile, dtype, mesh).items():
        if name == "decode_batch":
            costs[name] = greedy_decoding(trainer.model_config, mesh, EVAL_BATCH, lengths)
            continue
        batch = abstract_batch(trainer, profile.batch_size, lengths, packed)
        costs[name] = eval_step(trainer, batch) if name == "eval_step" else train_step(trainer, batch)
    return costs


def course(profile, with_02s_run: bool = False) -> dict:
    """Per notebook: its training runs, decoded examples and how many times it runs each program
    (`course_work`'s names), in a runtime of its own, as Colab and Kaggle open each notebook: 03-05
    find no run of notebook 02 there and fine-tune the published checkpoint in its place
    (`workflow.pretrained_checkpoint`), which 03 and 04 then do not fine-tune a second time
    (`workflow.published_checkpoints`); a profile without one runs 02's pretraining first (in
    03-05; 06 counts each of its pretrainings, 02's run where it reuses it, either way).
    `with_02s_run`: 02's finished run found instead, as when the notebooks share one runtime.
    00 times a matmul in float32 and bfloat16 (a first call, then the best of 5); 01 runs no
    model. 02 pretrains (validating every `eval_every` steps), and its interrupt-and-resume
    lesson trains 30 steps straight and 30 again, interrupted and resumed. 03 and 04 fine-tune
    from the pretrained model and from scratch, and the published checkpoints, and decode the
    validation set after each (03 also runs its sample-efficiency curve, from pretrained and from
    scratch at each size, and LoRA and prompt tuning, whose steps count as full fine-tuning
    steps, an upper bound); each fine-tuning
    validates every `eval_every` steps (teacher-forced batches and a decoded sample). 05
    fine-tunes once, teacher-forces the validation set, decodes it at the end and at each of the
    3 kept checkpoints. 06 pretrains at each width (span corruption + SSM) and once more without
    SSM, fine-tunes each for closed-book QA and decodes its held-out questions, then memorises
    each world of its grid at each width and scores every fact. Decoding counts every batch's
    full `targets` steps, an upper bound."""
    def decoded(task):
        return [min(n, profile.eval_examples or n) for n in VALIDATION_EXAMPLES[task].values()]

    def batches(examples):
        return sum(math.ceil(n / EVAL_BATCH) for n in examples)

    def validations(steps):
        return steps // profile.eval_every if profile.eval_every else 0

    def finetuning(runs_steps, suffix=""):
        """The train steps and validations of fine-tuning runs of these steps."""
        checks = sum(validations(steps) for steps in runs_steps)
        return {f"finetune_step{suffix}": sum(runs_steps), f"eval_step{suffix}": checks * profile.eval_batches,
                f"decode_batch{suffix}": checks * math.ceil(profile.decoded_sample / EVAL_BATCH)}

    def plus(*counts):
        return dict(sum(map(collections.Counter, counts), collections.Counter()))

    wmt, qa = decoded(profile.finetune_task), decoded(profile.qa_task)
    steps, short = profile.finetune_steps, min(30, profile.pretrain_steps)
    forced = sum(VALIDATION_EXAMPLES[profile.qa_task].values()) // profile.batch_size  # full batches
    pretraining = profile.pretrain_steps + 2 * short
    # what 03-05 fine-tune as pretrained, and 02's pretraining run first where there is nothing
    published_instead = not with_02s_run and profile.official_checkpoint is not None
    pretrained = profile.official_checkpoint if published_instead else workflow.pretraining_dir(profile)
    first = {} if with_02s_run or published_instead else {
        "pretrain_step": profile.pretrain_steps,
        "pretrain_eval_step": validations(profile.pretrain_steps) * profile.eval_batches}
    published_03 = len(workflow.published_checkpoints(profile, pretrained))
    published_04 = len(workflow.published_checkpoints(profile, pretrained, ("t5_1_1_small",)))
    curve = 2 * len(profile.transfer_sizes)
    runs_03 = 4 + published_03 + curve
    # 06's pretrainings at each width (then one fine-tuning each): the SSM width twice, with and without SSM
    runs = {width: 1 + (width == profile.ssm_width) for width in sorted({*profile.knowledge_widths, profile.ssm_width})}
    facts_qa = [min(FACTS_QA_VALIDATION, profile.eval_examples or FACTS_QA_VALIDATION)]
    knowledge = plus(*({f"knowledge_pretrain_step_w{width}": n * profile.knowledge_steps,
                        f"knowledge_pretrain_eval_step_w{width}": n * validations(profile.knowledge_steps)
                        * profile.eval_batches, f"decode_batch_w{width}": n * batches(facts_qa)}
                       for width, n in runs.items()),
                     *(finetuning([steps] * n, f"_w{width}") for width, n in runs.items()),
                     # a step of every seed's model at once (`capacity.memorise`), each model scored alone
                     *({f"memorise_step_w{width}": capacity.memorisation_recipe(profile, people, width).run.steps,
                        f"score_batch_w{width}": profile.capacity_seeds * math.ceil(people * FACT_RELATIONS / SCORE_BATCH)}
                       for width in profile.capacity_widths for people in profile.capacity_people))
    return {
        "00_setup": {"runs": 0, "examples": 0, "counts": {"matmul_float32": 6, "matmul_bfloat16": 6}},
        "01_tasks": {"runs": 0, "examples": 0, "counts": {}},
        "02_pretraining": {"runs": 3, "examples": 0,
                           "counts": {"pretrain_step": pretraining,
                                      "pretrain_eval_step": validations(pretraining) * profile.eval_batches}},
        # pretrained, scratch, LoRA and prompt tuning, the published checkpoints; the curve's, from
        # pretrained and from scratch at each size
        "03_finetuning": {"runs": runs_03 + bool(first), "examples": runs_03 * sum(wmt),
                          "counts": plus(first, finetuning([steps] * (4 + published_03) + [profile.transfer_steps] * curve),
                                         {"decode_batch": runs_03 * batches(wmt)})},
        "04_closed_book_qa": {"runs": 2 + published_04 + bool(first), "examples": (2 + published_04) * sum(qa),
                              "counts": plus(first, finetuning([steps] * (2 + published_04)),
                                             {"decode_batch": (2 + published_04) * batches(qa)})},
        "05_evaluation": {"runs": 1 + bool(first), "examples": 4 * sum(qa),
                          "counts": plus(first, finetuning([steps]),
                                         {"eval_step": forced, "decode_batch": 4 * batches(qa)})},
        "06_knowledge_capacity": {
            "runs": 2 * sum(runs.values()) + len(profile.capacity_widths) * len(profile.capacity_people),
            "examples": sum(runs.values()) * sum(facts_qa),
            "counts": knowledge},
    }


def train_steps(counts: dict) -> int:
    """The train steps among `course`'s counts of a notebook's programs."""
    return sum(n for program, n in counts.items() if "_step" in program and "eval" not in program)


def course_work(profile, dtype, chips: int = 1) -> tuple[dict, dict]:
    """{program: `step_cost.Work`} of every program `course` counts, traced in `dtype` at the
    profile's shapes, each batch split over `chips` (data parallel: one chip's rows, every weight
    and the whole optimizer update; nothing compiled): the course's trainers (bench/programs.py),
    06's models on the facts world at each width (the recipes `capacity` runs), 00's matmul. And
    {train step: the bytes of its gradients}, which several chips sum every step."""
    mesh = mesh_lib.make_mesh(devices=jax.devices("cpu")[:1])

    def rows(batch_size: int) -> int:
        if batch_size % chips:
            raise ValueError(f"a batch of {batch_size} does not split over {chips} chips")
        return batch_size // chips

    trainers, work, gradients = course_trainers(profile, dtype, mesh), {}, {}

    def train(name: str, trainer: Trainer, batch_size: int, lengths: dict, packed: bool, evaluated: str = ""):
        batch = abstract_batch(trainer, rows(batch_size), lengths, packed)
        work[name] = step_cost.train_step_work(trainer, batch)
        gradients[name] = sum(leaf.size * 4 for leaf in jax.tree.leaves(trainer.abstract_state().params))  # float32
        if evaluated:
            work[evaluated] = step_cost.train_step_work(trainer, batch, step=False)

    pretraining, pretrain_lengths, _ = trainers["pretrain_step"]
    finetuning, finetune_lengths, _ = trainers["finetune_step"]
    train("pretrain_step", pretraining, profile.batch_size, pretrain_lengths, True, "pretrain_eval_step")
    train("finetune_step", finetuning, profile.batch_size, finetune_lengths, False, "eval_step")
    work["decode_batch"] = step_cost.decoding_work(finetuning.model_config, rows(EVAL_BATCH), finetune_lengths)
    for name in ("float32", "bfloat16"):
        work[f"matmul_{name}"] = step_cost.matmul_work(profile.matmul_size, jnp.dtype(name))
    for width in sorted({*profile.knowledge_widths, profile.ssm_width}):
        recipe = workflow.pretraining_recipe(profile, profile.knowledge_steps, task=PRETRAINING,
                                             model=capacity.width_model(width))
        trainer = Trainer(recipe.model_config().replace(dtype=dtype), recipe.optimizer, mesh)
        train(f"knowledge_pretrain_step_w{width}", trainer, profile.batch_size, pretrain_lengths, True,
              f"knowledge_pretrain_eval_step_w{width}")
        tuner = Trainer(trainer.model_config, TrainConfig(learning_rate=1e-3), mesh)
        train(f"finetune_step_w{width}", tuner, profile.batch_size, finetune_lengths, False, f"eval_step_w{width}")
        work[f"decode_batch_w{width}"] = step_cost.decoding_work(tuner.model_config, rows(EVAL_BATCH),
                                                                 finetune_lengths)
    for width in profile.capacity_widths:
        recipe = capacity.memorisation_recipe(profile, profile.capacity_people[0], width)
        trainer = Trainer(recipe.model_config().replace(dtype=dtype), recipe.optimizer, mesh)
        train(f"memorise_step_w{width}", trainer, recipe.data.batch_size, capacity.FACT_LENGTHS, False)
        work[f"memorise_step_w{width}"] = step_cost.stacked(work[f"memorise_step_w{width}"], profile.capacity_seeds)
        gradients[f"memorise_step_w{width}"] *= profile.capacity_seeds
        work[f"score_batch_w{width}"] = step_cost.train_step_work(
            trainer, abstract_batch(trainer, rows(SCORE_BATCH), capacity.FACT_LENGTHS, False), step=False)
    return work, gradients


def compile_ratios(mesh, programs: dict) -> dict:
    """How many times longer a chip's host compiles a program than this CPU (see COMPILE_RESULTS)."""
    tpu = 1.0
    if mesh.devices.flat[0].platform == "tpu":  # the same programs compiled for this CPU as well
        cpu_mesh = mesh_lib.make_mesh(devices=jax.devices("cpu")[:1])
        tpu_s = cpu_s = 0.0
        for key, compiled in programs.items():
            profile_name, dtype = key.split()
            on_cpu = programs_in(jnp.dtype(dtype), cpu_mesh, get_profile(profile_name))
            tpu_s += sum(program["compile_s"] for program in compiled.values())
            cpu_s += sum(program["compile_s"] for program in on_cpu.values())
        tpu = tpu_s / cpu_s
    return {"tpu": round(tpu, 2)}


def gpu_compile_ratio() -> float:
    """The accelerator course's compile seconds on an H200 over those on this CPU (first runs),
    the notebooks measured on both (the H200's host, without TensorFlow, compiled 02-05)."""
    gpu, cpu = compile_seconds("accelerator", GPU_COMPILE_RESULTS), compile_seconds("accelerator")
    return sum(gpu.values()) / sum(cpu[notebook] for notebook in gpu)


def compile_seconds(profile_name: str, path: pathlib.Path = COMPILE_RESULTS) -> dict:
    """bench/compile.py's measured compile seconds per notebook (this CPU's, or `path`'s), the
    course run in order."""
    return {notebook: sum(programs.values())
            for notebook, programs in compile_seconds_by_program(profile_name, path).items()}


def fresh_runtime_compile_seconds(profile_name: str) -> dict:
    """Per notebook, its compile seconds in a runtime of its own, as Colab and Kaggle open each
    notebook (Colab keeps compiled programs only where runs/ is on Drive): each of its programs at
    the seconds of the first program of the same name in bench/compile.py's run of the course in
    order, where that run loaded it from the cache an earlier notebook wrote. Names are not
    programs: 03-05's "train step" (fine-tuning) is charged 02's pretraining step, 6.9 s against
    its own 6.5 in 03, and "init (from scratch)", which 03 loaded under that name, 0.0 s in 03 and
    04. A measurement of each notebook alone in an empty runs folder would replace this."""
    first, fresh = {}, {}
    for notebook, programs in compile_seconds_by_program(profile_name).items():
        fresh[notebook] = sum(first.setdefault(name, seconds) for name, seconds in programs.items())
    return fresh


def compile_seconds_by_program(profile_name: str, path: pathlib.Path = COMPILE_RESULTS) -> dict:
    """{notebook: {program: first-run seconds, trace + compile}} of bench/compile.py's `path`."""
    measured = json.loads(path.read_text())
    first = measured["results"][measured["current"]][profile_name]["first"]
    return {notebook: {name: s["trace"] + s["compile"] for name, s in programs.items()}
            for notebook, programs in first.items()}


def estimate() -> dict:
    started = time.perf_counter()
    mesh = compile_target()
    programs = {}  # "<profile> <dtype>" -> its programs
    for chip, _, profile_name in setups().values():
        dtype = jnp.dtype(compute_dtype(chip.device())).name
        if f"{profile_name} {dtype}" not in programs:
            programs[f"{profile_name} {dtype}"] = programs_in(jnp.dtype(dtype), mesh, get_profile(profile_name))
    result = {"date": datetime.date.today().isoformat(), "commit": commit(),
              "compiled_for": mesh.devices.flat[0].device_kind, "bench_seconds": round(time.perf_counter() - started),
              "profiles": {name: dataclasses.asdict(get_profile(name)) for name in {p for *_, p in setups().values()}},
              "assumptions": {"compile_ratios": compile_ratios(mesh, programs),
                              "eval_batch": EVAL_BATCH, "validation_examples": VALIDATION_EXAMPLES,
                              "chips": {key: dataclasses.asdict(CHIPS[key]) for _, key, _ in SETUPS}},
              "programs": programs}
    return count(result)


def setups() -> dict:
    """name -> (chip, how many, the profile detection gives it)."""
    return {name: (CHIPS[key], chips, profile_name_for(CHIPS[key].device())) for name, key, chips in SETUPS}


# Each chip's link to the others, bytes/s each way (data sheets): a T4's PCIe Gen3 x16 (32 GB/s
# both ways), a TPU v5e's inter-chip interconnect (1,600 Gbps)
INTERCONNECT = {"Tesla T4": 16e9, "TPU v5 lite": 200e9}


def all_reduce_seconds(size: float, chip, chips: int) -> float:
    """Summing `size` bytes of gradients over `chips` chips in a ring: each sends and receives
    2 (n - 1) / n of them over its link, at the data sheet's bandwidth (a lower bound)."""
    return 0.0 if chips == 1 else 2 * (chips - 1) / chips * size / INTERCONNECT[chip.kind]


def pipeline_of(notebook: str, program: str) -> str | None:
    """The input pipeline (bench/pipeline.py's name) that feeds `program`, a train step of
    `notebook`: 03 fine-tunes on the profile's fine-tuning task, 04 and 05 on its QA task, 06 on
    the facts world; None for what runs on batches made once (validation, decoding, scoring)."""
    for prefix, pipeline in (("pretrain_step", "pretrain"), ("knowledge_pretrain_step", "knowledge_pretrain"),
                             ("finetune_step_w", "facts_qa"), ("memorise_step", "memorise")):
        if program.startswith(prefix):
            return pipeline
    if program == "finetune_step":
        return "finetune" if notebook == "03_finetuning" else "qa"
    return None


def host_seconds(pipelines: dict, profile_name: str) -> dict:
    """{pipeline: seconds a batch} on 2 cores, from bench/pipeline.py's `pipelines` (`PIPELINE_RESULTS`)."""
    return {pipeline: row["s_per_batch"] for pipeline, row in pipelines["measured"][profile_name].items()}


def count(result: dict) -> dict:
    """`result` with each setup's minutes per notebook (`step_cost.seconds`, whose measured error
    the calibration gives): its programs' work (`course_work`) at the rates measured on the H200,
    each train step at least as long as its input pipeline's batch on a 2-core host
    (`host_seconds`: the host feeds the chips while they run, so a step takes the longer of the
    two), and compiling: `COMPILE_RESULTS`' seconds in a fresh runtime per notebook
    (`fresh_runtime_compile_seconds`) times the chip's ratio; and each notebook's setup cell
    (`SETUP_RESULTS`: its first run, then again after the restart). In a runtime of its own
    (`course`), and with notebook 02's run found (`with_02s_run`)."""
    ratios = {**result["assumptions"]["compile_ratios"], "gpu": round(gpu_compile_ratio(), 2)}
    calibration = step_cost.calibrate()
    setup_cell = json.loads(step_cost.SETUP_RESULTS.read_text())
    pipelines = json.loads(step_cost.PIPELINE_RESULTS.read_text())
    # the setup cell once, and again after the restart a protobuf upgrade asks for
    setup = setup_cell["first_run_s"] + setup_cell["second_run_s"]
    works, results = {}, {}
    for name, (chip, chips, profile_name) in setups().items():
        dtype = jnp.dtype(compute_dtype(chip.device())).name
        profile = get_profile(profile_name)
        if (profile_name, dtype, chips) not in works:
            works[profile_name, dtype, chips] = course_work(profile, jnp.dtype(dtype), chips)
        work, gradients = works[profile_name, dtype, chips]
        compiled, notebooks = result["programs"][f"{profile_name} {dtype}"], {}
        cpu_compile_s = fresh_runtime_compile_seconds(profile_name)
        # one run of each program on each of `chips` chips; a train step's gradients summed over
        # them, not overlapped with the backward pass
        seconds = {program: step_cost.seconds(one, chip, dtype, calibration) for program, one in work.items()}
        for program, size in gradients.items():
            seconds[program] += all_reduce_seconds(size, chip, chips)
        host = host_seconds(pipelines, profile_name)
        after_02 = course(profile, with_02s_run=True)
        for notebook, plan in course(profile).items():
            counts = plan["counts"]
            fed = {program: host.get(pipeline_of(notebook, program), 0.0)
                   for program in {**counts, **after_02[notebook]["counts"]}}
            compiling = cpu_compile_s.get(notebook, 0.0) * ratios[chip.platform]
            memory = [compiled[program]["memory"] for program in counts if program in compiled]
            compute, with_02 = (sum(n * max(seconds[program], fed[program]) for program, n in runs.items())
                                for runs in (counts, after_02[notebook]["counts"]))  # a step waits for its batch
            notebooks[notebook] = {
                "training_runs": plan["runs"], "decoded_examples": plan["examples"], "train_steps": train_steps(counts),
                "minutes": (compute + compiling + setup) / 60, "with_02s_run": (with_02 + compiling + setup) / 60,
                "with_02s_run_train_steps": train_steps(after_02[notebook]["counts"]),
                "compute_minutes": compute / 60, "compile_minutes": compiling / 60, "setup_minutes": setup / 60,
                "chip_minutes": sum(n * seconds[program] for program, n in counts.items()) / 60,
                "host_minutes": sum(n * fed[program] for program, n in counts.items()) / 60,
                "memory_gb": max(memory, default=0) / 1e9}
        total = {key: sum(row[key] for row in notebooks.values())
                 for key in ("minutes", "with_02s_run", "compute_minutes", "compile_minutes", "setup_minutes",
                             "chip_minutes", "host_minutes")}
        memory_gb = max(row["memory_gb"] for row in notebooks.values())
        results[name] = {"chip": chip.kind, "chips": chips, "profile": profile_name, "dtype": dtype,
                         "notebooks": notebooks, **total, "seconds_per_run": seconds,
                         "memory_gb": memory_gb, "fits_in_memory": memory_gb * 1e9 <= chip.memory}
    compile_results = json.loads(COMPILE_RESULTS.read_text())
    return {**result, "counted": {"date": datetime.date.today().isoformat(), "commit": commit(),
                                  "made_from": step_cost.made_from()},
            "profiles": {name: dataclasses.asdict(get_profile(name)) for name in result["profiles"]},
            "assumptions": {**result["assumptions"], "calibration": calibration, "compile_ratios": ratios,
                            "compile_results": {"file": COMPILE_RESULTS.name, "commit": compile_results["current"],
                                                "cpu": compile_results["cpu"], "gpu_file": GPU_COMPILE_RESULTS.name},
                            "setup_cell": {"file": step_cost.SETUP_RESULTS.name, **setup_cell},
                            "host": {"file": step_cost.PIPELINE_RESULTS.name,
                                     **{key: value for key, value in pipelines.items() if key != "measured"}}},
            "setups": results}


def same_shapes(result: dict) -> None:
    """Refuse to count again from kept programs compiled for other shapes than today's profiles'."""
    shapes = ("model", "batch_size", "inputs_length", "targets_length", "finetune_inputs_length",
              "finetune_targets_length", "execution")
    for name, kept in result["profiles"].items():
        changed = [field for field in shapes if kept[field] != getattr(get_profile(name), field)]
        if changed:
            raise SystemExit(f"profile {name}: {', '.join(changed)} changed since its programs were compiled; "
                             "run without --recount")


def commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=pathlib.Path(__file__).parent)
    return run.stdout.strip() or "unknown"


def estimates_table():
    """scripts/estimates_table.py, which writes the docs' tables from this script's JSON."""
    script = RESULTS.parents[1] / "scripts" / "estimates_table.py"
    spec = importlib.util.spec_from_file_location("estimates_table", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    path = RESULTS / "accelerator_estimates.json"
    # --recount: the course times again from the programs kept in the JSON, for new compile seconds
    if "--recount" in sys.argv[1:]:
        kept = json.loads(path.read_text())
        same_shapes(kept)
        result = count(kept)
    else:
        result = estimate()
    print(estimates_table().table(result))
    calibration = result["assumptions"]["calibration"]
    print(f"\ncompiled for {result['compiled_for']} in {result['bench_seconds']} s; rates measured on an "
          f"{calibration['measured_on']}: matmuls at {calibration['matmul_efficiency']:.1%} of the peak, the counted "
          f"bytes at {calibration['bandwidth_efficiency']:.2f} x the bandwidth, "
          f"{calibration['seconds_per_operation'] * 1e6:.2f} us per other operation; measured against the estimate, "
          "each program left out of the rates it is estimated with: "
          + ", ".join(f"{name} {1e3 * row['measured_s']:.1f} ms against {1e3 * row['estimate_s']:.1f}"
                      for name, row in calibration["leave_one_out"].items())
          + f"; compiling {result['assumptions']['compile_ratios']} times this CPU's {COMPILE_RESULTS.name}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
