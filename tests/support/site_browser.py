"""The course site (``make book``) opened page by page in headless Chromium, as a reader would.

:func:`serve` serves a built site on loopback (a free port, a thread of this process, stopped on
exit). :func:`browse_site` opens every page of it and returns what a reader would trip over:

- a page without a title or without its ``<h1>``; a markdown table left as text (``|---|``,
  its dashes maybe typeset as dashes);
- an image that did not load (``naturalWidth`` 0), a response of 400 or more;
- a request to any host but the site's (the site must work offline), a console error or an
  uncaught page error;
- an internal link to a page that does not answer 200, or to an ``#anchor`` its page lacks;
- a collapsed ``<details>`` block that is open before a click or stays closed after one;
- a search that does not find ``search_word`` on ``search_page``.

Screenshots of the pages named in ``shots`` go to ``shot_dir`` (``book-<page>.png``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urljoin

from chexnet_utils.notebook.site_check import site_pages

TIMEOUT_MS = 30_000

_PAGE_FACTS = r"""() => ({
  title: document.title,
  h1: [...document.querySelectorAll('h1')].map(h => h.innerText.trim()).filter(Boolean),
  broken_images: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))
                   .map(i => i.getAttribute('src')),
  images: document.images.length,
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id)
       .concat([...document.querySelectorAll('a[name]')].map(a => a.name)),
  details: document.querySelectorAll('details').length,
  raw_tables: [...document.querySelectorAll('p')]
                .filter(p => /\|\s*:?[-\u2013\u2014]+:?\s*\|/.test(p.innerText))
                .map(p => p.innerText.slice(0, 60)),
})"""


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def serve(site: Path) -> Iterator[str]:
    """Serve ``site`` on ``127.0.0.1`` (a free port) from a thread; yield its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def browse_site(browser: object, base: str, site: Path, *, shots: Sequence[str] = (),
                shot_dir: Path | None = None, search_word: str | None = None,
                search_page: str | None = None) -> dict[str, object]:
    """Open every page of ``site`` (served at ``base``); return ``{"problems": [...],
    "pages": n, "images": n, "links": n, "search_hits": [...], "details_checked": n}``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    problems: list[str] = []
    events: list[str] = []
    page.on("request", lambda r: events.append(f"request to another host: {r.url}")
            if not r.url.startswith((base, "data:", "blob:")) else None)
    page.on("response", lambda r: events.append(f"HTTP {r.status} for {r.url}")
            if r.status >= 400 else None)
    page.on("console", lambda m: events.append(f"console error: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: events.append(f"page error: {e}"))
    facts: dict[str, dict] = {}
    try:
        for rel in (p.relative_to(site).as_posix() for p in site_pages(site)):
            events.clear()
            page.goto(urljoin(base, rel), wait_until="load")
            f = page.evaluate(_PAGE_FACTS)
            facts[rel] = f
            problems += [f"{rel}: {e}" for e in events]
            events.clear()
            if not f["title"].strip():
                problems.append(f"{rel}: no <title>")
            if not f["h1"]:
                problems.append(f"{rel}: no <h1>")
            problems += [f"{rel}: image {src} did not load" for src in f["broken_images"]]
            problems += [f"{rel}: a markdown table shown as text: {t!r}" for t in f["raw_tables"]]
            if rel.removesuffix(".html") in shots and shot_dir is not None:
                shot_dir.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(shot_dir / f"book-{rel.removesuffix('.html')}.png"))
            if f["details"]:
                problems += [f"{rel}: {p}" for p in _check_details(page)]
                problems += [f"{rel} (after opening a collapsed block): {e}" for e in events]
        problems += _check_links(context, base, facts)
        hits: list[str] = []
        if search_word:
            events.clear()
            hits = _search(page, base, search_word)
            problems += [f"search.html (searching {search_word!r}): {e}" for e in events]
            if search_page and not any(urldefrag(h)[0].endswith(search_page) for h in hits):
                problems.append(f"search for {search_word!r} did not find {search_page} "
                                f"(found: {hits})")
    finally:
        context.close()
    return {"problems": problems, "pages": len(facts),
            "images": sum(f["images"] for f in facts.values()),
            "links": sum(len(f["links"]) for f in facts.values()), "search_hits": hits,
            "details_checked": sum(1 for f in facts.values() if f["details"])}


def _check_details(page: object) -> list[str]:
    """The page's first ``<details>`` is closed, and opens (its text shown) on a click."""
    details = page.locator("details").first  # type: ignore[attr-defined]
    if details.get_attribute("open") is not None:
        return ["a collapsed block is open before any click"]
    details.locator("summary").first.click()
    if details.get_attribute("open") is None:
        return ["a collapsed block did not open on a click"]
    shown = details.evaluate("d => [...d.children].filter(c => c.tagName !== 'SUMMARY')"
                             ".some(c => c.offsetHeight > 0)")
    return [] if shown else ["a collapsed block opened, but nothing is shown under it"]


def _check_links(context: object, base: str, facts: dict[str, dict]) -> list[str]:
    """Every internal link answers 200 and its ``#anchor`` exists on the page it names."""
    problems = []
    status: dict[str, int] = {}
    for rel, f in facts.items():
        for href in f["links"]:
            url, fragment = urldefrag(href)
            if not url.startswith(base):
                continue  # another host: a link a reader follows by choice, not a request
            target = url[len(base):].split("?", 1)[0] or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if target not in facts:
                if url not in status:
                    status[url] = context.request.get(url).status  # type: ignore[attr-defined]
                if status[url] != 200:
                    problems.append(f"{rel}: link {href} answers HTTP {status[url]}")
            elif fragment and fragment not in facts[target]["ids"]:
                problems.append(f"{rel}: link {href}: no #{fragment} on {target}")
    return problems


def _search(page: object, base: str, word: str) -> list[str]:
    """The result links Sphinx's search page lists for ``word``."""
    page.goto(urljoin(base, f"search.html?q={word}"), wait_until="load")  # type: ignore[attr-defined]
    # Sphinx's searchtools.js appends the results one by one, then writes its summary
    page.wait_for_function(  # type: ignore[attr-defined]
        "() => /search finished|did not match/i.test("
        "document.querySelector('#search-results')?.innerText || '')")
    return page.evaluate(  # type: ignore[attr-defined]
        "() => [...document.querySelectorAll('#search-results li a')].map(a => a.href)")
