"""The ground floor: the SQLite file, its schema, and every SQL statement of Tally
(besides the reports' query modules). Imports nothing above it (tests/test_layers.py)."""
