"""watchfiles: best-effort early wake-ups from file-system events (optional extra ``ql-runner[watch]``)."""
