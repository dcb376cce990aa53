"""Development servers and tooling live in tools/, outside the runtime packages and the
production image (import-linter's `runtime-never-imports-tools` keeps the runtime from
importing them; this checks the image and the compose sandbox)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _stages() -> dict[str, str]:
    """The Dockerfile's stages by name, in order, each with its instructions."""
    parts = re.split(
        r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", (ROOT / "Dockerfile").read_text(), flags=re.M | re.I
    )
    return dict(zip(parts[1::2], parts[2::2], strict=False))


def test_the_production_image_holds_no_development_tools():
    stages = _stages()
    # the default target is the last stage: production, built from the cleaned source
    assert list(stages)[-1] == "production"
    production = stages["production"]
    assert "COPY --from=source /src /app" in production
    assert not re.search(r"^COPY\s+\.\s", production, re.M)  # never the raw checkout
    assert "rm -rf /src/tools" in stages["source"]
    assert "gunicorn" in production


def test_the_compose_sandbox_runs_localstripe_from_the_devtools_image():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    sandbox = compose["services"]["localstripe"]
    assert sandbox["build"]["target"] == "devtools"
    assert "tools.localstripe_server" in sandbox["command"]
    assert "COPY . ." in _stages()["devtools"]
    # every other service runs the production image
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if name != "localstripe" and isinstance(build, dict):
            assert build.get("target") in (None, "production"), name


def test_no_runtime_package_holds_a_development_server():
    for old in (
        "config/localstripe_server.py",
        "config/x402_chain.py",
        "config/x402_facilitator.py",
        "payments/ops/progress.py",
        "payments/management/commands/drill.py",
    ):
        assert not (ROOT / old).exists(), old
