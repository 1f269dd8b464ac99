"""t5nb on a GPU beside transformers' PyTorch T5: the headline numbers in one call of at most 8 minutes.

    python bench/gpu.py                       # on the GPU machine (no TensorFlow needed); bench/GPU.md
    python bench/gpu.py --quick               # the whole call rehearsed on a CPU, t5.1.1-tiny (3 minutes)
    python bench/gpu.py --dry-run [--quick]   # the plan: phases, timeouts, the deadline's arithmetic
    python bench/gpu.py --make-curve-batches  # here (TensorFlow): the real batches `curves` trains on

Each phase runs in a process of its own (this script, `--phase NAME`) under its timeout, and
starts only if that timeout fits in what is left of `--deadline`; else it is skipped, saying
so. All share one persistent compilation cache, as the course's runs do, and each says whether
it compiled its step or loaded it. In order of priority: T5.1.1-small's bfloat16 train step at
the accelerator course's 64 x 512/114 (its first step from the process's start, lap by lap;
step time, peak memory, MFU against the chip's data-sheet peak beside the fraction of the matmul
rate measured in the same process); `profile`: where small's and base's step time goes, by kind
(bench/step_profile.py); the small step's variants, each a T5Config change (fused attention,
unrolled layers, both, or no rematerialisation where the course asks for "auto", minimal on a GPU)
or another batch, and its compile again with the cache warm; transformers' step on the same weights and batch, eager and
through `torch.compile`; an XLA flag; T5.1.1-base's step; greedy decoding at batch 8 and 64,
then `generate` (tokens compared); small at the `fp32-gpu` profile's 32 x 256/58 in float32;
bfloat16 against float32 losses (`curves`); each course program in a process whose JAX may use
16 GB (`cap`); the small step again with malloc as `t5nb.tune_host()` sets it on a CPU
(`t5nb.host.keep_freed_memory()`). Each figure is printed as it exists and written at once to
bench/results/gpu-<stamp>-<backend>[-quick].json (each profile's trace and program beside it).
"""
import argparse
import collections
import dataclasses
import datetime
import json
import math
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STARTED = time.time()  # the process's start, near enough: the first step is timed from it

BENCH = pathlib.Path(__file__).resolve().parent
RESULTS = BENCH / "results"
CURVE_BATCHES = BENCH / "gpu_curve_batches.npz"  # made where TensorFlow is (--make-curve-batches)
CURVE_STEPS, CURVE_EVERY, CURVE_BATCH = 300, 10, 32
CAP_BYTES = 16 * 10**9  # a T4's and a v5e's memory
EVAL_BATCH = 64  # the course decodes in batches of 64
DEADLINE_S = {False: 470, True: 170}  # 8 minutes (3 with --quick), less the seconds around the call


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    kind: str  # which function of PHASES runs it
    timeout_s: int
    expected_s: int  # what it took, or is expected to take, on an H200 (the plan's arithmetic)
    settings: dict = dataclasses.field(default_factory=dict)
    needs: str | None = None  # the phase whose files (under --work) or results this one reads
    # first in its process: `t5nb.tune_host()`, as the course calls it (it leaves malloc alone on
    # an accelerator's host); or `t5nb.host.keep_freed_memory()`, its malloc settings on any host
    keep_freed_memory: bool = False

    @property
    def framework(self) -> str:
        return "transformers" if self.kind.startswith("hf") else "t5nb"


def plan(quick: bool = False) -> list[Phase]:
    """The call's phases, in the order they run: the headline and where its time goes, the t5nb
    variants measured against it (A/B), transformers, then what earlier calls measured already."""
    from programs import PROGRAMS  # bench/programs.py (imports JAX, which starts nothing)

    def seconds(gpu: int, cpu: int) -> int:
        return cpu if quick else gpu

    course, fp32 = ("rehearsal", "rehearsal") if quick else ("accelerator", "fp32-gpu")
    small = {"profile": course, "dtype": "bfloat16"}
    caps = {"rehearsal": "float32"} if quick else {"accelerator": "bfloat16", "fp32-gpu": "float32"}

    def variant(name: str, expected: int, **config) -> Phase:  # the small step with T5Config changed
        return Phase(name, "train", seconds(75, 40), expected, {**small, "config": config})

    def gpu_only(*phases: Phase) -> list[Phase]:
        """Not rehearsed by --quick, to fit its 3 minutes: more variants of the small step (the
        same code as those it runs, a field of T5Config or the batch changed), and torch.compile,
        whose compiler takes minutes on a CPU."""
        return [] if quick else list(phases)

    return [
        Phase("train-small", "train", seconds(100, 60), 40, {**small, "save_for_hf": True}),
        Phase("profile", "profile", seconds(120, 60), 60, {**small, "models": {
            "small": "t5.1.1-tiny" if quick else "t5.1.1-small", "base": "t5.1.1-tiny" if quick else "t5.1.1-base"}}),
        *gpu_only(variant("small-dot-product-attention", 35, attention="dot_product_attention"),
                  variant("small-unrolled-dot-product-attention", 45, scan_layers=False,
                          attention="dot_product_attention")),
        variant("small-remat-none", 35, remat_policy="none"),
        variant("small-unrolled", 45, scan_layers=False),
        Phase("compile-warm-cache", "compile", seconds(60, 30), 25, {"of": ["train-small", "small-unrolled"]},
              needs="small-unrolled"),
        *gpu_only(Phase("small-rows-256", "train", 75, 40, {**small, "rows": 256})),
        Phase("hf-train-small", "hf_train", seconds(60, 40), 20, needs="train-small"),
        *gpu_only(Phase("hf-compile-small", "hf_train", 120, 90, {"compiled": True}, needs="train-small"),
                  Phase("small-xla-latency-hiding", "train", 75, 35,
                        {**small, "xla_flags": "--xla_gpu_enable_latency_hiding_scheduler=true"})),
        Phase("train-base", "train", seconds(60, 30), 30,
              {**small, "model": "t5.1.1-tiny" if quick else "t5.1.1-base"}),
        *gpu_only(Phase("base-unrolled-dot-product-attention", "train", 90, 60, {
            **small, "model": "t5.1.1-base", "config": {"scan_layers": False, "attention": "dot_product_attention"}})),
        Phase("decode", "decode", seconds(90, 30), 22, {  # float32 on a CPU: there transformers' tokens must be t5nb's
            "profile": course, "dtype": "float32" if quick else "bfloat16", "batches": [2, 8] if quick else [8, 64],
            "inputs": seconds(512, 64), "new_tokens": seconds(64, 8)}),
        Phase("hf-decode", "hf_decode", seconds(60, 30), 18, needs="decode"),
        Phase("train-small-fp32", "train", seconds(60, 30), 29, {"profile": fp32, "dtype": "float32"}),
        Phase("curves", "curves", seconds(120, 40), 68, {"profile": course, "steps": seconds(CURVE_STEPS, 20)}),
        *(Phase(f"cap-{profile}-{program}", "cap", seconds(45, 25), 20,
                {"profile": profile, "dtype": dtype, "program": program})
          for profile, dtype in caps.items() for program in PROGRAMS),
        Phase("train-small-freed-memory-kept", "train", seconds(120, 30), 36, small, keep_freed_memory=True),
    ]


def schedule(phases: list[Phase], deadline: float) -> list[tuple[Phase, int, bool]]:
    """(phase, when it ends at the latest were every phase before it to run to its timeout,
    whether that is within the deadline): the phases sure to run, and those that run only
    where earlier ones end early."""
    rows, end = [], 0
    for phase in phases:
        end += phase.timeout_s
        rows.append((phase, end, end <= deadline))
    return rows


def expected(phases: list[Phase], deadline: float) -> list[tuple[Phase, int | None]]:
    """(phase, when it ends were each phase before it to take its expected seconds; None where it
    would not start: its timeout no longer fits what is left, or what it needs did not run)."""
    rows, now, ran = [], 0, set()
    for phase in phases:
        if phase.timeout_s <= deadline - now and (phase.needs is None or phase.needs in ran):
            now += phase.expected_s
            ran.add(phase.name)
        rows.append((phase, now if phase.name in ran else None))
    return rows


def print_plan(phases: list[Phase], deadline: float, quick: bool) -> None:
    """Each phase's timeout and when it ends at the latest; on a GPU, also the seconds expected."""
    rows, ends = schedule(phases, deadline), dict((p.name, end) for p, end in expected(phases, deadline))
    for i, (phase, end, sure) in enumerate(rows, 1):
        print(f"{i:2d}. {phase.name:34s} {phase.framework:12s} up to {phase.timeout_s:3d} s, ends by {end:4d} s "
              f"{'(sure)' if sure else '(if earlier phases end early)'}"
              + ("" if quick else f"; expected {phase.expected_s:3d} s, by {ends[phase.name]:3d} s"
                 if ends[phase.name] else "; expected: skipped")
              + (", malloc as tune_host() sets it on a CPU" if phase.keep_freed_memory else ""))
    sure, ran = [phase for phase, _, ok in rows if ok], [end for end in ends.values() if end]
    print(f"deadline {deadline:.0f} s: the first {len(sure)} phases fit it even at their timeouts "
          f"({sum(p.timeout_s for p in sure)} s)"
          + ("" if quick else f"; at the seconds expected on an H200, {len(ran)} run, the last ending by {max(ran)} s")
          + "; a phase starts only if its timeout fits what is left")


# -- the results file ------------------------------------------------------------------------
def record(path: pathlib.Path, phase: str, **fields) -> None:
    """Merge `fields` into the results file's entry for `phase` (written whole, then renamed)."""
    results = json.loads(path.read_text())
    results["phases"].setdefault(phase, {}).update(fields)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(results, indent=2, default=float) + "\n")
    os.replace(temporary, path)


def gpu_memory_bytes() -> int | None:
    """The first GPU's memory as nvidia-smi reports it; None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return int(out.split()[0]) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def run_all(args, phases: list[Phase], deadline: float) -> None:
    memory = gpu_memory_bytes()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu-{stamp}-{'gpu' if memory else 'cpu'}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps({
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "command": sys.argv, "quick": args.quick,
        "deadline_s": deadline, "gpu_memory_bytes": memory,
        "plan": [{"phase": p.name, "timeout_s": p.timeout_s, "expected_s": p.expected_s, "settings": p.settings,
                  "keep_freed_memory": p.keep_freed_memory} for p in phases],
        "phases": {}}, indent=2) + "\n")
    print(f"results: {path}", flush=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="t5nb-gpu-"))
    status = {}
    try:
        for phase in phases:
            left = deadline - (time.time() - STARTED)
            if phase.timeout_s > left:
                status[phase.name] = f"skipped: needs up to {phase.timeout_s} s, {left:.0f} s left"
            elif phase.needs and status.get(phase.needs) != "done":
                status[phase.name] = f"skipped: {phase.needs} did not finish"
            else:
                status[phase.name] = run_phase_process(args, phase, path, work, memory)
            print(f"-- {phase.name}: {status[phase.name]}", flush=True)
            record(path, phase.name, status=status[phase.name])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done = sum(s == "done" for s in status.values())
    print(f"{done} of {len(phases)} phases done in {time.time() - STARTED:.0f} s; results: {path}", flush=True)


def phase_environment(phase: Phase, work: pathlib.Path, memory: int | None, environ) -> dict:
    """The environment of `phase`'s process: `environ`, with the call's persistent cache (as the
    course keeps its compiled programs: a phase loads what an earlier one compiled, and says so),
    the phase's XLA flags, and for a `cap` phase on a GPU of `memory` bytes its share of it."""
    env = {"JAX_COMPILATION_CACHE_DIR": str(work / "jax_cache"), **environ}
    if "xla_flags" in phase.settings:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {phase.settings['xla_flags']}".strip()
    if phase.kind == "cap" and memory:  # JAX's allocator may take this much of the GPU, no more
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, CAP_BYTES / memory):.4f}"
    return env


def run_phase_process(args, phase: Phase, path: pathlib.Path, work: pathlib.Path, memory: int | None) -> str:
    """Run `phase` in a process of its own; what became of it."""
    command = [sys.executable, __file__, "--phase", phase.name, "--results", str(path), "--work", str(work),
               *(["--quick"] if args.quick else []), *(["--keep-freed-memory"] if phase.keep_freed_memory else [])]
    print(f"== {phase.name} (up to {phase.timeout_s} s)", flush=True)
    start = time.time()
    try:
        code = subprocess.run(command, env=phase_environment(phase, work, memory, os.environ),
                              timeout=phase.timeout_s).returncode
    except subprocess.TimeoutExpired:
        return f"timed out after {phase.timeout_s} s"
    record(path, phase.name, wall_s=time.time() - start)
    return "done" if code == 0 else f"failed (exit {code}) after {time.time() - start:.0f} s"


# -- in a phase's process ----------------------------------------------------------------------
class Say:
    """Print a figure at once, tagged with its phase, and write its fields to the results file."""

    def __init__(self, path: pathlib.Path, phase: Phase):
        self.path, self.phase = path, phase

    def __call__(self, line: str, **fields) -> None:
        print(f"[{self.phase.name}] {line}", flush=True)
        record(self.path, self.phase.name, **fields)

    def results(self, phase: str) -> dict:
        return json.loads(self.path.read_text())["phases"].get(phase, {})


def course_trainer(settings: dict, program: str, dtype: str | None = None):
    """bench/programs.py's trainer of a course program, as `settings` change the profile (its
    `model`, its batch's `rows`, T5Config's fields in `config`): (Trainer, lengths, packed, profile)."""
    import jax
    import jax.numpy as jnp
    from t5nb import mesh as mesh_lib
    from t5nb.profiles import get_profile
    from programs import course_trainers

    profile = get_profile(settings["profile"])
    profile = dataclasses.replace(profile, model=settings.get("model", profile.model),
                                  batch_size=settings.get("rows", profile.batch_size),
                                  execution={**(profile.execution or {}), **settings.get("config", {})})
    mesh = mesh_lib.make_mesh(devices=jax.devices()[:1])
    trainer, lengths, packed = course_trainers(profile, jnp.dtype(dtype or settings["dtype"]), mesh)[program]
    return trainer, lengths, packed, profile


class Laps:
    """Seconds from one mark to the next, the first from the process's start."""

    def __init__(self):
        self.seconds, self._last = {}, STARTED

    def __call__(self, name: str) -> None:
        now = time.time()
        self.seconds[name], self._last = now - self._last, now


def cache_events() -> collections.Counter:
    """JAX's persistent-cache events from now on, counted by name as they happen: compile
    requests, hits (loads), misses (compiled and written)."""
    import jax

    counts = collections.Counter()
    jax.monitoring.register_event_listener(
        lambda event, **_: counts.update([event.rsplit("/", 1)[-1]]) if "/compilation_cache/" in event else None)
    return counts


def efficiency(flops: float, step_s: float, peak: float | None, matmul_rate: float) -> dict:
    """A step's model FLOP/s over the chip's data-sheet peak (`mfu`; none on a CPU, which has no
    entry in profiles.CHIPS) and over the matmul rate measured in this process."""
    achieved = flops / step_s
    chip = {"peak_flops": peak, "mfu": achieved / peak} if peak else {}
    return {"analytic_flops": flops, "achieved_flops": achieved, **chip, "matmul_rate_flops": matmul_rate,
            "matmul_rate_fraction": achieved / matmul_rate}


def describe_efficiency(e: dict, dtype: str, framework: str) -> str:
    mfu = (f"MFU {e['mfu']:.1%} of the data sheet's {rate(e['peak_flops'])} ({dtype})" if "mfu" in e
           else "no MFU (no data-sheet peak for this device)")
    return (f"{rate(e['achieved_flops'])}: {mfu}; {e['matmul_rate_fraction']:.1%} of the "
            f"{rate(e['matmul_rate_flops'])} {dtype} matmul rate {framework} measured here")


def rate(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def jax_efficiency(flops: float, step_s: float, dtype: str, quick: bool) -> dict:
    """`efficiency` of a JAX step on this process's first device."""
    import jax
    import jax.numpy as jnp
    from t5nb.profiles import chip_of
    from t5nb.system import time_matmul

    chip = chip_of(jax.devices()[0])
    matmul_rate = time_matmul(1024 if quick else 8192, jnp.dtype(dtype))
    return efficiency(flops, step_s, chip.peak(dtype) if chip else None, matmul_rate)


def device_memory() -> dict:
    """Peak memory so far: the device's, as JAX's allocator saw it, else the process's."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return {"peak_device_gb": stats["peak_bytes_in_use"] / 1e9,
                "device_limit_gb": stats.get("bytes_limit", 0) / 1e9}
    return {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def describe_jax() -> dict:
    import jax

    return {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "compilation_cache": jax.config.jax_compilation_cache_dir}


def timed(step, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `step` after one more, a warm-up."""
    times = []
    for _ in range(1 + repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times[1:]


def stepper(trainer, state, batch):
    """A function that runs one train step on `batch` from the last one's state and waits for it,
    or (`wait=False`) only dispatches it, as the training loop does between its log points."""
    import jax

    carried = [state]

    def step(wait: bool = True):
        carried[0], sums = trainer.train_step(carried[0], batch)
        if wait:
            jax.block_until_ready(sums)

    return step


def compiled_how(before: collections.Counter, events: collections.Counter) -> str:
    """How the train step that ran since `before` (a copy of `events`) came to be."""
    if events["compile_requests_use_cache"] == before["compile_requests_use_cache"]:
        return "compiled already in this process"
    if events["cache_hits"] > before["cache_hits"]:
        return "loaded from the persistent cache"
    return "compiled" + (", written to the persistent cache" if events["cache_misses"] > before["cache_misses"] else "")


def train_phase(phase: Phase, args, say: Say) -> None:
    from programs import make_batch  # bench/programs.py
    import jax
    import numpy as np
    from t5nb import checkpoints
    from t5nb.trainer import train_step_flops

    laps, events = Laps(), cache_events()
    laps("import")
    jax.devices()
    laps("device_start")
    trainer, lengths, _, profile = course_trainer(phase.settings, "pretrain_step")
    config, dtype = trainer.model_config, phase.settings["dtype"]
    rows, inputs, targets = profile.batch_size, lengths["inputs"], lengths["targets"]
    params = trainer.init_params()
    state = trainer.init_state(params)
    laps("init_on_host")
    batch = make_batch(config, rows, inputs, targets)
    sharded = jax.block_until_ready(trainer.shard_batch(batch))
    laps("first_batch")
    step, before = stepper(trainer, state, sharded), events.copy()
    step()
    laps("first_step")
    seconds = {**laps.seconds, "compile": trainer.compile_seconds}
    seconds["first_step"] = seconds.pop("first_step") - trainer.compile_seconds  # after the compile
    how = compiled_how(before, events)
    say(f"{profile.model} {rows} x {inputs}/{targets}, {describe_execution(trainer)}: first step "
        f"{sum(seconds.values()):.1f} s after the process started: "
        + ", ".join(f"{name.replace('_', ' ')} {s:.1f}" for name, s in seconds.items()) + f" (the step {how})",
        model=profile.model, dtype=dtype, batch=[rows, inputs, targets], execution=execution(trainer),
        first_step_from_start_s=sum(seconds.values()), first_step_breakdown_s=seconds,
        compile_s=trainer.compile_seconds, compile_cache=how, **describe_jax())
    times = timed(step, 3 if args.quick else 10)
    step_s = statistics.median(times)
    memory = device_memory()
    planned = trainer.train_step_memory(batch)  # XLA's memory analysis of the step compiled above
    state_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(trainer.abstract_state()))
    limit = memory.get("device_limit_gb", 0) * 1e9
    fit = int(rows * (limit - state_bytes) / (planned - state_bytes)) // 8 * 8 if limit else None
    say(f"step {step_s * 1e3:.1f} ms (median of {len(times)}), {rows * (inputs + targets) / step_s:,.0f} tokens/s; "
        + ", ".join(f"{k.removesuffix('_gb').replace('_', ' ')} {v:.2f} GB" for k, v in memory.items())
        + f"; XLA plans {planned / 1e9:.2f} GB" + (f", so about {fit} rows would fit" if fit else ""),
        step_s=step_s, step_times_s=times, planned_gb=planned / 1e9, rows_fitting_estimate=fit, **memory)
    flops = train_step_flops(config, rows, inputs, targets)
    measured = jax_efficiency(flops, step_s, dtype, args.quick)
    say(describe_efficiency(measured, dtype, "JAX"), **measured)
    if trainer.run_config.attention == "dot_product_attention":
        kernels = attention_kernels(trainer, sharded, inputs, targets)
        say(f"attention: {kernels['chosen']} chosen; the step's program calls "
            + (", ".join(f"{target} x {n}" for target, n in kernels["cudnn_calls"].items()) or "no cuDNN kernel"),
            attention_kernels=kernels)
    if phase.settings.get("save_for_hf"):
        out = args.work / phase.name
        out.mkdir()
        checkpoints.save_hf(trainer.model(jax.device_get(params)), out / "hf")
        np.savez(out / "batch.npz", **batch)
        (out / "meta.json").write_text(json.dumps({"dtype": dtype, "flops": flops, "step_s": step_s}))


def attention_kernels(trainer, batch, inputs: int, targets: int) -> dict:
    """Which attention a fused-attention step ran: what `t5nb.model.attention_implementation`
    chose for each of the model's attentions, and the cuDNN fused-attention custom calls in the
    compiled program, by target (none: XLA's attention throughout)."""
    from t5nb.model import attention_implementation

    c = trainer.run_config
    program = trainer.compile_train_step(trainer.abstract_state(), batch).as_text()  # the one that ran
    lengths = {"encoder": (inputs, inputs), "decoder": (targets, targets), "encoder_decoder": (targets, inputs)}
    chosen = {name: attention_implementation(q, k, c.head_dim, c.dtype) for name, (q, k) in lengths.items()}
    return {"chosen": chosen, "cudnn_calls": cudnn_attention_calls(program)}


def cudnn_attention_calls(program: str) -> dict:
    """A compiled program's calls of cuDNN's fused attention (forward and backward), by target."""
    return dict(sorted(collections.Counter(re.findall(r'custom_call_target="(__cudnn\$fmha[^"]*)"', program)).items()))


def execution(trainer) -> dict:
    """How `trainer`'s model ran (`run_config`): T5Config's execution fields, those its config
    asks as "auto" shown as "<the choice> (auto)"."""
    from t5nb.config import EXECUTION_FIELDS

    return {name: str(getattr(trainer.run_config, name))
            + (" (auto)" if str(getattr(trainer.model_config, name)) == "auto" else "") for name in EXECUTION_FIELDS}


def describe_execution(trainer) -> str:
    return ", ".join(f"{name} {value}" for name, value in execution(trainer).items())


def profile_phase(phase: Phase, args, say: Say) -> None:
    """Each model's step timed, then profiled (bench/step_profile.py): where its time goes."""
    from programs import make_batch  # bench/programs.py
    import step_profile  # bench/step_profile.py
    from t5nb.trainer import train_step_flops

    events = cache_events()
    for key, model in phase.settings["models"].items():
        trainer, lengths, _, profile = course_trainer({**phase.settings, "model": model}, "pretrain_step")
        config, dtype = trainer.model_config, phase.settings["dtype"]
        rows, inputs, targets = profile.batch_size, lengths["inputs"], lengths["targets"]
        sharded = trainer.shard_batch(make_batch(config, rows, inputs, targets))
        step = stepper(trainer, trainer.init_state(), sharded)
        before = events.copy()
        step()
        how = compiled_how(before, events)
        step_s = statistics.median(timed(step, 3 if args.quick else 10))
        measured = jax_efficiency(train_step_flops(config, rows, inputs, targets), step_s, dtype, args.quick)
        fields = {"model": model, "batch": [rows, inputs, targets], "execution": execution(trainer),
                  "step_s": step_s, "compile_s": trainer.compile_seconds, "compile_cache": how, **measured}
        say(f"{model} {rows} x {inputs}/{targets}, {describe_execution(trainer)}: step {step_s * 1e3:.1f} ms, "
            f"compile {trainer.compile_seconds:.1f} s ({how}); {describe_efficiency(measured, dtype, 'JAX')}",
            **{key: fields})
        program = trainer.compile_train_step(trainer.abstract_state(), sharded).as_text()  # the one that ran
        profiled = 2 if args.quick else 3

        def run():  # as the training loop runs them: each dispatched as the last is, the last waited for
            for i in range(profiled):
                step(wait=i == profiled - 1)

        try:
            fields["profile"] = step_profile.profile(run, program, profiled,
                                                     keep=args.results.with_name(f"{args.results.stem}-profile-{key}"))
        except Exception as error:  # the timing above stands, and the next model is measured
            say(f"{model}: the profiler failed: {type(error).__name__}: {error}"[:500],
                **{key: {**fields, "profile_error": f"{type(error).__name__}: {error}"[:2000]}})
            continue
        say(f"{model}: {fields['profile']['span_ms']:.1f} ms a step under the profiler; where its time goes:\n"
            + step_profile.table(fields["profile"]), **{key: fields})


def compile_phase(phase: Phase, args, say: Say) -> None:
    """The train steps of the phases `of` names, traced, lowered and compiled again in a fresh
    process whose persistent cache they are in: a later run's seconds, beside their first."""
    from programs import make_batch  # bench/programs.py

    events, phases = cache_events(), {p.name: p for p in plan(args.quick)}
    for name in phase.settings["of"]:
        trainer, lengths, _, profile = course_trainer(phases[name].settings, "pretrain_step")
        batch = make_batch(trainer.model_config, profile.batch_size, lengths["inputs"], lengths["targets"])
        before, start = events.copy(), time.perf_counter()
        trainer.compile_train_step(trainer.abstract_state(), trainer.shard_batch(batch))
        seconds, first, how = time.perf_counter() - start, say.results(name), compiled_how(before, events)
        say(f"{name}'s step ({describe_execution(trainer)}) again: {seconds:.1f} s, {how}; "
            f"its first {first.get('compile_s', float('nan')):.1f} s ({first.get('compile_cache', 'not run')})",
            **{name: {"warm_compile_s": seconds, "compile_cache": how, "first_compile_s": first.get("compile_s"),
                      "execution": execution(trainer)}})


def decode_phase(phase: Phase, args, say: Say) -> None:
    from programs import make_batch  # bench/programs.py
    import numpy as np
    from t5nb import checkpoints, decode

    s = phase.settings
    trainer, _, _, profile = course_trainer(s, "decode_batch")
    model = trainer.model(trainer.init_params())
    out = args.work / phase.name
    out.mkdir()
    for rows in s["batches"]:
        tokens = make_batch(trainer.model_config, rows, s["inputs"], 1, seed=1)["encoder_input_tokens"]
        times = []
        for _ in range(1 + (1 if args.quick else 3)):  # the first one compiles
            start = time.perf_counter()
            sequences = np.asarray(decode.greedy_decode(model, tokens, s["new_tokens"]).sequences)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times[1:])
        say(f"{profile.model} {s['dtype']} greedy, batch {rows}, {s['inputs']} tokens in, {s['new_tokens']} out: "
            f"{seconds * 1e3:.1f} ms ({rows * s['new_tokens'] / seconds:,.0f} tokens/s), first call {times[0]:.1f} s",
            **{f"batch_{rows}": {"s": seconds, "first_call_s": times[0], "inputs": s["inputs"],
                                 "new_tokens": s["new_tokens"]}}, dtype=s["dtype"])
        np.savez(out / f"batch_{rows}.npz", tokens=tokens, sequences=sequences)
    checkpoints.save_hf(model, out / "hf")


def curves_phase(phase: Phase, args, say: Say) -> None:
    from programs import make_batch  # bench/programs.py
    import jax
    import numpy as np

    s = phase.settings
    trainers = {dtype: course_trainer(s, "pretrain_step", dtype) for dtype in ("float32", "bfloat16")}
    first, lengths, _, profile = trainers["float32"]
    rows = profile.batch_size if args.quick else CURVE_BATCH
    if CURVE_BATCHES.exists():
        source, length = CURVE_BATCHES.name, {"encoder": lengths["inputs"], "decoder": lengths["targets"]}
        stored = {name: a[:s["steps"], :rows, :length[name.split("_")[0]]].astype(np.int32)
                  for name, a in np.load(CURVE_BATCHES).items()}
        batches = [{name: a[i] for name, a in stored.items()} for i in range(len(stored["encoder_input_tokens"]))]
    else:
        source = "random tokens (no bench/gpu_curve_batches.npz)"
        batches = [make_batch(first.model_config, rows, lengths["inputs"], lengths["targets"], seed=i)
                   for i in range(s["steps"])]
    losses = {}
    for dtype, (trainer, *_) in trainers.items():  # the same initialisation: the trainers' seed
        state, curve = trainer.init_state(), []
        for step, batch in enumerate(batches, 1):
            state, sums = trainer.train_step(state, trainer.shard_batch(batch))
            if step % CURVE_EVERY == 0 or step == len(batches):
                sums = jax.device_get(sums)
                curve.append(float(sums["loss"] / sums["weight"]))
        losses[dtype] = curve
        say(f"{profile.model} {dtype}, {len(batches)} steps on {source}: losses {', '.join(f'{x:.3f}' for x in curve)}",
            **{f"losses_{dtype}": curve}, batches=source, steps=len(batches), every=CURVE_EVERY)
    relative = np.abs(np.subtract(losses["bfloat16"], losses["float32"])) / np.asarray(losses["float32"])
    say(f"bfloat16 against float32: largest relative difference {relative.max():.2%}, last {relative[-1]:.2%}",
        max_relative_difference=float(relative.max()), last_relative_difference=float(relative[-1]))


def packed_batch(config, rows: int, inputs: int, targets: int) -> dict:
    """A packed pretraining batch's features: two examples a row."""
    import numpy as np
    from programs import make_batch  # bench/programs.py

    batch = make_batch(config, rows, inputs, targets)
    for name, length in (("encoder", inputs), ("decoder", targets)):
        half = length // 2
        segments = np.r_[np.ones(half), np.full(length - half, 2)]
        positions = np.r_[np.arange(half), np.arange(length - half)]
        batch[f"{name}_segment_ids"] = np.tile(segments, (rows, 1)).astype(np.int32)
        batch[f"{name}_positions"] = np.tile(positions, (rows, 1)).astype(np.int32)
    return batch


def cap_phase(phase: Phase, args, say: Say) -> None:
    """One course program, run once in a process whose JAX may use CAP_BYTES of the GPU."""
    from programs import make_batch  # bench/programs.py
    import jax
    import numpy as np
    from t5nb import decode
    from programs import TRAIN_STEPS

    program = phase.settings["program"]
    trainer, lengths, packed, profile = course_trainer(phase.settings, program)
    batch = (packed_batch if packed else make_batch)(trainer.model_config, profile.batch_size,
                                                     lengths["inputs"], lengths["targets"])
    state = trainer.init_state()
    if program in TRAIN_STEPS:
        state, out = trainer.train_step(state, trainer.shard_batch(batch))
    elif program == "eval_step":
        out = trainer.eval_step(state.params, trainer.shard_batch(batch))
    else:
        tokens = np.resize(batch["encoder_input_tokens"], (EVAL_BATCH, lengths["inputs"]))
        out = decode.greedy_decode(trainer.model(state.params), tokens, lengths["targets"]).sequences
    jax.block_until_ready(out)
    cap = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    planned = trainer.train_step_memory(batch) / 1e9 if program in TRAIN_STEPS else None
    memory = device_memory()
    say(f"{profile.model} {phase.settings['dtype']} {program} ran {'within 16 GB' if cap else 'with no cap (no GPU)'}: "
        + ", ".join(f"{k.removesuffix('_gb').replace('_', ' ')} {v:.2f} GB" for k, v in memory.items())
        + (f", XLA planned {planned:.2f} GB" if planned else ""),
        cap_gb=CAP_BYTES / 1e9 if cap else None, planned_gb=planned, **memory)


def harness():
    """bench/run.py: transformers' train step and the torch side of the measurements (imports torch)."""
    import run

    run.transformers.logging.set_verbosity_error()
    run.transformers.logging.disable_progress_bar()
    return run


def hf_train_phase(phase: Phase, args, say: Say) -> None:
    """transformers' train step on `needs`' weights and batch; its efficiency against the same
    data-sheet peak, its memory beside t5nb's with and without rematerialisation."""
    import numpy as np
    import torch

    run = harness()
    work, ours, warmup = args.work / phase.needs, say.results(phase.needs), 1
    meta = json.loads((work / "meta.json").read_text())
    batch = dict(np.load(work / "batch.npz"))
    compiled = phase.settings.get("compiled", False)
    hf = run.bench_hf(str(work / "hf"), batch, meta["dtype"], warmup, 3 if args.quick else 10, compiled=compiled)
    # when its first step ended, from the process's start: now, less the steps after it (a warm-up as the median)
    from_start = time.time() - STARTED - sum(hf["step_times_s"]) - warmup * hf["step_s"]
    measured = efficiency(meta["flops"], hf["step_s"], ours.get("peak_flops"),
                          run.time_torch_matmul(1024 if args.quick else 8192, getattr(torch, meta["dtype"])))
    memory = {f"{name.removesuffix('_mb')}_gb": mb * 2**20 / 1e9 for name, mb in hf.items() if name.endswith("_mb")}
    peak = "peak_device_gb" if "peak_device_gb" in memory else "peak_rss_gb"
    t5nb = {f"t5nb, remat {policy}": say.results(name).get(peak)
            for policy, name in ((ours["execution"]["remat_policy"], phase.needs), ("none", "small-remat-none"))}
    say(f"transformers {'torch.compile' if compiled else 'eager'} {meta['dtype']} (autocast), same weights and batch: "
        f"step {hf['step_s'] * 1e3:.1f} ms, first step {from_start:.1f} s after the process started "
        f"({hf['first_step_s']:.1f} s its call; t5nb's {ours['first_step_from_start_s']:.1f} s); "
        f"{describe_efficiency(measured, meta['dtype'], 'torch')}; "
        f"t5nb {hf['step_s'] / meta['step_s']:.2f}x as fast; {peak.removesuffix('_gb').replace('_', ' ')}: "
        f"transformers (no remat) {memory[peak]:.2f} GB, "
        + ", ".join(f"{name} {gb:.2f} GB" for name, gb in t5nb.items() if gb is not None),
        **{name: value for name, value in hf.items() if not name.endswith("_mb")}, **memory, **measured,
        first_step_from_start_s=from_start, t5nb_peak_gb=t5nb, t5nb_speedup=hf["step_s"] / meta["step_s"],
        torch=torch.__version__, transformers=run.transformers.__version__, torch_device=run.torch_device().type)


def hf_decode_phase(phase: Phase, args, say: Say) -> None:
    import numpy as np
    import torch

    run = harness()
    work, ours = args.work / phase.needs, say.results(phase.needs)
    model = run.transformers.T5ForConditionalGeneration.from_pretrained(work / "hf").to(run.torch_device()).eval()
    for path in sorted(work.glob("batch_*.npz"), key=lambda p: int(p.stem.split("_")[1])):
        stored, t5nb = np.load(path), ours[path.stem]
        inputs = torch.from_numpy(stored["tokens"].astype(np.int64)).to(run.torch_device())
        out = {}

        def generate():
            with torch.no_grad(), torch.autocast(run.torch_device().type, torch.bfloat16,
                                                 enabled=ours["dtype"] == "bfloat16"):
                out["tokens"] = model.generate(inputs, attention_mask=inputs > 0, do_sample=False, num_beams=1,
                                               use_cache=True, max_new_tokens=t5nb["new_tokens"]).cpu().numpy()[:, 1:]
            run.torch_sync()

        first, times = run.timed_steps(generate, 0, 1 if args.quick else 3)
        seconds = statistics.median(times)
        same = float(np.mean(stored["sequences"][:, :out["tokens"].shape[1]] == out["tokens"]))
        say(f"transformers generate, batch {len(inputs)}: {seconds * 1e3:.1f} ms, first call {first:.1f} s; "
            f"t5nb {seconds / t5nb['s']:.2f}x as fast; same tokens {same:.0%}",
            **{path.stem: {"s": seconds, "first_call_s": first, "same_tokens_frac": same,
                           "t5nb_speedup": seconds / t5nb["s"]}})


PHASES = {"train": train_phase, "profile": profile_phase, "compile": compile_phase, "decode": decode_phase,
          "curves": curves_phase, "cap": cap_phase, "hf_train": hf_train_phase, "hf_decode": hf_decode_phase}


def run_phase(args) -> None:
    import t5nb  # first: malloc's settings must precede any other thread's first allocation

    tuned = t5nb.host.keep_freed_memory() if args.keep_freed_memory else t5nb.tune_host()
    t5nb.system.keep_compiled_programs()  # as the course keeps them: in the call's folder (JAX_COMPILATION_CACHE_DIR)
    phase = {p.name: p for p in plan(args.quick)}[args.phase]
    say = Say(args.results, phase)
    record(args.results, phase.name, malloc_tuned=tuned)
    try:
        PHASES[phase.kind](phase, args, say)
    except Exception as error:
        say(f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}",
            error=f"{type(error).__name__}: {error}"[:2000])
        raise


# -- here: the curves' real batches ------------------------------------------------------------
def make_curve_batches(steps: int = CURVE_STEPS) -> None:
    """Here, with TensorFlow: CURVE_STEPS packed span-corruption batches of the accelerator
    course's pretraining task (CURVE_BATCH rows), tokens as uint16, into CURVE_BATCHES."""
    import numpy as np
    from t5nb import tasks, workflow  # the input pipeline: TensorFlow, on this machine only
    from t5nb.profiles import get_profile

    profile = get_profile("accelerator")
    iterator = tasks.BatchIterator(profile.pretrain_task, workflow.feature_lengths(profile), CURVE_BATCH, seed=0)
    features = [next(iterator) for _ in range(steps)]
    arrays = {name: np.stack([f[name] for f in features]) for name in features[0]}
    arrays = {name: a.astype(np.uint16) if "tokens" in name else a.astype(np.int16) for name, a in arrays.items()}
    np.savez_compressed(CURVE_BATCHES, **arrays)
    print(f"{CURVE_BATCHES}: {steps} batches of {CURVE_BATCH}, {CURVE_BATCHES.stat().st_size / 2**20:.1f} MB")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="t5.1.1-tiny at toy shapes: the whole call on a CPU")
    parser.add_argument("--deadline", type=float, help=f"seconds for the whole call (default {DEADLINE_S[False]}, "
                                                       f"{DEADLINE_S[True]} with --quick)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--make-curve-batches", action="store_true", help="write `curves`' batches (TensorFlow)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="the results file's folder")
    parser.add_argument("--phase", help="one phase, in this process (as the call runs each, with --results, --work)")
    parser.add_argument("--only", help="these phases (names, comma-separated), in this order, not the whole plan")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="with --phase: t5nb.host.keep_freed_memory() first, not t5nb.tune_host()")
    parser.add_argument("--results", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        return run_phase(args)
    if args.make_curve_batches:
        return make_curve_batches()
    phases = plan(args.quick)
    if args.only:
        by_name = {phase.name: phase for phase in phases}
        unknown = [name for name in args.only.split(",") if name not in by_name]
        if unknown:
            parser.error(f"--only: no phase {', '.join(unknown)}; the plan's: {', '.join(by_name)}")
        phases = [by_name[name] for name in args.only.split(",")]
    deadline = args.deadline or DEADLINE_S[args.quick]
    if args.dry_run:
        return print_plan(phases, deadline, args.quick)
    run_all(args, phases, deadline)


if __name__ == "__main__":
    main()
