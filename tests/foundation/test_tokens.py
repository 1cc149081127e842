"""Callback tokens without OpenSSL: same format, same hash, constant-time comparison."""

from __future__ import annotations

import hashlib

from ql_core.receipts.codec import TOKEN_PATTERN
from ql_core.tokens import hash_token, new_token, same_hash


def test_a_token_is_256_random_bits_in_the_receipt_alphabet() -> None:
    tokens = {new_token() for _ in range(200)}
    assert len(tokens) == 200
    assert all(len(t) == 43 and TOKEN_PATTERN.fullmatch(t) for t in tokens)


def test_the_stored_hash_is_sha256_hex_and_compares_exactly() -> None:
    token = new_token()
    assert hash_token(token) == hashlib.sha256(token.encode()).hexdigest()
    assert same_hash(hash_token(token), token)
    assert not same_hash(hash_token(token), new_token())
    assert not same_hash(hash_token(token)[:-1] + "0", token) or hash_token(token).endswith("0")
