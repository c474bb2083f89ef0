"""Funnels: the visitors who did a series of steps in order, within one visit, and at the
end perhaps paid (GET /api/v1/stats/funnel; README, Reports: Funnels)."""
