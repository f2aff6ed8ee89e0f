"""Leaderboards built from submitted run summaries (see issue tracker for the builder)."""
