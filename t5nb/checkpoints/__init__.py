"""Checkpoints: a training run's folder and its own checkpoints (`runs`), Hugging Face T5 (`hf`) and T5X (`t5x`), and the
one parameter form they all meet in (`params`).

t5nb's parameters have one form: a nested dict (`params_of(model)`; the train state holds the
same) whose layer stacks are keyed by index, `{"encoder": {"layers": {0: {"attention": ...}}}}`.
Loaders return models, or that dict (`read_hf_checkpoint`, `read_t5x_checkpoint`);
`model_from_params` refuses any other form. Only the converters use T5X's flat names,
`encoder/layers_0/attention/query/kernel` (`flatten`, `unflatten`); `HF_NAME_TABLE` is the one
table between those and Hugging Face's names.
"""
from t5nb.checkpoints.hf import (HF_DIR, HF_NAME_TABLE, HF_WEIGHTS, config_from_hf, config_to_hf, hf_name,
                                 hf_weights_file, load_hf, read_hf_checkpoint, read_hf_config, save_hf)
from t5nb.checkpoints.params import (CheckpointError, abstract_model, abstract_params, check_params, flatten,
                                     model_from_params, params_of, unflatten, warn_if_not_finite)
from t5nb.checkpoints.runs import (RUN_DIR, RunCheckpoints, RunInUse, SaveFailed, checkpoint_config, checkpoint_kind,
                                   checkpoint_steps, holding, is_t5x_checkpoint, model_dir_kind, require_steps, resume_step, run_config,
                                   warn_if_short_of_space)
from t5nb.checkpoints.t5x import load_t5x, read_t5x_checkpoint

__all__ = ["CheckpointError", "HF_DIR", "HF_NAME_TABLE", "HF_WEIGHTS", "RUN_DIR", "RunCheckpoints", "RunInUse", "SaveFailed", "abstract_model",
           "abstract_params", "check_params", "checkpoint_config", "checkpoint_kind", "checkpoint_steps",
           "config_from_hf", "config_to_hf", "flatten", "hf_name", "holding", "hf_weights_file", "is_t5x_checkpoint",
           "load_hf", "load_t5x", "model_dir_kind", "model_from_params", "params_of", "read_hf_checkpoint",
           "read_hf_config", "read_t5x_checkpoint", "require_steps", "resume_step", "run_config", "save_hf", "unflatten",
           "warn_if_not_finite", "warn_if_short_of_space"]
