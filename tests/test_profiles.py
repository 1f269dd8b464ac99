import dataclasses
import json
import os
import pathlib
import types

import jax.numpy as jnp
import pytest

import t5nb
from t5nb import profiles, setup_cell, system
from t5nb.profiles import CHIPS, PROFILES, _read_profiles, detect_profile_name


def test_environment_variable_picks_the_profile(monkeypatch):
    monkeypatch.setenv("T5NB_PROFILE", "ci")
    assert t5nb.get_profile().name == "ci"
    monkeypatch.setenv("T5NB_PROFILE", "accelerator")
    assert t5nb.get_profile() is PROFILES["accelerator"]


def test_unset_profile_follows_the_first_device(monkeypatch):
    monkeypatch.delenv("T5NB_PROFILE", raising=False)
    assert detect_profile_name() == "cpu"  # the test machines have no accelerator
    monkeypatch.setattr("jax.devices", lambda *backend: [CHIPS["v5e"].device()])
    assert detect_profile_name() == "accelerator"


def test_the_setup_cells_profile_field_sets_the_profile_and_says_what_it_runs_and_how_long(monkeypatch, capsys,
                                                                                            tmp_path):
    monkeypatch.setenv("T5NB_PROFILE", "ci")
    monkeypatch.setattr(setup_cell, "keep_compiled_programs", lambda: tmp_path)  # the cache: tests/test_compile_cache.py
    # one kind of CPU on record: its times as they are (the next test has two)
    cpu, kind = next(iter(json.loads(profiles.COURSE_TIMES.read_text()).items()))
    (tmp_path / "course_times.json").write_text(json.dumps({cpu: kind}))
    monkeypatch.setattr(profiles, "COURSE_TIMES", tmp_path / "course_times.json")
    assert t5nb.choose_profile("detected").name == "ci"  # what the environment says stays
    assert t5nb.choose_profile("cpu") is PROFILES["cpu"] is t5nb.get_profile()
    assert os.environ["T5NB_PROFILE"] == "cpu"  # the kernel's later cells, and the processes it starts
    said = capsys.readouterr().out
    assert "Profile cpu: " in said and "02 pretrains on facts_pretraining for 1,000 steps" in said
    measured, total = kind["notebooks"], f"{sum(kind['notebooks'].values()) / 60:.0f} min"
    assert f"the course in about {total} (" in said
    assert (f"measured by `make course` (docs/course_times.json) on {cpu} ({total} in all); another CPU, or one busy "
            "with other work, may take longer") in said
    assert "this notebook" not in said  # none named
    t5nb.choose_profile("detected", "02_pretraining")
    said = capsys.readouterr().out
    assert f"this notebook, 02_pretraining: about {measured['02_pretraining'] / 60:.0f} min on cpu" in said
    with pytest.raises(ValueError, match="unknown profile 'tpu'"):
        t5nb.choose_profile("tpu")
    cell = "".join(json.loads((profiles.REPO_ROOT / "notebooks" / "00_setup.ipynb").read_text())["cells"][1]["source"])
    assert f"#@param {json.dumps(profiles.CHOICES)}" in cell  # the form field offers them all
    assert set(profiles.CHOICES) - {"detected"} <= set(PROFILES)


def test_on_a_cpu_each_notebook_is_told_the_least_to_the_most_of_the_kinds_of_cpu_on_record(monkeypatch, tmp_path,
                                                                                             capsys):
    """Two kinds of CPU on record: each notebook from the faster's time to the slower's, whatever
    this CPU's matmul speed, both kinds named with their course's minutes; one kind: its times,
    least and most alike. Under `t5nb course` the setup cell records the CPU and its matmul speed."""
    fast, slow = "2 cores of an AMD EPYC with AVX-512", "2 cores of an AMD EPYC without AVX-512"
    record = tmp_path / "course_times.json"
    record.write_text(json.dumps({
        slow: {"measured": "later", "matmul_gflops": 98.0, "notebooks": {"00_setup": 20.0, "02_pretraining": 1200.0,
                                                                          "03_finetuning": 540.0}},
        fast: {"measured": "earlier", "matmul_gflops": 214.3, "notebooks": {"00_setup": 9.0, "02_pretraining": 600.0,
                                                                             "03_finetuning": 600.0}}}))
    monkeypatch.setattr(profiles, "COURSE_TIMES", record)
    monkeypatch.setattr(profiles, "cpu_matmul_flops", lambda: 50e9)  # slower than either: no matter
    cpu = types.SimpleNamespace(platform="cpu")
    minutes, source = profiles.course_minutes("cpu", cpu, 1)
    assert minutes == {"00_setup": pytest.approx((0.15, 20 / 60)), "02_pretraining": pytest.approx((10.0, 20.0)),
                       "03_finetuning": pytest.approx((9.0, 10.0))}  # each notebook's own least and most
    assert source == (f"measured by `make course` (docs/course_times.json) on {fast} (20 min in all) and {slow} "
                      "(29 min in all); another CPU, or one busy with other work, may take longer")
    monkeypatch.setenv("T5NB_PROFILE", "cpu")
    monkeypatch.setenv("T5NB_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("T5NB_NOTEBOOK", "00_setup")  # as `t5nb course` runs it: the CPU is recorded
    monkeypatch.setattr(setup_cell, "keep_compiled_programs", lambda: tmp_path)
    t5nb.choose_profile("detected", "02_pretraining")
    assert json.loads((tmp_path / "headlines" / "00_setup.json").read_text()) == {
        "cpu": system.cpu_description(), "matmul_gflops": 50.0}
    said = capsys.readouterr().out
    assert "this notebook, 02_pretraining: about 10-20 min on cpu" in said
    assert "the course in about 19-30 min (00: under a minute, 02: 10-20 min, 03: 9-10 min)" in said
    record.write_text(json.dumps({slow: json.loads(record.read_text())[slow]}))
    minutes, source = profiles.course_minutes("cpu", cpu, 1)
    assert minutes == {"00_setup": pytest.approx((1 / 3,) * 2), "02_pretraining": (20.0, 20.0),
                       "03_finetuning": (9.0, 9.0)}  # one kind: least and most alike
    assert source.startswith(f"measured by `make course` (docs/course_times.json) on {slow} (29 min in all);")
    monkeypatch.delenv("T5NB_NOTEBOOK")  # a learner's setup cell records nothing, and times no matmul
    monkeypatch.setattr(profiles, "cpu_matmul_flops", lambda: pytest.fail("a matmul timed outside `t5nb course`"))
    (tmp_path / "headlines" / "00_setup.json").unlink()
    t5nb.choose_profile("detected", "00_setup")
    assert not list((tmp_path / "headlines").iterdir())
    said = capsys.readouterr().out
    assert "this notebook, 00_setup: under a minute on cpu" in said and "about under" not in said
    assert "the course in about 29 min (00: under a minute, 02: 20 min, 03: 9 min)" in said
    record.write_text("{}")
    assert profiles.course_minutes("cpu", cpu, 1) is None


def test_the_cpu_is_described_by_its_model_its_cores_and_whether_it_has_avx_512():
    xeon = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu avx2 avx512f avx512bw\n"
    assert system.cpu_description(xeon + xeon.replace(": 0", ": 1"), 2) == "2 cores of an Intel Xeon with AVX-512"
    epyc = "model name\t: AMD EPYC 7B13 64-Core Processor\nflags\t\t: fpu avx2 avx512_bf16\n"
    assert system.cpu_description(epyc, 1) == "1 core of an AMD EPYC 7B13 without AVX-512"
    assert system.cpu_description("processor\t: 0\nmodel name\t: Neoverse-N1\nFeatures\t: fp asimd\n", 4) == \
        "4 cores of a Neoverse-N1"  # no x86 flags: nothing said of AVX-512
    assert system.cpu_description().startswith(f"{len(os.sched_getaffinity(0))} core")


def test_minutes_are_said_in_whole_minutes_as_a_range_where_the_ends_round_apart():
    assert profiles.said_minutes((0.2, 0.4)) == "under a minute"
    assert profiles.said_minutes((0.3, 0.7)) == "about 1 min"
    assert profiles.said_minutes((12.01, 12.46)) == "about 12 min"
    assert profiles.said_minutes((16.6, 27.2)) == "about 17-27 min"
    assert profiles.said_minutes((4.4, 4.6), about="") == "4-5 min"


def test_on_a_chip_the_setup_cell_prints_the_notebooks_estimated_time(monkeypatch, capsys, tmp_path):
    """A Colab T4 (detected: fp32-gpu) is told the estimate of its notebook and of the course."""
    monkeypatch.delenv("T5NB_PROFILE", raising=False)
    monkeypatch.setattr("jax.devices", lambda *backend: [CHIPS["t4"].device()])
    monkeypatch.setattr("jax.device_count", lambda *backend: 1)
    monkeypatch.setattr(setup_cell, "keep_compiled_programs", lambda: tmp_path)
    monkeypatch.setenv("T5NB_RUNS_DIR", str(tmp_path / "runs"))  # a runtime of its own: no run of 02
    assert t5nb.choose_profile("detected", "03_finetuning").name == "fp32-gpu"
    said = capsys.readouterr().out
    minutes = json.loads(profiles.ESTIMATES.read_text())["setups"]["Colab T4"]["notebooks"]["03_finetuning"]

    assert (f"this notebook, 03_finetuning: about {round(minutes['minutes'])} min on Tesla T4, its first run "
            "(notebook 02's run not found)") in said
    assert "estimated for Colab T4 by bench/accelerator_estimates.py" in said and "not measured" in said
    assert ("before its lesson: Notebook 02's pretraining run is not in "
            f"{tmp_path / 'runs' / 'fp32-gpu' / 'pretraining'}, so this notebook fine-tunes the published") in said
    assert said.index("this notebook, 03") < said.index("before its lesson") < said.index("compiled programs")
    (tmp_path / "runs" / "fp32-gpu" / "pretraining" / "checkpoints" / "1000").mkdir(parents=True)
    t5nb.choose_profile("detected", "03_finetuning")
    said = capsys.readouterr().out
    assert (f"this notebook, 03_finetuning: about {round(minutes['with_02s_run'])} min on Tesla T4, its first run "
            "(notebook 02's run found)") in said
    assert "before its lesson: nothing: notebook 02's pretraining run is in" in said
    t5nb.choose_profile("detected", "06_knowledge_capacity")
    assert "before its lesson: nothing: this notebook trains every model it uses" in capsys.readouterr().out
    t5nb.choose_profile("detected", "02_pretraining")
    assert "before its lesson" not in capsys.readouterr().out


def test_each_estimated_setup_is_what_its_chip_is_told_and_other_profiles_have_no_estimate():
    for setup in json.loads(profiles.ESTIMATES.read_text())["setups"].values():
        chip = next(chip for chip in CHIPS.values() if chip.kind == setup["chip"])
        minutes, source = profiles.course_minutes(setup["profile"], chip.device(), setup["chips"])
        assert minutes == {notebook: (row["minutes"],) * 2 for notebook, row in setup["notebooks"].items()}
        below, above = json.loads(profiles.ESTIMATES.read_text())["assumptions"]["calibration"]["error"]
        assert (f"not measured: the programs an H200 ran took {1 - below:.0%} less to {above - 1:.0%} more than such "
                "estimates") in source
        assert profiles.course_minutes("cpu", chip.device(), setup["chips"]) is None
    assert profiles.course_minutes("ci", types.SimpleNamespace(platform="cpu")) is None


# every chip of the table, and the profile a learner on it gets: bfloat16 chips the
# accelerator course, GPUs without bfloat16 the same course sized for float32
PROFILE_OF_CHIP = {"v5e": "accelerator", "v4": "accelerator", "v3": "accelerator", "t4": "fp32-gpu",
                   "p100": "fp32-gpu", "l4": "accelerator", "a100": "accelerator", "h100": "accelerator",
                   "h200": "accelerator"}


@pytest.mark.parametrize("key", CHIPS)
def test_each_chip_is_detected_with_its_profile_and_peak(monkeypatch, key):
    monkeypatch.delenv("T5NB_PROFILE", raising=False)
    device = CHIPS[key].device()
    monkeypatch.setattr("jax.devices", lambda *backend: [device])
    assert t5nb.get_profile() is PROFILES[PROFILE_OF_CHIP[key]]
    assert profiles.chip_of(device) is CHIPS[key]
    assert profiles.chip_of(types.SimpleNamespace(platform="cpu", device_kind="cpu")) is None


def test_a_chips_peak_is_its_data_sheets_for_the_format_its_matmuls_run_in():
    """bfloat16 at its bfloat16 peak; float32 at TF32's where the chip has TF32 (JAX's default
    matmul precision on an A100 or H100), else at float32's (a T4); a format the chip lacks is refused."""
    assert CHIPS["h200"].peak(jnp.bfloat16) == 989e12 and CHIPS["h200"].peak(jnp.float32) == 494.7e12
    assert CHIPS["t4"].peak(jnp.float32) == 8.1e12 and CHIPS["v5e"].peak("bfloat16") == 197e12
    with pytest.raises(ValueError, match="Tesla T4 has no bfloat16 peak"):
        CHIPS["t4"].peak(jnp.bfloat16)
    for key, chip in CHIPS.items():  # every chip has a peak in the dtype the course computes in on it
        assert chip.peak(profiles.compute_dtype(chip.device())) > 0, key


def test_a_rocm_gpu_gets_a_profile_by_its_architecture():
    """ROCm names a GPU's architecture where CUDA gives a compute capability: CDNA's (MI200's
    gfx90a, MI300's gfx942) compute in bfloat16, a consumer RDNA GPU (gfx1100) in float32."""
    def rocm(architecture):
        return types.SimpleNamespace(platform="gpu", device_kind="AMD Instinct", compute_capability=architecture,
                                     client=types.SimpleNamespace(platform_version="rocm 6.4"))

    assert [profiles.profile_name_for(rocm(arch)) for arch in ("gfx90a", "gfx942", "gfx1100")] == [
        "accelerator", "accelerator", "fp32-gpu"]


def test_fp32_gpu_is_the_accelerator_course_at_smaller_sizes():
    """Same tasks, sources and official checkpoint as the accelerator profile: 02 pretrains on
    C4, 03 transfers to WMT, 04 answers NQ and TriviaQA."""
    accelerator, fp32 = PROFILES["accelerator"], PROFILES["fp32-gpu"]
    same = ("model", "vocabulary", "pretrain_task", "qa_task", "finetune_task", "official_checkpoint")
    assert {name: getattr(fp32, name) for name in same} == {name: getattr(accelerator, name) for name in same}
    assert fp32.pretrain_steps * fp32.batch_size * fp32.inputs_length < (
        accelerator.pretrain_steps * accelerator.batch_size * accelerator.inputs_length)


ESTIMATES = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results" / "accelerator_estimates.json"


def test_the_committed_estimates_are_of_these_profiles_and_chips():
    """bench/accelerator_estimates.py's result, as the README shows it: computed for today's
    profiles and chips (rerun it when they change), each setup on the profile detection gives it,
    each free setup's programs fitting its memory (tests/test_estimates.py holds its times)."""
    result = json.loads(ESTIMATES.read_text())
    assert result["profiles"] == {name: dataclasses.asdict(PROFILES[name]) for name in result["profiles"]}
    for name, setup in result["setups"].items():
        chip = next(key for key, chip in CHIPS.items() if chip.kind == setup["chip"])
        assert dataclasses.asdict(CHIPS[chip]) == result["assumptions"]["chips"][chip]
        assert setup["profile"] == PROFILE_OF_CHIP[chip], name
        if "Colab" in name and "Pro" not in name or "Kaggle" in name:
            assert setup["fits_in_memory"], name


@pytest.mark.parametrize("name", ["accelerator", "fp32-gpu", "rehearsal"])
def test_the_benchmarks_course_programs_are_what_the_workflow_trains(name, monkeypatch):
    """bench/programs.py builds the course's trainers from a profile alone (the GPU machine has
    no TensorFlow): the same model, optimizer and lengths as the workflow's recipes, LoRA's and
    prompt tuning's too."""
    import jax.numpy as jnp

    monkeypatch.syspath_prepend(str(ESTIMATES.parents[1]))
    from programs import PROGRAMS, adapted_trainer, course_trainers

    from t5nb import workflow

    profile = PROFILES[name]
    trainers = course_trainers(profile, jnp.float32, None)
    assert tuple(trainers) == PROGRAMS
    pretraining, finetuning = workflow.pretraining_recipe(profile), workflow.finetune_recipe(profile, profile.qa_task, None)
    recipes = {}
    for method in ("lora", "prompt"):
        adapter, learning_rate = workflow.FINE_TUNING_METHODS[method]
        trainers[method] = (adapted_trainer(profile, jnp.float32, None, method), *trainers["finetune_step"][1:])
        recipes[method] = workflow.finetune_recipe(profile, profile.qa_task, None, adapter=adapter,
                                                   learning_rate=learning_rate)
    for program, recipe in (("pretrain_step", pretraining), ("finetune_step", finetuning), *recipes.items()):
        trainer, lengths, packed = trainers[program]
        assert trainer.model_config == recipe.model_config().replace(dtype=jnp.float32), program
        assert trainer.train_config == recipe.optimizer, program
        assert lengths == {"inputs": recipe.data.inputs_length, "targets": recipe.data.targets_length}, program
        assert packed == (program == "pretrain_step")


def test_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("T5NB_PROFILE", "huge")
    with pytest.raises(ValueError, match="unknown profile 'huge'.*accelerator"):
        t5nb.get_profile()


def test_ci_profile_is_the_smallest():
    ci, cpu = PROFILES["ci"], PROFILES["cpu"]
    assert ci.pretrain_steps < cpu.pretrain_steps and ci.inputs_length <= cpu.inputs_length


def test_rehearsal_is_the_accelerator_course_with_only_its_sizes_changed():
    """CI's dress rehearsal of the Colab path runs the accelerator profile's tasks, sources and
    official checkpoint; only sizes (model preset, batch, lengths, steps, examples, evaluation cadence,
    the sample-efficiency curve's sizes, 06's widths, steps, worlds, exposures and seeds) differ."""
    accelerator, rehearsal = PROFILES["accelerator"], PROFILES["rehearsal"]
    changed = {field for field in vars(accelerator) if getattr(accelerator, field) != getattr(rehearsal, field)}
    assert changed == {"name", "description", "model", "batch_size", "inputs_length", "targets_length",
                       "pretrain_steps", "finetune_steps", "finetune_inputs_length", "finetune_targets_length",
                       "eval_examples", "eval_every", "eval_batches", "decoded_sample", "matmul_size", "transfer_sizes",
                       "transfer_steps", "knowledge_widths", "knowledge_steps", "ssm_width", "capacity_people",
                       "capacity_widths", "capacity_exposures", "capacity_seeds"}
    assert rehearsal.batch_size % 8 == 0  # splits over the 8 simulated devices


def test_a_profile_table_with_a_missing_or_unknown_field_names_the_file_and_profile(tmp_path):
    good = (pathlib.Path(profiles.__file__).with_name("profiles.toml")).read_text()
    path = tmp_path / "profiles.toml"
    path.write_text(good + '\n[mine]\nbase = "cpu"\nbatch_sise = 8\n')
    with pytest.raises(ValueError, match=r"profiles.toml: profile \[mine\]: .*batch_sise"):
        _read_profiles(path)
    path.write_text('[bare]\ndescription = "no sizes"\n')
    with pytest.raises(ValueError, match=r"profile \[bare\]: .*missing .*'model'"):
        _read_profiles(path)
    path.write_text(good + '\n[mine]\nbase = "cpu"\nbatch_size = 8\n')
    assert _read_profiles(path)["mine"] == dataclasses.replace(profiles.PROFILES["cpu"], name="mine", batch_size=8)
