"""Traffic counted per UTC day, stored once a day is final, and kept before pruning."""
