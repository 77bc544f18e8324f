"""Passwords and NATS tokens inside URLs are replaced wherever a URL is shown."""

from __future__ import annotations

import pytest

from kit.redaction import redact_urls


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("nats://u:s3cr3t@host:4222", "nats://u:REDACTED@host:4222"),
        ("cannot connect to tls://me:pw@h:1 (x)", "cannot connect to tls://me:REDACTED@h:1 (x)"),
        ("nats://a:p1@h1,nats://b:p2@h2", "nats://a:REDACTED@h1,nats://b:REDACTED@h2"),
        ("nats://u:p@ss:w@rd@host", "nats://u:REDACTED@host"),
        ("nats://t0ken@host:4222", "nats://REDACTED@host:4222"),
        ("https://user:pw@hub.example/api", "https://user:REDACTED@hub.example/api"),
        ("'nats://u:p@h'", "'nats://u:REDACTED@h'"),
        ("nats://u:@host", "nats://u:REDACTED@host"),
    ],
)
def test_secrets_in_urls_are_redacted(text: str, shown: str) -> None:
    assert redact_urls(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "nats://127.0.0.1:4222",
        "https://huggingface.co/org/model@main",
        "mail root@example.org about it",
        "ssh://git@example.org/repo",
    ],
)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact_urls(text) == text
