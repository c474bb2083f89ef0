"""Money: exact amounts, revenue by first touch, MRR and its movements, and their SQL."""
