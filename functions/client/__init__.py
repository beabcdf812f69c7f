"""The Python SDK's parts: typed errors (``errors``), the retry policy (``retrying``), what
goes on the wire (``wire``), the function and job handles of the sync client (``handles``)
and the asyncio client on aiohttp (``aio``). ``functions.sdk`` is the import callers use."""
