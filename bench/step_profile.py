"""Where a compiled step's device time goes, by kind of work (KINDS).

JAX's profiler records an event per kernel (a GPU) or per thunk (XLA:CPU), named by, or carrying
in its `hlo_op` stat, the HLO instruction it runs. Each instruction is found in the compiled
program's text (`compiled.as_text()`) and classed by what it computes (its opcode, or those of the
computation it fuses) and where it was traced from: its name stack (`rematted_computation`: the
backward pass computing the forward again) and the innermost Python function of its stack frame
(t5nb/model.py's attention, t5nb/trainer.py's loss, optax's or t5nb/layerwise.py's update).
Idle gaps are the span of the profiled steps that no event covers. bench/gpu.py's `profile`
phase prints and writes the table; `--quick` runs it on a CPU.
"""
import ast
import collections
import dataclasses
import functools
import gzip
import itertools
import pathlib
import re
import tempfile

MATMULS, FUSED_ATTENTION, ATTENTION = "matmuls", "fused attention (one kernel)", "attention's softmax and bias"
ELEMENTWISE, LOSS = "norms, embeddings and other elementwise", "cross-entropy over the vocabulary"
OPTIMIZER, REMAT, COPIES = "optimizer update", "rematerialised recompute", "copies, transposes and casts"
OTHER, IDLE = "other (not in the program)", "idle gaps between kernels"
KINDS = (MATMULS, FUSED_ATTENTION, ATTENTION, ELEMENTWISE, LOSS, OPTIMIZER, REMAT, COPIES, OTHER, IDLE)

CONTROL = {"while", "conditional", "call"}  # their bodies' own events hold their time
MOVES = {"copy", "transpose", "reshape", "bitcast", "broadcast", "slice", "dynamic-slice", "dynamic-update-slice",
         "concatenate", "pad", "convert", "parameter", "constant", "tuple", "get-tuple-element", "iota",
         "copy-start", "copy-done", "bitcast-convert"}
LOSS_FUNCTIONS = {"cross_entropy_with_z_loss", "_cross_entropy_forward", "_cross_entropy_backward", "is_argmax",
                  "_loss_weights", "Trainer._sums"}
GEMM_KERNEL = re.compile(r"gemm|cublas|cutlass|xmma|nvjet|matmul", re.IGNORECASE)  # nvjet: cuBLAS on Hopper
ATTENTION_KERNEL = re.compile(r"fmha|flash|dot_product_attention", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Op:
    """An HLO instruction: what it computes and where it was traced from."""

    opcode: str
    target: str = ""  # a custom call's
    op_name: str = ""  # JAX's name stack
    file: str = ""  # of the innermost traced frame
    function: str = ""
    calls: tuple = ()  # the computations it calls
    operands: tuple = ()  # the instructions it reads
    scalar: bool = False  # its result is one number (an index, a loop counter)


@dataclasses.dataclass(frozen=True)
class Event:
    op: str | None  # the HLO instruction's name; None for a device event without one (a memcpy)
    name: str
    start_ns: float
    duration_ns: float


# -- the program ---------------------------------------------------------------------------------
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][\w\-]*)\(")
_OPERANDS = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"\b(?:calls|to_apply|called_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_SCALAR = re.compile(r"^[a-z]\w*\[\]\s")
_TABLE_ROW = re.compile(r'^(\d+) (?:"(.*)"|\{(.*)\})$')


def _field(text: str, name: str) -> str:
    match = re.search(rf'\b{name}=(?:"((?:[^"\\]|\\.)*)"|(\w+))', text)
    return (match.group(1) if match.group(1) is not None else match.group(2)) if match else ""


@functools.cache
def enclosing_function(path: str, line: int) -> str:
    """The qualified name of the innermost function of `path` around `line` ('' if none)."""
    try:
        tree = ast.parse(open(path).read())
    except OSError:
        return ""
    best = ""

    def visit(node, prefix: str) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                    child.lineno <= line <= child.end_lineno):
                name, is_class = f"{prefix}{child.name}", isinstance(child, ast.ClassDef)
                best = best if is_class else name
                visit(child, f"{name}." if is_class else f"{name}.<locals>.")

    visit(tree, "")
    return best


def parse_program(text: str) -> tuple[dict, dict]:
    """`compiled.as_text()` -> ({instruction: Op}, {computation: (its instructions, its root)})."""
    lines, tables, section = text.splitlines(), collections.defaultdict(dict), None
    for line in lines:  # where instructions were traced from: tables of files, functions, frames
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
        elif section and (row := _TABLE_ROW.match(line)):
            tables[section][int(row[1])] = row[2] if row[2] is not None else dict(
                pair.split("=", 1) for pair in row[3].split())
        else:
            section = None
    ops, computations, computation = {}, {}, None
    for line in lines:
        if header := _HEADER.match(line):
            computation = header[1]
            computations[computation] = ([], None)
        elif computation and (instruction := _INSTRUCTION.match(line)):
            root, name, rest = instruction.groups()
            opcode = _OPCODE.search(rest)
            metadata = rest[rest.find("metadata={"):] if "metadata={" in rest else ""
            calls = tuple(c.strip().lstrip("%") for group in _CALLS.findall(rest) for c in group.strip("{}").split(","))
            operands = _OPERANDS.findall(rest[opcode.end():rest.find(")", opcode.end())]) if opcode else []
            ops[name] = Op(opcode[1] if opcode else "", _field(rest, "custom_call_target"), _field(metadata, "op_name"),
                           *_origin(tables, metadata), calls, tuple(operands), bool(_SCALAR.match(rest)))
            names, kept_root = computations[computation]
            names.append(name)
            computations[computation] = (names, name if root else kept_root)
    return ops, computations


def _origin(tables, metadata: str) -> tuple[str, str]:
    """(file, function) of an instruction's metadata: its stack frame's, or its source line's."""
    if frame := tables["StackFrames"].get(int(_field(metadata, "stack_frame_id") or 0)):
        location = tables["FileLocations"].get(int(frame["file_location_id"]), {})
        return (tables["FileNames"].get(int(location.get("file_name_id", 0)), ""),
                tables["FunctionNames"].get(int(location.get("function_name_id", 0)), ""))
    if file := _field(metadata, "source_file"):
        return file, enclosing_function(file, int(_field(metadata, "source_line") or 0))
    return "", ""


# -- each instruction's kind -----------------------------------------------------------------------
def op_kinds(text: str) -> dict:
    """{instruction name: (its kind (KINDS), or None for control flow; the function it was traced
    from)} of a compiled program's text."""
    ops, computations = parse_program(text)

    def inside(op: Op, seen: set) -> list:  # the instructions of what `op` calls, nested calls too
        found = []
        for called in op.calls:
            if called in computations and called not in seen:
                seen.add(called)
                for name in computations[called][0]:
                    found += [ops[name], *inside(ops[name], seen)]
        return found

    def origin(op: Op, depth: int = 3) -> Op:
        """Whose metadata speaks for `op`: its own, its fused root's (or another fused
        instruction's), else that of the first instruction it reads that has some."""
        if op.op_name or op.function:
            return op
        names, root = computations.get(op.calls[0], ([], None)) if op.calls else ([], None)
        fused = (ops[name] for name in (root, *reversed(names)) if name)
        read = (origin(ops[name], depth - 1) for name in op.operands if name in ops and depth)
        return next((o for o in itertools.chain(fused, read) if o.op_name or o.function), op)

    kinds = {}
    for name, op in ops.items():
        source = origin(op)
        kinds[name] = (kind_of(op, source, inside(op, set())), source.function or source.op_name.split("/")[-1])
    return kinds


def kind_of(op: Op, origin: Op, inside: list) -> str | None:
    """The kind of work `op` does, from its opcode and those of the instructions it fuses
    (`inside`), and from `origin`'s name stack and function. A matmul computed again for the
    backward pass is recompute; so is a fusion without matmuls that computes anything again."""
    if op.opcode in CONTROL:
        return None
    computed = (op, *inside)
    if ATTENTION_KERNEL.search(" ".join(i.target for i in computed)):
        return FUSED_ATTENTION
    matmuls = [i for i in computed if i.opcode in ("dot", "convolution") or GEMM_KERNEL.search(i.target)]
    if matmuls:
        return REMAT if all("rematted_computation" in i.op_name for i in matmuls) else MATMULS
    if any("rematted_computation" in i.op_name for i in (origin, *computed)):
        return REMAT
    if "/optax/" in origin.file or origin.file.endswith("layerwise.py") or origin.function.startswith(
            "Trainer._train_step_fn"):
        return OPTIMIZER
    if {i.opcode for i in inside or [op] if not i.scalar} <= MOVES:  # moving arrays, counting indices
        return COPIES
    if origin.function in LOSS_FUNCTIONS:
        return LOSS
    if "attention" in origin.function.lower() or "position" in origin.function.lower():
        return ATTENTION
    return ELEMENTWISE


def kind_of_unknown(event_name: str) -> str:
    """The kind of a device event whose instruction is not in the program: by its kernel's name."""
    if re.search(r"memcpy|memset", event_name, re.IGNORECASE):
        return COPIES
    if ATTENTION_KERNEL.search(event_name):
        return FUSED_ATTENTION
    return MATMULS if GEMM_KERNEL.search(event_name) else OTHER


# -- the profile -----------------------------------------------------------------------------------
def profile(run, program: str, steps: int, keep: pathlib.Path | None = None) -> dict:
    """`time_by_kind` of `run()` under JAX's profiler: `steps` runs of `program` (its compiled
    text), the last waited for. `keep`: a path to which the trace (.xplane.pb.gz) and the program
    (.hlo.txt.gz) are copied, to read again elsewhere."""
    import jax

    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            run()
        [trace] = pathlib.Path(folder).rglob("*.xplane.pb")
        serialized = trace.read_bytes()
    if keep:
        keep.with_name(f"{keep.name}.xplane.pb.gz").write_bytes(gzip.compress(serialized))
        keep.with_name(f"{keep.name}.hlo.txt.gz").write_bytes(gzip.compress(program.encode()))
    return from_trace(serialized, program, steps)


def from_trace(serialized: bytes, program: str, steps: int) -> dict:
    """`time_by_kind` of a serialized trace (an XSpace) of `steps` runs of `program` (its text)."""
    from jax.profiler import ProfileData

    return time_by_kind(device_events(ProfileData.from_serialized_xspace(serialized)), op_kinds(program), steps)


def device_events(profile) -> list:
    """The device's events in a `jax.profiler.ProfileData`: a GPU's kernels and copies (its
    streams' lines; those without an instruction kept, as `op=None`), else, on a CPU, the host's
    events that name an instruction (XLA:CPU's thunks). Only the profiled program runs meanwhile."""
    devices = [plane for plane in profile.planes if plane.name.startswith("/device:")]
    events = []
    for plane in devices or profile.planes:
        for line in plane.lines:
            if devices and not line.name.startswith("Stream"):
                continue  # CUPTI's overhead, or lines derived from the streams' events
            for event in line.events:
                op = dict(event.stats).get("hlo_op")
                if devices or op:
                    events.append(Event(op, event.name, event.start_ns, event.duration_ns))
    return events


def time_by_kind(events: list, kinds: dict, steps: int) -> dict:
    """Milliseconds a step of each kind (KINDS), the idle gaps (the profiled span that no event
    covers), and the instructions that took longest; a CPU's thunks may overlap, so the kinds
    add up to more than their span there."""
    per_kind, per_op, spans = collections.Counter(), collections.Counter(), []
    # XLA:GPU runs a command buffer's (a CUDA graph's) kernels under the buffer's name; each kernel is
    # named after its instruction, with '_' for '.' and '-'
    by_kernel = {re.sub(r"[.\-]", "_", name): name for name in kinds}
    for event in events:
        op = event.op if event.op in kinds else by_kernel.get(event.name)
        kind, where = kinds[op] if op else (kind_of_unknown(event.name), "")
        if kind is None:
            continue
        per_kind[kind] += event.duration_ns
        per_op[(op or event.name, kind, where)] += event.duration_ns
        spans.append((event.start_ns, event.start_ns + event.duration_ns))
    covered, end = 0.0, -float("inf")
    for start, stop in sorted(spans):
        covered += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = max(s for _, s in spans) - min(s for s, _ in spans) if spans else 0.0
    per_kind[IDLE] = span - covered
    ms = {kind: per_kind[kind] / steps / 1e6 for kind in KINDS if per_kind[kind]}
    return {"steps": steps, "span_ms": span / steps / 1e6, "events": len(spans), "ms": ms,
            "share": {kind: value / sum(ms.values()) for kind, value in ms.items()},
            "longest": [{"op": op, "kind": kind, "function": where, "ms": ns / steps / 1e6}
                        for (op, kind, where), ns in per_op.most_common(12)]}


def table(result: dict) -> str:
    """`time_by_kind`'s result as a Markdown table: kind, ms a step, share."""
    rows = [f"| {kind} | {ms:.2f} | {result['share'][kind]:.1%} |"
            for kind, ms in sorted(result["ms"].items(), key=lambda item: -item[1])]
    return "\n".join(["| kind | ms a step | share |", "|---|---:|---:|", *rows])


def main(argv=None) -> None:
    """Classify a kept profile again: `python bench/step_profile.py PREFIX STEPS`, PREFIX naming
    `PREFIX.xplane.pb.gz` and `PREFIX.hlo.txt.gz` (bench/gpu.py's `profile` phase writes them)."""
    import sys

    prefix, steps = (argv or sys.argv[1:])[:2]
    result = from_trace(gzip.decompress(pathlib.Path(f"{prefix}.xplane.pb.gz").read_bytes()),
                        gzip.decompress(pathlib.Path(f"{prefix}.hlo.txt.gz").read_bytes()).decode(), int(steps))
    print(table(result))
    for row in result["longest"]:
        print(f"{row['ms']:8.2f} ms  {row['kind']:40s} {row['op']} ({row['function']})")


if __name__ == "__main__":
    main()
