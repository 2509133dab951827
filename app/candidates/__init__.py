"""Candidate retrieval: the sources and their deduplicated, filtered, capped union."""

from app.candidates.retrieval import Candidate, CandidateFilter, Retriever

__all__ = ["Candidate", "CandidateFilter", "Retriever"]
