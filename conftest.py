"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n`): each test
file runs whole on one worker, so its module fixtures are built once, except SPREAD's, whose
tests are each a unit; the notebooks run as one unit, in order, on one worker, since each
reads the runs the ones before it wrote. The longest units go first. (A scheduler of our own,
since xdist's `loadgroup` marks no longer reach pytest 9's node ids.)"""
import pytest


# the longest units first (measured: minutes each on 2 cores), so that none is left to run
# alone at the end while the other worker waits
FIRST = ("notebooks", "tests/test_run_folder.py", "tests/test_hosted_path.py", "tests/test_train.py")
# files whose tests are each a unit of their own (each several minutes of processes of its own;
# a module fixture is then built once on each worker that runs some of them)
SPREAD = ("tests/test_run_folder.py", "tests/test_hosted_path.py")


def _file(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "notebooks" if path.endswith(".ipynb") else path


def _unit(nodeid: str) -> str:
    return nodeid if _file(nodeid) in SPREAD else _file(nodeid)


def pytest_collection_modifyitems(items):
    order = {unit: rank for rank, unit in enumerate(FIRST)}
    items.sort(key=lambda item: order.get(_file(item.nodeid), len(FIRST)))  # stable: each file keeps its order


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling  # only a distributed run (-n) loads xdist's scheduler

    class ByFileNotebooksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByFileNotebooksTogether(config, log)
