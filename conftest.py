"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n`): each test
file runs whole on one worker, so its module fixtures are built once, except SPREAD's, whose
tests are each a unit; the notebooks run as one unit, in order, on one worker, since each
reads the runs the ones before it wrote. The longest units go first. (A scheduler of our own,
since xdist's `loadgroup` marks no longer reach pytest 9's node ids.)

Where TensorFlow is not installed (the GPU machine's image), or with
T5NB_TESTS_WITHOUT_TENSORFLOW=1 (to rehearse that here), a test file or test that imports
TensorFlow or a package built on it is skipped, naming it, and so is one marked
`needs_tensorflow` (it installs TensorFlow, or runs a process that imports it): `python -m
pytest tests` then runs every test that needs no TensorFlow."""
import importlib.abc
import importlib.util
import os
import sys

import pytest

# the input pipeline's packages: each imports TensorFlow
TENSORFLOW_FAMILY = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "seqio", "t5", "clu")


class _WithoutTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in TENSORFLOW_FAMILY:
            built_on = "" if top == "tensorflow" else " (built on TensorFlow)"
            pytest.skip(f"needs {top}{built_on}, which is not installed here", allow_module_level=True)


WITHOUT_TENSORFLOW = (os.environ.get("T5NB_TESTS_WITHOUT_TENSORFLOW") == "1"
                      or importlib.util.find_spec("tensorflow") is None)
if WITHOUT_TENSORFLOW:
    sys.meta_path.insert(0, _WithoutTensorFlow())


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_tensorflow: skipped where TensorFlow is not installed")


# the longest units first (measured: minutes each on 2 cores), so that none is left to run
# alone at the end while the other workers wait; `make test` passes --no-loadscope-reorder, as
# xdist otherwise hands out the units with the most tests first, and the one-test kill chains last
FIRST = ("notebooks", "tests/test_run_folder.py", "tests/test_hosted_path.py", "tests/test_train.py",
         "tests/test_adapters.py", "tests/test_workflow.py", "tests/test_model.py", "tests/test_tasks_batching.py")
# files whose tests are each a unit of their own (each several minutes of processes of its own;
# a module fixture is then built once on each worker that runs some of them)
SPREAD = ("tests/test_run_folder.py", "tests/test_hosted_path.py")


def _file(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "notebooks" if path.endswith(".ipynb") else path


def _unit(nodeid: str) -> str:
    return nodeid if _file(nodeid) in SPREAD else _file(nodeid)


def pytest_collection_modifyitems(items):
    if WITHOUT_TENSORFLOW:
        skip = pytest.mark.skip(reason="needs TensorFlow, which is not installed here")
        for item in items:
            if item.get_closest_marker("needs_tensorflow"):
                item.add_marker(skip)
    order = {unit: rank for rank, unit in enumerate(FIRST)}
    items.sort(key=lambda item: order.get(_file(item.nodeid), len(FIRST)))  # stable: each file keeps its order


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling  # only a distributed run (-n) loads xdist's scheduler

    class ByFileNotebooksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByFileNotebooksTogether(config, log)
