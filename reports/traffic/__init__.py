"""Traffic figures: the aggregate and breakdowns (pure), and the realtime view."""
