"""Stripe webhooks: `mapping` (pure: events to Tally writes) and `webhook` (the route)."""
