"""Tests of this folder; imported as `tests.logs.*` (one import style for every test folder)."""
