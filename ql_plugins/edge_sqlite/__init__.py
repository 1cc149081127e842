"""The ``edge-sqlite`` journal backend (see :mod:`.store`)."""
