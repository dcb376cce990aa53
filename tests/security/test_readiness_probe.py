"""/readyz with an unreachable broker answers fast and does not open a broker
connection per request. The broker is a real TCP listener that never answers (a black
hole), so a probe without a timeout would hang; effects counted: connections it received."""

import socket
import threading
import time

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def black_hole():
    """Accepts TCP connections and never says a word; counts them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted = []
    stop = threading.Event()

    def run():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    for conn in accepted:
        conn.close()
    server.close()


@pytest.mark.alone  # asserts a wall-clock bound (make test runs xdist workers)
def test_readyz_with_a_silent_broker_is_bounded_and_cached(client, settings, black_hole):
    # given a broker that accepts connections and never answers
    port, accepted = black_hole
    client.get("/healthz")  # the URLconf and its imports load before the broker moves
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{port}/0"
    settings.READYZ_BROKER_TIMEOUT = 0.5
    settings.READYZ_CACHE_SECONDS = 30

    # when twenty probes arrive
    started = time.monotonic()
    answers = [client.get("/readyz") for _ in range(20)]
    elapsed = time.monotonic() - started

    # then all say unavailable, within about one timeout in total, over one connection
    assert {a.status_code for a in answers} == {503}
    assert all(a.json()["checks"]["broker"] == "unavailable" for a in answers)
    assert elapsed < 3.0, (elapsed, len(accepted))
    assert len(accepted) == 1
