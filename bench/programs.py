"""The course's programs on one chip, from a profile alone (no TensorFlow, so the GPU machine
builds them too): bench/accelerator_estimates.py compiles them, bench/gpu.py runs them, and
tests/test_profiles.py holds them equal to what the workflow's recipes train."""
from t5nb.config import get_config
from t5nb.trainer import Trainer, TrainConfig

TRAIN_STEPS = ("pretrain_step", "finetune_step")
PROGRAMS = (*TRAIN_STEPS, "eval_step", "decode_batch")  # the keys of `course_trainers`


def course_trainers(profile, dtype, mesh) -> dict:
    """name -> (Trainer, feature lengths, packed): pretraining (T5.1.1 span corruption, no
    dropout, T5X's rsqrt schedule) and fine-tuning (Adafactor at 1e-3), whose trainer also runs
    the course's eval step and greedy decoding. The presets' vocabulary is T5's: a profile on
    another (the facts world's) sizes its models to its task's, which needs the task."""
    if profile.vocabulary != "t5":
        raise ValueError(f"profile {profile.name!r} trains on the {profile.vocabulary!r} vocabulary; "
                         "its programs come from workflow's recipes")

    def trainer(train_config):
        return Trainer(get_config(profile.model, dtype=dtype, dropout_rate=0.0), train_config, mesh)

    finetuning = trainer(TrainConfig(learning_rate=1e-3))
    finetune_lengths = {"inputs": profile.finetune_inputs_length, "targets": profile.finetune_targets_length}
    return {"pretrain_step": (trainer(TrainConfig(warmup_steps=10_000)),
                              {"inputs": profile.inputs_length, "targets": profile.targets_length}, True),
            "finetune_step": (finetuning, finetune_lengths, False),
            "eval_step": (finetuning, finetune_lengths, False),
            "decode_batch": (finetuning, finetune_lengths, False)}
