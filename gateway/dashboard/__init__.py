"""The operator's dashboard: pages under ``/dashboard`` (``routes``), admin only (``session``)."""
