"""bench/gpu.py's plan, dry: its phases in order (the headline and its profile first, each
transformers phase after the t5nb one it compares with), the headline sure to fit the deadline,
and a call past its deadline skipping each phase, saying so; nothing is compiled and neither
torch nor transformers is needed. Then bench/step_profile.py: a GPU's events classed by their
HLO instructions (a program's text written here), and a small step profiled on this CPU."""
import dataclasses
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
HEADLINE = ["train-small", "profile"]  # sure to run, in this order


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu

    return gpu


@pytest.mark.parametrize("quick", [False, True])
def test_the_plan_runs_the_headline_first_and_each_peer_after_its_t5nb_phase(gpu, quick):
    from programs import PROGRAMS

    phases = gpu.plan(quick)
    names = [phase.name for phase in phases]
    assert names[:len(HEADLINE)] == HEADLINE and len(set(names)) == len(names)
    for i, phase in enumerate(phases):
        if phase.needs:  # what it reads ran before it
            assert phase.needs in names[:i], phase.name
        if phase.framework == "transformers":
            assert phases[names.index(phase.needs)].framework == "t5nb", phase.name
    assert {"hf-train-small", "small-remat-none", "small-unrolled", "compile-warm-cache"} <= set(names)
    assert quick or {"hf-compile-small", "small-dot-product-attention", "small-unrolled-dot-product-attention",
                     "base-unrolled-dot-product-attention"} <= set(names)
    caps = [phase.settings["program"] for phase in phases if phase.kind == "cap"]
    assert caps == list(PROGRAMS) * (1 if quick else 2)
    assert [phase.name for phase in phases if phase.keep_freed_memory] == ["train-small-freed-memory-kept"]
    assert all(phase.kind in gpu.PHASES for phase in phases)


def test_the_variants_change_only_t5nb_config_fields(gpu):
    from t5nb.config import T5Config

    fields = {field.name for field in dataclasses.fields(T5Config)}
    for phase in gpu.plan():
        assert set(phase.settings.get("config", {})) <= fields, phase.name


def test_a_variant_builds_its_trainer_with_the_fields_it_changes(gpu):
    trainer, *_ = gpu.course_trainer({"profile": "rehearsal", "dtype": "float32", "rows": 4,
                                      "config": {"remat_policy": "none", "scan_layers": False}}, "pretrain_step")
    assert (trainer.model_config.remat_policy, trainer.model_config.scan_layers) == ("none", False)


def test_a_fused_attention_phase_records_the_kernel_chosen_and_the_cudnn_calls_its_program_makes(gpu):
    """On a CPU: XLA's attention chosen everywhere, no cuDNN call in the program; a GPU program's
    cuDNN calls (their HLO form) are counted by target."""
    settings = {"profile": "rehearsal", "dtype": "float32", "rows": 4, "config": {"attention": "dot_product_attention"}}
    trainer, lengths, _, profile = gpu.course_trainer(settings, "pretrain_step")
    batch = {name: jax.ShapeDtypeStruct(shape, np.int32, sharding=trainer.batch_sharding) for name, shape in
             (("encoder_input_tokens", (4, lengths["inputs"])), ("decoder_input_tokens", (4, lengths["targets"])),
              ("decoder_target_tokens", (4, lengths["targets"])))}
    kernels = gpu.attention_kernels(trainer, batch, lengths["inputs"], lengths["targets"])
    assert kernels == {"chosen": {"encoder": "xla", "decoder": "xla", "encoder_decoder": "xla"}, "cudnn_calls": {}}
    program = ('%a = custom-call(%q, %k, %v, %b), custom_call_target="__cudnn$fmhaScaleBiasSoftmax"\n'
               '%b = custom-call(%q, %k), custom_call_target="__cudnn$fmhaScaleBiasSoftmaxBackward"\n'
               '%c = custom-call(%q, %k, %v, %b), custom_call_target="__cudnn$fmhaScaleBiasSoftmax"\n'
               '%d = custom-call(%x), custom_call_target="__cublas$gemm"')
    assert gpu.cudnn_attention_calls(program) == {"__cudnn$fmhaScaleBiasSoftmax": 2,
                                                 "__cudnn$fmhaScaleBiasSoftmaxBackward": 1}


def test_each_phase_process_shares_the_calls_cache_and_gets_its_own_settings(gpu, tmp_path):
    phases = {phase.name: phase for phase in gpu.plan()}
    flags = gpu.phase_environment(phases["small-xla-latency-hiding"], tmp_path, None, {"XLA_FLAGS": "--a=1"})
    assert flags["XLA_FLAGS"] == "--a=1 --xla_gpu_enable_latency_hiding_scheduler=true"
    assert flags["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax_cache")
    assert gpu.phase_environment(phases["train-small"], tmp_path, None, {"JAX_COMPILATION_CACHE_DIR": "kept"}) == {
        "JAX_COMPILATION_CACHE_DIR": "kept"}
    cap = gpu.phase_environment(phases["cap-accelerator-pretrain_step"], tmp_path, 141 * 10**9, {})
    assert float(cap["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == pytest.approx(16 / 141, abs=1e-4)


@pytest.mark.parametrize("quick, minutes", [(False, 8), (True, 3)])
def test_the_headline_fits_the_deadline(gpu, quick, minutes):
    deadline = gpu.DEADLINE_S[quick]
    assert deadline <= minutes * 60
    rows = gpu.schedule(gpu.plan(quick), deadline)
    assert [phase.name for phase, _, sure in rows if sure][:len(HEADLINE)] == HEADLINE
    assert all(phase.timeout_s <= deadline for phase, _, _ in rows)
    assert [end for _, end, _ in rows] == sorted(end for _, end, _ in rows)


def test_the_dry_run_prints_the_plan_and_starts_nothing():
    script = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import gpu; gpu.main(['--dry-run']); "
              "from jax._src import xla_bridge; "
              "assert 'torch' not in sys.modules and 'transformers' not in sys.modules and not xla_bridge._backends")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split()[1] == "train-small" and "(sure)" in lines[0]
    assert lines[-1].startswith("deadline 470 s: the first 5 phases fit it")
    expected_end = int(lines[-1].split("the last ending by ")[1].split()[0])
    expected_to_run = [line.split()[1] for line in lines[:-1] if "expected: skipped" not in line]
    assert expected_end <= 470 and "hf-compile-small" in expected_to_run


def test_only_runs_the_phases_it_names_in_its_order_and_refuses_a_name_not_in_the_plan():
    command = [sys.executable, str(BENCH / "gpu.py"), "--dry-run", "--only"]
    out = subprocess.run([*command, "train-base,train-small"], capture_output=True, text=True, check=True).stdout
    assert [line.split()[1] for line in out.splitlines()[:-1]] == ["train-base", "train-small"]
    refused = subprocess.run([*command, "train-small,train-tiny"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--only: no phase train-tiny; the plan's: train-small, profile," in refused.stderr


def test_a_call_past_its_deadline_skips_every_phase_saying_so(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--quick", "--deadline", "5", "--out", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "-- train-small: skipped: needs up to" in out
    [path] = tmp_path.glob("gpu-*-quick.json")
    results = json.loads(path.read_text())
    assert results["deadline_s"] == 5 and len(results["plan"]) == len(results["phases"])
    assert all(phase["status"].startswith("skipped") for phase in results["phases"].values())


@pytest.fixture
def step_profile(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import step_profile

    return step_profile


def gpu_program(loss_line: int) -> str:
    """A GPU program's text as XLA writes it: a cuBLAS matmul, cuDNN's fused attention, a fusion of
    the loss (its metadata by source line, as some JAX versions write it), a copy and a slice of
    a scanned stack (its index counted in scalars)."""
    trainer = pathlib.Path(__file__).resolve().parents[1] / "t5nb" / "trainer.py"
    return f"""HloModule jit_step, entry_computation_layout={{(f32[8,64]{{1,0}})->f32[128,8]{{0,1}}}}

%fused_exp (param_0: f32[8,128]) -> f32[8,128] {{
  %param_0 = f32[8,128]{{1,0}} parameter(0)
  ROOT %exponential.1 = f32[8,128]{{1,0}} exponential(f32[8,128]{{1,0}} %param_0), metadata={{op_name="jit(step)/exp" source_file="{trainer}" source_line={loss_line}}}
}}

%fused_slice (param_0.2: f32[2,8,64], param_1.2: s32[]) -> f32[8,64] {{
  %param_0.2 = f32[2,8,64]{{2,1,0}} parameter(0)
  %param_1.2 = s32[] parameter(1)
  %constant.3 = s32[] constant(1)
  %subtract.4 = s32[] subtract(s32[] %constant.3, s32[] %param_1.2), metadata={{op_name="jit(step)/while/body/sub"}}
  %constant.5 = s32[] constant(0)
  %dynamic-slice.6 = f32[1,8,64]{{2,1,0}} dynamic-slice(f32[2,8,64]{{2,1,0}} %param_0.2, s32[] %subtract.4, s32[] %constant.5, s32[] %constant.5), dynamic_slice_sizes={{1,8,64}}
  ROOT %bitcast.7 = f32[8,64]{{1,0}} bitcast(f32[1,8,64]{{2,1,0}} %dynamic-slice.6)
}}

ENTRY %main.9 (x.1: f32[8,64], w.1: f32[64,128], stacked.1: f32[2,8,64], i.1: s32[]) -> f32[128,8] {{
  %x.1 = f32[8,64]{{1,0}} parameter(0)
  %w.1 = f32[64,128]{{1,0}} parameter(1)
  %stacked.1 = f32[2,8,64]{{2,1,0}} parameter(2)
  %i.1 = s32[] parameter(3)
  %dynamic-slice_fusion = f32[8,64]{{1,0}} fusion(f32[2,8,64]{{2,1,0}} %stacked.1, s32[] %i.1), kind=kLoop, calls=%fused_slice
  %cublas-gemm.1 = (f32[8,128]{{1,0}}, s8[0]{{0}}) custom-call(f32[8,64]{{1,0}} %x.1, f32[64,128]{{1,0}} %w.1), custom_call_target="__cublas$gemm", metadata={{op_name="jit(step)/dot_general"}}
  %get-tuple-element.1 = f32[8,128]{{1,0}} get-tuple-element((f32[8,128]{{1,0}}, s8[0]{{0}}) %cublas-gemm.1), index=0
  %custom-call.2 = (f32[8,128]{{1,0}}, u8[0]{{0}}) custom-call(f32[8,128]{{1,0}} %get-tuple-element.1), custom_call_target="__cudnn$fmhaScaleBiasSoftmax"
  %loop_exponential_fusion = f32[8,128]{{1,0}} fusion(f32[8,128]{{1,0}} %get-tuple-element.1), kind=kLoop, calls=%fused_exp
  ROOT %copy.1 = f32[128,8]{{0,1}} copy(f32[8,128]{{1,0}} %loop_exponential_fusion)
}}
"""


def test_a_gpu_profile_is_classed_by_each_kernels_instruction(step_profile):
    import inspect
    from t5nb import trainer

    source, first = inspect.getsourcelines(trainer.cross_entropy_with_z_loss)
    kinds = step_profile.op_kinds(gpu_program(first + len(source) - 1))
    Event = step_profile.Event
    events = [Event("cublas-gemm.1", "sm90_xmma_gemm_bf16bf16_bf16f32", 0, 100),
              Event("loop_exponential_fusion", "loop_exponential_fusion", 150, 50),
              Event("copy.1", "copy_1", 200, 10), Event(None, "Memcpy DtoD (Device -> Device)", 210, 5),
              Event("custom-call.2", "cudnn_generated_fort_native_sdpa", 300, 100),
              Event("dynamic-slice_fusion", "dynamic_slice_fusion", 400, 20)]
    result = step_profile.time_by_kind(events, kinds, steps=1)
    assert result["ms"] == pytest.approx({step_profile.MATMULS: 100e-6, step_profile.LOSS: 50e-6,
                                          step_profile.COPIES: 35e-6, step_profile.FUSED_ATTENTION: 100e-6,
                                          step_profile.IDLE: 135e-6})
    assert result["span_ms"] == pytest.approx(420e-6) and sum(result["share"].values()) == pytest.approx(1)
    assert kinds["loop_exponential_fusion"] == (step_profile.LOSS, "cross_entropy_with_z_loss")


def test_a_command_buffers_kernels_are_classed_by_the_instructions_they_are_named_after(step_profile):
    """XLA:GPU runs a CUDA graph's kernels as events of the command buffer (`hlo_op`
    command_buffer_N), each kernel named after its instruction with '_' for '.' and '-'."""
    import inspect
    from t5nb import trainer

    source, first = inspect.getsourcelines(trainer.cross_entropy_with_z_loss)
    kinds = step_profile.op_kinds(gpu_program(first + len(source) - 1))
    Event = step_profile.Event
    events = [Event("command_buffer_3", "loop_exponential_fusion", 0, 50), Event("command_buffer_3", "copy_1", 50, 10),
              Event("command_buffer_3", "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT", 60, 100),
              Event("command_buffer_3", "memcpy128", 160, 20)]
    result = step_profile.time_by_kind(events, kinds, steps=1)
    assert result["ms"] == pytest.approx({step_profile.LOSS: 50e-6, step_profile.COPIES: 30e-6,
                                          step_profile.MATMULS: 100e-6})
    assert [row["op"] for row in result["longest"]][:2] == ["nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT",
                                                            "loop_exponential_fusion"]


def test_a_cpu_profile_finds_the_steps_matmuls_loss_optimizer_and_recompute(step_profile):
    import jax
    import jax.numpy as jnp
    import optax
    from t5nb.trainer import cross_entropy_with_z_loss

    optimizer = optax.adafactor(1e-3)

    def loss(w, x, targets):
        hidden = jax.checkpoint(lambda h: jnp.tanh(h @ w), policy=jax.checkpoint_policies.nothing_saveable)(x)
        return cross_entropy_with_z_loss(hidden @ w.T, targets)[0].sum()

    def step(w, state, x, targets):
        updates, state = optimizer.update(jax.grad(loss)(w, x, targets), state, w)
        return optax.apply_updates(w, updates), state

    w, x = jnp.ones((256, 512)) / 512, jnp.ones((64, 256))
    targets = jnp.arange(64) % 512
    arguments = (w, optimizer.init(w), x, targets)
    compiled = jax.jit(step).lower(*arguments).compile()
    result = step_profile.profile(lambda: jax.block_until_ready([compiled(*arguments) for _ in range(2)]),
                                  compiled.as_text(), steps=2)
    for kind in (step_profile.MATMULS, step_profile.LOSS, step_profile.OPTIMIZER, step_profile.REMAT):
        assert result["ms"].get(kind, 0) > 0, (kind, result["ms"])
    assert result["events"] > 0 and step_profile.OTHER not in result["ms"]
    assert "| kind | ms a step | share |" in step_profile.table(result)
