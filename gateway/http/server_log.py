"""aiohttp's ``aiohttp.server`` logger, tamed: a malformed request is one WARNING line, without its bytes.

aiohttp answers a request it cannot parse (a NUL byte in a header, a bad
request line) with 400 and logs an ERROR with the parser's traceback, which
quotes the offending header: an API key sent in it would be in the log, and
any client could write tracebacks as fast as it can connect. ``install``
adds a filter that rewrites such a record as ``malformed HTTP request from
ADDR (answered 400): KIND``, the kind being the parser's reason up to its
first colon (never the bytes), through a ``LogLimiter`` (once per reason per
window, with a count). Other records of that logger pass unchanged.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

from poolgate.shared.telemetry.log_limit import LogLimiter

SERVER_LOGGER = "aiohttp.server"


class MalformedRequests(logging.Filter):
    def __init__(self, limiter: LogLimiter):
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        kind = (exc.message or type(exc).__name__).strip().splitlines()[0].split(":")[0].split("'")[0][:80].strip()
        seen = self.limiter.check((exc.code, kind))
        if seen is None:
            return False
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg, record.args = "malformed HTTP request from %s (answered %s): %s", (remote, exc.code, kind)
        if seen[0]:
            record.msg += " (%d more like it in the last %.0fs)"
            record.args += seen
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Put the filter on aiohttp's server logger (once)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, MalformedRequests) for f in logger.filters):
        logger.addFilter(MalformedRequests(LogLimiter(logger)))
