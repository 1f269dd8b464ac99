"""Recipes: a training run in one TOML file, which `t5nb train RECIPE` and the course's
workflow both run through `run_recipe`.

    [model]      # a preset of t5nb.config and any T5Config field changed
    preset = "t5.1.1-small"
    dropout_rate = 0.0
    [data]       # what it trains on (`Data`)
    task = "c4_span_corruption"
    inputs_length = 512
    targets_length = 114
    batch_size = 256
    [optimizer]  # how it learns: t5nb.trainer.TrainConfig's fields
    warmup_steps = 10000
    [run]        # where it goes, how long, what it starts from, how often it logs and saves (`Run`)
    model_dir = "runs/t5_1_1_small_c4"
    steps = 100000
    [mesh]       # how the devices split the work (`Mesh`)
    num_partitions = 1

A key left out takes its default; TOML has no null, so a key whose default is none is left
out (`--set key=none` unsets it). The run directory gets `recipe.toml`, the recipe resolved:
every model field, the dtype chosen for this chip and the vocabulary size filled in, so
`t5nb train <model_dir>/recipe.toml` reproduces the run.
"""
import dataclasses
import hashlib
import json
import pathlib
import tomllib
import typing

import jax
import jax.numpy as jnp

from t5nb import mesh as mesh_lib
from t5nb.checkpoints.runs import checkpoint_config, checkpoint_kind
from t5nb.config import PRESETS, T5Config, get_config
from t5nb.profiles import compute_dtype
from t5nb.trainer import TrainConfig, Trainer

RSQRT_DECAY = "rsqrt_decay"  # optimizer.learning_rate's name for TrainConfig.learning_rate=None


class RecipeError(ValueError):
    """A recipe that cannot be run: the message names the file, section and key."""


# [data]'s keys that describe a task read from files, as register_task takes them
FILE_OPTIONS = ("validation_file", "split_ratio", "fields", "file_format", "objective", "prefix", "metric",
                "vocabulary")


@dataclasses.dataclass(frozen=True)
class Data:
    """[data]: the task (or mixture) trained on, its feature lengths and the global batch."""

    task: str
    inputs_length: int
    targets_length: int
    batch_size: int  # the global batch, summed over every process
    pack: bool | None = None  # none: pack targets-only (pretraining) tasks, not supervised ones
    seed: int = 0  # shuffling and random preprocessing (span corruption's noise)
    # your own data: `task` is registered from these files (t5nb.tasks.register_task's options)
    train_file: str | None = None  # TSV, CSV, JSON (an array of objects), JSONL or text
    validation_file: str | None = None  # or split_ratio: the share of train_file kept for training
    split_ratio: float | None = None
    fields: dict[str, str] | None = None  # feature -> column or key, {inputs = "question", targets = "answer"}
    file_format: str | None = None  # default: from the file name's suffix
    objective: str | None = None  # supervised, or span_corruption (default: span corruption for text only)
    prefix: str | None = None  # text put before every input, e.g. "question: "
    metric: str | None = None  # squad (EM/F1 over every accepted answer), accuracy or bleu
    vocabulary: str | None = None  # facts (default), byte, t5 or a SentencePiece model path
    # resolved: the files' SHA-256, so that a run refuses to resume on a file that changed
    train_file_sha256: str | None = None
    validation_file_sha256: str | None = None

    def __post_init__(self):
        given = [name for name in FILE_OPTIONS if getattr(self, name) is not None]
        if given and self.train_file is None:
            raise ValueError(f"{', '.join(given)} describe the task read from train_file; give train_file too")
        if self.validation_file is not None and self.split_ratio is not None:
            raise ValueError("give validation_file or split_ratio, not both")

    def files(self) -> dict:
        """The data files by their key: `{"train_file": path, "validation_file": path}` as given."""
        return {key: getattr(self, key) for key in ("train_file", "validation_file") if getattr(self, key)}


@dataclasses.dataclass(frozen=True)
class Run:
    """[run]: where the run goes, the step it trains to, what it starts from, its cadences."""

    model_dir: str  # local, created if absent; a run already there is resumed
    steps: int  # the global step to reach (T5X's TRAIN_STEPS)
    # a run directory (its latest checkpoint), a Hugging Face directory or hf://<org>/<repo>,
    # or a T5X checkpoint directory (local or gs://); none: random initialisation
    init_checkpoint: str | None = None
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 50
    eval_every: int = 0  # steps between validations (0: none)
    eval_batches: int = 2  # batches of the task's validation split in each validation loss
    decoded_sample: int = 0  # validation examples decoded and scored at each validation (one process only)


@dataclasses.dataclass(frozen=True)
class Mesh:
    """[mesh]: devices per model replica, and T5X's 1-D or 2-D logical axis rules."""

    num_partitions: int = 1  # the 'model' axis; the rest of the devices form 'data'
    parameter_dims: int = 1  # 2: parameters and optimizer state also split over 'data' (FSDP-like)
    activation_dims: int = 1  # 2: activations' embed dimension also split over 'model'


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training run: `model` holds a preset and/or T5Config fields, the rest their dataclasses."""

    model: dict
    data: Data
    optimizer: TrainConfig
    run: Run
    mesh: Mesh = Mesh()
    source: str = "recipe"  # where it came from, for error messages

    # -- reading -------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, table: dict, source: str = "recipe") -> "Recipe":
        """A recipe from parsed TOML, every section and key checked."""
        unknown = sorted(set(table) - set(SECTIONS))
        if unknown:
            raise RecipeError(f"{source}: no section [{unknown[0]}] in a recipe; its sections: "
                              + ", ".join(f"[{name}]" for name in SECTIONS))
        for name in SECTIONS:
            if not isinstance(table.get(name, {}), dict):
                raise RecipeError(f"{source}: [{name}] must be a table of keys, got {table[name]!r}")
        sections = {name: _section(source, name, kind, table.get(name, {})) for name, kind in SECTIONS.items()}
        return cls(**sections, source=source)

    def with_overrides(self, assignments) -> "Recipe":
        """This recipe with `section.key=value` assignments (`--set`), each value read as a
        TOML value (a bare word is a string)."""
        table = self.to_dict()
        for assignment in assignments:
            name, equals, text = assignment.partition("=")
            section, dot, key = name.strip().partition(".")
            if not (equals and dot and section and key):
                raise RecipeError(f"--set {assignment!r}: expected SECTION.KEY=VALUE, e.g. run.steps=2000")
            if section not in SECTIONS:
                raise RecipeError(f"--set {assignment!r}: no section [{section}] in a recipe; its sections: "
                                  + ", ".join(SECTIONS))
            if text.strip() == "none":  # back to the default (or none)
                if key not in _fields_of(SECTIONS[section]):
                    raise RecipeError(f"--set {assignment!r}: [{section}] has no key {key!r}; its keys: "
                                      + ", ".join(_fields_of(SECTIONS[section])))
                table.get(section, {}).pop(key, None)
            else:
                table.setdefault(section, {})[key] = _toml_value_of(text)
            if section == "data" and key in ("train_file", "validation_file"):  # another file: digested anew
                table["data"].pop(f"{key}_sha256", None)
        return Recipe.from_dict(table, f"{self.source} with --set")

    # -- writing -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Sections of keys as TOML holds them (keys whose value is none left out)."""
        table = {"model": dict(self.model)}
        for name in ("data", "optimizer", "run", "mesh"):
            values = dataclasses.asdict(getattr(self, name))
            if name == "optimizer" and values["learning_rate"] is None:
                values["learning_rate"] = RSQRT_DECAY
            table[name] = {key: value for key, value in values.items() if value is not None}
        return table

    def to_toml(self) -> str:
        lines = [f"# t5nb recipe (resolved from {self.source}): t5nb train <this file>"]
        for name, values in self.to_dict().items():
            lines += ["", f"[{name}]"] + [f"{key} = {_toml(value)}" for key, value in values.items()]
        return "\n".join(lines) + "\n"

    # -- what it builds ------------------------------------------------------------------------
    def model_config(self) -> T5Config:
        """The model: the preset (or the initial checkpoint's own configuration, or the fields
        alone when they are complete) with the recipe's fields; the vocabulary size of the task
        and this chip's compute dtype unless given."""
        fields = dict(self.model)
        preset = fields.pop("preset", None)
        if set(fields) >= set(MODEL_FIELDS):  # resolved: nothing to look up
            base = T5Config()
        elif preset is not None:
            base = get_config(preset)
        elif self.run.init_checkpoint and checkpoint_kind(self.run.init_checkpoint) in ("run", "hf"):
            base = checkpoint_config(self.run.init_checkpoint)
        else:
            raise RecipeError(f"{self.source}: [model] needs a preset (one of {', '.join(sorted(PRESETS))}), "
                              "every T5Config field, or a run.init_checkpoint with its own configuration "
                              "(a run or Hugging Face directory)")
        if preset is not None:
            fields.setdefault("vocab_size", default_vocab_size(self.data))
        fields.setdefault("dtype", jnp.dtype(compute_dtype()).name)
        return T5Config.from_json({**base.to_json(), **fields})

    def resolved(self) -> "Recipe":
        """This recipe with every model field spelled out and its data files' digests, as the
        run directory keeps it; a file whose recorded digest it no longer has is refused."""
        digests = {}
        for key, path in self.data.files().items():
            digest, recorded = file_sha256(path, f"{self.source}: [data] {key}"), getattr(self.data, f"{key}_sha256")
            if recorded not in (None, digest):
                raise RecipeError(f"{self.source}: [data] {key} {path} has changed since the recipe recorded it "
                                  f"(sha256 {recorded[:12]}..., now {digest[:12]}...): restore the file, or give "
                                  f"it again (--set data.{key}={path}) to train on it as it is")
            digests[f"{key}_sha256"] = digest
        recipe = dataclasses.replace(self, data=dataclasses.replace(self.data, **digests))
        return dataclasses.replace(recipe, model=recipe.model_config().to_json())

    def make_mesh(self) -> jax.sharding.Mesh:
        return mesh_lib.make_mesh(self.mesh.num_partitions)

    def rules(self) -> tuple:
        return mesh_lib.standard_rules(self.mesh.activation_dims, self.mesh.parameter_dims)


SECTIONS = {"model": None, "data": Data, "optimizer": TrainConfig, "run": Run, "mesh": Mesh}
MODEL_FIELDS = {field.name: field.type for field in dataclasses.fields(T5Config)}


def _toml(value) -> str:
    """A TOML value: booleans, numbers, strings and lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):  # an inline table
        return "{" + ", ".join(f"{json.dumps(str(key))} = {_toml(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def _toml_value_of(text: str):
    """`--set`'s value: a TOML value (`2000`, `1e-3`, `true`, `"x"`, `[1, 2]`), else the text as a string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def _describe(kind) -> str:
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}
    arguments = [a for a in typing.get_args(kind) if a is not type(None)]
    if arguments and typing.get_origin(kind) is not tuple:
        return " or ".join(_describe(a) for a in arguments) + " (or none)"
    if typing.get_origin(kind) is tuple:
        return "a list of strings"
    if typing.get_origin(kind) is dict:
        return 'a table of strings, e.g. {inputs = "question", targets = "answer"}'
    return names.get(kind, "a dtype name such as float32 or bfloat16" if kind is jnp.dtype else str(kind))


def _coerce(where: str, value, kind):
    """`value` as a field of type `kind` wants it, or a RecipeError naming `where`."""
    arguments = typing.get_args(kind)
    if type(None) in arguments:
        if value is None or value == "none":
            return None
        kind = next(a for a in arguments if a is not type(None))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is jnp.dtype and isinstance(value, str):
        try:
            return jnp.dtype(value).name
        except TypeError:
            pass
    elif typing.get_origin(kind) is dict:
        if not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
            raise RecipeError(f"{where} must be {_describe(kind)}, got {value!r}")
        return dict(value)
    elif typing.get_origin(kind) is tuple:
        if not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise RecipeError(f"{where} must be {_describe(kind)}, got {value!r}")
        return tuple(value)
    elif isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise RecipeError(f"{where} must be {_describe(kind)}, got {value!r}")


def _fields_of(kind) -> dict:
    """A section's keys and their types: [model]'s a preset and T5Config's fields."""
    return {"preset": str, **MODEL_FIELDS} if kind is None else typing.get_type_hints(kind)


def _section(source: str, name: str, kind, values: dict):
    """Section `name` checked: no unknown key, every value of its field's type."""
    fields = _fields_of(kind)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise RecipeError(f"{source}: [{name}] has no key {unknown[0]!r}; its keys: {', '.join(fields)}")
    if kind is TrainConfig and values.get("learning_rate") == RSQRT_DECAY:
        values = {**values, "learning_rate": None}
    checked = {key: _coerce(f"{source}: [{name}] {key}", value, fields[key]) for key, value in values.items()}
    if kind is None:
        if "preset" in checked and checked["preset"] not in PRESETS:
            raise RecipeError(f"{source}: [model] preset {checked['preset']!r} is not one of "
                              f"{', '.join(sorted(PRESETS))}")
        if "preset" in checked and set(checked) >= set(MODEL_FIELDS):
            raise RecipeError(f"{source}: [model] gives every field, so its preset would change nothing; "
                              "change the fields, or give the preset and only the fields that differ")
        return checked
    missing = [f.name for f in dataclasses.fields(kind)
               if f.name not in checked and f.default is dataclasses.MISSING]
    if missing:
        raise RecipeError(f"{source}: [{name}] needs {', '.join(missing)}")
    try:
        return kind(**checked)
    except ValueError as error:
        raise RecipeError(f"{source}: [{name}]: {error}") from None


def load_recipe(path) -> Recipe:
    """The recipe in the TOML file `path`."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such recipe file")
    try:
        table = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"{path}: not TOML ({error})") from None
    return Recipe.from_dict(table, str(path))


def file_sha256(path, where: str) -> str:
    """The SHA-256 of the file `path` (hex); `where` names the key that gave it when it is missing."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{where} {path}: {'not a file' if path.exists() else 'no such file'}")
    return hashlib.sha256(path.read_bytes()).hexdigest()


_file_tasks = {}  # task name -> (its Data's file options, digests) when data_task registered it


def data_task(data: Data):
    """[data]'s task: registered from its files when it names them (again when they changed,
    within this process), else the registered task of that name."""
    from t5nb import tasks  # TensorFlow (tf.data) loads with the tasks; a recipe reads and checks without it

    if data.train_file is None:
        return tasks.get_task(data.task)
    options = {name: getattr(data, name) for name in FILE_OPTIONS if getattr(data, name) is not None}
    key = (repr(sorted(options.items())), data.train_file,
           tuple(file_sha256(path, f"[data] {name}") for name, path in data.files().items()))
    if tasks.is_registered(data.task) and data.task in _file_tasks:
        if _file_tasks[data.task] == key:
            return tasks.get_task(data.task)
        tasks.remove_task(data.task)
    validation = options.pop("validation_file", None)
    files = {"train": data.train_file, "validation": validation} if validation else data.train_file
    task = tasks.register_task(data.task, files, seed=data.seed, **options)
    _file_tasks[data.task] = key
    return task


def register_run_task(model_dir, names) -> None:
    """Register the task a run trained on from the data files its `recipe.toml` names, when
    `names` holds it and no task of that name is registered yet (`t5nb eval` and `infer` of a
    run trained on a file take its task by name)."""
    from t5nb import tasks  # TensorFlow (tf.data) loads with the tasks; a recipe reads and checks without it

    path = pathlib.Path(model_dir) / "recipe.toml"
    if not path.is_file():
        return
    data = load_recipe(path).data
    if data.train_file and data.task in names and not tasks.is_registered(data.task):
        data_task(data)


def default_vocab_size(data: Data) -> int:
    """The embedding rows for [data]'s task's vocabulary: its ids, or 32128 for the official T5
    vocabulary's 32100, as the published checkpoints pad it."""
    from t5nb import tasks  # TensorFlow (tf.data) loads with the tasks; a recipe reads and checks without it

    vocabulary = data_task(data).output_features["targets"].vocabulary
    return 32128 if tasks.vocab.is_official(vocabulary) else vocabulary.vocab_size


def feature_lengths(recipe: Recipe) -> dict:
    return {"inputs": recipe.data.inputs_length, "targets": recipe.data.targets_length}


def make_trainer(recipe: Recipe) -> Trainer:
    """The recipe's model and optimizer on its mesh, with its axis rules."""
    return Trainer(recipe.model_config(), recipe.optimizer, recipe.make_mesh(), recipe.rules())
