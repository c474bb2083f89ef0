"""The parameters every report takes, and the reports as CSV and as text."""
