"""api/bodies.py's read_limited on gunicorn's own request bodies (a socket pair, no server):
a Content-Length body read at once gives what gunicorn's Body.read gives."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from gunicorn.http.body import Body, ChunkedReader, LengthReader
from gunicorn.http.unreader import SocketUnreader

from api.bodies import read_limited
from api.errors import ApiError

LIMIT = 8_192


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def length_request(sock, length: int):
    unreader = SocketUnreader(sock)
    return SimpleNamespace(content_length=length, stream=Body(LengthReader(unreader, length))), unreader


@pytest.mark.parametrize("size", [1, 1_023, 1_024, 1_025, 7_900, LIMIT])
def test_a_body_of_its_content_length_is_read_whole_and_nothing_after_it(pair, size):
    ours, theirs = pair
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    theirs.sendall(body + b"GET /next HTTP/1.1\r\n")  # a pipelined request follows
    req, unreader = length_request(ours, size)
    assert read_limited(req, LIMIT) == body
    assert req.stream.read(10) == b""  # gunicorn's drain of the body finds nothing left
    assert unreader.read() == b"GET /next HTTP/1.1\r\n"


def test_a_body_cut_short_reads_as_gunicorn_reads_it(pair):
    ours, theirs = pair
    theirs.sendall(b"x" * 3_000)
    theirs.shutdown(socket.SHUT_WR)
    req, _ = length_request(ours, 5_000)
    assert read_limited(req, LIMIT) == b"x" * 3_000


def test_a_body_partly_read_already_and_a_chunked_body_go_through_body_read(pair):
    ours, theirs = pair
    theirs.sendall(b"abcdefgh")
    req, _ = length_request(ours, 8)
    assert req.stream.read(3) == b"abc"
    req.content_length = None  # what is left, as a caller without a length reads it
    assert read_limited(req, LIMIT) == b"defgh"
    other_ours, other_theirs = socket.socketpair()
    try:
        other_theirs.sendall(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        chunked = SimpleNamespace(content_length=None, stream=Body(ChunkedReader(
            SimpleNamespace(cfg=SimpleNamespace()), SocketUnreader(other_ours))))
        assert read_limited(chunked, LIMIT) == b"hello world"
    finally:
        other_ours.close()
        other_theirs.close()


def test_a_content_length_over_the_limit_is_refused_before_reading(pair):
    ours, _ = pair
    req, _ = length_request(ours, LIMIT + 1)
    with pytest.raises(ApiError) as caught:
        read_limited(req, LIMIT)
    assert caught.value.status == 413
