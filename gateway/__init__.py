"""The broker: HTTP API, auth, job store, dispatcher, executor, restart recovery."""

import time

PROCESS_STARTED = time.monotonic()
"""When this package was first imported: the start of a ``firepool serve`` process."""
