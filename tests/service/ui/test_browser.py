"""The pages in Debian's chromium (headless, driven by Playwright) against a real uvicorn.

Each test loads pages as a person would, fails on any console error, page error or
failed request, and leaves a screenshot in tests/service/ui/artifacts/.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from .conftest import (
    NAN_STEP,
    READ_TOKEN,
    RUN,
    WIDE_GRADIENTS,
    PageWatch,
    Served,
    TrainedStore,
    WideSnapshot,
)


def _no_problems(watch: PageWatch) -> None:
    assert watch.problems == [], watch.problems


def _column(page: Any, index: int) -> list[str]:
    return page.locator(f"table.gradients tbody tr td:nth-child({index})").all_inner_texts()


def test_overview_lists_runs_and_flags_the_nan_snapshot(
    page: PageWatch, open_service: Served, trained_store: TrainedStore
) -> None:
    page.page.goto(open_service.base_url + "/")  # redirected to /ui
    assert page.page.url == open_service.base_url + "/ui"
    runs = page.page.locator("table.runs tbody tr td:first-child").all_inner_texts()
    assert runs == ["probe", RUN]  # the run with the newest snapshot first
    rows = page.page.locator("table.snapshots tbody tr")
    assert rows.count() == len(trained_store.snapshots) + 1
    flagged = page.page.locator("table.snapshots tbody tr[data-healthy=false]")
    assert flagged.count() == 1
    assert flagged.get_attribute("data-snapshot") == trained_store.nan_snapshot.id
    assert flagged.locator(".badge").inner_text() == "NaN 1"
    healthy = len(trained_store.snapshots) - 1 + 1  # every mlp step but one, and the probe
    assert page.page.locator("table.snapshots .badge.ok").count() == healthy
    steps = page.page.locator("table.snapshots tbody tr td:nth-child(2)").all_inner_texts()
    assert steps[1:] == [str(s) for s in range(len(trained_store.snapshots) - 1, -1, -1)]
    page.screenshot("overview")
    _no_problems(page)


def test_run_chart_has_a_series_per_layer_and_marks_the_nan_step(
    page: PageWatch, open_service: Served, trained_store: TrainedStore
) -> None:
    page.page.goto(open_service.base_url + "/ui")
    page.page.get_by_role("link", name=RUN, exact=True).first.click()
    chart = page.page.locator("#run-chart[data-ready=true]")
    chart.wait_for()
    assert chart.get_attribute("data-series") == str(len(trained_store.layer_names))
    legend = page.page.locator("#run-chart .u-legend .u-series")
    labels = [text.strip() for text in legend.all_inner_texts()]
    assert len(labels) == 1 + len(trained_store.layer_names)  # the x series, then one per layer
    assert all(any(name in label for label in labels) for name in trained_store.layer_names)
    assert chart.get_attribute("data-marked-steps") == "1"
    nonfinite = page.page.locator("#nonfinite li")
    assert nonfinite.count() == 1
    assert nonfinite.inner_text().startswith(f"step {NAN_STEP}")
    assert "layers.0.bias" in nonfinite.inner_text()  # the second gradient got the NaN
    # the red marker is on the canvas: some pixel column holds the marker's red
    red_columns = page.page.evaluate(
        """() => {
          const canvas = document.querySelector('#run-chart canvas');
          const ctx = canvas.getContext('2d');
          const {width, height} = canvas;
          const data = ctx.getImageData(0, 0, width, height).data;
          let columns = 0;
          for (let x = 0; x < width; x++) {
            let reds = 0;
            for (let y = 0; y < height; y++) {
              const i = (y * width + x) * 4;
              const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
              if (r > 180 && g < 80 && b < 80 && a > 200) reds++;
            }
            if (reds > height / 2) columns++;
          }
          return columns;
        }"""
    )
    assert red_columns >= 1
    page.screenshot("run")
    _no_problems(page)


def test_snapshot_table_sorts_and_shows_the_bar_chart(
    page: PageWatch, open_service: Served, trained_store: TrainedStore
) -> None:
    page.page.goto(f"{open_service.base_url}/ui/snapshots/{trained_store.nan_snapshot.id}")
    assert page.page.locator(".bars .bar-track").count() == len(trained_store.layer_names)
    assert page.page.locator(".bars .bar.bad").count() == 1
    assert _column(page.page, 2) == trained_store.layer_names  # manifest order
    page.page.locator("th a[data-sort=l2_norm]").click()
    page.page.wait_for_url(re.compile(r"sort=l2_norm&order=asc"))
    norms = [float(text) for text in _column(page.page, 6)]
    assert norms == sorted(norms)
    page.page.locator("th a[data-sort=l2_norm]").click()
    page.page.wait_for_url(re.compile(r"sort=l2_norm&order=desc"))
    assert [float(text) for text in _column(page.page, 6)] == sorted(norms, reverse=True)
    page.page.locator("th a[data-sort=nan_count]").click()
    page.page.wait_for_url(re.compile(r"sort=nan_count&order=asc"))
    assert _column(page.page, 8)[-1] == "1"
    page.page.locator("th a[data-sort=name]").click()
    page.page.wait_for_url(re.compile(r"sort=name&order=asc"))
    assert _column(page.page, 2) == sorted(trained_store.layer_names)
    page.page.locator("th a[data-sort=nan_count]").click()
    page.page.locator("th a[data-sort=nan_count]").click()
    page.page.wait_for_url(re.compile(r"sort=nan_count&order=desc"))
    assert page.page.locator("table.gradients tbody tr.unhealthy").count() == 1
    page.screenshot("snapshot")
    _no_problems(page)


def _api_bytes(served: Served, path: str, token: str | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(served.base_url + path, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.content


def _check_downloads(page: PageWatch, served: Served, snapshot_id: str, token: str | None) -> int:
    """Every download link of the snapshot page gives the bytes the /v1 API gives."""
    page.page.goto(f"{served.base_url}/ui/snapshots/{snapshot_id}")
    links = page.page.locator("table.gradients a.npy")
    checked = 0
    for row in page.page.locator("table.gradients tbody tr").all():
        param_id = row.get_attribute("data-param")
        href = row.locator("a.npy").get_attribute("href")
        got = page.page.request.get(served.base_url + href).body()
        assert got == _api_bytes(
            served, f"/v1/snapshots/{snapshot_id}/grads/{param_id}?format=npy", token
        )
        checked += 1
    assert checked == links.count() > 0
    with page.page.expect_download() as download_info:
        page.page.locator("#download-safetensors").click()
    download = download_info.value
    assert download.suggested_filename == f"{snapshot_id}.safetensors"
    saved = download.path()
    with open(saved, "rb") as file:
        assert file.read() == _api_bytes(served, f"/v1/snapshots/{snapshot_id}/safetensors", token)
    with page.page.expect_download() as download_info:
        links.first.click()
    assert download_info.value.suggested_filename.endswith(".npy")
    return checked


def test_download_links_give_the_bytes_the_api_gives(
    page: PageWatch, open_service: Served, trained_store: TrainedStore
) -> None:
    checked = _check_downloads(page, open_service, trained_store.nan_snapshot.id, None)
    assert checked == len(trained_store.layer_names)
    _no_problems(page)


def test_diff_compares_two_steps_of_a_run(
    page: PageWatch, open_service: Served, trained_store: TrainedStore
) -> None:
    before = trained_store.snapshots[NAN_STEP - 1]
    page.page.goto(f"{open_service.base_url}/ui/run?run={RUN}")
    page.page.locator(f"input[name=a][value='{before.id}']").check()
    page.page.locator(f"input[name=b][value='{trained_store.nan_snapshot.id}']").check()
    page.page.get_by_role("button", name="Compare A with B").click()
    page.page.wait_for_url(re.compile(r"/ui/diff\?"))
    rows = page.page.locator("table.diff tbody tr")
    assert rows.count() == len(trained_store.layer_names)
    assert page.page.locator("table.diff tbody tr.unhealthy").count() == 1
    ratios = page.page.locator("table.diff tbody tr td:nth-child(4)").all_inner_texts()
    norms_a = page.page.locator("table.diff tbody tr td:nth-child(2)").all_inner_texts()
    norms_b = page.page.locator("table.diff tbody tr td:nth-child(3)").all_inner_texts()
    for ratio, a, b in zip(ratios, norms_a, norms_b, strict=True):
        assert abs(float(ratio) - float(b) / float(a)) <= 2e-3 * float(ratio)
    page.page.get_by_role("link", name="largest change").click()
    page.page.wait_for_url(re.compile(r"sort=ratio"))
    page.screenshot("diff")
    _no_problems(page)


def test_tables_read_and_sort_without_javascript(
    browser: Any, open_service: Served, trained_store: TrainedStore
) -> None:
    context = browser.new_context(java_script_enabled=False)
    try:
        page = PageWatch(context.new_page())
        page.page.goto(f"{open_service.base_url}/ui/run?run={RUN}")
        assert page.page.locator("table.snapshots tbody tr").count() == len(trained_store.snapshots)
        assert page.page.locator("noscript").count() == 1
        page.page.goto(f"{open_service.base_url}/ui/snapshots/{trained_store.nan_snapshot.id}")
        page.page.locator("th a[data-sort=max_abs]").click()
        page.page.wait_for_url(re.compile(r"sort=max_abs&order=asc"))
        values = [float(t) for t in _column(page.page, 7)]
        assert values == sorted(values)
        page.screenshot("snapshot-no-js")
        _no_problems(page)
    finally:
        context.close()


def test_a_protected_service_asks_for_the_token_then_shows_the_pages(
    page: PageWatch, protected_service: Served, trained_store: TrainedStore
) -> None:
    visited: list[str] = []
    page.page.on("request", lambda request: visited.append(request.url))
    base = protected_service.base_url
    page.page.goto(f"{base}/ui/run?run={RUN}")
    assert page.page.url.startswith(f"{base}/ui/login?next=")
    page.page.get_by_label("token").fill("not-a-token")
    page.page.get_by_role("button", name="Sign in").click()
    assert page.page.get_by_role("alert").inner_text() == "that token is not one this service knows"
    page.screenshot("login-refused")
    page.problems.clear()  # the refused login answers 401, which chromium logs as an error
    page.page.get_by_label("token").fill(READ_TOKEN)
    page.page.get_by_role("button", name="Sign in").click()
    page.page.wait_for_url(f"{base}/ui/run?run={RUN}")
    page.page.locator("#run-chart[data-ready=true]").wait_for()
    assert page.page.locator("#run-chart").get_attribute("data-marked-steps") == "1"
    (cookie,) = page.page.context.cookies()
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/ui")
    assert page.page.evaluate("document.cookie") == ""  # scripts cannot read it
    page.screenshot("protected-run")
    _check_downloads(page, protected_service, trained_store.nan_snapshot.id, READ_TOKEN)
    # the cookie opens the pages, not the API: /v1 still wants Authorization
    api = page.page.request.get(f"{base}/v1/snapshots")
    assert api.status == 401
    assert not any(READ_TOKEN in url for url in visited)
    page.page.get_by_role("button", name="Sign out").click()
    page.page.wait_for_url(re.compile(r"/ui/login"))
    page.page.goto(f"{base}/ui")
    assert page.page.url.startswith(f"{base}/ui/login?next=")
    _no_problems(page)


def test_zooming_a_downsampled_chart_fetches_the_range_in_full(
    long_run: Served, page: PageWatch
) -> None:
    page.page.goto(f"{long_run.base_url}/ui/run?run=long&max_points=4")
    chart = page.page.locator("#run-chart[data-ready=true]")
    chart.wait_for()
    note = page.page.locator("#run-chart-note")
    assert note.inner_text().startswith("30 snapshots shown as 4 points")
    assert chart.get_attribute("data-marked-steps") == "1"  # step 17, inside a bucket
    area = page.page.locator("#run-chart .u-over").bounding_box()
    middle = area["y"] + area["height"] / 2
    page.page.mouse.move(area["x"] + area["width"] * 0.3, middle)
    page.page.mouse.down()
    page.page.mouse.move(area["x"] + area["width"] * 0.7, middle, steps=5)
    page.page.mouse.up()
    page.page.wait_for_function(
        "() => document.getElementById('run-chart-note').textContent.includes('from step')"
    )
    zoomed = note.inner_text()
    steps = [int(word) for word in zoomed.split() if word.isdigit()]
    first, last = steps[1], steps[2]
    assert zoomed.startswith(f"{last - first + 1} snapshots from step {first} to {last}")
    assert first < 17 < last
    page.screenshot("run-zoomed")
    page.page.locator("#run-chart .u-over").dblclick()
    page.page.wait_for_function(
        "() => document.getElementById('run-chart-note').textContent.startsWith('30 snapshots')"
    )
    _no_problems(page)


def test_a_wide_snapshot_pages_through_its_gradients(
    page: PageWatch, wide_snapshot: WideSnapshot
) -> None:
    base = f"{wide_snapshot.served.base_url}/ui/snapshots/{wide_snapshot.snapshot_id}"
    page.page.goto(base)
    rows = page.page.locator("table.gradients tbody tr")
    assert rows.count() == 500
    assert page.page.locator(".bars .bar-track").count() == 500
    pager = page.page.locator(".gradient-pager").first
    assert f"gradients 1–500 of {WIDE_GRADIENTS} · page 1 of 3" in pager.inner_text()
    pager.get_by_role("link", name="next ›").click()
    page.page.wait_for_url(re.compile(r"page=2$"))
    assert _column(page.page, 1)[0] == "500"
    assert page.page.locator("table.gradients tbody tr.unhealthy").count() == 1
    page.page.locator(".gradient-pager").first.get_by_role("link", name="last »").click()
    page.page.wait_for_url(re.compile(r"page=3$"))
    assert rows.count() == WIDE_GRADIENTS - 1000
    # sorting is over the whole snapshot, and starts again from its first page
    page.page.locator("th a[data-sort=l2_norm]").click()
    page.page.wait_for_url(re.compile(r"sort=l2_norm&order=asc$"))
    assert _column(page.page, 1)[:3] == ["0", "1", "2"]
    page.page.locator("th a[data-sort=l2_norm]").click()
    page.page.wait_for_url(re.compile(r"sort=l2_norm&order=desc$"))
    assert _column(page.page, 1)[:3] == [str(WIDE_GRADIENTS - 1 - i) for i in range(3)]
    page.page.locator(".gradient-pager").first.get_by_role("link", name="next ›").click()
    page.page.wait_for_url(re.compile(r"sort=l2_norm&order=desc&page=2$"))
    norms = [float(text) for text in _column(page.page, 6)]
    assert norms == sorted(norms, reverse=True) and len(norms) == 500
    page.page.locator(".gradient-pager").first.get_by_role("link", name="‹ previous").click()
    page.page.wait_for_url(re.compile(r"sort=l2_norm&order=desc$"))
    page.screenshot("snapshot-wide")
    _no_problems(page)
