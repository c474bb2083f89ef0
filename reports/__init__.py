"""Reports: traffic statistics, revenue by first touch, MRR and its movements.

`service` is the one entry point: it checks a report's parameters and runs it through
`assembly`, which puts each report together from the packages below it:
- `traffic`: the figures of traffic (pure) and the realtime view with its SQL;
- `money`: exact money, revenue, MRR and its movements (pure), and their SQL;
- `days`: traffic counted per UTC day and stored once a day is final, and its SQL;
- `segments`: filters and goals, and filtered traffic per day, stored like `days`;
- `shared`: the parameters every report takes, and CSV and text output.
`timeseries` gives the figures of each time bucket and the changes of a comparison.
SQL is written only in each package's `queries` module (and in storage/).
"""
