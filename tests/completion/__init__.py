"""Tests of this folder; imported as `tests.completion.*` (one import style for every test folder)."""
