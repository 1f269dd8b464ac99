"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `--dist loadgroup`):
each test file runs whole on one worker, so its module fixtures are built once; the notebooks
run as one group, in order, on one worker, since each reads the runs the ones before it wrote.
The notebooks go first: theirs is the longest chain."""
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        group = "notebooks" if item.path.suffix == ".ipynb" else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.path.suffix != ".ipynb")  # stable: each group keeps its order
