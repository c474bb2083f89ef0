"""Segments: filters and goals, and filtered traffic counted per day and stored."""
