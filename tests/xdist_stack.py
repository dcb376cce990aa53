"""pytest plugin (PYTEST_PLUGINS, set by tests/stack.py with `pytest -n N`): a pytest-xdist
worker adopts its own stack's environment (tests/stack.py starts one stack per worker).

It acts when the module is imported, which pytest does while it reads its options: before
pytest-django imports the settings, which read DATABASE_URL, REDIS_URL, STRIPE_API_BASE and
X402_* from the environment. Processes a test starts (a Celery worker, `make serve`) inherit
the adopted environment. Outside xdist, or in a single-stack run, it does nothing.
"""

from __future__ import annotations

import json
import os

from tests.stack import WORKERS_FILE


def _adopt_worker_stack() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", set before the worker's config
    if not worker:
        return
    path = os.environ.get(WORKERS_FILE)
    if not path:
        return  # tests/conftest.py refuses a worker without a stack of its own
    stacks = json.loads(open(path).read())
    index = int(worker.removeprefix("gw"))
    if index >= len(stacks):
        raise RuntimeError(f"worker {worker} has no stack ({len(stacks)} started)")
    os.environ.update(stacks[index])


_adopt_worker_stack()
