"""edge-sqlite: the receipt journal kept in the SQLite run database (edge and standalone)."""
