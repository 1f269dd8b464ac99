import dataclasses
import pathlib

import pytest

import t5nb
from t5nb import profiles
from t5nb.profiles import PROFILES, _read_profiles, detect_profile_name


def test_environment_variable_picks_the_profile(monkeypatch):
    monkeypatch.setenv("T5NB_PROFILE", "ci")
    assert t5nb.get_profile().name == "ci"
    monkeypatch.setenv("T5NB_PROFILE", "accelerator")
    assert t5nb.get_profile() is PROFILES["accelerator"]


def test_unset_profile_follows_the_jax_backend(monkeypatch):
    monkeypatch.delenv("T5NB_PROFILE", raising=False)
    assert detect_profile_name() == "cpu"  # the test machines have no accelerator
    monkeypatch.setattr("jax.default_backend", lambda: "tpu")
    assert detect_profile_name() == "accelerator"


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
    the sample-efficiency curve's sizes) differ."""
    accelerator, rehearsal = PROFILES["accelerator"], PROFILES["rehearsal"]
    changed = {field for field in vars(accelerator) if getattr(accelerator, field) != getattr(rehearsal, field)}
    assert changed == {"name", "description", "model", "batch_size", "inputs_length", "targets_length",
                       "pretrain_steps", "finetune_steps", "finetune_inputs_length", "finetune_targets_length",
                       "eval_examples", "eval_every", "eval_batches", "decoded_sample", "matmul_size", "transfer_sizes",
                       "transfer_steps"}
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
