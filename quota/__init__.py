"""Monthly event allowances per plan."""
