"""The loopback JSON API that HTTP-source tests run against answers as its canned handlers say."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.http_api import (
    TRUNCATED_JSON,
    JsonApi,
    Reply,
    Request,
    endless_pages,
    malformed_json,
    next_url_pages,
    rate_limited,
    server_errors,
    watermark_pages,
)


@pytest.fixture
def api() -> Iterator[JsonApi]:
    with JsonApi() as server:
        yield server
    assert server.errors == []


def get(url: str, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=data, headers={"X-Test": "yes"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def get_json(url: str) -> Any:
    status, _, body = get(url)
    assert status == 200, body
    return json.loads(body)


def test_next_url_pages_in_the_body_walk_every_record_once(api: JsonApi) -> None:
    api.records.extend({"id": i} for i in range(5))
    api.route("/items", next_url_pages(api.records, page_size=2))
    seen, url, pages = [], api.url_for("/items"), 0
    while url:
        page = get_json(url)
        seen += page["data"]
        url, pages = page["next"], pages + 1
        assert url is None or url.startswith(f"{api.url}/items?")
    assert seen == [{"id": i} for i in range(5)] and pages == 3
    assert [r.query for r in api.requests] == [{}, {"page": "2"}, {"page": "3"}]


def test_next_url_pages_in_a_link_header_end_without_one(api: JsonApi) -> None:
    api.records.extend({"id": i} for i in range(4))
    api.route("/items", next_url_pages(api.records, page_size=2, style="link"))
    status, headers, body = get(api.url_for("/items", limit=2))
    assert status == 200 and json.loads(body) == [{"id": 0}, {"id": 1}]
    assert headers["Link"] == f'<{api.url}/items?limit=2&page=2>; rel="next"'
    status, headers, body = get(f"{api.url}/items?limit=2&page=2")
    assert json.loads(body) == [{"id": 2}, {"id": 3}] and "Link" not in headers


def test_records_appended_while_serving_are_served_on_the_next_walk(api: JsonApi) -> None:
    api.route("/items", next_url_pages(api.records, page_size=10))
    assert get_json(api.url_for("/items")) == {"data": [], "next": None}
    api.records.append({"id": 1})
    assert get_json(api.url_for("/items")) == {"data": [{"id": 1}], "next": None}


def test_watermark_pages_filter_strictly_above_since_and_page_by_token(api: JsonApi) -> None:
    api.records.extend([{"id": "a", "ts": 3}, {"id": "b", "ts": 1}, {"id": "c", "ts": 3}, {"id": "d", "ts": 10},
                        {"id": "e", "ts": 2}])
    api.route("/events", watermark_pages(api.records, "ts", page_size=2))
    first = get_json(api.url_for("/events"))
    assert [r["id"] for r in first["data"]] == ["b", "e"]
    second = get_json(api.url_for("/events", page_token=first["next_page_token"]))
    assert [r["id"] for r in second["data"]] == ["a", "c"]
    third = get_json(api.url_for("/events", page_token=second["next_page_token"]))
    assert [r["id"] for r in third["data"]] == ["d"] and third["next_page_token"] is None

    # "9" compares as a number with the integer field: 10 > 9 although "10" < "9".
    above = get_json(api.url_for("/events", since=3))
    assert above == {"data": [{"id": "d", "ts": 10}], "next_page_token": None}
    assert [r["id"] for r in get_json(api.url_for("/events", since=9))["data"]] == ["d"]
    api.records.append({"id": "f", "ts": 11})
    assert [r["id"] for r in get_json(api.url_for("/events", since=10))["data"]] == ["f"]


def test_a_watermark_token_answers_only_with_its_own_since(api: JsonApi) -> None:
    api.records.extend({"id": i, "ts": i} for i in range(6))
    api.route("/events", watermark_pages(api.records, "ts", page_size=2))
    token = get_json(api.url_for("/events", since=1))["next_page_token"]
    assert get_json(api.url_for("/events", since=1, page_token=token))["data"] == [{"id": 4, "ts": 4}, {"id": 5, "ts": 5}]
    status, _, body = get(api.url_for("/events", since=0, page_token=token))
    assert status == 400 and b"since" in body
    status, _, _ = get(api.url_for("/events", page_token="not-a-token"))
    assert status == 400


def test_rate_limited_answers_429_with_retry_after_then_delegates(api: JsonApi) -> None:
    api.route("/items", rate_limited(2, 3, next_url_pages([{"id": 1}], page_size=5)))
    for _ in range(2):
        status, headers, _ = get(api.url_for("/items"))
        assert status == 429 and headers["Retry-After"] == "3"
    assert get_json(api.url_for("/items")) == {"data": [{"id": 1}], "next": None}
    assert len(api.requests) == 3


def test_server_errors_malformed_json_and_endless_pages(api: JsonApi) -> None:
    then = next_url_pages([{"id": 1}], page_size=5)
    api.route("/down", server_errors(1, then, status=502))
    api.route("/broken", malformed_json())
    api.route("/once-broken", malformed_json(then))
    api.route("/endless", endless_pages(3))
    assert get(api.url_for("/down"))[0] == 502
    assert get_json(api.url_for("/down"))["data"] == [{"id": 1}]
    for _ in range(2):
        status, _, body = get(api.url_for("/broken"))
        assert status == 200 and body == TRUNCATED_JSON
        with pytest.raises(json.JSONDecodeError):
            json.loads(body)
    assert get(api.url_for("/once-broken"))[2] == TRUNCATED_JSON
    assert get_json(api.url_for("/once-broken"))["data"] == [{"id": 1}]
    url = api.url_for("/endless")
    for page in range(1, 30):
        body = get_json(url)
        assert body["data"][0] == {"id": (page - 1) * 3} and body["next"]
        url = body["next"]


def test_every_request_is_recorded_and_unknown_paths_answer_404(api: JsonApi) -> None:
    assert api.requests == []
    seen: list[Request] = []

    def echo_handler(request: Request) -> Reply:
        seen.append(request)
        return Reply(201, b"ok", {"X-Reply": "1"})

    api.route("/echo", echo_handler)
    status, headers, body = get(api.url_for("/echo", q="1"), data=b'{"a": 1}')
    assert (status, body, headers["X-Reply"]) == (201, b"ok", "1")
    assert get(api.url_for("/nowhere"))[0] == 404
    echo, nowhere = api.requests
    assert seen == [echo]
    assert (echo.method, echo.path, echo.query, echo.body) == ("POST", "/echo", {"q": "1"}, b'{"a": 1}')
    assert echo.headers["x-test"] == "yes"
    assert (nowhere.method, nowhere.path) == ("GET", "/nowhere")
    assert api.requests_to("/echo") == [echo]


def test_a_failing_handler_answers_500_and_is_kept() -> None:
    def boom(request: Request) -> Reply:
        raise RuntimeError("handler bug")

    with JsonApi() as api:
        api.route("/boom", boom)
        assert get(api.url_for("/boom"))[0] == 500
    assert [str(e) for e in api.errors] == ["handler bug"]
