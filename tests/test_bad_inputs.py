"""Every bad input answered clearly: one table of mistakes a person could make, each with the
exception (or warning, or the command's exit status) and the words its message must contain."""
import itertools
import math
import os
import pathlib
import types
from typing import Callable, NamedTuple
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, serialization, traverse_util

import t5nb.tasks as tasks
from t5nb import checkpoints, cli, decode, mesh, restore
from t5nb.config import get_config
from t5nb.model import Transformer
from t5nb.checkpoints import RunCheckpoints
from t5nb.train import train
from t5nb.trainer import TrainConfig, Trainer

FACTS_IDS = tasks.get_vocabulary("facts").vocab_size  # 1124
CONFIG = get_config("t5.1.1-tiny", vocab_size=FACTS_IDS, dropout_rate=0.0)
QA_FIELDS = {"inputs": "question", "targets": "answer"}


class Case(NamedTuple):
    """`action(env)` raises (or warns) `expected`; for a command line, `action(env)` is its
    argv and `status` the exit status. The message holds every one of `words`."""

    id: str
    action: Callable
    expected: type | None
    words: tuple
    status: int | None = None


def call(id, action, expected, *words) -> Case:
    return Case(id, action, expected, words)


def command(id, argv, status, *words) -> Case:
    return Case(id, argv, None, words, status)


def write(env, name: str, content: str) -> pathlib.Path:
    path = env.tmp / name
    path.write_text(content)
    return path


def with_param(model, path: str, value: float):
    """A copy of `model` whose parameter `path` is filled with `value` (NaN, inf)."""
    params = checkpoints.flatten(checkpoints.params_of(model))
    params[path] = np.full_like(params[path], value)
    return checkpoints.model_from_params(model.config, checkpoints.unflatten(params))


def nested(flat: dict) -> dict:
    """`{"a/b": x}` -> `{"a": {"b": x}}`."""
    return traverse_util.unflatten_dict(flat, sep="/")


def t5x_file(env, model) -> pathlib.Path:
    """A single-file T5X msgpack checkpoint of `model`'s parameters."""
    path = env.tmp / "checkpoint"
    target = nested(checkpoints.flatten(checkpoints.params_of(model)))
    path.write_bytes(serialization.msgpack_serialize({"optimizer": {"target": target}}))
    return path


def saved_hf(env, model) -> pathlib.Path:
    """`model` saved as a Hugging Face directory."""
    directory = env.tmp / "hf"
    checkpoints.save_hf(model, directory)
    return directory


def hf_copy(env, edit) -> pathlib.Path:
    """`env.hf_dir`'s files copied, then `edit(directory)`."""
    directory = env.tmp / "hf"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        (directory / name).write_bytes((env.hf_dir / name).read_bytes())
    edit(directory)
    return directory


def register(env, content: str, **kwargs):
    """Register a task from `content` as rows.jsonl."""
    return tasks.register_task("bad_inputs_task", write(env, "rows.jsonl", content), **{"fields": QA_FIELDS, **kwargs})


def predictor(env, task="facts_qa", **kwargs):
    return decode.Predictor(env.model, task, **kwargs)


def infer_argv(env, input_path, *options, output=None) -> list[str]:
    """`t5nb infer` of the Hugging Face directory's model on `input_path` for facts_qa."""
    return [str(arg) for arg in ("infer", env.hf_dir, "--task", "facts_qa", "--input", input_path,
                                 "--output", output or env.tmp / "out.jsonl", *options)]


def eval_argv(model_dir, *options) -> list[str]:
    """`t5nb eval` of `model_dir` on facts_qa."""
    return [str(arg) for arg in ("eval", model_dir, "--task", "facts_qa", *options)]


def main_with_debug_variable(argv) -> int:
    with mock.patch.dict(os.environ, {"T5NB_DEBUG": "1"}):
        return cli.main(argv)


def train_briefly(env, model_dir=None, config=CONFIG, train_config=TrainConfig(learning_rate=1e-3),
                  batches=None, **options):
    """`train` a tiny model for a step in a fresh directory (or `model_dir`), with `options`."""
    batches = batches or itertools.repeat(env.batch)
    return train(Trainer(config, train_config), batches, options.pop("num_steps", 1), model_dir or env.tmp / "run",
                 **{"checkpoint_every": 1, "progress": False, **options})


ROW = '{"question": "Where?", "answer": "Here"}\n'

CASES = [
    # -- custom tasks ----------------------------------------------------------------------
    call("split-ratio-above-one", lambda env: register(env, ROW * 4, split_ratio=1.5),
         ValueError, "split_ratio=1.5", "between 0 and 1"),
    call("split-ratio-zero", lambda env: register(env, ROW * 4, split_ratio=0),
         ValueError, "split_ratio=0", "between 0 and 1"),
    call("null-target", lambda env: register(env, ROW + '{"question": "Who?", "answer": null}\n'),
         tasks.TaskDataError, "rows.jsonl, line 2, field 'answer'", "null, not text"),
    call("number-target", lambda env: register(env, '{"question": "How many?", "answer": 42}\n'),
         tasks.TaskDataError, "line 1, field 'answer'", "a number (42), not text"),
    call("object-target", lambda env: register(env, '{"question": "What?", "answer": {"text": "x"}}\n'),
         tasks.TaskDataError, "line 1, field 'answer'", "an object, not text"),
    call("list-target-with-a-number", lambda env: register(env, '{"question": "Which?", "answer": ["a", 3]}\n'),
         tasks.TaskDataError, "line 1, field 'answer'", "a number (3) in the list, not text"),
    call("empty-list-target", lambda env: register(env, ROW + ROW + '{"question": "Which?", "answer": []}\n'),
         tasks.TaskDataError, "line 3, field 'answer'", "empty target"),
    call("null-input", lambda env: register(env, '{"question": null, "answer": "x"}\n'),
         tasks.TaskDataError, "line 1, field 'question'", "null, not text"),
    call("fields-without-targets", lambda env: register(env, ROW, fields={"input": "question", "target": "answer"}),
         ValueError, "rows.jsonl", "fields=", "'targets'"),
    call("task-file-missing", lambda env: tasks.register_task("bad_inputs_task", env.tmp / "absent.tsv",
                                                              fields=QA_FIELDS),
         FileNotFoundError, "absent.tsv", "no such file"),
    call("unknown-vocabulary", lambda env: register(env, ROW, vocabulary="fact"),
         FileNotFoundError, "vocabulary 'fact'", "'facts', 'byte', 't5'"),
    # -- vocabularies ----------------------------------------------------------------------
    call("model-smaller-than-vocabulary", lambda env: tasks.check_vocabulary(64, "facts_qa"),
         ValueError, "vocab_size=64", "'facts_qa'", "SentencePiece facts_spm.model (1124 ids)", "1124 or 1152"),
    call("facts-model-on-byte-task", lambda env: tasks.check_vocabulary(FACTS_IDS, "facts_qa_byte"),
         ValueError, f"vocab_size={FACTS_IDS}", "'facts_qa_byte'", "byte (259 ids)", "259 or 384"),
    call("byte-model-on-facts-mixture", lambda env: tasks.check_vocabulary(384, "facts_pretraining"),
         ValueError, "vocab_size=384", "'facts_pretraining'", "(1124 ids)"),
    call("predictor-vocabulary-mismatch", lambda env: predictor(env, "facts_qa_byte"),
         ValueError, f"vocab_size={FACTS_IDS}", "'facts_qa_byte'", "byte (259 ids)"),
    call("unknown-task", lambda env: tasks.check_vocabulary(FACTS_IDS, "facts_q"),
         tasks.TaskNameError, "'facts_q'", "did you mean 'facts_qa'"),
    # -- decoding and batches --------------------------------------------------------------
    call("predictor-batch-size-zero", lambda env: predictor(env, batch_size=0),
         ValueError, "batch_size", "positive", "got 0"),
    call("predictor-input-length-negative", lambda env: predictor(env, input_length=-1),
         ValueError, "input_length", "got -1"),
    call("unknown-decoding-method", lambda env: predictor(env, method="beams"),
         ValueError, "'beams'", "'greedy', 'beam' or 'sample'"),
    call("beam-count-zero", lambda env: predictor(env, method="beam", num_decodes=0),
         ValueError, "num_decodes", "got 0"),
    call("option-of-another-method", lambda env: predictor(env, temperature=0.5),
         ValueError, "'greedy' takes no option temperature"),
    call("top-k-above-the-vocabulary", lambda env: predictor(env, method="sample", top_k=FACTS_IDS + 1),
         ValueError, "top_k", f"vocabulary of {FACTS_IDS} tokens", f"got {FACTS_IDS + 1}"),
    call("top-p-zero", lambda env: decode.sample_decode(env.model, np.ones((1, 4), np.int32), 4, top_p=0.0),
         ValueError, "top_p", "(0, 1]", "got 0.0"),
    call("non-text-input", lambda env: predictor(env)(["Where?", None]),
         TypeError, "input 1", "NoneType", "not a string"),
    call("inputs-cut-to-input-length", lambda env: predictor(env, input_length=16).inputs(["a", "b " * 40, "c " * 40]),
         UserWarning, "2 of 3 inputs", "input length 16"),
    # -- meshes ----------------------------------------------------------------------------
    call("mesh-zero-partitions", lambda env: mesh.make_mesh(0), ValueError, "num_partitions", "got 0"),
    call("mesh-negative-partitions", lambda env: mesh.make_mesh(-2), ValueError, "num_partitions", "got -2"),
    call("mesh-more-partitions-than-devices", lambda env: mesh.make_mesh(jax.device_count() + 1),
         ValueError, f"num_partitions={jax.device_count() + 1}", "more than there are"),
    call("mesh-partitions-do-not-divide", lambda env: mesh.make_mesh(2, jax.devices()[:1] * 3),
         ValueError, "num_partitions=2 does not divide the 3 devices", "use one of [1, 3]"),
    call("mesh-without-devices", lambda env: mesh.make_mesh(1, []), ValueError, "no devices"),
    # -- model configs ---------------------------------------------------------------------
    call("config-unknown-field", lambda env: get_config("t5.1.1-tiny", vocab=64),
         ValueError, "no field vocab", "vocab_size"),
    call("config-zero-vocabulary", lambda env: get_config("t5.1.1-tiny", vocab_size=0),
         ValueError, "vocab_size", "positive", "got 0"),
    # -- checkpoints -----------------------------------------------------------------------
    call("hf-nan-weights", lambda env: checkpoints.load_hf(
        saved_hf(env, with_param(env.model, "encoder/encoder_norm/scale", math.nan))),
         RuntimeWarning, "NaN or infinite", "1 parameter(s)", "encoder/encoder_norm/scale"),
    call("t5x-infinite-weights", lambda env: checkpoints.load_t5x(
        t5x_file(env, with_param(env.model, "decoder/logits_dense/kernel", math.inf)), CONFIG),
         RuntimeWarning, "checkpoint", "NaN or infinite", "decoder/logits_dense/kernel"),
    call("own-run-nan-weights", lambda env: restore.load_model(env.run_dir, 2),
         RuntimeWarning, "checkpoints/2", "NaN or infinite", "encoder/encoder_norm/scale"),
    call("hf-without-weights-t5nb-reads", lambda env: checkpoints.load_hf(hf_copy(
        env, lambda d: (d / "model.safetensors").rename(d / "tf_model.h5"))),
         FileNotFoundError, "config.json and model.safetensors", "found config.json, tf_model.h5"),
    call("hf-truncated-safetensors", lambda env: checkpoints.load_hf(hf_copy(
        env, lambda d: (d / "model.safetensors").write_bytes((env.hf_dir / "model.safetensors").read_bytes()[:500]))),
         checkpoints.CheckpointError, "model.safetensors", "not a readable safetensors file"),
    call("hf-config-not-json", lambda env: checkpoints.load_hf(hf_copy(
        env, lambda d: (d / "config.json").write_text("{'d_model': 8"))),
         checkpoints.CheckpointError, "config.json", "not valid JSON"),
    call("hf-config-lacks-sizes", lambda env: checkpoints.load_hf(hf_copy(
        env, lambda d: (d / "config.json").write_text('{"model_type": "t5", "vocab_size": 96}'))),
         checkpoints.CheckpointError, "config.json", "lacks d_model, num_heads"),
    call("t5x-not-msgpack", lambda env: checkpoints.load_t5x(write(env, "checkpoint", "not msgpack"), CONFIG),
         checkpoints.CheckpointError, "checkpoint: not a T5X checkpoint", "msgpack"),
    call("t5x-config-by-name", lambda env: checkpoints.load_t5x(t5x_file(env, env.model), "t5.1.1-tiny"),
         TypeError, "config must be a T5Config", "str"),
    call("load-missing-directory", lambda env: restore.load_model(env.tmp / "nowhere"),
         FileNotFoundError, "nowhere", "no such directory", "config.json and checkpoints/<step>/"),
    # -- the command line ------------------------------------------------------------------
    command("batch-size-zero", lambda env: eval_argv(env.run_dir, "--batch-size", "0"),
            2, "argument --batch-size", "positive whole number", "'0'"),
    command("beams-negative", lambda env: eval_argv(env.run_dir, "--beams", "-3"),
            2, "argument --beams", "'-3'"),
    command("inputs-length-zero", lambda env: eval_argv(env.run_dir, "--inputs-length", "0"),
            2, "argument --inputs-length", "'0'"),
    command("max-examples-not-a-number", lambda env: eval_argv(env.run_dir, "--max-examples", "all"),
            2, "argument --max-examples", "'all'"),
    command("step-negative", lambda env: eval_argv(env.run_dir, "--step", "-1"),
            2, "argument --step", "'-1'"),
    command("alpha-not-finite", lambda env: infer_argv(env, env.tmp / "in.txt", "--alpha", "nan"),
            2, "argument --alpha", "finite", "'nan'"),
    command("eval-run-without-checkpoints", lambda env: eval_argv(env.run_without_checkpoints),
            1, "a training run without checkpoints", "checkpoint_every"),
    command("eval-missing-directory", lambda env: eval_argv(env.tmp / "nowhere"),
            1, "nowhere: no such directory", "config.json and model.safetensors"),
    command("eval-directory-that-is-not-a-run", lambda env: eval_argv(write(env, "notes.txt", "x").parent),
            1, "not a model directory", "found notes.txt"),
    command("eval-step-the-run-lacks", lambda env: eval_argv(env.run_dir, "--step", "7"),
            1, "no checkpoint of step 7", "its steps: 1, 2"),
    command("eval-split-the-task-lacks", lambda env: eval_argv(env.hf_dir, "--split", "test"),
            1, "'facts_qa' has no split 'test'", "train, validation"),
    command("eval-task-of-another-vocabulary", lambda env: eval_argv(env.hf_dir, "--task", "facts_qa_byte"),
            1, f"vocab_size={FACTS_IDS}", "'facts_qa_byte'", "byte (259 ids)"),
    command("infer-empty-file", lambda env: infer_argv(env, write(env, "in.txt", "")),
            1, "in.txt: no inputs"),
    command("infer-blank-lines", lambda env: infer_argv(env, write(env, "in.txt", "\n  \n\t\n")),
            1, "in.txt: no inputs"),
    command("infer-empty-jsonl", lambda env: infer_argv(env, write(env, "in.jsonl", "")),
            1, "in.jsonl: no inputs"),
    command("infer-malformed-jsonl", lambda env: infer_argv(
        env, write(env, "in.jsonl", '{"input": "a"}\n{"input": \n')),
            1, "in.jsonl, line 2", "not JSON"),
    command("infer-row-without-the-field", lambda env: infer_argv(
        env, write(env, "in.jsonl", '{"question": "a"}\n{"text": "b"}\n')),
            1, "in.jsonl, line 2, field 'question'", "missing field", "['text']"),
    command("infer-input-not-text", lambda env: infer_argv(env, write(env, "in.jsonl", '{"input": 5}\n')),
            1, "in.jsonl, line 1, field 'input'", "a number (5), not text"),
    command("infer-no-input-field", lambda env: infer_argv(env, write(env, "in.jsonl", '{"prompt": "a"}\n')),
            1, "in.jsonl, line 1", "no input field", "['prompt']"),
    command("infer-missing-input-file", lambda env: infer_argv(env, env.tmp / "absent.txt"),
            1, "absent.txt: no such input file"),
    command("infer-output-is-a-directory", lambda env: infer_argv(
        env, write(env, "in.txt", "Where?\n"), output=env.tmp),
            1, "a directory", "the output is a file"),
    # training configuration, the loop's arguments and resume
    call("learning-rate-negative", lambda env: TrainConfig(learning_rate=-1e-3),
         ValueError, "TrainConfig.learning_rate", "-0.001"),
    call("learning-rate-zero", lambda env: TrainConfig(learning_rate=0.0), ValueError, "learning_rate", "positive"),
    call("warmup-steps-zero", lambda env: TrainConfig(warmup_steps=0), ValueError, "warmup_steps", "got 0"),
    call("grad-accum-steps-zero", lambda env: TrainConfig(grad_accum_steps=0), ValueError, "grad_accum_steps", "got 0"),
    call("optimizer-unknown", lambda env: TrainConfig(optimizer="sgd"), ValueError, "optimizer", "'sgd'"),
    call("label-smoothing-one", lambda env: TrainConfig(label_smoothing=1.0), ValueError, "label_smoothing", "[0, 1)"),
    call("train-zero-steps", lambda env: train_briefly(env, num_steps=0), ValueError, "num_steps", "got 0"),
    call("train-negative-steps", lambda env: train_briefly(env, num_steps=-5), ValueError, "num_steps", "got -5"),
    call("train-log-every-zero", lambda env: train_briefly(env, log_every=0), ValueError, "log_every", "got 0"),
    call("train-checkpoint-every-negative", lambda env: train_briefly(env, checkpoint_every=-1),
         ValueError, "checkpoint_every", "got -1"),
    call("train-eval-every-negative", lambda env: train_briefly(env, eval_every=-2), ValueError, "eval_every", "got -2"),
    call("train-keep-no-checkpoints", lambda env: train_briefly(env, checkpoint_every=1, keep_checkpoints=0),
         ValueError, "keep_checkpoints", "got 0"),
    call("train-task-of-another-vocabulary", lambda env: train_briefly(
        env, batches=tasks.BatchIterator("facts_qa_byte", {"inputs": 16, "targets": 8}, 2)),
         ValueError, f"vocab_size={FACTS_IDS}", "'facts_qa_byte'", "byte (259 ids)"),
    call("resume-with-another-model", lambda env: train_briefly(env, model_dir=env.run_dir, num_steps=3, config=get_config(
        "t5.1.1-tiny", vocab_size=FACTS_IDS, dropout_rate=0.0, mlp_activations=("relu",))),
         ValueError, "checkpoints of another model", "mlp_activations=['relu'] (saved: ['gelu', 'linear'])"),
    call("resume-with-another-optimizer", lambda env: train_briefly(
        env, model_dir=env.run_dir, num_steps=3, train_config=TrainConfig(learning_rate=1e-3, optimizer="adamw")),
         ValueError, "another model or optimizer", "optimizer='adamw' (saved: 'adafactor')"),
    call("batch-size-zero", lambda env: tasks.BatchIterator("facts_qa", {"inputs": 16, "targets": 8}, 0),
         ValueError, "batch_size", "got 0"),
    call("data-position-of-other-settings", lambda env: tasks.BatchIterator(
        "facts_qa", {"inputs": 16, "targets": 8}, 2, seed=1).set_state(
        tasks.BatchIterator("facts_qa", {"inputs": 32, "targets": 8}, 2).state()),
         ValueError, "data settings differ", "feature_lengths", "seed 0 in the checkpoint, 1 here"),
    call("cli-debug-shows-the-exception", lambda env: cli.main(eval_argv(env.tmp / "nowhere", "--debug")),
         FileNotFoundError, "nowhere: no such directory"),
    call("cli-debug-variable-shows-the-exception", lambda env: main_with_debug_variable(eval_argv(env.tmp)),
         FileNotFoundError, "not a model directory", "found nothing"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny model of the facts vocabulary, as a Hugging Face directory, and two training runs:
    one with checkpoints at steps 1 (trained) and 2 (a NaN parameter), one without any."""
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    hf_dir = tmp_path_factory.mktemp("hf")
    checkpoints.save_hf(model, hf_dir)
    trainer = Trainer(CONFIG, TrainConfig(learning_rate=1e-3))
    batch = next(tasks.BatchIterator("facts_qa", {"inputs": 16, "targets": 8}, 2))
    run_dir, run_without_checkpoints = tmp_path_factory.mktemp("run"), tmp_path_factory.mktemp("run_no_checkpoints")
    state = train(trainer, itertools.repeat(batch), 1, run_dir, checkpoint_every=1, progress=False).state
    train(trainer, itertools.repeat(batch), 1, run_without_checkpoints, progress=False)
    params = {**state.params, "encoder": {**state.params["encoder"], "encoder_norm": {"scale": jnp.full(
        state.params["encoder"]["encoder_norm"]["scale"].shape, jnp.nan)}}}
    run_checkpoints = RunCheckpoints(run_dir / "checkpoints")
    run_checkpoints.save(state.replace(step=state.step + 1, params=params))
    run_checkpoints.wait()
    return types.SimpleNamespace(model=model, hf_dir=hf_dir, run_dir=run_dir, batch=batch,
                                 run_without_checkpoints=run_without_checkpoints)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_answered_clearly(case, models, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("T5NB_DEBUG", raising=False)
    env = types.SimpleNamespace(**vars(models), tmp=tmp_path)
    if case.status is not None:
        capsys.readouterr()
        argv = case.action(env)
        status = cli.main(argv)
        stderr = capsys.readouterr().err
        assert status == case.status and "Traceback" not in stderr
        assert len(stderr.splitlines()) == 1 and stderr.startswith(f"t5nb {argv[0]}: error: "), stderr
        message = stderr
    elif issubclass(case.expected, Warning):
        with pytest.warns(case.expected) as caught:
            case.action(env)
        message = " ".join(str(warning.message) for warning in caught if issubclass(warning.category, case.expected))
    else:
        with pytest.raises(case.expected) as raised:
            case.action(env)
        message = str(raised.value)
    missing = [word for word in case.words if word not in message]
    assert not missing, f"{missing} not in: {message}"
