"""Tests of this folder; imported as `tests.recovery.*` (one import style for every test folder)."""
