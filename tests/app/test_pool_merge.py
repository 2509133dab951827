"""The candidate pool's weighted round-robin (:func:`app.candidates.retrieval.merge`)."""

from __future__ import annotations

import heapq
import random

from app.candidates.retrieval import Pool, merge
from app.candidates.sources import Proposal


def one_heap_step_per_video(proposals: list[tuple[str, float, Proposal]]) -> Pool:
    """The round-robin as first written: one pop and one push per proposed video."""
    pool = Pool()
    heap = [(1.0 / share, i, 0, 0) for i, (_, share, p) in enumerate(proposals) if p.videos]
    heapq.heapify(heap)
    while heap:
        _, i, at, taken = heapq.heappop(heap)
        name, share, proposal = proposals[i]
        video = proposal.videos[at]
        found = pool.proposers.get(video)
        if found is None:
            pool.proposers[video] = [name]
            pool.videos.append(video)
            pool.sources.append(name)
            taken += 1
        elif name not in found:
            found.append(name)
        if at + 1 < len(proposal.videos):
            heapq.heappush(heap, ((taken + 1) / share, i, at + 1, taken))
    return pool


def test_each_source_leads_in_proportion_to_its_share_and_duplicates_keep_the_first() -> None:
    pool = merge([
        ("a", 2.0, Proposal(["a1", "a2", "a3", "a4"])),
        ("b", 1.0, Proposal(["b1", "a1", "b2"])),
        ("c", 1.0, Proposal([])),
    ])
    assert pool.videos == ["a1", "a2", "b1", "a3", "a4", "b2"]
    assert pool.sources == ["a", "a", "b", "a", "a", "b"]
    assert pool.proposers["a1"] == ["a", "b"]


def test_the_same_pool_as_one_heap_step_per_video() -> None:
    rng = random.Random(7)
    for _ in range(300):
        catalog = [f"v{k}" for k in range(rng.randint(1, 60))]
        proposals = [
            (name, rng.choice([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 1.0, 1 / 3]),
             Proposal(rng.sample(catalog, rng.randint(0, len(catalog)))))
            for name in ("embedding", "covisit", "categories", "creators", "trending", "fresh")[
                : rng.randint(1, 6)
            ]
        ]
        want, got = one_heap_step_per_video(proposals), merge(proposals)
        assert (got.videos, got.sources, got.proposers) == (
            want.videos, want.sources, want.proposers
        )
