import os

from celery import Celery
from celery.signals import beat_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("verity")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _mark_ready(name: str) -> None:
    # The embedded default only (`make run`): the banner waits for these markers, so the
    # credentials are printed after the worker and beat are up, as the last thing on
    # screen. A deployment on Redis has no banner and writes nothing here.
    from django.conf import settings

    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        run_dir = settings.VAR_DIR / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / f"{name}.ready").write_text(str(os.getpid()))


@worker_ready.connect
def _worker_ready(**_kwargs) -> None:
    _mark_ready("worker")


@beat_init.connect
def _beat_ready(**_kwargs) -> None:
    _mark_ready("beat")
