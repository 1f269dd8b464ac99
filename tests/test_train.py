"""Training: loss, steps on meshes, resume after SIGKILL, two processes, NaN guard, logging."""
import collections
import functools
import json
import os
import pathlib
import signal
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5nb import layerwise
from t5nb import model as model_lib
from t5nb.checkpoints import RunCheckpoints, flatten, runs
from t5nb.config import get_config
from t5nb.model import shift_right
from t5nb import train as train_lib
from t5nb import trainer as trainer_lib
from t5nb.profiles import CHIPS
from t5nb.train import train
from t5nb.trainer import TrainConfig, Trainer, cross_entropy_with_z_loss, is_argmax, teacher_forced, train_step_flops

WORKER = pathlib.Path(__file__).with_name("train_worker.py")


def run_worker(tmp_path, *args, devices=1):
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path.parent / "jax_cache"), **os.environ,
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    result = subprocess.run([sys.executable, str(WORKER), *map(str, args)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


def load(path):
    with np.load(path) as arrays:
        return {name: arrays[name] for name in arrays.files}


def test_cross_entropy_with_z_loss_matches_optax():
    logits = jax.random.normal(jax.random.key(0), (2, 5, 11)) * 3
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 11)
    loss, z_term = cross_entropy_with_z_loss(logits, targets, z_loss=1e-4, label_smoothing=0.1)
    smoothed = optax.smooth_labels(jax.nn.one_hot(targets, 11), 0.1 * 11 / 10)  # low = 0.1 / (V - 1)
    entropy = -(0.9 * np.log(0.9) + 10 * 0.01 * np.log(0.01))
    expected = optax.softmax_cross_entropy(logits, smoothed) - entropy
    log_z = jax.nn.logsumexp(logits, -1)
    np.testing.assert_allclose(z_term, 1e-4 * log_z**2, rtol=1e-6)
    np.testing.assert_allclose(loss - z_term, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_the_losss_written_out_gradient_is_the_derivative_of_its_formula(label_smoothing):
    """Both outputs' cotangents (the loss and the z-loss term alone), against autodiff of the
    same formula through optax."""
    logits = jax.random.normal(jax.random.key(0), (2, 5, 11)) * 3
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 11)
    weights = jax.random.uniform(jax.random.key(2), (2, 2, 5))

    def reference(logits):
        smoothed = optax.smooth_labels(jax.nn.one_hot(targets, 11), label_smoothing * 11 / 10)
        log_z = jax.nn.logsumexp(logits, -1)
        z_term = 1e-2 * log_z**2
        return optax.softmax_cross_entropy(logits, smoothed) + z_term, z_term

    def objective(loss_fn):
        return lambda logits: sum(jnp.sum(w * out) for w, out in zip(weights, loss_fn(logits)))

    ours = jax.grad(objective(lambda x: cross_entropy_with_z_loss(x, targets, 1e-2, label_smoothing)))(logits)
    np.testing.assert_allclose(ours, jax.grad(objective(reference))(logits), rtol=1e-5, atol=1e-6)


def test_token_accuracy_is_argmax_with_its_tie_break():
    """Logits with many exact ties (as bf16 logits have): the first top index counts."""
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 3, (4, 6, 9)).astype(np.float32)
    targets = rng.integers(0, 9, (4, 6))
    expected = np.argmax(logits, axis=-1) == targets
    assert 0 < expected.sum() < (logits == logits.max(-1, keepdims=True))[
        np.arange(4)[:, None], np.arange(6), targets].sum()  # ties decide some positions
    np.testing.assert_array_equal(is_argmax(jnp.asarray(logits), jnp.asarray(targets)), expected)


def copy_batch(rows=8, length=10, vocab=64, seed=0):
    x = np.random.default_rng(seed).integers(2, vocab, (rows, length), dtype=np.int32)
    t = x[:, ::-1].copy()
    return {"encoder_input_tokens": x, "decoder_target_tokens": t,
            "decoder_input_tokens": np.asarray(shift_right(t))}


def test_gradient_accumulation_equals_the_full_batch():
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0)
    results = []
    for accum in (1, 2):
        trainer = Trainer(config, TrainConfig(learning_rate=1e-2, grad_accum_steps=accum))
        state, sums = trainer.train_step(trainer.init_state(), trainer.shard_batch(copy_batch()))
        results.append((jax.device_get(state.params), float(sums["loss"])))
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(results[0][0]), jax.tree.leaves(results[1][0])):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_runs_progress_bar_names_the_run(tmp_path, capsys):
    """A notebook that trains several runs (03's sample-efficiency curve) shows a bar for each,
    told apart by its run folder."""
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    train(trainer, Batches(copy_batch()), 2, tmp_path / "finetune_slots_first50_scratch")
    assert "train finetune_slots_first50_scratch: 100%" in capsys.readouterr().err


def test_teacher_forced_answer_accuracy_leaves_out_the_eos_that_ends_each_target(tmp_path):
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    batch = copy_batch()
    batch["decoder_target_tokens"][:, -1] = 1  # EOS
    batch["decoder_input_tokens"] = np.asarray(shift_right(batch["decoder_target_tokens"]))
    params = train(trainer, Batches(batch), 30, tmp_path, progress=False).state.params  # EOS learnt first
    metrics = teacher_forced(trainer, params, [batch])
    logits = trainer.model(params)(batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                                   batch["decoder_target_tokens"])
    right = np.asarray(is_argmax(logits, jnp.asarray(batch["decoder_target_tokens"])))
    np.testing.assert_allclose(metrics["accuracy"], right.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["answer_accuracy"], right[:, :-1].mean(), rtol=1e-6)
    assert right[:, -1].all() and metrics["answer_accuracy"] < metrics["accuracy"]


def test_trainers_of_one_model_and_optimizer_share_their_compiled_train_step():
    """A notebook's fine-tunings of one model compile its step once; another optimizer, another step."""
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0)
    first, second, other = (Trainer(config, TrainConfig(learning_rate=rate)) for rate in (1e-2, 1e-2, 2e-2))
    batch = first.shard_batch(copy_batch())
    compiled = first.compile_train_step(first.abstract_state(), batch)
    assert second.compile_train_step(second.abstract_state(), batch) is compiled
    assert other.compile_train_step(other.abstract_state(), batch) is not compiled


def largest_difference(a: dict, b: dict) -> float:
    return max(float(np.abs(a[name] - b[name]).max()) for name in a)


def same_steps(run: list, reference: list) -> bool:
    """Each step's loss and gradient norm within 0.1% of the reference's (what 02 checks of its
    8-device run): rounding differs by about 1e-6; a gradient summed over d data shards instead of
    averaged has d times the norm."""
    return len(run) == len(reference) and all(
        np.isclose(step[key], expected[key], rtol=1e-3) for step, expected in zip(run, reference) for key in step)


def test_meshes_8x1_4x2_2x4_match_one_device(tmp_path):
    """Every mesh trains the same three steps as one device: each step's loss and gradient norm
    (before the optimizer) agree (`same_steps`), and the final parameters agree within a bound
    measured on this host. A mesh that sums its data shards' gradients instead of averaging them
    (run here too, deliberately) trains to the same parameters, since Adafactor as configured is
    invariant to the gradient's scale; its gradient norms give it away.

    The parameters' bound is empirical, calibrated on the host that runs it: the one-device run
    from initial parameters each moved by 16 ulps (random directions, two draws; a mesh rounds
    each of the step's sums at up to 2d places for d <= 8 devices, where one device rounds once)
    shows how far perturbations of rounding's size carry through three Adafactor steps; the larger
    of the two distances is the bound. On one 2-core machine the meshes differed by at most 1.3e-6
    and the nudged runs by 4e-6 to 2.6e-5. The bound must stay a hundred times below the average
    per-step move of the most-moved parameter element (its whole move over the run, divided by
    the steps: 1.3e-2 there), the size of difference a wrong sharding of the optimizer's state or
    of the dropout mask makes."""
    out = tmp_path / "m"
    steps, ulps = 3, 16
    print(run_worker(tmp_path, "--out", out, "--meshes", "1x1,8x1,4x2,2x4,8x1:summed", "--steps", steps,
                     "--nudge-ulps", ulps, devices=8))
    reference, initial = load(f"{out}.1x1.npz"), load(f"{out}.init.npz")
    reference_steps = json.loads(pathlib.Path(f"{out}.1x1.json").read_text())
    assert len(reference_steps) == steps
    bound = max(largest_difference(load(f"{out}.nudged{seed}.npz"), reference) for seed in range(2))
    assert 0 < bound < largest_difference(reference, initial) / steps / 100
    for shape in ("8x1", "4x2", "2x4"):
        params = load(f"{out}.{shape}.npz")
        assert params.keys() == reference.keys()
        worst = max(params, key=lambda name: np.abs(params[name] - reference[name]).max())
        assert largest_difference(params, reference) <= bound, (shape, worst)
        assert same_steps(json.loads(pathlib.Path(f"{out}.{shape}.json").read_text()), reference_steps), shape
    summed = json.loads(pathlib.Path(f"{out}.8x1-summed.json").read_text())
    assert largest_difference(load(f"{out}.8x1-summed.npz"), reference) <= bound  # the parameters cannot tell
    assert not same_steps(summed, reference_steps)
    assert [step["grad_norm"] / expected["grad_norm"] for step, expected in zip(summed, reference_steps)] == (
        pytest.approx([8] * steps, rel=1e-3))


def test_a_scanned_data_parallel_step_has_no_two_collectives_that_can_wait_at_once(tmp_path):
    """XLA:CPU starts two collectives with no data dependence between them (an all-reduce of
    the batch, one inside a layer loop) at once on each simulated device; devices waiting in
    both can deadlock (XLA aborts after 40 s: the rehearsal's 04, now and then). The train and
    eval steps the rehearsal runs (scanned layers, 8x1) have no such pair; the control program,
    built with one, is found. Model-parallel meshes' scanned steps still have pairs that XLA's
    partitioner places; this does not assert on them."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path.parent / "jax_cache")}
    result = subprocess.run([sys.executable, str(WORKER.with_name("collective_order.py"))], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(found["control"]) == 1  # its loop and the all-reduce beside it
    assert found["train"] == [] and found["eval"] == []


class Batches:
    def __init__(self, batch):
        self.batch = batch

    def __next__(self):
        return self.batch


@pytest.mark.parametrize("remat_policy,lengths", [("none", (9, 7)), ("minimal", (9, 7)), ("full", (9, 7)),
                                                   ("auto", (9, 7)), ("full", (10, 8))])
def test_fused_attention_under_scan_and_remat_takes_the_kernel_chosen_before_tracing(monkeypatch, remat_policy,
                                                                                   lengths):
    """`attention="dot_product_attention"`, scanned layers, each remat policy, in bfloat16 with
    the device taken for an H100: at odd lengths cuDNN's kernel is never asked for (where it
    refused them in its gradient's forward rule, traced late under scan and remat, past any
    `try`), and the step trains; at even ones it is (a stand-in for it runs XLA's here)."""
    asked, xla_attention = [], jax.nn.dot_product_attention

    def stand_in(*args, implementation=None, **kwargs):
        asked.append(implementation)
        return xla_attention(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    monkeypatch.setattr(model_lib, "attention_implementation",
                        functools.partial(model_lib.attention_implementation, device=CHIPS["h100"].device()))
    monkeypatch.setattr(trainer_lib, "_COMPILED", collections.OrderedDict())  # each step traced afresh
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0, dtype=jnp.bfloat16, scan_layers=True,
                        remat_policy=remat_policy, attention="dot_product_attention", head_dim=8)
    trainer = Trainer(config, TrainConfig(learning_rate=1e-2))
    rng, (inputs, targets) = np.random.default_rng(0), lengths
    target_tokens = rng.integers(2, 64, (8, targets), dtype=np.int32)
    batch = {"encoder_input_tokens": rng.integers(2, 64, (8, inputs), dtype=np.int32),
             "decoder_target_tokens": target_tokens, "decoder_input_tokens": np.asarray(shift_right(target_tokens))}
    state, sums = trainer.train_step(trainer.init_state(), trainer.shard_batch(batch))
    assert np.isfinite(float(sums["loss"])) and int(state.step) == 1
    assert set(asked) == ({"xla"} if inputs % 2 else {"cudnn"})


def test_nan_loss_stops_and_names_the_last_good_checkpoint(tmp_path):
    class CorruptAfterTwo:  # an out-of-vocabulary id embeds as NaN (jnp.take fills), as bad data would
        n = 0

        def __next__(self):
            self.n += 1
            batch = copy_batch()
            if self.n > 2:
                batch["encoder_input_tokens"][0, 0] = 10**6
            return batch

    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    with pytest.raises(FloatingPointError, match=r"loss became nan .*between steps 2 and 3.*last good checkpoint: step 2"):
        train(trainer, CorruptAfterTwo(), 4, tmp_path, checkpoint_every=2, log_every=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2"]


def test_a_non_finite_update_is_never_saved_and_the_error_names_a_finite_checkpoint(tmp_path):
    """A finite loss and gradient, then an update that overflows float32 (learning rate 1e39):
    the loss guard cannot see it; the check at checkpoint time does."""
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0)
    good = Trainer(config, TrainConfig(learning_rate=1e-2, optimizer="adamw"))
    train(good, Batches(copy_batch()), 2, tmp_path, checkpoint_every=2, progress=False)
    overflowing = Trainer(config, TrainConfig(learning_rate=1e39, optimizer="adamw"))
    with pytest.warns(UserWarning, match="changed training settings learning_rate=1e[+]39 [(]was 0.01[)]"), \
            pytest.raises(FloatingPointError, match=r"at step 3 are not finite; not saved.*last good checkpoint: step 2"):
        train(overflowing, Batches(copy_batch()), 4, tmp_path, checkpoint_every=1, log_every=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2"]
    restored = train(good, Batches(copy_batch()), 2, tmp_path, checkpoint_every=1, progress=False).state
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(restored.params))


def test_resume_falls_back_to_the_previous_checkpoint_when_the_newest_is_damaged(tmp_path):
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    train(trainer, Batches(copy_batch()), 4, tmp_path, checkpoint_every=2, progress=False)
    straight = train(trainer, Batches(copy_batch()), 4, tmp_path / "other", checkpoint_every=2, progress=False)
    for path in (tmp_path / "checkpoints" / "4" / "state").rglob("*"):
        if path.is_file() and path.stat().st_size > 1000:
            path.write_bytes(path.read_bytes()[:100])  # truncated
    with pytest.warns(UserWarning, match=r"checkpoint step 4 in .* cannot be read .*; resuming from step 2"):
        resumed = train(trainer, Batches(copy_batch()), 4, tmp_path, checkpoint_every=2, progress=False)
    assert [h["step"] for h in resumed.history] == [2, 4]  # 2 read back from the log, 3 and 4 trained again
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(straight.state.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_ctrl_c_while_a_step_is_logged_saves_that_step_and_the_resumed_run_equals_a_straight_one(tmp_path):
    """SIGINT during the log of step 3, a step with no checkpoint of its own (every 4): the
    loop saves step 3, then stops; resuming ends where a run never interrupted does."""
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    straight = train(trainer, Batches(copy_batch()), 6, tmp_path / "straight", checkpoint_every=4, progress=False)

    def press_ctrl_c_at_step_3(step, metrics):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt, match="stopped by SIGINT at step 3; checkpoint step 3 saved"):
        train(trainer, Batches(copy_batch()), 6, tmp_path / "resumed", checkpoint_every=4, log_every=1,
              on_log=press_ctrl_c_at_step_3, progress=False)
    assert sorted(int(p.name) for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == [3]
    resumed = train(trainer, Batches(copy_batch()), 6, tmp_path / "resumed", checkpoint_every=4, progress=False)
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(straight.state.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_resuming_with_another_model_is_refused_and_config_json_is_kept(tmp_path):
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0)
    train(Trainer(config, TrainConfig(learning_rate=1e-2)), Batches(copy_batch()), 2, tmp_path,
          checkpoint_every=2, progress=False)
    saved = (tmp_path / "config.json").read_text()
    other = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0, mlp_activations=("relu",))
    with pytest.raises(ValueError, match=r"checkpoints of another model.*mlp_activations=\['relu'\] \(saved: \['gelu', 'linear'\]\)"):
        train(Trainer(other, TrainConfig(learning_rate=1e-2)), Batches(copy_batch()), 4, tmp_path,
              checkpoint_every=2, progress=False)
    assert (tmp_path / "config.json").read_text() == saved


def test_a_run_resumes_with_scanned_rematerialised_layers_after_a_warning(tmp_path, monkeypatch):
    """Scanned with remat_policy='full' and Adafactor, a step updates each layer inside the
    backward pass, as soon as its gradient exists (`layerwise.update_in_backward`): with dropout,
    the resumed run ends with the unrolled run's parameters, statistics, loss and gradient norm."""
    steps_updating_in_backward = []
    update_in_backward = layerwise.update_in_backward
    monkeypatch.setattr(layerwise, "update_in_backward",
                        lambda *args: steps_updating_in_backward.append(1) or update_in_backward(*args))
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.1)
    straight = train(Trainer(config, TrainConfig(learning_rate=1e-2)), Batches(copy_batch()), 4, tmp_path / "straight",
                     checkpoint_every=2, progress=False)
    train(Trainer(config, TrainConfig(learning_rate=1e-2)), Batches(copy_batch()), 2, tmp_path / "resumed",
          checkpoint_every=2, progress=False)
    assert steps_updating_in_backward == []
    scanned = Trainer(config.replace(scan_layers=True, remat_policy="full"), TrainConfig(learning_rate=1e-2))
    with pytest.warns(UserWarning, match=r"remat_policy='full' \(was 'none'\), scan_layers=True \(was False\)"):
        resumed = train(scanned, Batches(copy_batch()), 4, tmp_path / "resumed", checkpoint_every=2, progress=False)
    assert steps_updating_in_backward == [1]  # the scanned step, traced once
    assert_close_states(scanned.checkpoint_state(resumed.state), straight.state)
    for metric in ("loss", "accuracy", "grad_norm"):
        np.testing.assert_allclose(resumed.history[-1][metric], straight.history[-1][metric], rtol=1e-5)


def test_a_run_begun_before_a_config_field_existed_resumes_as_its_default_without_a_warning(tmp_path):
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0)
    train(Trainer(config, TrainConfig(learning_rate=1e-2)), Batches(copy_batch()), 2, tmp_path, checkpoint_every=2,
          progress=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["model"]["attention"], saved["train"]["grad_accum_steps"]  # as a run written before they existed
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train(Trainer(config, TrainConfig(learning_rate=1e-2)), Batches(copy_batch()), 4, tmp_path, checkpoint_every=2,
              progress=False)
    with pytest.warns(UserWarning, match=r"attention='dot_product_attention' \(was 'einsum'\)"):
        train(Trainer(config.replace(attention="dot_product_attention"), TrainConfig(learning_rate=1e-2)),
              Batches(copy_batch()), 6, tmp_path, checkpoint_every=2, progress=False)


def assert_close_states(got, expected, atol=1e-5):
    """Two train states in the per-layer layout: the same tree, every number within `atol`."""
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    expected_params = flatten(expected.params)
    for path, value in flatten(got.params).items():
        np.testing.assert_allclose(value, expected_params[path], atol=atol, err_msg=path)
    for a, b in zip(jax.tree.leaves(got.opt_state), jax.tree.leaves(expected.opt_state)):
        np.testing.assert_allclose(a, b, atol=atol)


@pytest.mark.parametrize("optimizer, lora_rank", [("adafactor", 0), ("adamw", 0), ("adafactor", 2)])
def test_a_scanned_state_holds_its_stacks_stacked_and_its_checkpoints_per_layer(tmp_path, optimizer, lora_rank):
    """T5X's scanned layout in the train state (a leading `layers` axis on the parameters and on
    their optimizer statistics: the scan reads them as they are) and the per-layer layout on disk:
    an unrolled trainer restores a scanned run's checkpoint, and both runs train alike, as the
    optimizer updates each layer's matrices on their own (AdamW's clip sees all of them at once);
    the same for LoRA's adapters, which live in the layers."""
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0, lora_rank=lora_rank,
                        lora_targets=("query", "value", "wo"))
    trainers = {name: Trainer(config.replace(scan_layers=name == "scanned"),
                              TrainConfig(learning_rate=1e-2, optimizer=optimizer)) for name in ("scanned", "unrolled")}
    scanned_state = trainers["scanned"].init_state()
    name = "lora_a" if lora_rank else "kernel"
    stacked = scanned_state.params["decoder"]["layers"]["mlp"]["wo"][name]
    per_layer = trainers["unrolled"].init_state().params["decoder"]["layers"]
    assert stacked.shape == (config.num_decoder_layers, *per_layer[0]["mlp"]["wo"][name].shape)
    np.testing.assert_array_equal(stacked[1], per_layer[1]["mlp"]["wo"][name])  # the same initialisation
    statistics = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(scanned_state.opt_state)
                  if "'decoder']['layers']" in jax.tree_util.keystr(path)]
    assert statistics and all(leaf.shape[0] == config.num_decoder_layers for leaf in statistics)
    runs = {name: train(trainer, Batches(copy_batch()), 3, tmp_path / name, checkpoint_every=3, progress=False)
            for name, trainer in trainers.items()}
    restored = RunCheckpoints(tmp_path / "scanned" / "checkpoints").restore(trainers["unrolled"].abstract_checkpoint())
    assert_close_states(restored, runs["unrolled"].state)


def test_a_run_warns_before_its_first_step_when_its_checkpoints_will_not_fit(tmp_path, monkeypatch):
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    size = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(trainer.abstract_checkpoint()))
    usage = runs.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(runs.shutil, "disk_usage", lambda path: usage._replace(free=3 * size))  # room for 3, not 4
    with pytest.warns(UserWarning, match=rf"MB free, but this run's checkpoints need about {4 * size / 2**20:,.0f} MB "
                                         r"\(3 kept .*run\.keep_checkpoints.*run\.model_dir"):
        train(trainer, Batches(copy_batch()), 1, tmp_path, checkpoint_every=1, progress=False)


def test_batch_not_divisible_by_data_parallel_degree_is_clear():
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64), TrainConfig(grad_accum_steps=3))
    with pytest.raises(ValueError, match=r"global batch 8 .* not divisible .* grad_accum_steps 3"):
        trainer.shard_batch(copy_batch())


def test_metrics_go_to_tensorboard_and_history(tmp_path):
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    logged = []
    result = train(trainer, Batches(copy_batch()), 4, tmp_path, log_every=2, eval_every=4,
                   eval_batches=lambda: [copy_batch(seed=1)], progress=False,
                   decoded_eval=lambda model: {"vocab": model.config.vocab_size},  # gets the model of the state
                   on_log=lambda s, m: logged.append((s, "validation/loss" in m)))
    assert logged == [(2, False), (4, False), (4, True)] and [h["step"] for h in result.history] == [2, 4]
    assert result.train_eval[0][1]["decoded/vocab"] == 64
    for name in ("loss", "accuracy", "z_loss", "learning_rate", "grad_norm", "seqs_per_s", "target_tokens_per_s",
                 "matmul_rate_fraction"):
        assert np.isfinite(result.history[-1][name]), name
    assert "mfu" not in result.history[-1]  # a CPU has no data sheet's peak in profiles.CHIPS
    assert result.history[-1]["learning_rate"] == pytest.approx(1e-2)
    assert result.train_eval[0][0] == 4 and 0 <= result.train_eval[0][1]["accuracy"] <= 1
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))
    assert list((tmp_path / "training_eval" / "train_eval").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "config.json").read_text())["train"]["learning_rate"] == 1e-2


def test_a_resumed_or_finished_run_returns_and_redraws_its_whole_curve(tmp_path):
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    common = dict(log_every=2, checkpoint_every=2, eval_every=2, eval_batches=lambda: [copy_batch(seed=1)],
                  decoded_eval=lambda model: {"mean": float(jnp.mean(model.token_embedder.embedding[...]))}, progress=False)
    straight = train(trainer, Batches(copy_batch()), 6, tmp_path / "straight", **common)
    train(trainer, Batches(copy_batch()), 4, tmp_path / "resumed", **common)
    for num_steps in (6, 6):  # resumed at step 4, then called again when finished
        drawn = []
        resumed = train(trainer, Batches(copy_batch()), num_steps, tmp_path / "resumed",
                        on_log=lambda step, metrics: drawn.append((step, sorted(metrics)[0])), **common)
        assert drawn == [(step, name) for step in (2, 4, 6) for name in ("accuracy", "validation/accuracy")]
        assert [h["step"] for h in resumed.history] == [h["step"] for h in straight.history] == [2, 4, 6]
        np.testing.assert_allclose([h["loss"] for h in resumed.history], [h["loss"] for h in straight.history],
                                   rtol=1e-6)  # event files keep float32
        assert [step for step, _ in resumed.train_eval] == [2, 4, 6]
        for name in ("loss", "decoded/mean"):
            np.testing.assert_allclose([m[name] for _, m in resumed.train_eval],
                                       [m[name] for _, m in straight.train_eval], rtol=1e-6)


def test_tiny_model_loss_falls_on_the_offline_facts_corpus(tmp_path):
    from t5nb import tasks

    batches = tasks.BatchIterator("facts_span_corruption", {"inputs": 64, "targets": 16}, 16)
    config = get_config("t5.1.1-tiny", vocab_size=tasks.get_vocabulary("facts").vocab_size, dropout_rate=0.0)
    trainer = Trainer(config, TrainConfig(learning_rate=3e-2))
    history = train(trainer, batches, 60, tmp_path, log_every=20, progress=False).history
    print([round(h["loss"], 3) for h in history])
    assert history[-1]["loss"] < history[0]["loss"] - 0.5
    assert batches.state()["batches"] == 60


def test_init_state_copies_params_so_donation_leaves_the_callers_arrays_alive():
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    params = trainer.init_params()
    state, _ = trainer.train_step(trainer.init_state(params), trainer.shard_batch(copy_batch()))
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params))  # not deleted by donation



def test_mfu_divides_by_the_data_sheets_peak_in_the_models_compute_dtype(monkeypatch):
    """On a chip of profiles.CHIPS a run's MFU (PaLM's) divides by its peak in the dtype the
    model computes in; elsewhere a run reports its FLOP/s over the measured matmul rate."""
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dtype=jnp.bfloat16), TrainConfig(learning_rate=1e-2))
    monkeypatch.setattr(train_lib, "chip_of", lambda device: CHIPS["h100"])
    assert train_lib._utilisation(trainer) == ("mfu", 989e12 * trainer.mesh.devices.size)


@pytest.mark.parametrize("chip,dtype", [("t4", jnp.bfloat16), ("v5e", jnp.float32), ("h100", jnp.bfloat16)])
def test_a_run_trains_to_the_end_and_logs_mfu_only_where_its_chip_has_a_peak_for_its_dtype(
        tmp_path, monkeypatch, chip, dtype):
    """A T4's data sheet has no bfloat16 peak, a TPU's no float32 one: the run trains on and logs
    no `mfu` (and no other utilisation in its place); on an H100 it logs one."""
    monkeypatch.setattr(train_lib, "chip_of", lambda device: CHIPS[chip])
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0, dtype=dtype),
                      TrainConfig(learning_rate=1e-2))
    result = train(trainer, Batches(copy_batch()), 2, tmp_path, log_every=1, progress=False)
    assert [h["step"] for h in result.history] == [1, 2]
    assert "matmul_rate_fraction" not in result.history[-1]
    assert ("mfu" in result.history[-1]) == (CHIPS[chip].peak_format(dtype) is not None) == (chip == "h100")


@pytest.mark.parametrize("adapters", [{}, {"lora_rank": 8},
                                      {"lora_rank": 4, "lora_targets": ("query", "key", "out", "wi_0", "wo")},
                                      {"prompt_length": 20}, {"lora_rank": 8, "prompt_length": 5}])
def test_a_steps_model_flops_are_xlas_count_of_its_matmuls_and_count_every_scanned_layer(adapters):
    """`train_step_flops` counts the matmuls: within 5% below XLA's count of the whole unrolled
    step (which adds the elementwise work), for full training, LoRA (where frozen kernels get no
    gradient: counting them as trained overstated it by 40%) and prompt tuning (whose prompt
    lengthens the encoder's input); a scanned model's step counts the same (XLA's analysis
    counts a scan's layer once)."""
    config = get_config("t5.1.1-mini", vocab_size=1024, dropout_rate=0.0, **adapters)
    trainer = Trainer(config, TrainConfig(learning_rate=1e-3))
    batch = copy_batch(length=32, vocab=1024)
    batch.update({name: batch[name][:, :12] for name in ("decoder_input_tokens", "decoder_target_tokens")})
    abstract = {name: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=trainer.batch_sharding)
                for name, x in trainer.shard_batch(batch).items()}
    rows, inputs = batch["encoder_input_tokens"].shape
    targets = batch["decoder_target_tokens"].shape[1]
    frozen = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), trainer._abstract_frozen)
    xla = jax.jit(trainer._train_step_fn).lower(trainer.abstract_state(), frozen, abstract).cost_analysis()
    assert 0.95 <= train_step_flops(config, rows, inputs, targets) / xla["flops"] <= 1.0
    if not adapters:
        scanned = Trainer(config.replace(scan_layers=True), TrainConfig(learning_rate=1e-3))
        scanned.train_step(scanned.init_state(), scanned.shard_batch(batch))
        assert scanned.step_flops() == train_step_flops(config, rows, inputs, targets)


def test_loading_a_finished_run_shows_no_progress_bar_and_a_run_with_steps_to_go_does(tmp_path, capfd):
    """A notebook that only loads a finished run (03, 04 and 05 load 02's) prints no "train run: 100%" bar."""
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0), TrainConfig(learning_rate=1e-2))
    train(trainer, Batches(copy_batch()), 2, tmp_path / "run", log_every=2, checkpoint_every=2)
    assert "train run: 100%" in capfd.readouterr().err
    train(trainer, Batches(copy_batch()), 2, tmp_path / "run", log_every=2, checkpoint_every=2)
    assert "train run" not in capfd.readouterr().err


def test_auto_remat_runs_the_least_recomputation_whose_step_fits_the_chips_memory(monkeypatch):
    """remat_policy="auto": on a CPU (no memory limit) every activation is kept; on a chip whose
    memory holds the `minimal` step within trainer.FITS but not the `none` one, it runs
    `minimal`, with the numbers `minimal` gives; where nothing fits, `full`."""
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0, scan_layers=True)
    batch = copy_batch(rows=8, length=32)
    planned = {policy: Trainer(config.replace(remat_policy=policy), TrainConfig(learning_rate=1e-2))
               .train_step_memory(batch) for policy in trainer_lib.REMAT_CHOICES}
    assert planned["none"] > planned["minimal"] >= planned["full"], planned
    for limit, chosen in ((None, "none"), (planned["minimal"] / trainer_lib.FITS, "minimal"), (1, "full")):
        monkeypatch.setattr(trainer_lib, "memory_limit", lambda device: limit)
        trainer = Trainer(config.replace(remat_policy="auto"), TrainConfig(learning_rate=1e-2))
        state, sums = trainer.train_step(trainer.init_state(), trainer.shard_batch(batch))
        assert trainer.run_config.remat_policy == chosen, (limit, planned)
        assert trainer.model_config.remat_policy == "auto"  # as asked: what a recipe compares it with
    reference = Trainer(config.replace(remat_policy="minimal"), TrainConfig(learning_rate=1e-2))
    expected, expected_sums = reference.train_step(reference.init_state(), reference.shard_batch(batch))
    monkeypatch.setattr(trainer_lib, "memory_limit", lambda device: planned["minimal"] / trainer_lib.FITS)
    trainer = Trainer(config.replace(remat_policy="auto"), TrainConfig(learning_rate=1e-2))
    state, sums = trainer.train_step(trainer.init_state(), trainer.shard_batch(batch))
    assert trainer_lib.remat_choices("gpu") == ("minimal", "full")  # a GPU never keeps every activation
    assert trainer_lib.remat_choices("cpu") == trainer_lib.remat_choices("tpu") == trainer_lib.REMAT_CHOICES
    np.testing.assert_allclose(float(sums["loss"]), float(expected_sums["loss"]), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_auto_remat_takes_a_step_the_compiler_refuses_for_its_size_as_one_that_does_not_fit(monkeypatch):
    """A TPU's compiler raises RESOURCE_EXHAUSTED for a step larger than the chip: the next policy."""
    compile_step = Trainer._compile_train_step

    def refusing(trainer, state, batch):
        if trainer.run_config.remat_policy == "none":
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM")
        return compile_step(trainer, state, batch)

    monkeypatch.setattr(Trainer, "_compile_train_step", refusing)
    monkeypatch.setattr(trainer_lib, "memory_limit", lambda device: 10**12)
    config = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0, remat_policy="auto")
    trainer = Trainer(config, TrainConfig(learning_rate=1e-2))
    trainer.train_step(trainer.init_state(), trainer.shard_batch(copy_batch()))
    assert trainer.run_config.remat_policy == "minimal"
