"""The HTTP face of Tally: Falcon resources and the pieces they share."""
