"""Bench settings: the real settings plus the floor views (bench/floor_urls.py).

gunicorn is started with DJANGO_SETTINGS_MODULE=bench.settings, so the real endpoints and
the floors run in the same processes, with the same middleware, database connection
settings and workers: the ratio between them is the cost of Verity's own work.
"""

from config.settings import *  # noqa: F401,F403

ROOT_URLCONF = "bench.floor_urls"
