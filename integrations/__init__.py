"""Integrations that turn other services' notifications into Tally's records."""
