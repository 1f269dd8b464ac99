"""Models and parameters from checkpoints: the model of a run's step or a Hugging Face directory
(`load_model`, for `t5nb eval` and `infer`), the parameters a run starts from (`initial_params`:
a run, Hugging Face or T5X checkpoint), and an adapter run's frozen base (`restore_base`)."""
import pathlib

import jax

from t5nb import adapters, checkpoints
from t5nb.config import T5Config
from t5nb.recipe import RecipeError, load_recipe
from t5nb.trainer import TrainConfig, Trainer


def load_model(model_dir, step: int | None = None, mesh=None):
    """The model of a training run's checkpoint `step` (default: latest), on `mesh`, or of a
    Hugging Face directory or repository (`hf://<org>/<repo>`). Returns (model, step); a Hugging
    Face model is step 0 (or `step`). A warning names any parameter that is not finite."""
    if checkpoints.checkpoint_kind(model_dir) == "hf":
        return checkpoints.load_hf(model_dir), 0 if step is None else step
    model_dir = pathlib.Path(model_dir)
    available = checkpoints.require_steps(model_dir, [] if step is None else [step])
    step = available[-1] if step is None else step
    config, train_config = checkpoints.run_config(model_dir)
    trainer = Trainer(config, TrainConfig(**train_config), mesh)
    if adapters.has_adapters(config):
        restore_base(model_dir, trainer)
    state = trainer.from_checkpoint(
        checkpoints.RunCheckpoints(model_dir / "checkpoints").restore(trainer.abstract_checkpoint(), step))
    model = trainer.model(state.params)
    checkpoints.warn_if_not_finite(model, model_dir / "checkpoints" / str(step))
    return model, int(jax.device_get(state.step))


def initial_params(path: str, config: T5Config, mesh=None) -> dict:
    """The parameters of checkpoint `path` (see `Run.init_checkpoint`), checked against `config`;
    for a model with adapters, the checkpoint is their base, and fresh adapters are added."""
    if adapters.has_adapters(config):
        return adapters.add_adapters(initial_params(path, adapters.base_config(config), mesh), config)
    kind = checkpoints.checkpoint_kind(path)
    if kind == "t5x":
        params = checkpoints.read_t5x_checkpoint(path)
    elif kind == "hf":
        params = checkpoints.read_hf_checkpoint(path)[1]
    else:
        params = checkpoints.params_of(load_model(path, mesh=mesh)[0])
    try:
        checkpoints.check_params(config, checkpoints.flatten(params))
    except checkpoints.CheckpointError as error:
        raise RecipeError(f"run.init_checkpoint {path} does not fit the recipe's model: {error}") from None
    return params


def restore_base(model_dir, trainer: Trainer) -> None:
    """Give `trainer` (of a run with adapters, whose checkpoints hold only them) the frozen base
    its `recipe.toml` names."""
    path = pathlib.Path(model_dir) / "recipe.toml"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: its checkpoints hold only adapters, and no recipe.toml names their base")
    init = load_recipe(path).run.init_checkpoint
    trainer.init_state(None if init is None else initial_params(init, trainer.model_config, trainer.mesh))
