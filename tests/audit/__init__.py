"""Tests of this folder; imported as `tests.audit.*` (one import style for every test folder)."""
