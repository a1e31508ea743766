"""The dashboard in a real headless Chromium against a real server.

Needs Debian's ``chromium`` and the ``playwright`` Python package (its driver only:
never ``playwright install``, which downloads browsers). Skips when either is missing.
The last screenshot is kept at ``artifacts/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_metrics import fake, x
from tests.servers import running_server, write_config

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HAS_CHROMIUM = Path(CHROMIUM).exists()
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
BUDGET_MB = 256
TIMEOUT_MS = 15_000


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not HAS_CHROMIUM:
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    playwright = pytest.importorskip(
        "playwright.async_api", reason="pip install playwright (no `playwright install`)"
    )
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    models: list[dict[str, Any]] = [
        {"name": "echo", **fake(model_root, "echo", "EchoModel"), "isolation": "inline"}
        | {"preload": True},
        {"name": "add", "path": "add", "isolation": "inline", "preload": True},
        {"name": "mlp", "path": "mlp", "isolation": "inline"},
    ]
    return write_config(
        tmp_path,
        models,
        model_repository=str(model_root),
        devices=[{"name": "cpu", "memory_budget_mb": BUDGET_MB}],
    )


async def traffic(client: httpx.AsyncClient, seconds: float) -> int:
    """Requests to echo and add for ``seconds``, a little faster each second."""
    add = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    sent = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        burst = 2 + int(seconds - (end - loop.time())) * 3
        replies = await asyncio.gather(
            *(client.post("/v2/models/echo/infer", json=x(0.5)) for _ in range(burst)),
            client.post("/v2/models/add/infer", json=add),
        )
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        sent += burst
        await asyncio.sleep(0.1)
    return sent


async def test_dashboard_shows_models_memory_traffic_and_events(
    config_file: Path, browser: Any
) -> None:
    async with running_server(config_file) as (app, client):
        page = await browser.new_page(viewport={"width": 1280, "height": 1100})
        problems: list[str] = []

        def on_console(message: Any) -> None:
            if message.type == "error":
                problems.append(message.text)

        page.on("console", on_console)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.set_default_timeout(TIMEOUT_MS)
        await page.goto(f"http://127.0.0.1:{app.http_port}/dashboard")

        # Models with their state, and the device bar against the budget.
        await page.wait_for_selector('.model-row[data-model="echo"][data-state="READY"]')
        await page.wait_for_selector('.model-row[data-model="mlp"][data-state="UNLOADED"]')
        bar = page.locator('.device-bar[data-device="cpu"]')
        assert await bar.get_attribute("data-budget-bytes") == str(BUDGET_MB * 1024 * 1024)
        assert int(await bar.get_attribute("data-reserved-bytes") or 0) > 0
        assert await bar.locator('.segment[data-model="echo"]').count() == 1
        echo_requests = page.locator('.model-row[data-model="echo"] .requests')
        assert await echo_requests.inner_text() == "0"
        assert await page.locator("#connection").get_attribute("data-state") == "live"

        # Traffic and a cold start: the numbers move on the next polls.
        running = asyncio.create_task(traffic(client, 3.0))
        try:
            await page.wait_for_function(
                "() => parseFloat(document.querySelector("
                "'.traffic-card[data-model=\"echo\"] .rate-now')?.textContent) > 0"
            )
        finally:
            sent = await running
        assert (await client.post("/v2/models/mlp/infer", json=_mlp())).status_code == 200
        await page.wait_for_function(
            "n => document.querySelector('.model-row[data-model=\"echo\"] .requests')"
            ".textContent === String(n)",
            arg=sent,
        )
        await page.wait_for_selector('.model-row[data-model="mlp"][data-state="READY"]')
        await page.wait_for_selector('.device-bar[data-device="cpu"] .segment[data-model="mlp"]')
        card = page.locator('.traffic-card[data-model="echo"]')
        await card.locator('svg.chart[data-metric="rate"] polyline').first.wait_for()
        await card.locator('svg.chart[data-metric="latency"] polyline.line-p99').first.wait_for()
        assert "ms" in await card.locator(".latency-now").inner_text()
        mlp_card = page.locator('.traffic-card[data-model="mlp"]')
        await mlp_card.locator('svg.chart[data-metric="cold"] rect').first.wait_for()
        loaded = page.locator('#events .event[data-kind="loaded"]')
        await loaded.filter(has_text="mlp:1").first.wait_for()

        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        assert problems == []


async def test_dashboard_assets_are_local_and_guarded(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        page = await client.get("/dashboard")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert "http://" not in page.text
        assert "https://" not in page.text
        for asset in ("dashboard.js", "dashboard.css"):
            r = await client.get(f"/dashboard/{asset}")
            assert r.status_code == 200, asset
            assert "https://" not in r.text
        assert (await client.get("/dashboard/missing.js")).status_code == 404
        home = await client.get("/")
        assert home.status_code == 302
        assert home.headers["location"] == "/dashboard"
        feed = await client.get("/v2/stats/timeseries", params={"window_s": 60})
        assert feed.status_code == 200
        assert feed.json()["window_s"] == 60
        bad = await client.get("/v2/stats/timeseries", params={"window_s": "soon"})
        assert bad.status_code == 400


def _mlp() -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64}]}


async def test_the_feed_has_generation_figures_and_client_errors_apart(
    model_root: Path, llm_root: Path, tmp_path: Path
) -> None:
    pytest.importorskip("llama_cpp", reason="the llm extra serves GGUF models")
    from tests.integration.llm_models import llm_model

    models = [
        llm_model("llama-a"),
        {"name": "add", "path": str(model_root / "add"), "isolation": "inline"},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(llm_root))
    async with running_server(cfg) as (_, client):
        done = await client.post(
            "/v1/completions",
            json={"model": "llama-a", "prompt": "Hello", "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert done.status_code == 200, done.text
        tensor = {"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1] * 3}
        wrong = {"inputs": [tensor]}
        assert (await client.post("/v2/models/add/infer", json=wrong)).status_code == 400
        await asyncio.sleep(1.1)  # the feed shows whole seconds only
        feed = (await client.get("/v2/stats/timeseries", params={"window_s": 30})).json()
    series = {m["name"]: m for m in feed["models"]}
    llama, add = series["llama-a"], series["add"]
    assert sum(llama["tokens"]) == done.json()["usage"]["completion_tokens"]
    assert [t for t in llama["ttft_p50_s"] if t is not None]
    assert llama["active_sequences"] == 0
    assert add["active_sequences"] is None
    assert sum(add["client_errors"]) == 1
    assert sum(add["errors"]) == 0
