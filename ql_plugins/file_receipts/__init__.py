"""The ``file`` receipt store plugin (the store itself is :mod:`ql_core.receipts.file_store`)."""
