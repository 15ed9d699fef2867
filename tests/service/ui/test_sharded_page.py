"""The pages on a sharded snapshot written by three ranks (``Recorder.snapshot_shard``), one
of them with a NaN and an Inf: the listing marks it and its health is its ranks', its page
lists the ranks, and each rank's page is a snapshot page of the rank's shard."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from gradvault.core import open_store
from tests.sharded_writes import PARAMS, rank_record, write_sharded

from .conftest import PageWatch, Served, _record, serve_store


@dataclass(frozen=True)
class ShardedStore:
    served: Served
    sharded_id: str
    whole_id: str


def _nan_on_rank_1(rank: int):
    return rank_record(rank, nonfinite=rank == 1)


async def _whole(path) -> str:
    store = open_store(path)
    try:
        return (await store.write_snapshot(_record(0), run="ddp", step=8)).id
    finally:
        await store.close()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardedStore]:
    path = tmp_path_factory.mktemp("sharded") / "store"
    # in a thread of its own: a browser's event loop may already run in this one
    with ThreadPoolExecutor(1) as thread:
        sharded_id = thread.submit(
            write_sharded, path, world_size=3, run="ddp", step=7, record_of=_nan_on_rank_1
        ).result()
        whole_id = thread.submit(asyncio.run, _whole(path)).result()
    for served in serve_store(path):
        yield ShardedStore(served, sharded_id, whole_id)


def _get(served: Served, path: str) -> httpx.Response:
    response = httpx.get(served.base_url + path, timeout=60)
    assert response.status_code == 200, (path, response.text)
    return response


def _rows(html: str, table: str) -> list[str]:
    body = html.split(f'<table class="{table}">', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr class=.*?</tr>", body, flags=re.S)


def test_the_overview_marks_the_sharded_snapshot_with_its_ranks_health(sharded: ShardedStore):
    html = _get(sharded.served, "/ui").text
    rows = _rows(html, "snapshots")
    assert len(rows) == 2
    whole, with_ranks = rows
    assert f'data-snapshot="{sharded.whole_id}"' in whole and "ranks</span>" not in whole
    assert f'data-snapshot="{sharded.sharded_id}"' in with_ranks
    assert 'data-healthy="false"' in with_ranks  # rank 1's NaN and Inf
    assert ">3 ranks</span>" in with_ranks
    assert ">NaN 1</span>" in with_ranks and ">Inf 1</span>" in with_ranks
    assert '<td class="num">6</td>' in with_ranks  # gradients over every rank


def test_the_sharded_page_lists_each_rank_and_its_links(sharded: ShardedStore):
    snapshot_id = sharded.sharded_id
    html = _get(sharded.served, f"/ui/snapshots/{snapshot_id}").text
    assert '<dd id="world-size">3 (sharded' in html
    rows = _rows(html, "ranks")
    assert [re.search(r'data-rank="(\d)"', row)[1] for row in rows] == ["0", "1", "2"]
    assert ['data-healthy="true"' in row for row in rows] == [True, False, True]
    for rank, row in enumerate(rows):
        page_link = re.search(r'<a class="rank" href="([^"]+)"', row)[1]
        assert page_link == f"/ui/snapshots/{snapshot_id}?rank={rank}"
        download = re.search(r'<a class="safetensors" href="([^"]+)"', row)[1]
        got = _get(sharded.served, download)
        api = _get(sharded.served, f"/v1/snapshots/{snapshot_id}/safetensors?rank={rank}")
        assert got.content == api.content
        assert f"{snapshot_id}-rank{rank}.safetensors" in got.headers["content-disposition"]


def test_a_rank_s_page_is_its_shard_s_gradients(sharded: ShardedStore):
    snapshot_id = sharded.sharded_id
    html = _get(sharded.served, f"/ui/snapshots/{snapshot_id}?rank=1").text
    assert f'<dd id="rank">1 of 3 · <a id="all-ranks" href="/ui/snapshots/{snapshot_id}">' in html
    assert "this rank's shard (.safetensors)</a>" in html
    rows = _rows(html, "gradients sortable")
    assert len(rows) == 2 and "unhealthy" in rows[0]
    for (param_id, _), row in zip(PARAMS, rows, strict=True):
        link = re.search(r'<a class="npy" href="([^"]+)"', row)[1]
        assert link == f"/ui/snapshots/{snapshot_id}/grads/{param_id}.npy?rank=1"
        npy = _get(sharded.served, link)
        api = _get(
            sharded.served, f"/v1/snapshots/{snapshot_id}/grads/{param_id}?format=npy&rank=1"
        )
        assert npy.content == api.content
        assert f"{snapshot_id}-rank1-{param_id}.npy" in npy.headers["content-disposition"]
    sorted_link = re.search(r'<a href="([^"]+)" data-sort="l2_norm"', html)[1]
    assert "rank=1" in sorted_link
    assert _get(sharded.served, sorted_link.replace("&amp;", "&")).status_code == 200


def test_a_rank_outside_the_snapshot_is_an_error_page(sharded: ShardedStore):
    response = httpx.get(
        f"{sharded.served.base_url}/ui/snapshots/{sharded.sharded_id}?rank=3", timeout=60
    )
    assert response.status_code == 422
    assert "ranks 0..2" in response.text


def test_in_chromium_from_the_overview_to_a_rank(page: PageWatch, sharded: ShardedStore):
    snapshot_id = sharded.sharded_id
    page.page.goto(sharded.served.base_url + "/ui")
    row = page.page.locator(f'table.snapshots tr[data-snapshot="{snapshot_id}"]')
    assert row.locator(".tag.ranks").inner_text() == "3 ranks"
    row.locator(f'a[href="/ui/snapshots/{snapshot_id}"]').click()
    page.page.wait_for_url(f"**/ui/snapshots/{snapshot_id}")
    ranks = page.page.locator("table.ranks tbody tr")
    assert ranks.count() == 3
    assert (
        page.page.locator("table.ranks tbody tr[data-healthy=false]").get_attribute("data-rank")
        == "1"
    )
    page.screenshot("sharded")
    page.page.locator('table.ranks a.rank:text("rank 1")').click()
    page.page.wait_for_url(f"**/ui/snapshots/{snapshot_id}?rank=1")
    assert page.page.locator("#rank").inner_text().startswith("1 of 3")
    assert page.page.locator("table.gradients tbody tr").count() == 2
    assert page.page.locator("table.gradients tbody tr.unhealthy").count() == 1
    with page.page.expect_download() as download_info:
        page.page.locator("#download-safetensors").click()
    download = download_info.value
    assert download.suggested_filename == f"{snapshot_id}-rank1.safetensors"
    with open(download.path(), "rb") as file:
        api = _get(sharded.served, f"/v1/snapshots/{snapshot_id}/safetensors?rank=1")
        assert file.read() == api.content
    page.screenshot("sharded-rank")
    page.page.locator("#all-ranks").click()
    page.page.wait_for_url(f"**/ui/snapshots/{snapshot_id}")
    assert page.problems == [], page.problems


def test_the_run_chart_counts_every_rank_and_the_diff_page_answers(sharded: ShardedStore):
    stats = _get(sharded.served, "/ui/api/run-stats?run=ddp").json()
    assert stats["snapshots"] == 2
    assert stats["ids"] == [sharded.sharded_id, sharded.whole_id]  # steps 7 and 8
    weight = stats["param_ids"].index(str(PARAMS[0][0]))
    weights = [next(iter(_nan_on_rank_1(rank))).array for rank in range(3)]
    # the largest over the ranks, each norm over its finite values (rank 1 has a NaN, an Inf)
    largest = max(float(np.linalg.norm(w[np.isfinite(w)].astype(np.float64))) for w in weights)
    assert stats["l2_norm"][weight][0] == pytest.approx(largest, rel=1e-6)
    (flagged,) = stats["nonfinite"]
    assert (flagged["id"], flagged["nan_count"], flagged["inf_count"]) == (sharded.sharded_id, 1, 1)
    assert flagged["layers"] == [PARAMS[0][1]]
    page = _get(sharded.served, f"/ui/diff?a={sharded.sharded_id}&b={sharded.whole_id}")
    assert page.status_code == 200
