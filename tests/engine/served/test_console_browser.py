"""The operator console in a real browser: Debian's Chromium driven by Playwright, against
``contextful pipeline serve --http`` serving a project whose pipelines have run.

Playwright's own browser download is not reachable here: the test launches Debian's ``chromium`` by
its path (.ci/run installs it) and fails, never skips, when it is missing. Screenshots are saved to
``$CONTEXTFUL_TEST_ARTIFACTS`` (else a temporary directory, printed); docs/images/console.png is one.

What a person does: opens the console, signs in with the keyboard alone, reads the pipelines table
and the reader/Admin label, at a desktop width and at 360 px. The console signs each mutation with
its non-extractable Ed25519 key (``surface.apply.operator-attestation``'s header and message,
checked here by a verifier written from the contract).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.control.credentials import b64url_decode
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect, sync_playwright

from tests.engine.control.scenario import Serve
from tests.engine.served.console_site import Site, console_served, landed_site, post
from tests.support.cli import contextful

CHROMIUM = Path("/usr/bin/chromium")
DESKTOP = {"width": 1280, "height": 900}
NARROW = {"width": 360, "height": 740}
ATTESTATION = re.compile(r"v1;nonce=(?P<nonce>[0-9a-f]{32});iat=(?P<iat>[0-9]+);sig=(?P<sig>[A-Za-z0-9_-]+)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.is_file():
        pytest.fail(f"Debian's chromium is not at {CHROMIUM}: `apt-get install chromium` (.ci/run does); the "
                    "console's browser test runs in CI, it is never skipped")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("CONTEXTFUL_TEST_ARTIFACTS") or tmp_path_factory.mktemp("artifacts")) / "console"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {folder}")
    return folder


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    made = browser.new_context(viewport=DESKTOP)
    yield made
    made.close()


def opened(context: BrowserContext, url: str) -> Page:
    page = context.new_page()
    page.goto(f"{url}/console/")
    page.wait_for_selector("body[data-ready='true']")
    return page


def sign_in(page: Page, token: str) -> None:
    page.get_by_label("Control credential").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#main")).to_be_visible()


def table(page: Page, selector: str) -> list[list[str]]:
    """The body rows of a table as a person reads them: each cell's text."""
    rows: list[list[str]] = page.locator(f"{selector} tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells, c => c.innerText.trim()))")
    return rows


def focus_ring(page: Page) -> dict[str, Any]:
    """What has focus and how its outline is drawn."""
    found: dict[str, Any] = page.evaluate("""() => {
        const e = document.activeElement, s = getComputedStyle(e);
        return {tag: e.tagName, id: e.id, label: e.getAttribute('aria-labelledby') || e.textContent.trim().slice(0, 40),
                outline: s.outlineStyle, width: parseFloat(s.outlineWidth)};
    }""")
    return found


def test_a_reader_signs_in_and_reads_the_pipelines_table_by_keyboard_alone(
        site: Site, url: str, context: BrowserContext, shots: Path) -> None:
    fetched: list[str] = []
    context.on("request", lambda r: fetched.append(r.url))
    page = opened(context, url)
    unnamed = page.evaluate("""() => Array.from(document.querySelectorAll('input, textarea, select, button'))
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
        .map(e => e.outerHTML)""")
    assert unnamed == []  # every control is labelled
    for _ in range(4):  # the skip link, then the credential field
        page.keyboard.press("Tab")
        if focus_ring(page)["id"] == "credential":
            break
    assert focus_ring(page)["id"] == "credential"
    page.keyboard.type(site.credential("ops", operator="rita"))
    page.keyboard.press("Enter")
    expect(page.locator("#holder")).to_contain_text("Signed in as rita")
    expect(page.locator("#holder")).to_contain_text("reader: status only")
    expect(page.locator("#edit")).to_be_hidden()  # a reader is shown nothing it may change

    rows = {cells[0]: cells for cells in table(page, "#pipelines")}
    assert set(rows) == {"orders", "customers"}
    assert rows["orders"][1:4] == ["files", "every 1h", "armed"]
    assert rows["orders"][6].startswith("committed, 7 rows at ")
    assert rows["customers"][2] == "—" and rows["customers"][3].startswith("not armed")
    assert rows["customers"][6].startswith("committed, 3 rows at ")
    runs = [(r[1], r[4]) for r in table(page, "#runs")]
    assert runs[0] == ("orders", "7")  # newest first
    assert sorted(runs) == [("customers", "3"), ("order_count", "1"), ("orders", "5"), ("orders", "7")]
    assert page.locator("#rows-chart svg circle").count() == 4
    assert table(page, "#models")[0][:3] == ["order_count", "build 1", "stale"]
    [export] = table(page, "#exports")
    assert export[:2] == ["order_count", "bi.order_count"] and export[3] == "model order_count build 1"
    assert page.locator("#fires-chart svg path").count() == 1  # one next fire: orders's

    # Tab on through the page to its last table: every stop shows its focus, each table's region is a stop
    stops: list[str] = []
    while "exports-caption" not in stops:
        assert len(stops) < 40, f"Tab never reached the exports table: {stops}"
        page.keyboard.press("Tab")
        ring = focus_ring(page)
        assert ring["outline"] != "none" and ring["width"] >= 2, ring
        stops.append(ring["label"])
    assert {"pipelines-caption", "runs-caption", "derive-caption", "models-caption"} <= set(stops)
    page.keyboard.press("Shift+Tab")  # and back: the keyboard moves both ways
    assert focus_ring(page)["label"] == "models-caption"
    page.screenshot(path=str(shots / "console-reader.png"), full_page=True)
    assert fetched and all(u.startswith(f"{url}/") for u in fetched), fetched  # served from the package alone


def test_the_console_works_at_360_px(site: Site, url: str, browser: Browser, shots: Path) -> None:
    context = browser.new_context(viewport=NARROW)
    try:
        page = opened(context, url)
        sign_in(page, site.credential("ops", operator="rita"))
        expect(page.locator("#pipelines tbody tr")).to_have_count(2)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= NARROW["width"], f"the page scrolls sideways at 360 px: {width} px wide"
        for region in page.locator(".scroll").all():  # a wide table scrolls inside its own labelled region
            assert region.bounding_box()["width"] <= NARROW["width"]  # type: ignore[index]
        page.screenshot(path=str(shots / "console-narrow.png"), full_page=True)
    finally:
        context.close()


def test_each_change_is_signed_by_the_browsers_non_extractable_console_key(
        site: Site, url: str, context: BrowserContext, shots: Path) -> None:
    page = opened(context, url)
    public = page.locator("#console-public-key").inner_text().strip()
    assert re.fullmatch(r"ed25519:[A-Za-z0-9_-]{43}", public), public
    key = Ed25519PublicKey.from_public_bytes(b64url_decode(public.removeprefix("ed25519:")))
    stored = page.evaluate("""() => new Promise((resolve, reject) => {
        const open = indexedDB.open('contextful-console', 1);
        open.onsuccess = () => {
            const get = open.result.transaction('keys').objectStore('keys').get('console');
            get.onsuccess = async () => {
                const pair = get.result;
                let exported = 'refused';
                try { await crypto.subtle.exportKey('pkcs8', pair.privateKey); exported = 'exported'; } catch (e) {}
                resolve({algorithm: pair.privateKey.algorithm.name, extractable: pair.privateKey.extractable, exported});
            };
        };
        open.onerror = () => reject(open.error);
    })""")
    assert stored == {"algorithm": "Ed25519", "extractable": False, "exported": "refused"}
    page.reload()
    page.wait_for_selector("body[data-ready='true']")
    assert page.locator("#console-public-key").inner_text().strip() == public  # kept across loads

    document = '[project]\nname = "shop"\n'
    posted: list[tuple[dict[str, str], bytes]] = []

    def served_document(route: Route) -> None:  # /control/* are the served helper's routes (engine.served.control)
        route.fulfill(status=200, content_type="application/json",
                      body=json.dumps({"version": 1, "document": document, "receipt": None, "draft": None}))

    def draft(route: Route) -> None:
        posted.append((route.request.headers, route.request.post_data_buffer or b""))
        route.fulfill(status=400, content_type="application/json", body=json.dumps({
            "error": "ApplyValidationRefused", "detail": "1 problem",
            "problems": [{"error": "ScheduleUnreadable", "detail": "orders: 'every 5x' is not a schedule"}]}))

    page.route("**/control/document", served_document)
    page.route("**/control/draft", draft)
    sign_in(page, site.credential("ops", operator="ada", admin=True, console_key=public))
    expect(page.locator("#holder")).to_contain_text("Admin: edits and applies")
    expect(page.locator("#key-match")).to_contain_text("binds this browser's key")
    expect(page.get_by_label(re.compile("Manifest document"))).to_have_value(document)

    edited = document + '\n[[pipeline]]\nid = "orders"\nschedule = "every 5x"\n'
    page.get_by_label(re.compile("Manifest document")).fill(edited)
    for _ in range(2):  # two saves: two signatures, each with a nonce of its own
        page.get_by_role("button", name="Save draft").click()
        expect(page.locator("#problem-list li")).to_have_text(["ScheduleUnreadable: orders: 'every 5x' is not a schedule"])
        expect(page.get_by_role("button", name="Apply draft")).to_be_disabled()
    page.screenshot(path=str(shots / "console-problems.png"), full_page=True)

    nonces = set()
    for headers, body in posted:
        assert json.loads(body) == {"document": edited, "version": 1}
        found = ATTESTATION.fullmatch(headers["contextful-attestation"])
        assert found is not None, headers["contextful-attestation"]
        assert abs(int(found["iat"]) - time.time()) <= 60
        message = (f"contextful-console-v1\nada\nPOST /control/draft\n{hashlib.sha256(body).hexdigest()}\n"
                   f"{found['nonce']}\n{found['iat']}\n").encode()
        key.verify(b64url_decode(found["sig"]), message)  # raises InvalidSignature when it does not hold
        nonces.add(found["nonce"])
    assert len(nonces) == 2


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[tuple[Site, Serve]]:
    """A project of its own (the test applies a version to it), served."""
    site = landed_site(tmp_path)
    with console_served(site) as serve:
        yield site, serve


@pytest.mark.clause("surface.edit.store-draft", "surface.apply.operator-attestation")
def test_an_admin_edits_a_schedule_sees_the_problem_fixes_it_applies_and_sees_the_new_version_armed(
        fresh: tuple[Site, Serve], context: BrowserContext, shots: Path) -> None:
    site, serve = fresh
    page = opened(context, serve.url)
    public = page.locator("#console-public-key").inner_text().strip()
    sign_in(page, site.credential("ops", operator="ada", admin=True, console_key=public))
    expect(page.locator("#holder")).to_contain_text("Admin: edits and applies")
    editor = page.get_by_label(re.compile("Manifest document"))
    expect(editor).to_have_value(re.compile('schedule = "every 1h"'))
    applied = editor.input_value()
    signed: list[tuple[str, dict[str, str], bytes]] = []
    page.on("request", lambda r: signed.append((r.url, r.headers, r.post_data_buffer or b""))
            if r.method == "POST" else None)

    # by keyboard: from the editor Tab reaches "Save draft", Enter saves
    editor.fill(applied.replace('schedule = "every 1h"', "schedule = 15"))  # a number where a schedule goes
    editor.press("Tab")
    expect(page.get_by_role("button", name="Save draft")).to_be_focused()
    page.keyboard.press("Enter")
    problems = page.locator("#problem-list li")
    expect(problems.first).to_be_visible()
    assert "schedule" in problems.first.inner_text()
    expect(page.get_by_role("button", name="Apply draft")).to_be_disabled()
    page.screenshot(path=str(shots / "console-problem.png"), full_page=True)

    editor.fill(applied.replace('schedule = "every 1h"', 'schedule = "every 15m"'))
    editor.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#draft-state")).to_contain_text("saved by ada, based on v1")
    expect(page.locator("#problems")).to_be_hidden()
    draft = json.loads(contextful(site.project.root, "--json", "pipeline", "status").stdout)
    assert draft["version"] == 1  # a saved draft leaves the applied pointer where it was
    expect(page.get_by_role("button", name="Apply draft")).to_be_focused()  # a saved draft: focus on Apply
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_contain_text("Applied v2 (v1 before)")
    expect(page.locator("#applied-version")).to_have_text("v2")
    orders = next(cells for cells in table(page, "#pipelines") if cells[0] == "orders")
    assert orders[2:4] == ["every 15m", "armed"]
    serve.wait_line("armed v2")  # serve re-armed on the version the console applied
    status = json.loads(contextful(site.project.root, "--json", "pipeline", "status").stdout)
    assert status["version"] == 2 and [(e["id"], e["schedule"]) for e in status["armed"]] == [("orders", "every 15m")]
    page.screenshot(path=str(shots / "console-applied.png"), full_page=True)

    # the page signed each mutation; the same signed request sent again is refused and changes nothing
    [*_, (url, headers, body)] = [s for s in signed if s[0].endswith("/control/apply")]
    replay = {k: v for k, v in headers.items() if k in ("authorization", "content-type", "contextful-attestation")}
    answer = post(url, body, replay)
    assert (answer.status, answer.json()["error"]) == (401, "ControlOperatorAttestationInvalid")
    assert json.loads(contextful(site.project.root, "--json", "pipeline", "status").stdout)["version"] == 2
