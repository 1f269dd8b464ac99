"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n`): each test
file runs whole on one worker, so its module fixtures are built once; the notebooks run as one
unit, in order, on one worker, since each reads the runs the ones before it wrote. The notebooks
go first: theirs is the longest chain. (A scheduler of our own, since xdist's `loadgroup` marks
no longer reach pytest 9's node ids.)"""
import pytest


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "notebooks" if path.endswith(".ipynb") else path


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: _unit(item.nodeid) != "notebooks")  # stable: each file keeps its order


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling  # only a distributed run (-n) loads xdist's scheduler

    class ByFileNotebooksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByFileNotebooksTogether(config, log)
