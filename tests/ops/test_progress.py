"""The progress line of long commands (tools/progress.py): plain lines at once and
then every interval when the stream is not a terminal, redrawn in place on a terminal,
nothing with quiet."""

import io
import time

from tools.progress import Progress, eta


def test_plain_progress_prints_at_once_then_every_interval_and_a_final_line():
    # given a status that changes and a non-terminal stream
    done = {"n": 0}
    stream = io.StringIO()

    # when it runs for a little over three intervals
    with Progress(
        lambda: f"{done['n']} done", label="job", stream=stream, terminal=False, plain_every=0.2
    ) as progress:
        for _ in range(7):
            time.sleep(0.1)
            done["n"] += 1
        progress.note("VIOLATION: seen now")

    # then the first line came at once, one per interval after, the note, and a final line
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("job [0:00] 0 done")
    assert 3 <= sum(1 for line in lines if " job [" in line) <= 6
    assert any(line.endswith("VIOLATION: seen now") for line in lines)
    assert lines[-1].endswith("7 done (done)")


def test_quiet_progress_prints_nothing():
    stream = io.StringIO()
    with Progress(
        lambda: "x", stream=stream, terminal=False, plain_every=0.05, quiet=True
    ) as progress:
        time.sleep(0.2)
        progress.note("not shown")
    assert stream.getvalue() == ""


def test_terminal_progress_redraws_in_place():
    # given a terminal stream
    stream = io.StringIO()
    # when the line is redrawn a few times
    with Progress(lambda: "redrawn", label="t", stream=stream, terminal=True):
        time.sleep(1.2)
    # then rich moved the cursor back over the line instead of adding lines
    out = stream.getvalue()
    assert "redrawn" in out
    assert "\x1b[" in out
    assert out.count("\n") <= 2


def test_a_failing_status_does_not_stop_the_command():
    stream = io.StringIO()
    with Progress(lambda: 1 / 0, stream=stream, terminal=False, plain_every=10):
        pass
    assert "progress unavailable: ZeroDivisionError" in stream.getvalue()


def test_eta_from_the_rate_so_far():
    assert eta(done=25, total=100, elapsed=60) == "~3:00 left"
    assert eta(done=0, total=100, elapsed=5) == ""
