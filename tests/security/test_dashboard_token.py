"""The dashboard of a server with a management token asks for it once and then shows data.

Runs in a real headless Chromium, as ``tests/integration/test_dashboard.py`` (and skips
the same way when Chromium or playwright is missing).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from tests.integration.test_dashboard import TIMEOUT_MS, browser  # noqa: F401  (fixture)
from tests.servers import running_server, write_config

MANAGEMENT = "mgmt-" + secrets.token_urlsafe(24)


async def test_dashboard_asks_for_the_management_token(
    model_root: Path,
    tmp_path: Path,
    browser: Any,  # noqa: F811
) -> None:
    models = [{"name": "add", "path": "add", "isolation": "inline", "preload": True}]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(model_root),
        security={"management_token": MANAGEMENT},
    )
    async with running_server(cfg) as (app, _):
        page = await browser.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        prompts: list[str] = []

        async def answer(dialog: Any) -> None:
            prompts.append(dialog.message)
            await dialog.accept(MANAGEMENT)

        page.on("dialog", answer)
        await page.goto(f"http://127.0.0.1:{app.http_port}/dashboard")
        await page.wait_for_selector('#connection[data-state="live"]')
        await page.wait_for_selector('.model-row[data-model="add"][data-state="READY"]')
        assert len(prompts) == 1
        assert "management token" in prompts[0]
        assert MANAGEMENT not in page.url
