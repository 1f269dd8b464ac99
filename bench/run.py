"""Train-step and cached greedy-decode throughput of t5nb (JAX) vs Hugging Face T5 (PyTorch), side by side.

    python bench/run.py            # full: T5.1.1-tiny and T5.1.1-small shapes
    python bench/run.py --quick    # a few minutes on 2 CPU cores

Same weights (t5nb -> `save_hf` -> `from_pretrained`), same batch, same dtype, Adafactor in
both; decoding: `t5nb.decode.greedy_decode` vs `generate()` (greedy, kv cache), 64 new tokens. Compile and warm-up steps are excluded (compile time is reported apart); step times
are medians. Writes `bench/results/latest.json` and a timestamped copy, and prints a table.
Both run in one process, so both get t5nb's host-memory setting (glibc keeps freed memory).
"""
import t5nb

t5nb.tune_host()  # first: its malloc setting must precede any other thread's first allocation
import torch

# Flush-to-zero before torch's first parallel op (it is per thread): a subnormal-heavy
# backward otherwise makes CPU matmuls ~3x slower. XLA flushes denormals by default.
torch.set_flush_denormal(True)

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import transformers  # noqa: E402

from t5nb import checkpoints, decode  # noqa: E402
from t5nb.config import get_config  # noqa: E402
from t5nb.system import time_matmul  # noqa: E402
from t5nb.trainer import Trainer, TrainConfig, train_step_flops  # noqa: E402
from programs import make_batch  # noqa: E402  (bench/programs.py)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SHAPES = {  # name -> (preset, batch, input length, target length)
    "tiny": ("t5.1.1-tiny", 8, 512, 114),
    "small": ("t5.1.1-small", 8, 512, 114),
}
LEARNING_RATE = 1e-3
DECODE_PRESET, DECODE_INPUT_LENGTH, DECODE_NEW_TOKENS = "t5.1.1-small", 512, 64


# -- machine -------------------------------------------------------------------------------
def describe_device() -> dict:
    jax_device = jax.devices()[0]
    return {"jax_backend": jax.default_backend(), "jax_device": jax_device.device_kind,
            "torch_device": torch_device().type,
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "jax": jax.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__}


def torch_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_torch_matmul(n: int, dtype, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an [n, n] @ [n, n] in torch (as `t5nb.system.time_matmul`)."""
    x = torch.randn(n, n, device=torch_device()).to(dtype)
    x @ x
    torch_sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x @ x
        torch_sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def matmul_peaks(n: int) -> dict:
    """Measured matmul FLOP/s of both frameworks, fp32 and bf16, in this process."""
    return {"jax_fp32": time_matmul(n, jnp.float32), "jax_bf16": time_matmul(n, jnp.bfloat16),
            "torch_fp32": time_torch_matmul(n, torch.float32),
            "torch_bf16": time_torch_matmul(n, torch.bfloat16)}


class PeakMemory:
    """Peak process RSS (sampled every 20 ms) and accelerator memory over a `with` block."""

    def __init__(self):
        self.process, self.peak_rss, self._stop = psutil.Process(), 0, threading.Event()

    def __enter__(self):
        self.peak_rss = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        return self

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def report(self, framework: str) -> dict:
        out = {"peak_rss_mb": self.peak_rss / 2**20}
        if framework == "torch" and torch.cuda.is_available():
            out["peak_device_mb"] = torch.cuda.max_memory_allocated() / 2**20
        if framework == "jax" and jax.default_backend() != "cpu":
            stats = jax.devices()[0].memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                out["peak_device_mb"] = stats["peak_bytes_in_use"] / 2**20
        return out


# -- work ----------------------------------------------------------------------------------
def timed_steps(step, warmup: int, repeats: int) -> tuple[float, list[float]]:
    """(seconds of the first call, which compiles, [seconds of each timed call after warm-up])."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return first, times


def bench_t5nb(trainer: Trainer, params: dict, batch: dict, warmup: int, repeats: int) -> dict:
    holder = {"state": trainer.init_state(params)}
    sharded = trainer.shard_batch(batch)

    def step():
        holder["state"], sums = trainer.train_step(holder["state"], sharded)
        jax.block_until_ready(sums)

    with PeakMemory() as memory:
        first, times = timed_steps(step, warmup, repeats)
    return {"step_s": statistics.median(times), "step_times_s": times, "compile_s": trainer.compile_seconds,
            "first_step_s": first, **memory.report("jax")}


def bench_hf(hf_dir: str, batch: dict, dtype: str, warmup: int, repeats: int, compiled: bool = False) -> dict:
    """transformers' train step (eager, or the model through `torch.compile`)."""
    device = torch_device()
    model = transformers.T5ForConditionalGeneration.from_pretrained(hf_dir).to(device).train()
    if model.lm_head.weight is model.shared.weight and not model.config.tie_word_embeddings:
        raise RuntimeError("transformers tied lm_head to the embedding of an untied T5.1.1 model")
    forward = torch.compile(model) if compiled else model
    optimizer = transformers.optimization.Adafactor(
        model.parameters(), lr=LEARNING_RATE, scale_parameter=True, relative_step=False, warmup_init=False)
    inputs = {name: torch.from_numpy(array.astype(np.int64)).to(device) for name, array in batch.items()}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step():
        with autocast:
            loss = forward(input_ids=inputs["encoder_input_tokens"],
                           attention_mask=inputs["encoder_input_tokens"] > 0,
                           decoder_input_ids=inputs["decoder_input_tokens"],
                           labels=inputs["decoder_target_tokens"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch_sync()

    with PeakMemory() as memory:
        first, times = timed_steps(step, warmup, repeats)
    return {"step_s": statistics.median(times), "step_times_s": times, "first_step_s": first,
            **memory.report("torch")}


def bench_train(shape: str, dtype: str, dropout: float, warmup: int, repeats: int) -> dict:
    print(f"train step, {shape} shape", flush=True)
    preset, batch_size, inputs, targets = SHAPES[shape]
    config = get_config(preset, dtype=jnp.dtype(dtype), dropout_rate=dropout)
    batch = make_batch(config, batch_size, inputs, targets)
    trainer = Trainer(config, TrainConfig(learning_rate=LEARNING_RATE, optimizer="adafactor"))
    params = jax.device_get(trainer.init_params())  # T5X init: output layer std d_model**-0.5
    with tempfile.TemporaryDirectory() as hf_dir:
        checkpoints.save_hf(trainer.model(params), hf_dir)
        hf = bench_hf(hf_dir, batch, dtype, warmup, repeats)
    gc.collect()
    ours = bench_t5nb(trainer, params, batch, warmup, repeats)
    gc.collect()
    flops = train_step_flops(config, batch_size, inputs, targets)
    tokens = batch_size * (inputs + targets)
    result = {"shape": f"{preset} b{batch_size} {inputs}/{targets}", "dtype": dtype, "dropout": dropout,
              "optimizer": "adafactor", "tokens_per_step": tokens, "analytic_flops": flops,
              "t5nb": ours, "hf": hf}
    for name, run in (("t5nb", ours), ("hf", hf)):
        run["tokens_per_s"] = tokens / run["step_s"]
        run["flops_per_s"] = flops / run["step_s"]
        result[f"{name}_tokens_per_s"] = run["tokens_per_s"]
    result["ratio_vs_hf"] = hf["step_s"] / ours["step_s"]
    return result


def add_peak_fractions(result: dict, peaks: dict) -> None:
    """Achieved FLOP/s of each framework as a fraction of its own measured matmul peak."""
    peak_key = "bf16" if result["dtype"] == "bfloat16" else "fp32"
    for name, framework in (("t5nb", "jax"), ("hf", "torch")):
        result[name]["frac_of_peak"] = result[name]["flops_per_s"] / peaks[f"{framework}_{peak_key}"]
    result["frac_of_jax_fp32_peak"] = result["t5nb"]["flops_per_s"] / peaks["jax_fp32"]


def bench_decode(batch_sizes, dtype: str, repeats: int) -> list[dict]:
    """Greedy decoding of DECODE_NEW_TOKENS tokens with the kv cache, encoding included."""
    config = get_config(DECODE_PRESET, dtype=jnp.dtype(dtype), dropout_rate=0.0)
    trainer = Trainer(config, TrainConfig())
    model = trainer.model(trainer.init_params())
    results = []
    with tempfile.TemporaryDirectory() as hf_dir:
        checkpoints.save_hf(model, hf_dir)
        hf_model = transformers.T5ForConditionalGeneration.from_pretrained(hf_dir).to(torch_device()).eval()
        for batch_size in batch_sizes:
            tokens = make_batch(config, batch_size, DECODE_INPUT_LENGTH, 1, seed=1)["encoder_input_tokens"]
            ours_out = {}

            def ours():
                ours_out["sequences"] = np.asarray(decode.greedy_decode(model, tokens, DECODE_NEW_TOKENS).sequences)

            inputs = torch.from_numpy(tokens.astype(np.int64)).to(torch_device())
            hf_out = {}

            def hf():
                with torch.no_grad(), torch.autocast(torch_device().type, torch.bfloat16, enabled=dtype == "bfloat16"):
                    hf_out["sequences"] = hf_model.generate(
                        inputs, attention_mask=inputs > 0, do_sample=False, num_beams=1, use_cache=True,
                        max_new_tokens=DECODE_NEW_TOKENS).cpu().numpy()[:, 1:]  # drop the start token
                torch_sync()

            result = {"batch": batch_size, "input_length": DECODE_INPUT_LENGTH, "new_tokens": DECODE_NEW_TOKENS}
            for name, run in (("t5nb", ours), ("hf", hf)):
                first, times = timed_steps(run, 1, repeats)
                result[name] = {"s": statistics.median(times), "times_s": times, "first_call_s": first}
            # Equal work: both ran all the steps (no early EOS), and the greedy tokens agree.
            generated = {name: int(np.sum(out["sequences"] > 0)) for name, out in (("t5nb", ours_out), ("hf", hf_out))}
            result["same_tokens_frac"] = float(np.mean(ours_out["sequences"][:, :hf_out["sequences"].shape[1]]
                                                       == hf_out["sequences"][:, :DECODE_NEW_TOKENS]))
            for name in ("t5nb", "hf"):
                result[name]["generated_tokens"] = generated[name]
                result[f"{name}_tokens_per_s"] = generated[name] / result[name]["s"]
            result["ratio_vs_hf"] = result["t5nb_tokens_per_s"] / result["hf_tokens_per_s"]
            results.append(result)
    return results


# -- report --------------------------------------------------------------------------------
def print_table(results: dict) -> None:
    print(f"\ndevice: {results['device']['jax_device']} ({results['device']['cpu_count']} cores), "
          f"load average at start {results['loadavg_start']}, at end {results['loadavg_end']}")
    print("matmul peaks (GFLOP/s, best of start and end): " + ", ".join(
        f"{k} {v / 1e9:.0f} ({results['peaks_start'][k] / 1e9:.0f}, {results['peaks_end'][k] / 1e9:.0f})"
        for k, v in results["peaks"].items()))
    header = f"{'shape':32s} {'impl':5s} {'step s':>8s} {'tok/s':>8s} {'GFLOP/s':>8s} {'%peak':>6s} " \
             f"{'compile s':>9s} {'RSS MB':>7s}"
    print(header + "\n" + "-" * len(header))
    for train in results["train_runs"]:
        for name in ("t5nb", "hf"):
            run = train[name]
            compile_s = f"{run['compile_s']:.1f}" if "compile_s" in run else "-"
            print(f"{train['shape'] + ' ' + train['dtype']:32s} {name:5s} {run['step_s']:8.3f} "
                  f"{run['tokens_per_s']:8.0f} {run['flops_per_s'] / 1e9:8.1f} {100 * run['frac_of_peak']:5.1f}% "
                  f"{compile_s:>9s} {run['peak_rss_mb']:7.0f}")
        print(f"{'':32s} t5nb/HF throughput {train['ratio_vs_hf']:.2f}x, "
              f"{100 * train['frac_of_jax_fp32_peak']:.1f}% of JAX fp32 matmul peak "
              f"(analytic {train['analytic_flops'] / 1e9:.0f} GFLOP/step)")
    for run in results.get("decode_runs", []):
        print(f"greedy decoding, batch {run['batch']}, {run['input_length']} input tokens, {run['new_tokens']} new: "
              f"t5nb {run['t5nb']['s']:.2f} s ({run['t5nb_tokens_per_s']:.0f} tokens/s), "
              f"hf {run['hf']['s']:.2f} s ({run['hf_tokens_per_s']:.0f} tokens/s), {run['ratio_vs_hf']:.2f}x, "
              f"same tokens {100 * run['same_tokens_frac']:.0f}%")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats; a few minutes on 2 CPU cores")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="t5nb compute dtype / torch autocast dtype (parameters stay float32)")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout rate in both models")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding benchmark")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()

    on_cpu = jax.default_backend() == "cpu"
    repeats = {"tiny": 5 if args.quick else 10, "small": 3 if args.quick else 5}
    warmup = 1  # beyond the first call, which is never timed
    results = {"mode": "quick" if args.quick else "full", "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "device": describe_device(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    print(f"load average {results['loadavg_start']}; measuring matmul peaks", flush=True)
    peak_n = 2048 if on_cpu else 8192
    results["peaks_start"] = matmul_peaks(peak_n)
    results["train_runs"] = [bench_train(shape, args.dtype, args.dropout, warmup, repeats[shape])
                             for shape in args.shapes]
    if not args.no_decode:
        print("greedy decoding", flush=True)
        results["decode_runs"] = bench_decode([1, 8], args.dtype, 1 if args.quick else 3)
        results["decode"] = results["decode_runs"][-1]  # the headline: batch 8
    # A peak is the best rate seen: measured before and after the runs, as one slow moment
    # of the machine would otherwise flatter every fraction of it.
    results["peaks_end"] = matmul_peaks(peak_n)
    results["peaks"] = {k: max(results["peaks_start"][k], results["peaks_end"][k]) for k in results["peaks_start"]}
    for train in results["train_runs"]:
        add_peak_fractions(train, results["peaks"])
    results["train"] = results["train_runs"][-1]  # the headline: the largest shape run
    results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print_table(results)

    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=2, default=str)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (args.out / f"{stamp}-{results['device']['jax_backend']}-{results['mode']}.json").write_text(text)
    (args.out / "latest.json").write_text(text)


if __name__ == "__main__":
    main()
