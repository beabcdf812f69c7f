"""The engine: job store, dispatcher, executor, pod lifecycle, restart recovery, behind one
service facade (``broker.service.Broker``) built from ``Settings``."""

import time

PROCESS_STARTED = time.monotonic()
"""When this package was first imported: the start of a ``firepool serve`` process."""
