"""`make bench`: Tally's ingestion measured against its own ceilings (see bench/run.py)."""
