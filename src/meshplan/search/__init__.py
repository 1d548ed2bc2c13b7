"""Exhaustive search over parallel plans: candidates, vectorised scoring, pruning, ranked results."""

from meshplan.search.limits import check_space
from meshplan.search.run import SearchResult, search
from meshplan.search.space import Space

__all__ = ["SearchResult", "Space", "check_space", "search"]
