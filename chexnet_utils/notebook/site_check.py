"""Checking a built static site without a browser: every internal link and figure resolves,
nothing is loaded from another host.

:func:`site_problems` reads every HTML page of the site (:mod:`html.parser`) and reports

- an internal link (``<a href>``) to a file that is not in the site, or to an ``#anchor``
  that the target page does not define;
- a link or resource outside the site's folder (``../figures/x.png``: not published with it);
- a resource (``<img>``, ``<script>``, ``<link rel=stylesheet|icon|preload...>``, ``<iframe>``,
  ``<source>``, ``<video>``, ``<audio>``, ``<embed>``, ``<object>``) that is missing from the
  site, empty, or on another host (the site must work offline: a browser fetches those
  without a click);
- ``url(...)`` in the site's CSS pointing to another host.

Links to other hosts in ``<a href>`` are fine: a reader follows them by choice. ``make book``
fails on any problem; the browser check (tests/support/site_browser.py) then checks the same
pages live.
"""

from __future__ import annotations

import html.parser
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

RESOURCE_TAGS = {"img": "src", "script": "src", "iframe": "src", "source": "src",
                 "video": "src", "audio": "src", "embed": "src", "object": "data"}
FETCHED_RELS = {"stylesheet", "icon", "shortcut", "preload", "modulepreload", "prefetch",
                "preconnect", "dns-prefetch", "manifest", "apple-touch-icon"}
TEMPLATE_DIRS = {"_static"}
"""Folders of the site whose ``.html`` files are not pages (the themes copy their Jinja
macros there)."""
_CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")]+)['\"]?\s*\)")


class _Page(html.parser.HTMLParser):
    """The ids, links and fetched resources of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.resources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for key in ("id", "name") if tag == "a" else ("id",):
            if a.get(key):
                self.ids.add(a[key])
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        elif tag == "link" and FETCHED_RELS & set(a.get("rel", "").lower().split()):
            self.resources.append(a.get("href", ""))
        elif tag in RESOURCE_TAGS and a.get(RESOURCE_TAGS[tag]):
            self.resources.append(a[RESOURCE_TAGS[tag]])


def is_remote(url: str) -> bool:
    """Whether fetching ``url`` leaves the site (a scheme other than ``data:``/``blob:``, or
    a protocol-relative ``//host/...``)."""
    parts = urlsplit(url)
    return bool(parts.netloc) or parts.scheme not in ("", "data", "blob")


def _target(site: Path, page: Path, url: str) -> tuple[Path, str] | None:
    """The file and fragment an internal ``url`` on ``page`` points to (``None``: not a path
    reference, e.g. ``mailto:`` or ``javascript:``)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc:
        return None
    path = unquote(parts.path)
    if not path:
        return page, parts.fragment
    base = site if path.startswith("/") else page.parent
    target = (base / path.lstrip("/")).resolve()
    if target.is_dir():
        target = target / "index.html"
    return target, parts.fragment


def site_pages(site: Path) -> list[Path]:
    """The site's HTML pages, sorted (not the themes' templates in :data:`TEMPLATE_DIRS`)."""
    return [p for p in sorted(site.rglob("*.html"))
            if p.relative_to(site).parts[0] not in TEMPLATE_DIRS]


def site_problems(site: Path) -> list[str]:
    """Every broken internal link or anchor, missing or empty resource and outside request of
    the HTML site in ``site`` (empty list: none), one line each naming the page."""
    site = site.resolve()
    pages = {p.resolve(): _read(p) for p in site_pages(site)}
    problems = []
    for page, parsed in pages.items():
        name = page.relative_to(site)
        problems += [f"{name}: {p}" for url in parsed.resources
                     for p in [_resource_problem(site, page, url)] if p]
        problems += [f"{name}: {p}" for url in parsed.links
                     for p in [_link_problem(site, page, url, pages)] if p]
    for css in sorted(site.rglob("*.css")):
        for url in _CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace")):
            if is_remote(url):
                problems.append(f"{css.relative_to(site)}: url({url}) from another host")
    return problems


def _resource_problem(site: Path, page: Path, url: str) -> str | None:
    """What is wrong with a resource ``url`` the browser fetches for ``page``, if anything."""
    if is_remote(url):
        return f"loads {url} from another host"
    found = _target(site, page, url)
    if found is None:
        return None   # data: or blob:
    if not found[0].is_relative_to(site):
        return f"resource {url} is outside the site's folder"
    if not found[0].is_file() or found[0].stat().st_size == 0:
        return f"resource {url} is missing or empty"
    return None


def _link_problem(site: Path, page: Path, url: str, pages: dict[Path, _Page]) -> str | None:
    """What is wrong with an internal link ``url`` of ``page``, if anything."""
    found = _target(site, page, url)
    if found is None:
        return None   # another host, mailto:, javascript:
    path, fragment = found
    if not path.is_relative_to(site):
        return f"link {url} leaves the site's folder"
    if not path.is_file():
        return f"link {url} points to a missing file"
    if fragment and path.suffix == ".html":
        target = pages.get(path) or _read(path)
        if unquote(fragment) not in target.ids:
            return f"link {url}: no #{fragment} in {path.name}"
    return None


def _read(path: Path) -> _Page:
    parsed = _Page()
    parsed.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parsed
