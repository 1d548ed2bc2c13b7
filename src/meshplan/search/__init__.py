"""Exhaustive search over parallel plans: candidates, vectorised scoring, pruning, ranked results."""

from meshplan.search.run import SearchResult, Space, check_space, search

__all__ = ["SearchResult", "Space", "check_space", "search"]
