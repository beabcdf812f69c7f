"""How ``firepool serve`` writes its log: readable text lines, or one JSON object per line.

``configure_logging(fmt)`` sets the root logger's one handler (stderr, INFO). ``text`` is
``TIME LOGGER MESSAGE``; ``json`` (python-json-logger, encoded by orjson) is an object with
``time``, ``level``, ``logger``, ``message`` and the fields the broker passes with each event
(``extra=``): ``event`` (``job_queued``, ``attempt_started``, ``job_ended``, ``pod_deleted``,
``reset_unclean``, ``reset_unreachable``, ``http_request``, ...), ``job_id``,
``attempt_id``, ``caller``, ``pool`` and the event's own. docs/observability.md lists them.

No secret reaches either format: ``Redact`` scrubs every record before it is formatted
(message, arguments, extra fields and the traceback): bearer tokens and anything shaped like
a JWT, the ``sig=`` of a signed package URL, a password in a URL, and any extra field named
like a credential (``token``, ``authorization``, ``secret``, ``password``, ``sig``...). The
broker logs none of these on purpose (the access log has the path, never the query, and the
caller, never the token); this is the net under a future line that would.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TextIO

from pythonjsonlogger.orjson import OrjsonFormatter

from broker.settings import LOG_FORMATS

REDACTED = "[redacted]"
_SECRET_TEXT = re.compile(
    r"eyJ[\w-]{4,}\.[\w-]{4,}\.[\w-]*"  # a JWT (its header is base64url of '{"')
    r"|(?i:bearer)\s+\S+"  # an Authorization header's value
    r"|(?<=[?&]sig=)[^&\s\"']+"  # a signed URL's signature
    r"|(?<=://)[^/\s:@]+:[^@\s/]+(?=@)"  # user:password in a URL
)
_SECRET_FIELDS = ("token", "authorization", "secret", "password", "sig", "signature", "key")
"""An extra field whose name contains one of these is never logged (its value replaced)."""
_PLAIN_FIELDS = frozenset({"job_id", "attempt_id", "caller", "pool", "pod", "event"})
"""Fields that hold names, never a secret: passed as they are, unscanned."""
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def redact(text: str) -> str:
    """``text`` with every secret ``_SECRET_TEXT`` recognises replaced by ``REDACTED``."""
    return _SECRET_TEXT.sub(REDACTED, text)


class Redact(logging.Filter):
    """Scrubs a record of secrets before any formatter sees it (see the module docstring).
    The message is formatted here, once, and its arguments dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
            record.exc_info = None  # formatted (and scrubbed) once: exc_text is used as is
        for name, value in record.__dict__.items():
            if name in _RECORD_FIELDS or name in _PLAIN_FIELDS:
                continue
            lowered = name.lower()
            if any(word in lowered for word in _SECRET_FIELDS):
                record.__dict__[name] = REDACTED
            elif isinstance(value, str):
                record.__dict__[name] = redact(value)
        return True


def json_formatter() -> logging.Formatter:
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, then the
    record's extra fields."""
    return OrjsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger", "exc_info": "traceback"},
        timestamp="time",
    )


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``fmt``, one of ``broker.settings.LOG_FORMATS``."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    if fmt == "json":
        return json_formatter()
    return logging.Formatter("%(asctime)s %(name)s %(message)s")


def configure_logging(fmt: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Send every log record at ``level`` and above to ``stream`` (stderr) in ``fmt``,
    scrubbed of secrets; replaces the root logger's handlers."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(Redact())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
