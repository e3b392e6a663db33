"""Every link to a heading of the docs works on GitHub and on the docs site (issue 43 item 17): the two make
anchors by different rules (tests/helpers/anchors.py), so each linked heading must have one anchor under both,
and so must every heading, for the links still to come."""

from __future__ import annotations

import pytest

from tests.helpers.anchors import anchor_links, github_slug, headings, site_slug
from tests.helpers.docs import ROOT, pages


def test_the_two_slug_rules_are_the_sites_and_githubs():
    """Known anchors of both (GitHub keeps a hyphen per space; the site collapses them)."""
    for text, github, site in (
        ("The two-tower + graph filter", "the-two-tower--graph-filter", "the-two-tower-graph-filter"),
        ("Ids, timestamps and the rules", "ids-timestamps-and-the-rules", "ids-timestamps-and-the-rules"),
        ("Sharding / resharding", "sharding--resharding", "sharding-resharding"),
        ("`data.slices` (recsys/data/slices.py)", "dataslices-recsysdataslicespy", "dataslices-recsysdataslicespy"),
    ):
        assert (github_slug(text), site_slug(text)) == (github, site), text


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_heading_has_one_anchor_on_github_and_on_the_site(page):
    differ = [
        f"{page.name}:{h.line} {h.text!r}: GitHub #{h.slugs[0]}, site #{h.slugs[1]}"
        for h in headings(page)
        if h.slugs[0] != h.slugs[1]
    ]
    assert not differ, "reword these headings (' + ', ' / ', ' - ' give GitHub two hyphens):\n" + "\n".join(differ)
    # a repeated heading gets "-1" on GitHub and "_1" on the site: every heading of a page is its own
    slugs = [h.slugs[1] for h in headings(page)]
    assert len(slugs) == len(set(slugs)), sorted({s for s in slugs if slugs.count(s) > 1})


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_anchor_link_resolves_under_both_rules(page):
    broken = []
    for link in anchor_links(page):
        if not link.target.is_file():
            broken.append(f"{page.name}:{link.line}: {link.target} does not exist")
            continue
        slugs = [h.slugs for h in headings(link.target)]
        for rule, known in (("GitHub", {g for g, _ in slugs}), ("the site", {s for _, s in slugs})):
            if link.anchor not in known:
                broken.append(f"{page.name}:{link.line}: #{link.anchor} is no anchor of {link.target.name} on {rule}")
    assert not broken, "\n".join(broken)
