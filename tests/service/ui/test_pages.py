"""The pages and their JSON over HTTP (a real uvicorn on loopback), without a browser.

Auth as the service configures it, the run-stats endpoint (downsampling, step ranges,
built from manifests alone) and every bad input answered with a clear error.
"""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import httpx
import pytest

from .conftest import (
    NAN_STEP,
    ODD_RUN,
    READ_TOKEN,
    RUN,
    WIDE_GRADIENTS,
    WRITE_TOKEN,
    Served,
    TrainedStore,
    WideSnapshot,
    serve_store,
)


def _client(served: Served, **options: object) -> httpx.Client:
    return httpx.Client(base_url=served.base_url, timeout=60, **options)


def test_root_redirects_to_the_pages(open_service: Served) -> None:
    with _client(open_service) as client:
        response = client.get("/")
    assert response.status_code == 307
    assert response.headers["location"] == "/ui"


def test_run_stats_come_from_the_manifests(
    open_service: Served, trained_store: TrainedStore
) -> None:
    with _client(open_service) as client:
        stats = client.get("/ui/api/run-stats", params={"run": RUN}).json()
        manifests = [client.get(f"/v1/snapshots/{s.id}").json() for s in trained_store.snapshots]
    assert stats["layers"] == trained_store.layer_names
    assert stats["steps"] == list(range(len(trained_store.snapshots)))
    assert stats["ids"] == [s.id for s in trained_store.snapshots]
    assert stats["bucket_size"] == 1
    for layer, series in enumerate(stats["l2_norm"]):
        assert series == [m["gradients"][layer]["stats"]["l2_norm"] for m in manifests]
    nan_layer = trained_store.layer_names[1]
    assert stats["nonfinite"] == [
        {
            "step": NAN_STEP,
            "id": trained_store.nan_snapshot.id,
            "nan_count": 1,
            "inf_count": 0,
            "layers": [nan_layer],
        }
    ]
    assert stats["nonfinite_total"] == 1


def test_run_stats_never_read_gradient_bytes(trained_store: TrainedStore, tmp_path: Path) -> None:
    """With every chunk of every snapshot gone, the stats and the pages still answer."""
    copy = tmp_path / "store"
    shutil.copytree(trained_store.path, copy)
    removed = [chunk for chunk in copy.glob("snapshots/*/**/c.*") if chunk.is_file()]
    assert removed
    for chunk in removed:
        chunk.unlink()
    for served in serve_store(copy):
        with _client(served) as client:
            stats = client.get("/ui/api/run-stats", params={"run": RUN})
            page = client.get(f"/ui/snapshots/{trained_store.nan_snapshot.id}")
            gone = client.get(f"/v1/snapshots/{trained_store.nan_snapshot.id}/safetensors")
        assert stats.status_code == 200 and len(stats.json()["steps"]) == len(
            trained_store.snapshots
        )
        assert page.status_code == 200
        assert gone.status_code >= 400  # the bytes really are gone


def test_a_long_run_is_downsampled_keeping_peaks_and_every_nan_step(long_run: Served) -> None:
    with _client(long_run) as client:
        stats = client.get("/ui/api/run-stats", params={"run": "long", "max_points": 4}).json()
    assert stats["snapshots"] == 30
    assert stats["bucket_size"] == 8  # ceil(30 / 4)
    assert stats["steps"] == [7, 15, 23, 29]  # each bucket at its last step
    # the largest norm of each bucket: a 4-vector of (step + 1) has norm 2 * (step + 1)
    assert stats["l2_norm"][0] == [16.0, 32.0, 48.0, 60.0]
    assert [round(v, 3) for v in stats["l2_norm"][1]] == [
        round(30.0 * (step + 1), 3) for step in (7, 15, 23, 29)
    ]
    assert [bad["step"] for bad in stats["nonfinite"]] == [17]
    assert stats["nonfinite"][0]["layers"] == ["b.weight"]


def test_a_step_range_is_answered_in_full(long_run: Served) -> None:
    with _client(long_run) as client:
        stats = client.get(
            "/ui/api/run-stats",
            params={"run": "long", "step_min": 10, "step_max": 19, "max_points": 1000},
        ).json()
    assert stats["steps"] == list(range(10, 20))
    assert stats["bucket_size"] == 1
    assert (stats["step_min"], stats["step_max"]) == (10, 19)


def test_pages_escape_what_they_show_and_link_any_run_name(long_run: Served) -> None:
    with _client(long_run) as client:
        overview = client.get("/ui")
        run_page = client.get("/ui/run", params={"run": ODD_RUN})
        stats = client.get("/ui/api/run-stats", params={"run": ODD_RUN}).json()
    assert "<script>alert(1)</script>" not in overview.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in overview.text
    assert run_page.status_code == 200
    assert "<script>alert(1)" not in run_page.text
    assert stats["run"] == ODD_RUN and stats["snapshots"] == 1
    assert overview.headers["content-security-policy"].startswith("default-src 'self'")


def test_listings_are_paged_newest_first(long_run: Served) -> None:
    with _client(long_run) as client:
        first = client.get("/ui/run", params={"run": "long"})
        assert first.status_code == 200
        assert first.text.count('data-snapshot="') == 30  # a page holds 50
        unknown = client.get("/ui/run", params={"run": "no such run"})
    assert unknown.status_code == 200 and "no snapshots" in unknown.text


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        ("/ui/snapshots/not-an-id", 400, "snapshot id"),
        ("/ui/snapshots/01ARZ3NDEKTSV4RRFFQ69G5FAV", 404, "01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        ("/ui/snapshots/01ARZ3NDEKTSV4RRFFQ69G5FAV?sort=colour", 422, "sort"),
        ("/ui/snapshots/01ARZ3NDEKTSV4RRFFQ69G5FAV?order=up", 422, "order"),
        ("/ui/diff?a=nope&b=01ARZ3NDEKTSV4RRFFQ69G5FAV", 422, "query.a"),
        ("/ui/diff?a=01ARZ3NDEKTSV4RRFFQ69G5FAV", 422, "query.b"),
        ("/ui/api/run-stats?run=mlp&max_points=1", 422, "max_points"),
        ("/ui/api/run-stats?run=mlp&step_min=-1", 422, "step_min"),
        ("/ui/api/run-stats", 422, "query.run"),
        ("/ui/run?run=", 422, "query.run"),
        ("/ui?cursor=garbage", 422, "cursor"),
        ("/ui/snapshots/01ARZ3NDEKTSV4RRFFQ69G5FAV/grads/xyz.npy", 400, "xyz"),
    ],
)
def test_bad_input_is_refused_naming_what_is_wrong(
    open_service: Served, path: str, status: int, words: str
) -> None:
    with _client(open_service) as client:
        response = client.get(path)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]


def test_a_download_of_a_missing_gradient_names_it(
    open_service: Served, trained_store: TrainedStore
) -> None:
    snapshot = trained_store.nan_snapshot.id
    with _client(open_service) as client:
        response = client.get(f"/ui/snapshots/{snapshot}/grads/0123456789abcdef.npy")
    assert response.status_code == 404
    assert "0123456789abcdef" in response.json()["detail"]


def test_a_protected_service_sends_pages_to_the_login_form(protected_service: Served) -> None:
    with _client(protected_service) as client:
        page = client.get("/ui/run", params={"run": RUN})
        data = client.get("/ui/api/run-stats", params={"run": RUN})
        download = client.get("/ui/snapshots/01ARZ3NDEKTSV4RRFFQ69G5FAV/safetensors")
        form = client.get(page.headers["location"])
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/login?next=%2Fui%2Frun%3Frun%3Dmlp"
    assert data.status_code == 401 and download.status_code == 401
    assert data.json()["error"] == "AuthenticationError"
    assert data.headers["www-authenticate"] == 'Bearer realm="gradvault"'
    assert form.status_code == 200
    assert 'name="next" value="/ui/run?run=mlp"' in form.text
    assert READ_TOKEN not in form.text


@pytest.mark.parametrize("token", [READ_TOKEN, WRITE_TOKEN])
def test_a_known_token_opens_the_pages(protected_service: Served, token: str) -> None:
    with _client(protected_service) as client:
        login = client.post("/ui/login", data={"token": token, "next": "/ui/run?run=mlp"})
        assert login.status_code == 303
        assert login.headers["location"] == "/ui/run?run=mlp"
        cookie = login.headers["set-cookie"]
        assert cookie.startswith("gradvault_ui_token=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert client.get("/ui/run", params={"run": RUN}).status_code == 200
        assert client.get("/ui/api/run-stats", params={"run": RUN}).status_code == 200
        # the cookie is for the pages only: the API still wants Authorization
        with _client(protected_service, cookies={"gradvault_ui_token": token}) as cookie_only:
            assert cookie_only.get("/v1/snapshots").status_code == 401
        logout = client.post("/ui/logout")
        assert logout.status_code == 303
        assert client.get("/ui").status_code == 303


def test_a_bearer_token_opens_the_json(protected_service: Served) -> None:
    with _client(protected_service, headers={"Authorization": f"Bearer {READ_TOKEN}"}) as client:
        assert client.get("/ui/api/run-stats", params={"run": RUN}).status_code == 200


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("", "enter a token"),
        ("wrong-token", "that token is not one this service knows"),
    ],
)
def test_a_refused_login_says_why_and_sets_no_cookie(
    protected_service: Served, token: str, problem: str
) -> None:
    with _client(protected_service) as client:
        response = client.post("/ui/login", data={"token": token})
    assert response.status_code == 401
    assert problem in response.text
    assert "set-cookie" not in response.headers


def test_an_unknown_cookie_goes_back_to_the_form(protected_service: Served) -> None:
    with _client(protected_service, cookies={"gradvault_ui_token": "stale"}) as client:
        response = client.get("/ui")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/ui/login")


@pytest.mark.parametrize(
    "next_path",
    ["https://elsewhere.example/", "//elsewhere.example/ui", "/v1/snapshots", "/ui/../v1", None],
)
def test_login_goes_only_to_pages_of_this_service(
    protected_service: Served, next_path: str | None
) -> None:
    form = {"token": READ_TOKEN} | ({"next": next_path} if next_path is not None else {})
    with _client(protected_service) as client:
        response = client.post("/ui/login", data=form)
    assert response.status_code == 303
    assert response.headers["location"] == "/ui"


def test_public_reads_need_no_login(trained_store: TrainedStore) -> None:
    for served in serve_store(trained_store.path, tokens=f"{WRITE_TOKEN}:write", public_read=True):
        with _client(served) as client:
            assert client.get("/ui").status_code == 200
            assert client.get("/ui/api/run-stats", params={"run": RUN}).status_code == 200


def test_an_open_service_has_no_login(open_service: Served) -> None:
    with _client(open_service) as client:
        form = client.get("/ui/login", params={"next": "/ui/run?run=mlp"})
        posted = client.post("/ui/login", data={"token": "anything"})
    assert form.status_code == 303 and form.headers["location"] == "/ui/run?run=mlp"
    assert posted.status_code == 303 and "set-cookie" not in posted.headers


def test_a_wrong_method_names_the_right_ones(open_service: Served) -> None:
    with _client(open_service) as client:
        response = client.post("/ui/run", params={"run": RUN})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"


def test_a_diff_orders_layers_by_how_much_they_changed(long_run: Served) -> None:
    with _client(long_run) as client:
        snapshots = client.get("/v1/snapshots", params={"run": "long", "limit": 1000}).json()
        by_step = {summary["step"]: summary["id"] for summary in snapshots["data"]}
        # a.weight grows 2 * 18 / (2 * 1) = 18x; b.weight (one NaN at step 17) less
        page = client.get(
            "/ui/diff", params={"a": by_step[0], "b": by_step[17], "sort": "ratio"}
        ).text
        flipped = client.get(
            "/ui/diff", params={"a": by_step[17], "b": by_step[0], "sort": "ratio"}
        ).text
    assert page.index(">a.weight<") < page.index(">b.weight<")
    assert ">18<" in page  # B / A of a.weight
    assert flipped.index(">a.weight<") < flipped.index(">b.weight<")  # 1/18: as big a change
    assert page.count('class="unhealthy"') == 1


#: gradients a page of a snapshot's table shows (docs/SERVICE.md, The pages)
GRADIENTS_PER_PAGE = 500


def _rows(page: str) -> list[tuple[int, str]]:
    """(position, name) of each row of a snapshot page's gradient table, in page order."""
    table = page[page.index('<table class="gradients') :]
    return [
        (int(position), name)
        for position, name in re.findall(r'<td class="num">(\d+)</td>\s*<td>([^<]*)</td>', table)
    ]


def _links(page: str) -> dict[str, str]:
    """The gradient pager's links by their text (the first pager of the page)."""
    pager = page[page.index('<p class="pager gradient-pager">') :]
    pager = pager[: pager.index("</p>")]
    return {
        text: html.unescape(href)
        for href, text in re.findall(r'<a[^>]* href="([^"]+)">([^<]+)</a>', pager)
    }


def test_a_wide_snapshot_is_shown_a_page_of_gradients_at_a_time(
    wide_snapshot: WideSnapshot,
) -> None:
    base = f"/ui/snapshots/{wide_snapshot.snapshot_id}"
    with _client(wide_snapshot.served) as client:
        first = client.get(base)
        assert first.status_code == 200
        rows = _rows(first.text)
        assert rows == [(i, f"layer{i:04d}.weight") for i in range(GRADIENTS_PER_PAGE)]
        assert first.text.count('class="bar-track"') == GRADIENTS_PER_PAGE  # this page's bars
        assert f"gradients 1–500 of {WIDE_GRADIENTS} · page 1 of 3" in first.text
        assert first.text.count('class="pager gradient-pager"') == 2  # above and below
        assert f"in {WIDE_GRADIENTS} gradients" in first.text  # the facts are the snapshot's
        links = _links(first.text)
        assert links == {"next ›": f"{base}?page=2", "last »": f"{base}?page=3"}

        second = client.get(links["next ›"])
        assert _rows(second.text)[0] == (500, "layer0500.weight")
        assert len(_rows(second.text)) == GRADIENTS_PER_PAGE
        assert _links(second.text) == {
            "« first": base,
            "‹ previous": base,
            "next ›": f"{base}?page=3",
            "last »": f"{base}?page=3",
        }
        assert second.text.count('class="unhealthy"') == 1  # the NaN at position 700
        last = client.get(links["last »"])
        assert [position for position, _ in _rows(last.text)] == list(range(1000, WIDE_GRADIENTS))
        assert f"gradients 1001–{WIDE_GRADIENTS} of {WIDE_GRADIENTS} · page 3 of 3" in last.text
        assert set(_links(last.text)) == {"« first", "‹ previous"}


def test_a_wide_snapshot_sorts_over_every_page(wide_snapshot: WideSnapshot) -> None:
    base = f"/ui/snapshots/{wide_snapshot.snapshot_id}"
    with _client(wide_snapshot.served) as client:
        first = client.get(base, params={"sort": "l2_norm", "order": "desc"})
        # the largest norms of the whole snapshot, not of the first page's gradients
        assert [p for p, _ in _rows(first.text)] == list(range(WIDE_GRADIENTS - 1, 733, -1))
        links = _links(first.text)
        assert links["next ›"] == f"{base}?sort=l2_norm&order=desc&page=2"
        # the chart shows this page's gradients in the snapshot's order
        labels = re.findall(r'<div class="bar-label" title="([^"]*)"', first.text)
        assert labels == [f"layer{i:04d}.weight" for i in range(734, WIDE_GRADIENTS)]
        third = client.get(links["last »"])
        assert [p for p, _ in _rows(third.text)] == list(range(233, -1, -1))
        # a column header sorts from the first page again
        header = re.search(r'<a href="([^"]+)" data-sort="name">', third.text)
        assert header is not None and "page=" not in html.unescape(header.group(1))


@pytest.mark.parametrize(
    ("page", "status", "words"),
    [
        ("4", 422, "has 1234 gradients, 3 page(s) of 500; page 4 is past the last"),
        ("0", 422, "page"),
        ("two", 422, "page"),
        (str(2**40), 422, "page"),
    ],
)
def test_a_page_past_the_last_is_refused(
    wide_snapshot: WideSnapshot, page: str, status: int, words: str
) -> None:
    with _client(wide_snapshot.served) as client:
        response = client.get(f"/ui/snapshots/{wide_snapshot.snapshot_id}", params={"page": page})
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert words in response.json()["detail"]


def test_a_small_snapshot_has_one_page_and_no_pager(
    open_service: Served, trained_store: TrainedStore
) -> None:
    with _client(open_service) as client:
        page = client.get(f"/ui/snapshots/{trained_store.nan_snapshot.id}")
    assert page.status_code == 200
    assert "gradient-pager" not in page.text
    assert [name for _, name in _rows(page.text)] == trained_store.layer_names
