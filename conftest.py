"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n`): each test
file runs whole on one worker, so its module fixtures are built once, except SPREAD's, whose
tests are each a unit; the notebooks run as one unit, in order, on one worker, since each
reads the runs the ones before it wrote. The longest units go first. (A scheduler of our own,
since xdist's `loadgroup` marks no longer reach pytest 9's node ids.)

Where TensorFlow is not installed (a GPU machine's image), or with
T5NB_TESTS_WITHOUT_TENSORFLOW=1 (to rehearse that here), a test file or test that imports
TensorFlow or a package built on it is skipped, naming it, and so is one marked
`needs_tensorflow` (it installs TensorFlow, or runs a process that imports it). Likewise a test
that needs the notebook packages (nbformat, nbclient, nbval, ipywidgets), where they are not
installed, or with T5NB_TESTS_AS_ON_GPU=1, which hides both families as a GPU image lacks them:
`python -m pytest tests` then runs every test that needs neither."""
import importlib.abc
import importlib.util
import os
import sys

import pytest

from t5nb.host import collect_cycles_less_often

# the test processes collect cycles as t5nb's own do (`t5nb.tune_host()`)
collect_cycles_less_often()

# packages a GPU machine's image may lack, by family: the input pipeline's (each imports
# TensorFlow) and the notebooks' (reading, running and drawing notebooks)
TENSORFLOW_FAMILY = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "seqio", "t5", "clu")
NOTEBOOK_FAMILY = ("nbformat", "nbclient", "nbval", "ipywidgets")
AS_ON_GPU = os.environ.get("T5NB_TESTS_AS_ON_GPU") == "1"


def _hidden(family, rehearsed: bool) -> tuple:
    """The family's packages to skip on: all of them when `rehearsed`, else those not installed."""
    if rehearsed:
        return family
    return tuple(name for name in family if importlib.util.find_spec(name) is None)


class _Without(importlib.abc.MetaPathFinder):
    """Importing a hidden package skips the test (or test file) that imports it, naming it."""

    def __init__(self, hidden):
        self.hidden = hidden

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in self.hidden:
            built_on = " (built on TensorFlow)" if top in TENSORFLOW_FAMILY[1:] else ""
            pytest.skip(f"needs {top}{built_on}, which is not installed here", allow_module_level=True)


HIDDEN = (*_hidden(TENSORFLOW_FAMILY, AS_ON_GPU or os.environ.get("T5NB_TESTS_WITHOUT_TENSORFLOW") == "1"),
          *_hidden(NOTEBOOK_FAMILY, AS_ON_GPU))
WITHOUT_TENSORFLOW = "tensorflow" in HIDDEN
if HIDDEN:
    sys.meta_path.insert(0, _Without(HIDDEN))


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_tensorflow: skipped where TensorFlow is not installed")


# the longest units first (measured on 2 cores: minutes each, down to test_tasks_real.py's 40 s,
# which, handed out last, ran alone for 44 s), so that none is left to run alone at the end while
# the other workers wait; `make test` passes --no-loadscope-reorder, as
# xdist otherwise hands out the units with the most tests first, and the one-test kill chains last
FIRST = ("notebooks", "tests/test_browser.py", "tests/test_run_folder.py", "tests/test_hosted_path.py",
         "tests/test_train.py", "tests/test_adapters.py", "tests/test_workflow.py", "tests/test_model.py",
         "tests/test_tasks_batching.py", "tests/test_tasks_real.py")
# files whose tests are each a unit of their own (each several minutes of processes of its own;
# a module fixture is then built once on each worker that runs some of them)
SPREAD = ("tests/test_run_folder.py", "tests/test_hosted_path.py", "tests/test_browser.py")


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
