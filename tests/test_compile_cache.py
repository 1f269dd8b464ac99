"""The compiled programs a kernel keeps for the next (`system.keep_compiled_programs`): loaded by
the next process, each entry written whole, a truncated one compiled again and replaced, and the
folder of the first compile kept until a restart. Every process here keeps its programs in a
temporary runs folder."""
import json
import os
import subprocess
import sys
import warnings

from t5nb import system

# A process of the course: its setup cell, then one train step compiled; with a folder given, the
# setup cell again with the runs there. Prints how many programs JAX loaded from its persistent
# cache (hits) and compiled and wrote there (misses), and the cache's limits.
COMPILE_A_STEP = """
import json, os, sys, jax, jax.numpy as jnp, t5nb
events = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
t5nb.choose_profile("ci")
from t5nb.config import get_config
from t5nb.trainer import Trainer, TrainConfig
trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=128), TrainConfig())
batch = {name: jax.ShapeDtypeStruct((4, 16), jnp.int32, sharding=trainer.batch_sharding)
         for name in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")}
trainer.compile_train_step(trainer.abstract_state(), batch)
if len(sys.argv) > 1:
    os.environ["T5NB_RUNS_DIR"] = sys.argv[1]
    t5nb.choose_profile("ci")
print(json.dumps({"hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses"),
                  "max_bytes": jax.config.jax_compilation_cache_max_size,
                  "min_compile_s": jax.config.jax_persistent_cache_min_compile_time_secs}))
"""
UNREADABLE = "Error reading persistent compilation cache entry"


def test_the_next_process_loads_every_kept_program_and_a_truncated_entry_is_compiled_again_and_replaced(tmp_path):
    env = {name: value for name, value in os.environ.items()
           if name not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                           "JAX_COMPILATION_CACHE_MAX_SIZE")}
    env["T5NB_RUNS_DIR"] = str(tmp_path / "runs")
    compiled = tmp_path / "runs" / "compiled"

    def run(*arguments):
        process = subprocess.run([sys.executable, "-c", COMPILE_A_STEP, *arguments], capture_output=True, text=True,
                                 env=env)
        assert process.returncode == 0, process.stderr[-2000:]
        assert f"compiled programs are kept in {compiled}" in process.stdout
        return process, json.loads(process.stdout.splitlines()[-1])

    def entries():
        return {path.name: path.read_bytes() for path in compiled.glob("*-cache")}

    first, counts = run(str(tmp_path / "elsewhere"))  # the setup cell run again, with runs elsewhere
    kept = entries()
    assert kept and counts == {"hits": 0, "misses": len(kept), "max_bytes": system.CACHE_MAX_BYTES,
                               "min_compile_s": system.CACHE_MIN_COMPILE_S}
    assert (f"compiled programs stay in {compiled}, not {tmp_path / 'elsewhere' / 'compiled'}, until the kernel "
            "restarts") in first.stdout
    assert not (tmp_path / "elsewhere" / "compiled").exists()
    assert run()[1] == {**counts, "hits": len(kept), "misses": 0}  # the next process compiles nothing it kept

    largest = max(kept, key=lambda name: len(kept[name]))
    (compiled / largest).write_bytes(kept[largest][: len(kept[largest]) // 2])  # a write cut short by a kill
    healing, healed = run()
    assert UNREADABLE in healing.stderr and healed["misses"] == 1  # compiled again, and written whole
    assert len(entries()[largest]) > len(kept[largest]) // 2
    after, loaded = run()
    assert UNREADABLE not in after.stderr and loaded == {**counts, "hits": len(kept), "misses": 0}
    assert entries().keys() == kept.keys() and not list(compiled.glob(".*.tmp"))  # no temporaries left


def test_an_entry_written_by_a_plain_jax_cache_in_the_same_folder_is_evicted_first_not_failed_on(tmp_path):
    """A process without `keep_compiled_programs` (JAX_COMPILATION_CACHE_DIR alone) writes no access
    time: the next write here counts that entry as the least recently used, and says nothing."""
    from jax._src import lru_cache

    from t5nb.system import WholeEntries

    (tmp_path / f"plain{lru_cache._CACHE_SUFFIX}").write_bytes(b"x" * 60)  # as JAX's unbounded cache writes it
    cache = WholeEntries(str(tmp_path), max_size=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.put("kept", b"y" * 60)
    assert cache.get("kept") == b"y" * 60 and not (tmp_path / f"plain{lru_cache._CACHE_SUFFIX}").exists()


def test_a_cache_without_a_size_cap_writes_and_reads_entries_and_evicts_nothing(tmp_path):
    """JAX's `max_size=-1`: no lock and no eviction, every entry written whole (a write again
    replaces it) and read back."""
    from jax._src import lru_cache

    from t5nb.system import WholeEntries

    cache = WholeEntries(str(tmp_path), max_size=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for index in range(3):
            cache.put(f"entry{index}", bytes([index]) * 1000)
        cache.put("entry0", b"again")
    assert [cache.get(f"entry{index}") for index in range(3)] == [b"again", b"\x01" * 1000, b"\x02" * 1000]
    assert sorted(path.name for path in tmp_path.iterdir()) == [f"entry{i}{lru_cache._CACHE_SUFFIX}" for i in range(3)]


def test_writes_read_the_folders_size_once_a_while_and_keep_it_under_the_cap(tmp_path, monkeypatch):
    """Between two reads of the folder (CACHE_SIZE_READ_S apart), a process counts its own writes:
    past the cap, the folder is read again and the least recently used entries go."""
    from jax._src import lru_cache

    from t5nb.system import WholeEntries

    reads, scandir = [], os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: reads.append(path) or scandir(path))
    cache = WholeEntries(str(tmp_path), max_size=1000)
    for index in range(9):
        cache.put(f"entry{index}", b"x" * 100)
    assert len(reads) == 1  # the first write read the folder; the next eight were counted
    for index in range(9, 12):  # past the cap
        cache.put(f"entry{index}", b"x" * 100)
    kept = sorted(int(path.name.removeprefix("entry").removesuffix(lru_cache._CACHE_SUFFIX))
                  for path in tmp_path.glob(f"*{lru_cache._CACHE_SUFFIX}"))
    assert sum(path.stat().st_size for path in tmp_path.glob(f"*{lru_cache._CACHE_SUFFIX}")) <= 1000
    assert kept == list(range(12 - len(kept), 12)) and len(kept) == 10  # the oldest went
    monkeypatch.setattr(system, "CACHE_SIZE_READ_S", 0)  # time for a fresh read
    reads.clear()
    cache.put("entry12", b"x" * 10)
    assert reads and cache.get("entry12") == b"x" * 10
