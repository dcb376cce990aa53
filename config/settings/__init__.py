# Settings split by concern; each module reads the environment through config.env.
# ruff: noqa: I001  (the order is the point: each module reads the ones before it)
from .base import *  # noqa: F401,F403
from .database import *  # noqa: F401,F403
from .queue import *  # noqa: F401,F403
from .provider import *  # noqa: F401,F403
from .x402 import *  # noqa: F401,F403
from .api import *  # noqa: F401,F403
from .events import *  # noqa: F401,F403
from .security import *  # noqa: F401,F403  (last: start-up refusals read the others)
