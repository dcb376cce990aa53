"""The compose stack cannot start here (no Docker engine): check it refers to real things."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _env_example() -> dict[str, str]:
    pairs = [
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    return dict(pairs)


def test_every_service_command_refers_to_existing_code():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "localstripe"} <= set(services)
    for name, svc in services.items():
        cmd = svc.get("command") or []
        if "gunicorn" in cmd:
            module, attr = cmd[cmd.index("gunicorn") + 1].split(":")
            assert (ROOT / (module.replace(".", "/") + ".py")).exists(), name
        if "celery" in cmd:
            assert cmd[cmd.index("-A") + 1] == "config" and (ROOT / "config/celery.py").exists()
        if "-m" in cmd:
            assert (ROOT / (cmd[cmd.index("-m") + 1].replace(".", "/") + ".py")).exists(), name
        if "manage.py" in cmd:
            assert (ROOT / "manage.py").exists()
        if svc.get("build"):
            assert (ROOT / "Dockerfile").exists()


def test_compose_environment_names_only_known_settings():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    known = set(_env_example())
    app = compose["x-app"]
    assert app["env_file"] == ".env.example"
    for name in app["environment"]:
        assert name in known, f"{name} is not documented in .env.example"


def test_env_example_lists_every_variable_the_settings_read():
    import re

    read = set()
    for path in (ROOT / "config").rglob("*.py"):
        read |= set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z_]+)"', path.read_text()))
    assert read, "no settings found"
    missing = read - set(_env_example())
    assert not missing, f".env.example lacks {sorted(missing)}"
