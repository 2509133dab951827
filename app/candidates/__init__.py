"""Candidate retrieval: the sources, their deduplicated, filtered, capped union, and the
nearest-neighbour index over the video vectors."""

from app.candidates.ann import VideoIndex
from app.candidates.ann_rebuild import LiveIndex
from app.candidates.retrieval import Candidate, CandidateFilter, Retriever

__all__ = ["Candidate", "CandidateFilter", "LiveIndex", "Retriever", "VideoIndex"]
