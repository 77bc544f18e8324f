"""``hub.urls``: the parsing rules the Hub client's token, redirect and proxy logic rely on."""

from __future__ import annotations

import pytest

from hub.urls import Url


def test_origin_is_case_insensitive_and_fills_in_the_default_port() -> None:
    assert Url("HTTPS://Hub.Example/api").origin == ("https", "hub.example", 443)
    assert Url("https://hub.example:443/x").origin == Url("https://hub.example").origin
    assert Url("http://hub.example/").origin != Url("https://hub.example/").origin
    assert Url("https://hub.example:8443/").origin != Url("https://hub.example/").origin


@pytest.mark.parametrize(
    ("reference", "joined"),
    [
        ("/blobs/abc?x=1", "https://hub.example/blobs/abc?x=1"),
        ("other", "https://hub.example/api/other"),
        ("//cdn.example/f", "https://cdn.example/f"),
        ("http://cdn.example:8080/f#frag", "http://cdn.example:8080/f"),
        ("  /padded  ", "https://hub.example/padded"),
    ],
)
def test_a_reference_joins_as_a_browser_follows_it(reference: str, joined: str) -> None:
    assert str(Url("https://hub.example/api/models").join(reference)) == joined


def test_the_target_keeps_what_the_server_wrote_and_encodes_only_what_a_request_line_cannot_carry() -> (
    None
):
    assert Url("http://h/a%2Fb/c?q=%20&r=é").target == "/a%2Fb/c?q=%20&r=%C3%A9"
    assert Url("http://h/a b").target == "/a%20b"
    # A Location that tries to smuggle a header stays inside the request line, encoded.
    assert "\r" not in Url("http://h/x\r\nX-Evil: 1").target
    assert Url("http://h").target == "/"


def test_hosts_for_the_host_header_and_tls() -> None:
    assert Url("http://[::1]:8080/x").host == "::1"
    assert Url("http://[::1]:8080/x").host_port == "[::1]:8080"
    assert Url("https://hub.example/x").host_port == "hub.example"
    assert Url("https://bücher.example/").host == "xn--bcher-kva.example"


def test_credentials_are_decoded_and_never_printed() -> None:
    proxy = Url("http://us%40er:p%3Ass@proxy:3128")
    assert (proxy.user, proxy.password) == ("us@er", "p:ss")
    assert "p:ss" not in str(proxy) and "us@er" not in repr(proxy)


@pytest.mark.parametrize(
    "text",
    ["ftp://h/x", "http://", "/relative", "http://h:99999/", "http://h:port/", "http://[::1/"],
)
def test_malformed_urls_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError, match="URL|host"):
        Url(text)


def _fields(url: Url) -> tuple[object, ...]:
    return (url.scheme, url.host, url.port, url.explicit_port, url.target, url.user, url.password)


@pytest.mark.parametrize(
    "reference",
    [
        "https://cdn.example/f?sig=a%2Fb&exp=1",
        "http://CDN.Example:8080/a/./b/../c",
        "https://u:p@cdn.example/f#x",
        "https://bücher.example/f",
        "https://cdn.example",
    ],
)
def test_an_absolute_reference_is_what_resolving_it_gives(reference: str) -> None:
    from urllib.parse import urljoin

    base = Url("https://hub.example/api/models")
    assert _fields(base.join(reference)) == _fields(Url(urljoin(str(base), reference)))


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://hub.example",
        "https://hub.example/",
        "http://mirror.example:8443/hf/",
        "https://u:p@h",
    ],
)
def test_a_path_under_the_endpoint_is_the_url_its_text_parses_to(endpoint: str) -> None:
    path = "/org/m%20x/resolve/abc/dir/f%C3%A9.bin"
    assert _fields(Url(endpoint).under(path)) == _fields(Url(endpoint.rstrip("/") + path))


@pytest.mark.parametrize(
    ("endpoint", "path"),
    [
        ("https://hub.example/?x=1", "/f"),  # a query: joined as text by the caller instead
        ("https://hub.example", "f"),
        ("https://hub.example", "/a b"),
        ("https://hub.example", "/a\r\nX-Evil: 1"),
        ("https://hub.example", "/é"),
    ],
)
def test_under_refuses_what_it_cannot_append_verbatim(endpoint: str, path: str) -> None:
    with pytest.raises(ValueError, match="cannot append"):
        Url(endpoint).under(path)
