"""Collectives that a compiled program may run at once, for the multi-device test.

XLA:CPU starts a program's independent instructions concurrently, on each simulated device:
two collectives with no data dependence between them (one inside a layer loop, one beside it)
are then waited in at once, and devices waiting in both can deadlock (XLA aborts after 40 s).
`unordered(hlo_text)` lists such pairs.

Run on 8 simulated devices, it prints, as JSON, the pairs in a control program built to have
one and in t5nb's scanned train and eval steps on an 8x1 mesh.
"""
import itertools
import re

COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(-start)?\(")
HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (.*)$")
CALLED = re.compile(r"\b(?:body|condition|calls|to_apply)=%([\w.\-]+)|branch_computations=\{([^}]*)\}")


def parse(text: str) -> dict:
    """{computation: {instruction: (operands, called computations, is a collective)}}."""
    computations, current = {}, None
    for line in text.splitlines():
        if not line.startswith(" ") and (header := HEADER.match(line)):
            current = computations.setdefault(header.group(1), {})
        elif line.strip() == "}":
            current = None
        elif current is not None and (instruction := INSTRUCTION.match(line)):
            name, rest = instruction.groups()
            rest = rest.split(", metadata=")[0]
            called = set()
            for single, branches in CALLED.findall(rest):
                called |= {single} if single else set(re.findall(r"%([\w.\-]+)", branches))
            current[name] = (set(re.findall(r"%([\w.\-]+)", rest)) - called, called, bool(COLLECTIVE.search(rest)))
    return computations


def unordered(text: str) -> list[tuple[str, str, str]]:
    """(computation, a, b) for each two instructions that are or contain collectives, with no
    path of operands from one to the other."""
    computations = parse(text)
    holds = {}

    def has_collective(computation):
        if computation not in holds:
            holds[computation] = False  # a computation never calls itself
            holds[computation] = any(collective or any(has_collective(c) for c in called if c in computations)
                                     for _, called, collective in computations[computation].values())
        return holds[computation]

    pairs = []
    for computation, instructions in computations.items():
        bearing = [name for name, (_, called, collective) in instructions.items()
                   if collective or any(has_collective(c) for c in called if c in computations)]
        before = {}

        def ancestors(name):
            if name not in before:
                seen, stack = set(), list(instructions[name][0])
                while stack:
                    operand = stack.pop()
                    if operand in instructions and operand not in seen:
                        seen.add(operand)
                        stack.extend(instructions[operand][0])
                before[name] = seen
            return before[name]

        pairs += [(computation, a, b) for a, b in itertools.combinations(bearing, 2)
                  if a not in ancestors(b) and b not in ancestors(a)]
    return pairs


if __name__ == "__main__":
    import json
    import os

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from t5nb import mesh as mesh_lib
    from t5nb.config import get_config
    from t5nb.model import shift_right
    from t5nb.trainer import TrainConfig, Trainer

    devices = jax.devices()[:8]
    control_mesh = jax.make_mesh((8,), ("d",), devices=devices)

    def control(x):  # a loop of all-reduces, and an all-reduce of the input beside it
        looped = jax.lax.scan(lambda c, _: (c + jax.lax.psum(c, "d"), None), x, None, length=3)[0]
        return looped, jax.lax.psum(x.astype(jnp.int32), "d")

    control_input = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=jax.NamedSharding(control_mesh, P("d")))
    control_step = jax.jit(jax.shard_map(control, mesh=control_mesh, in_specs=P("d"), out_specs=(P("d"), P("d"))))
    found = {"control": unordered(control_step.lower(control_input).compile().as_text())}
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, 64, (8, 10), dtype=np.int32)
    tokens[:, -2:] = 0  # padding
    batch = {"encoder_input_tokens": tokens, "decoder_target_tokens": tokens[:, ::-1].copy()}
    batch["decoder_input_tokens"] = np.asarray(shift_right(batch["decoder_target_tokens"]))
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.1, scan_layers=True),
                      TrainConfig(learning_rate=1e-2), mesh_lib.make_mesh(1, devices))  # 8x1, as the rehearsal
    sharded = trainer.shard_batch(batch)
    found["train"] = unordered(trainer.compile_train_step(trainer.abstract_state(), sharded).as_text())
    trainer.eval_step(trainer.init_state().params, sharded)
    found["eval"] = unordered(trainer._eval_step.as_text())
    print(json.dumps(found))
    os._exit(0)  # skip the slow interpreter teardown
