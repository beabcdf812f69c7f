"""The HTTP edge: routes, auth, strict decoding, error mapping, OpenAPI, metrics, the CLI."""
