"""Reports: revenue by first-touch channel, MRR and its movements, traffic statistics.

`revenue`, `mrr` and `traffic` are pure: they take plain rows and return plain dicts, so
every figure can be checked by hand. The SQL that feeds them lives in `reports.queries`
and, for traffic counted per day, `reports.days`; `service` is the one entry point.
"""
