"""The chaos soak, short and seeded, so a regression fails CI (the long run is `make soak`)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_chaos_soak_holds_every_invariant():
    result = subprocess.run(
        [sys.executable, "bench/soak.py", "--seconds", "45", "--clients", "6", "--seed", "7",
         "--drain", "120"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(result.stdout[-6000:], result.stderr[-3000:])
    assert "max charges per purchase" in result.stdout
    assert result.returncode == 0, result.stdout[-3000:]
