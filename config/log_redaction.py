"""Status tokens never reach a log line.

A customer's `/status/<token>/` link is the customer's credential for that page. Django's
request logger writes the full path at WARNING (a 405, a 409 on pay-again) and gunicorn's
access log writes every request line and referer; both go through `StatusTokenFilter`,
which rewrites the formatted message with each token replaced by `‹token›`.

- Django: the filter sits on the `console` handler in settings.LOGGING (every record that
  reaches the process's output passes it, whichever logger wrote it).
- gunicorn: `RedactingGunicornLogger` (named in gunicorn.conf.py, which gunicorn loads from
  the working directory) puts the same filter on its access and error logs.
"""

from __future__ import annotations

import logging
import re

TOKEN_IN_PATH = re.compile(r"(/status/)[A-Za-z0-9_-]{16,128}")
REDACTED = r"\1‹token›"


def redact(text: str) -> str:
    return TOKEN_IN_PATH.sub(REDACTED, text)


class StatusTokenFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's problem, not ours
            return True
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


try:
    from gunicorn.glogging import Logger as _GunicornLogger
except ImportError:  # gunicorn is the production server; `manage.py` runs without it
    _GunicornLogger = None

if _GunicornLogger is not None:

    class RedactingGunicornLogger(_GunicornLogger):
        def setup(self, cfg):
            super().setup(cfg)
            for log in (self.access_log, self.error_log):
                log.addFilter(StatusTokenFilter())
